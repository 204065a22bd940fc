//! `tether validate`: network configs' ipam sections read the way the plugin reads them, offline,
//! with what a NAD author should be warned about: a file store shared across nodes, and (between
//! the configs given, and the cluster's NADs with `--cluster`) ranges that overlap across
//! uniqueness domains on one master or disagree about their subnet ([`crate::overlap`]).

use std::path::PathBuf;

use clap::Args;
use tether_kube_store::{Cluster, KubeSettings};
use tether_pool::{PoolConfig, StoreKind};

use crate::nads::{NadNetwork, file_network, nad_networks, with_files};
use crate::output::{EXIT_FAILED, EXIT_OK};
use crate::overlap::findings;

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
        match file_network(path) {
            Ok(n) => {
                print_network(&n.cfg);
                warnings.extend(validate_warnings(&n.cfg, args.node_local));
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
    println!(
        "network {}: {}; {:?} store",
        cfg.network_name,
        ranges.join(", "),
        cfg.store
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
