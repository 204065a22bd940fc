//! `tether validate`: network configs read the way both plugins read them on a node of a cluster
//! running tether (the node-agent on every node), offline: the CNI keys, tether-ipvlan's (mode,
//! flags, master, mtu, capabilities), the log and data paths the plugins accept, and tether-ipam's
//! section; from JSON or YAML files, manifests of several documents included. It warns about what a
//! NAD author should know: a file store shared across nodes, whereabouts' keys tether reads
//! differently, a `log_file` the plugins ignore, and (between the networks given, and the
//! cluster's NADs with `--cluster`) ranges that overlap across uniqueness domains on one master or
//! disagree about their subnet ([`crate::overlap`]).

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::{Value, json};
use tether_attach::IpvlanConfig;
use tether_cluster::Cluster;
use tether_cni::NetConf;
use tether_kube_store::KubeSettings;
use tether_pool::{
    KubeconfigSource, NODE_KUBECONFIG, NodeAgent, PoolConfig, StoreKind, StoreSource,
};
use tether_trusted_fs::Place;

use crate::manifests::{NetworkDocument, plugins_of, read_documents};
use crate::nads::{NadNetwork, attacher_of, master_of, nad_networks, with_files};
use crate::output::{EXIT_FAILED, EXIT_OK, Output};
use crate::overlap::findings;
use crate::store_access::describe_store;

/// `tether validate`'s flags.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    /// Files to check: CNI configs or conflists (JSON), NetworkAttachmentDefinitions as JSON or
    /// YAML, manifests of several YAML documents (other kinds are skipped), `kubectl get
    /// net-attach-def -o yaml` lists. Several networks are also compared with each other.
    files: Vec<PathBuf>,
    /// A file to check, as the positional arguments (kept for scripts that name it so).
    #[arg(long)]
    config: Vec<PathBuf>,
    /// These configs are used on one node only (a range that belongs to that node): the file
    /// store is right for them, do not warn.
    #[arg(long)]
    node_local: bool,
    /// Treat a warning as a failure (exit 1): for CI.
    #[arg(long)]
    strict: bool,
    /// Compare the configs' ranges with those of the cluster's NetworkAttachmentDefinitions too
    /// (a NAD given in a file stands in for the cluster's copy of it).
    #[arg(long)]
    cluster: bool,
    /// Kubeconfig for --cluster (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, requires = "cluster")]
    kubeconfig: Option<PathBuf>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// What was found of one network configuration.
#[derive(Debug, Default)]
struct Checked {
    source: String,
    nad: Option<String>,
    name: Option<String>,
    plugins: Vec<String>,
    /// The tether-ipam network, when its section parsed.
    ipam: Option<NadNetwork>,
    errors: Vec<String>,
    warnings: Vec<String>,
}

impl Checked {
    fn json(&self) -> Value {
        let ipam = self.ipam.as_ref().map(|n| {
            json!({
                "network": n.cfg.network_name,
                "isolatedFabric": n.cfg.domain,
                "store": describe_store(&n.cfg),
                "ranges": n.cfg.ranges.iter().map(|r| json!({"range": r.to_string(), "usable": r.usable_count().to_string()})).collect::<Vec<_>>(),
            })
        });
        json!({
            "source": self.source, "nad": self.nad, "name": self.name, "plugins": self.plugins,
            "ipam": ipam, "valid": self.errors.is_empty(), "errors": self.errors, "warnings": self.warnings,
        })
    }
}

pub(super) fn validate(args: &ValidateArgs) -> Result<i32, String> {
    let paths: Vec<&PathBuf> = args.files.iter().chain(&args.config).collect();
    if paths.is_empty() {
        return Err(
            "name the files to check (tether validate FILE…; --help says what they may be)".into(),
        );
    }
    let mut checked = Vec::new();
    let mut notes = Vec::new();
    for path in &paths {
        match read_documents(path) {
            Ok(found) => {
                let without: Vec<String> = found
                    .without_config
                    .iter()
                    .map(|nad| {
                        format!(
                            "NAD {nad} has no spec.config: Multus reads its config from a file on each node, which is \
                             not checked here"
                        )
                    })
                    .collect();
                if found.networks.is_empty() && found.other_kinds.is_empty() {
                    // Nothing checked is not a pass (a manifest of pods is skipped, said below).
                    let mut errors = vec![format!(
                        "{} holds no network config to check",
                        path.display()
                    )];
                    errors.extend(without);
                    checked.push(Checked {
                        source: path.display().to_string(),
                        errors,
                        ..Checked::default()
                    });
                } else {
                    notes.extend(without);
                }
                for other in found.other_kinds {
                    notes.push(format!("{}: skipped {other}", path.display()));
                }
                checked.extend(
                    found
                        .networks
                        .into_iter()
                        .map(|d| check_document(d, args.node_local)),
                );
            }
            Err(e) => checked.push(Checked {
                source: path.display().to_string(),
                errors: vec![e],
                ..Checked::default()
            }),
        }
    }
    let files: Vec<NadNetwork> = checked.iter().filter_map(|c| c.ipam.clone()).collect();
    let compared = if args.cluster {
        with_files(cluster_networks(args.kubeconfig.as_ref())?, &files)
    } else {
        files.clone()
    };
    let overlaps: Vec<String> = findings(&compared)
        .into_iter()
        .filter(|f| files.iter().any(|n| f.nads().contains(&n.nad.as_str())))
        .map(|f| f.message())
        .collect();
    let valid = checked.iter().all(|c| c.errors.is_empty());
    let warned = !overlaps.is_empty() || checked.iter().any(|c| !c.warnings.is_empty());
    match args.output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "kind": "ValidationReport",
                "items": checked.iter().map(Checked::json).collect::<Vec<_>>(),
                "overlaps": overlaps,
                "notes": notes,
                "valid": valid,
            }))
            .map_err(|e| format!("writing JSON: {e}"))?
        ),
        Output::Table => {
            for c in &checked {
                if let Some(n) = &c.ipam {
                    print_network(&n.cfg);
                }
                for e in &c.errors {
                    eprintln!("tether: {}: {e}", where_(c));
                }
            }
            if files.len() > 1 || args.cluster {
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
                    overlaps.len()
                );
            }
            for n in &notes {
                eprintln!("tether: note: {n}");
            }
            for w in checked.iter().flat_map(|c| &c.warnings).chain(&overlaps) {
                eprintln!("tether: warning: {w}");
            }
        }
    }
    Ok(if !valid || (args.strict && warned) {
        EXIT_FAILED
    } else {
        EXIT_OK
    })
}

