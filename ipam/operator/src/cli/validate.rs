//! `tether validate`: a network config's ipam section read the way the plugin reads it, offline,
//! with what a NAD author should be warned about.

use std::path::PathBuf;

use tether_pool::{NodeAgent, PoolConfig, StoreKind};

use crate::output::{EXIT_FAILED, EXIT_OK};
use crate::store_access::read_network_config;

pub(super) fn validate(path: &PathBuf, node_local: bool, strict: bool) -> Result<i32, String> {
    let cfg = PoolConfig::from_value(&read_network_config(path)?, &NodeAgent::on_every_node())
        .map_err(|e| e.to_string())?;
    let ranges: Vec<String> = cfg
        .ranges
        .iter()
        .map(|r| format!("{r} ({} usable)", r.usable_count()))
        .collect();
    println!(
        "network {}: {}; {:?} store",
        cfg.network_name,
        ranges.join(", "),
        cfg.store
    );
    let warnings = validate_warnings(&cfg, node_local);
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
            "network {} keeps its leases in the node-local file store (\"store\": \"file\", the default without \
             \"kubernetes\"), so every node that attaches a pod to it hands out {} on its own: two nodes can give \
             the same address to two pods, and only the ARP/NDP probe stands between them (two nodes probing the \
             same address at the same moment both hear silence). A NAD is used on every node: give it the cluster \
             store (\"kubernetes\": {{\"kubeconfig\": \"/etc/cni/net.d/tether.d/tether.kubeconfig\"}}). The file \
             store is right only for a range that belongs to one node (pass --node-local to say so).",
            cfg.network_name,
            ranges.join(", "),
        ));
    }
    out
}
