//! `tether validate`: a network config's ipam section read the way the plugin reads it on a node
//! of a cluster running tether (the node-agent on every node), offline, with what a NAD author
//! should be warned about.

use std::path::PathBuf;

use serde_json::Value;
use tether_pool::{
    KubeconfigSource, NODE_KUBECONFIG, NodeAgent, PoolConfig, StoreKind, StoreSource,
};

use crate::output::{EXIT_FAILED, EXIT_OK};
use crate::store_access::{describe_store, read_network_config};

pub(super) fn validate(path: &PathBuf, node_local: bool, strict: bool) -> Result<i32, String> {
    let raw = read_network_config(path)?;
    let cfg =
        PoolConfig::from_value(&raw, &NodeAgent::on_every_node()).map_err(|e| e.to_string())?;
    let ranges: Vec<String> = cfg
        .ranges
        .iter()
        .map(|r| format!("{r} ({} usable)", r.usable_count()))
        .collect();
    let elsewhere = if cfg.store_source == StoreSource::NodeAgent {
        "; on a host without tether's node-agent (cnitool, one node), the node-local file store"
    } else {
        ""
    };
    println!(
        "network {}: {}; {}{elsewhere}",
        cfg.network_name,
        ranges.join(", "),
        describe_store(&cfg)
    );
    let mut warnings = validate_warnings(&cfg, node_local);
    warnings.extend(whereabouts_key_warnings(&raw));
    for w in &warnings {
        eprintln!("tether: warning: {w}");
    }
    Ok(if strict && !warnings.is_empty() {
        EXIT_FAILED
    } else {
        EXIT_OK
    })
}

/// What `validate` warns about in a config that parses.
pub fn validate_warnings(cfg: &PoolConfig, node_local: bool) -> Vec<String> {
    let mut out = Vec::new();
    if cfg.store == StoreKind::File && !node_local {
        let ranges: Vec<String> = cfg.ranges.iter().map(ToString::to_string).collect();
        out.push(format!(
            "network {} keeps its leases in the node-local file store (\"store\": \"file\"), so every node that \
             attaches a pod to it hands out {} on its own: two nodes can give the same address to two pods, and only \
             the ARP/NDP probe stands between them (two nodes probing the same address at the same moment both hear \
             silence). A NAD is used on every node: give it the cluster store (remove \"store\", or set \"store\": \
             \"kubernetes\"). The file store is right only for a range that belongs to one node (pass --node-local to \
             say so).",
            cfg.network_name,
            ranges.join(", "),
        ));
    }
    if let Some(KubeconfigSource::InsteadOfWhereabouts(theirs)) =
        cfg.kubernetes.as_ref().map(|k| &k.source)
    {
        out.push(format!(
            "ipam.kubernetes.kubeconfig {} is whereabouts' credential: where tether's node-agent runs, tether-ipam uses \
             the agent's kubeconfig ({NODE_KUBECONFIG}) instead, and on a node without the agent it refuses the \
             config. Set ipam.kubernetes.kubeconfig to {NODE_KUBECONFIG}, or remove the key.",
            theirs.display()
        ));
    }
    out
}

/// whereabouts' keys tether reads differently, from the raw config (the top level or `ipam`).
fn whereabouts_key_warnings(raw: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(path) = raw
        .pointer("/ipam/configuration_path")
        .and_then(Value::as_str)
        .filter(|p| !p.trim().is_empty())
    {
        out.push(format!(
            "ipam.configuration_path {path:?} is whereabouts' flat file merged under the config; tether does not read \
             it (nor whereabouts.d/whereabouts.conf): put the keys it holds into the ipam section, and remove the key."
        ));
    }
    if let Some(why) = raw
        .as_object()
        .and_then(tether_cni::logging::unfit_log_file)
    {
        out.push(format!(
            "{why}; the plugins ignore it and log to stderr (which the runtime or Multus keeps)."
        ));
    }
    out
}
