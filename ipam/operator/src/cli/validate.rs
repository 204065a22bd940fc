//! `tether validate`: network configs' ipam sections read the way the plugin reads them on a node
//! of a cluster running tether (the node-agent on every node), offline, with what a NAD author
//! should be warned about: a file store shared across nodes, whereabouts' keys tether reads
//! differently, and (between the configs given, and the cluster's NADs with `--cluster`) ranges
//! that overlap across uniqueness domains on one master or disagree about their subnet
//! ([`crate::overlap`]).

use std::path::PathBuf;

use clap::Args;
use serde_json::Value;
use tether_kube_store::{Cluster, KubeSettings};
use tether_pool::{
    KubeconfigSource, NODE_KUBECONFIG, NodeAgent, PoolConfig, StoreKind, StoreSource,
};

use crate::nads::{NadNetwork, file_network, nad_networks, with_files};
use crate::output::{EXIT_FAILED, EXIT_OK};
use crate::overlap::findings;
use crate::store_access::{describe_store, read_network_config};

/// `tether validate`'s flags.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// A network config (a NAD's spec.config, a .conf, a .conflist, or the NAD object as JSON,
    /// e.g. `kubectl get net-attach-def NAME -o json`). Give it several times to compare the
    /// configs' ranges with each other too.
    #[arg(long, required = true)]
    config: Vec<PathBuf>,
    /// These configs are used on one node only (a range that belongs to that node): the file
    /// store is right for them, do not warn.
    #[arg(long)]
    node_local: bool,
    /// Treat a warning as a failure (exit 1): for CI.
    #[arg(long)]
    strict: bool,
    /// Compare the configs' ranges with those of the cluster's NetworkAttachmentDefinitions too
    /// (a NAD object given as a config stands in for the cluster's copy of it).
    #[arg(long)]
    cluster: bool,
    /// Kubeconfig for --cluster (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, requires = "cluster")]
    kubeconfig: Option<PathBuf>,
}

pub(super) fn validate(args: &ValidateArgs) -> Result<i32, String> {
    let several = args.config.len() > 1;
    let mut files = Vec::new();
    let mut unreadable = false;
    let mut warnings = Vec::new();
    for path in &args.config {
        match file_network(path, &NodeAgent::on_every_node()) {
            Ok(n) => {
                print_network(&n.cfg);
                warnings.extend(validate_warnings(&n.cfg, args.node_local));
                warnings.extend(whereabouts_key_warnings(&read_network_config(path)?));
                files.push(n);
            }
            Err(e) if !several => return Err(e),
            Err(e) => {
                eprintln!("tether: {}: {e}", path.display());
                unreadable = true;
            }
        }
    }
    let compared = if args.cluster {
        with_files(cluster_networks(args.kubeconfig.as_ref())?, &files)
    } else {
        files.clone()
    };
    let found: Vec<_> = findings(&compared)
        .into_iter()
        .filter(|f| files.iter().any(|n| f.nads().contains(&n.nad.as_str())))
        .collect();
    if several || args.cluster {
        println!(
            "ranges of {} config(s){} compared: {} overlap finding(s)",
            files.len(),
            if args.cluster {
                format!(
                    " and {} other network(s) of the cluster's NADs",
                    compared.len() - files.len()
                )
            } else {
                String::new()
            },
            found.len()
        );
    }
    warnings.extend(found.iter().map(|f| f.message()));
    for w in &warnings {
        eprintln!("tether: warning: {w}");
    }
    Ok(if unreadable || (args.strict && !warnings.is_empty()) {
        EXIT_FAILED
    } else {
        EXIT_OK
    })
}

fn print_network(cfg: &PoolConfig) {
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
        describe_store(cfg)
    );
}

/// The tether-ipam networks of the cluster's NADs (none when the API serves no NADs).
fn cluster_networks(kubeconfig: Option<&PathBuf>) -> Result<Vec<NadNetwork>, String> {
    let settings = kubeconfig
        .map(KubeSettings::with_kubeconfig)
        .unwrap_or_default();
    let cluster = Cluster::connect(&settings).map_err(|e| e.to_string())?;
    match cluster.network_attachment_definitions() {
        Ok(Some(nads)) => Ok(nad_networks(&nads)),
        Ok(None) => {
            eprintln!(
                "tether: note: the API serves no NetworkAttachmentDefinitions (k8s.cni.cncf.io/v1): \
                 nothing of the cluster's to compare"
            );
            Ok(Vec::new())
        }
        Err(e) => Err(format!(
            "reading the cluster's NetworkAttachmentDefinitions: {e}"
        )),
    }
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