/// How an error names its network: the NAD, else the file.
fn where_(c: &Checked) -> String {
    match (&c.nad, &c.name) {
        (Some(nad), _) => format!("NAD {nad} ({})", c.source),
        (None, Some(name)) => format!("network {name} ({})", c.source),
        _ => c.source.clone(),
    }
}

/// One network configuration as both plugins would read it on a node.
fn check_document(doc: NetworkDocument, node_local: bool) -> Checked {
    let mut c = Checked {
        source: doc.source.clone(),
        nad: doc.nad.clone(),
        name: doc
            .config
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_string),
        ..Checked::default()
    };
    let plugins = plugins_of(&doc.config);
    for (i, plugin) in plugins.iter().enumerate() {
        let kind = plugin
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("(no type)")
            .to_string();
        c.plugins.push(kind.clone());
        let ipam_type = plugin.pointer("/ipam/type").and_then(Value::as_str);
        let ours = kind == "tether-ipvlan" || ipam_type == Some("tether-ipam");
        if !ours {
            continue;
        }
        let conf = match serde_json::to_vec(plugin)
            .map_err(|e| e.to_string())
            .and_then(|raw| NetConf::parse(&raw).map_err(|e| e.to_string()))
        {
            Ok(conf) => conf,
            Err(e) => {
                c.errors.push(format!("{kind}: {e}"));
                continue;
            }
        };
        if let Err(e) = tether_cni::logging::check_log_keys(&conf.value) {
            c.errors.push(e.0);
        }
        if kind == "tether-ipvlan" {
            check_attacher(&conf, i == 0, &mut c);
        }
        if ipam_type == Some("tether-ipam") {
            check_ipam(plugin, &doc, node_local, &mut c);
        }
        if let Some(why) = tether_cni::logging::unfit_log_file(&conf.value) {
            c.warnings.push(format!(
                "{why}; the plugins ignore it and log to stderr (which the runtime or Multus keeps)."
            ));
        }
    }
    if !c.plugins.iter().any(|k| k == "tether-ipvlan") && c.ipam.is_none() && c.errors.is_empty() {
        c.warnings.push(format!(
            "{}: no plugin of tether's (type tether-ipvlan, or ipam type tether-ipam): nothing here is read by tether",
            where_(&c)
        ));
    }
    c
}

/// tether-ipvlan's keys, as its ADD reads them before touching the kernel.
fn check_attacher(conf: &NetConf, first: bool, c: &mut Checked) {
    if let Err(e) = IpvlanConfig::from_conf(conf) {
        c.errors.push(format!("tether-ipvlan: {e}"));
    }
    if conf.value.get("ipam").is_none_or(Value::is_null) && first {
        c.errors.push(
            "tether-ipvlan has no ipam section and nothing chained before it hands it addresses: every ADD would \
             fail. Add \"ipam\": {\"type\": \"tether-ipam\", …}"
                .into(),
        );
    }
    if conf
        .value
        .get("capabilities")
        .and_then(|c| c.get("mac"))
        .and_then(Value::as_bool)
        == Some(true)
    {
        c.warnings.push(
            "capabilities.mac: an ipvlan interface always carries its master's MAC, so a pod that asks for a MAC \
             (the network selection's \"mac\") is refused with code 2. Remove \"mac\" from capabilities."
                .into(),
        );
    }
}

/// tether-ipam's section, as the plugin reads it where the node-agent runs.
fn check_ipam(plugin: &Value, doc: &NetworkDocument, node_local: bool, c: &mut Checked) {
    match PoolConfig::from_value(plugin, &NodeAgent::on_every_node()) {
        Ok(cfg) => {
            if let Err(e) = tether_trusted_fs::check_place(
                "ipam.dataDir",
                Path::new(&cfg.data_dir),
                Place::State,
            ) {
                c.errors.push(format!(
                    "{e}: tether-ipam keeps its files (the file store, the node journal, locks) only there, and \
                     refuses every ADD otherwise"
                ));
            }
            c.warnings.extend(validate_warnings(&cfg, node_local));
            c.warnings.extend(whereabouts_key_warnings(plugin));
            c.ipam = Some(NadNetwork {
                nad: doc.nad.clone().unwrap_or_else(|| doc.source.clone()),
                master: master_of(plugin),
                attacher: attacher_of(plugin),
                cfg,
            });
        }
        Err(e) => c.errors.push(e.to_string()),
    }
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

/// whereabouts' keys tether reads differently, from the raw config.
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
    out
}
