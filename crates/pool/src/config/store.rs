//! Which lease store a configuration uses, and with which kubeconfig: decided here, in one place,
//! from the `store`, `datastore` (whereabouts') and `kubernetes.kubeconfig` keys and from whether
//! tether's node-agent is installed where the configuration is read.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::{ConfigError, KubernetesConfig, StoreKind, opt_str};

/// Where tether's node-agent writes the plugins' kubeconfig on every node it runs on.
pub const NODE_KUBECONFIG: &str = "/etc/cni/net.d/tether.d/tether.kubeconfig";

/// Whether tether's node-agent is installed where the configuration is read. Never from the
/// configuration itself: a NAD is written by someone else and must not choose a root credential.
/// The plugin looks for the agent's kubeconfig (tether-kube-store's `node_agent`); the controller
/// and the agents know an agent runs on every node ([`NodeAgent::on_every_node`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeAgent {
    /// Installed: the kubeconfig it writes for the plugins.
    Installed(PathBuf),
    /// Not installed (cnitool, a single host, a laptop).
    Absent,
}

impl NodeAgent {
    /// As on every node of a cluster that runs tether: the agent, its kubeconfig at the usual path.
    pub fn on_every_node() -> NodeAgent {
        NodeAgent::Installed(PathBuf::from(NODE_KUBECONFIG))
    }
}

/// Why a configuration uses the store it does (`tether validate` and `doctor` say it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreSource {
    /// `ipam.store`.
    StoreKey,
    /// whereabouts' `ipam.datastore` (`"kubernetes"`), without `store`.
    DatastoreKey,
    /// `ipam.kubernetes.kubeconfig` is set, without `store` or `datastore`.
    KubeconfigKey,
    /// None of those keys, and tether's node-agent is installed: the cluster store, with the
    /// agent's kubeconfig.
    NodeAgent,
    /// None of those keys and no node-agent: the node-local file store, the embedded default
    /// (cnitool, a single host).
    Default,
}

/// Why, in a few words (`tether validate` and `doctor` print it).
impl std::fmt::Display for StoreSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreSource::StoreKey => "ipam.store",
            StoreSource::DatastoreKey => "ipam.datastore",
            StoreSource::KubeconfigKey => "ipam.kubernetes.kubeconfig",
            StoreSource::NodeAgent => "no store named, and tether's node-agent is installed",
            StoreSource::Default => {
                "no store named, and tether's node-agent is not installed: the embedded default"
            }
        })
    }
}

/// Where the cluster store's kubeconfig comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KubeconfigSource {
    /// `ipam.kubernetes.kubeconfig`; when that is absent too, the in-cluster service account,
    /// else `KUBECONFIG`.
    #[default]
    Config,
    /// tether's node-agent's, for a configuration that names none.
    NodeAgent,
    /// tether's node-agent's, in place of whereabouts' kubeconfig, which the configuration named
    /// (this path).
    InsteadOfWhereabouts(PathBuf),
}

/// Is `path` whereabouts' kubeconfig: a file named `whereabouts.kubeconfig`, or anything in a
/// `whereabouts.d` directory (whereabouts installs `/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig`)?
pub fn is_whereabouts_kubeconfig(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n == "whereabouts.kubeconfig")
        || path
            .parent()
            .is_some_and(|d| d.components().any(|c| c.as_os_str() == "whereabouts.d"))
}

/// The store a configuration uses, why, and the `kubernetes` settings it uses it with.
///
/// `store` decides; else whereabouts' `datastore`; else a `kubernetes.kubeconfig` (the cluster
/// store); else the node-agent when installed (the cluster store), else the file store. The
/// cluster store without a kubeconfig of its own gets the node-agent's. A kubeconfig of
/// whereabouts' (another identity, which tether's RBAC does not know) is replaced by the
/// node-agent's, or refused without one when the cluster store would use it.
pub(super) fn choose_store(
    ipam: &Map<String, Value>,
    kubernetes: Option<KubernetesConfig>,
    agent: &NodeAgent,
) -> Result<(StoreKind, StoreSource, Option<KubernetesConfig>), ConfigError> {
    let store = match opt_str(ipam, "store", "ipam.store")? {
        None => None,
        Some("file") => Some(StoreKind::File),
        Some("kubernetes") => Some(StoreKind::Kubernetes),
        Some(_) => {
            return Err(ConfigError::invalid(
                "ipam.store",
                &ipam["store"],
                "expected \"file\" or \"kubernetes\"",
            ));
        }
    };
    let datastore = parse_datastore(ipam)?;
    let given = kubernetes.as_ref().and_then(|k| k.kubeconfig.clone());
    let (kind, source) = match (store, datastore, &given, agent) {
        (Some(k), _, _, _) => (k, StoreSource::StoreKey),
        (None, Some(k), _, _) => (k, StoreSource::DatastoreKey),
        (None, None, Some(_), _) => (StoreKind::Kubernetes, StoreSource::KubeconfigKey),
        (None, None, None, NodeAgent::Installed(_)) => {
            (StoreKind::Kubernetes, StoreSource::NodeAgent)
        }
        (None, None, None, NodeAgent::Absent) => (StoreKind::File, StoreSource::Default),
    };
    let kubernetes = match (given, agent) {
        (Some(theirs), NodeAgent::Installed(ours)) if is_whereabouts_kubeconfig(&theirs) => {
            let mut k = kubernetes.unwrap_or_default();
            k.kubeconfig = Some(ours.clone());
            k.source = KubeconfigSource::InsteadOfWhereabouts(theirs);
            Some(k)
        }
        (Some(theirs), NodeAgent::Absent)
            if kind == StoreKind::Kubernetes && is_whereabouts_kubeconfig(&theirs) =>
        {
            return Err(ConfigError::invalid(
                "ipam.kubernetes.kubeconfig",
                &Value::from(theirs.display().to_string()),
                format!(
                    "this is whereabouts' kubeconfig, an identity tether's RBAC does not know, and tether's \
                     node-agent (whose kubeconfig would replace it) is not installed on this node: install tether's \
                     node-agent, or set ipam.kubernetes.kubeconfig to tether's kubeconfig ({NODE_KUBECONFIG})"
                ),
            ));
        }
        (None, NodeAgent::Installed(ours)) if kind == StoreKind::Kubernetes => {
            let mut k = kubernetes.unwrap_or_default();
            k.kubeconfig = Some(ours.clone());
            k.source = KubeconfigSource::NodeAgent;
            Some(k)
        }
        _ => kubernetes,
    };
    Ok((kind, source, kubernetes))
}

/// whereabouts' `datastore`: `"kubernetes"` is the cluster store; anything else (`"etcd"`) is
/// refused: tether keeps leases nowhere else, and a NAD that asks for etcd must not quietly get
/// another store.
fn parse_datastore(ipam: &Map<String, Value>) -> Result<Option<StoreKind>, ConfigError> {
    match opt_str(ipam, "datastore", "ipam.datastore")? {
        None => Ok(None),
        Some("kubernetes") => Ok(Some(StoreKind::Kubernetes)),
        Some(_) => Err(ConfigError::invalid(
            "ipam.datastore",
            &ipam["datastore"],
            "tether keeps its leases as IPLease objects in the cluster (\"kubernetes\", the only datastore it \
             accepts) or in node-local files (\"store\": \"file\"): remove \"datastore\" and the etcd_* keys \
             (etcd_host, etcd_username, etcd_password, etcd_key_file, etcd_cert_file, etcd_ca_cert_file)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const OURS: &str = "/etc/cni/net.d/tether.d/tether.kubeconfig";
    const GIVEN: &str = "/etc/kubernetes/tether-ipam.kubeconfig";
    const WHEREABOUTS: &str = "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig";

    /// What the decision gave, in the table's words: kind, source, and the kubeconfig (`-` none,
    /// `given`, `whereabouts`, `agent`, `agent for whereabouts`), or the refused key.
    fn decide(store: &str, datastore: &str, kubeconfig: &str, agent: bool) -> String {
        let mut ipam = json!({});
        if store != "-" {
            ipam["store"] = json!(store);
        }
        if datastore != "-" {
            ipam["datastore"] = json!(datastore);
        }
        let kubernetes = match kubeconfig {
            "-" => None,
            k => Some(KubernetesConfig {
                kubeconfig: Some(PathBuf::from(if k == "given" {
                    GIVEN
                } else {
                    WHEREABOUTS
                })),
                ..KubernetesConfig::default()
            }),
        };
        let agent = if agent {
            NodeAgent::Installed(OURS.into())
        } else {
            NodeAgent::Absent
        };
        match choose_store(ipam.as_object().unwrap(), kubernetes, &agent) {
            Err(ConfigError::Invalid { key, .. }) => format!("refused: {key}"),
            Err(e) => panic!("{e}"),
            Ok((kind, source, k)) => {
                let kc = match k.map(|k| (k.kubeconfig, k.source)) {
                    None | Some((None, _)) => "-".to_string(),
                    Some((Some(p), KubeconfigSource::Config)) if p == Path::new(GIVEN) => {
                        "given".into()
                    }
                    Some((Some(p), KubeconfigSource::Config)) if p == Path::new(WHEREABOUTS) => {
                        "whereabouts".into()
                    }
                    Some((Some(p), KubeconfigSource::NodeAgent)) if p == Path::new(OURS) => {
                        "agent".into()
                    }
                    Some((Some(p), KubeconfigSource::InsteadOfWhereabouts(w)))
                        if p == Path::new(OURS) && w == Path::new(WHEREABOUTS) =>
                    {
                        "agent for whereabouts".into()
                    }
                    other => panic!("unexpected kubeconfig {other:?}"),
                };
                format!("{kind:?} {source:?} {kc}")
            }
        }
    }

    /// Every combination of `store`, `datastore`, `kubernetes.kubeconfig` and the node-agent:
    /// (store, datastore, kubeconfig, agent installed) → "kind source kubeconfig".
    #[rustfmt::skip]
    const EVERY_COMBINATION: [(&str, &str, &str, bool, &str); 36] = [
        ("-", "-", "-", true, "Kubernetes NodeAgent agent"),
        ("-", "-", "given", true, "Kubernetes KubeconfigKey given"),
        ("-", "-", "whereabouts", true, "Kubernetes KubeconfigKey agent for whereabouts"),
        ("-", "kubernetes", "-", true, "Kubernetes DatastoreKey agent"),
        ("-", "kubernetes", "given", true, "Kubernetes DatastoreKey given"),
        ("-", "kubernetes", "whereabouts", true, "Kubernetes DatastoreKey agent for whereabouts"),
        ("file", "-", "-", true, "File StoreKey -"),
        ("file", "-", "given", true, "File StoreKey given"),
        ("file", "-", "whereabouts", true, "File StoreKey agent for whereabouts"),
        ("file", "kubernetes", "-", true, "File StoreKey -"),
        ("file", "kubernetes", "given", true, "File StoreKey given"),
        ("file", "kubernetes", "whereabouts", true, "File StoreKey agent for whereabouts"),
        ("kubernetes", "-", "-", true, "Kubernetes StoreKey agent"),
        ("kubernetes", "-", "given", true, "Kubernetes StoreKey given"),
        ("kubernetes", "-", "whereabouts", true, "Kubernetes StoreKey agent for whereabouts"),
        ("kubernetes", "kubernetes", "-", true, "Kubernetes StoreKey agent"),
        ("kubernetes", "kubernetes", "given", true, "Kubernetes StoreKey given"),
        ("kubernetes", "kubernetes", "whereabouts", true, "Kubernetes StoreKey agent for whereabouts"),
        ("-", "-", "-", false, "File Default -"),
        ("-", "-", "given", false, "Kubernetes KubeconfigKey given"),
        ("-", "-", "whereabouts", false, "refused: ipam.kubernetes.kubeconfig"),
        ("-", "kubernetes", "-", false, "Kubernetes DatastoreKey -"),
        ("-", "kubernetes", "given", false, "Kubernetes DatastoreKey given"),
        ("-", "kubernetes", "whereabouts", false, "refused: ipam.kubernetes.kubeconfig"),
        ("file", "-", "-", false, "File StoreKey -"),
        ("file", "-", "given", false, "File StoreKey given"),
        ("file", "-", "whereabouts", false, "File StoreKey whereabouts"),
        ("file", "kubernetes", "-", false, "File StoreKey -"),
        ("file", "kubernetes", "given", false, "File StoreKey given"),
        ("file", "kubernetes", "whereabouts", false, "File StoreKey whereabouts"),
        ("kubernetes", "-", "-", false, "Kubernetes StoreKey -"),
        ("kubernetes", "-", "given", false, "Kubernetes StoreKey given"),
        ("kubernetes", "-", "whereabouts", false, "refused: ipam.kubernetes.kubeconfig"),
        ("kubernetes", "kubernetes", "-", false, "Kubernetes StoreKey -"),
        ("kubernetes", "kubernetes", "given", false, "Kubernetes StoreKey given"),
        ("kubernetes", "kubernetes", "whereabouts", false, "refused: ipam.kubernetes.kubeconfig"),
    ];

    #[test]
    fn every_combination() {
        for (store, datastore, kubeconfig, agent, want) in EVERY_COMBINATION {
            assert_eq!(
                decide(store, datastore, kubeconfig, agent),
                want,
                "store {store}, datastore {datastore}, kubeconfig {kubeconfig}, agent {agent}"
            );
        }
        // Other datastores, whatever else is set, and a store that is not one.
        for agent in [true, false] {
            for store in ["-", "file", "kubernetes"] {
                assert_eq!(decide(store, "etcd", "-", agent), "refused: ipam.datastore");
                assert_eq!(
                    decide(store, "consul", "given", agent),
                    "refused: ipam.datastore"
                );
            }
            assert_eq!(decide("etcd", "-", "-", agent), "refused: ipam.store");
        }
    }

    #[test]
    fn messages_say_which_key_to_change() {
        let refused = |ipam: Value, k: Option<&str>| {
            let kubernetes = k.map(|p| KubernetesConfig {
                kubeconfig: Some(p.into()),
                ..KubernetesConfig::default()
            });
            choose_store(ipam.as_object().unwrap(), kubernetes, &NodeAgent::Absent)
                .unwrap_err()
                .to_string()
        };
        let e = refused(json!({"datastore": "etcd", "etcd_host": "x:2379"}), None);
        assert!(e.starts_with("ipam.datastore \"etcd\": "), "{e}");
        assert!(
            e.contains("IPLease objects") && e.contains("remove \"datastore\" and the etcd_* keys"),
            "{e}"
        );
        let e = refused(json!({}), Some(WHEREABOUTS));
        assert!(
            e.starts_with(&format!("ipam.kubernetes.kubeconfig \"{WHEREABOUTS}\": ")),
            "{e}"
        );
        assert!(
            e.contains("install tether's node-agent")
                && e.contains(&format!(
                    "set ipam.kubernetes.kubeconfig to tether's kubeconfig ({NODE_KUBECONFIG})"
                )),
            "{e}"
        );
    }

    #[test]
    fn whereabouts_kubeconfigs_are_known_by_name_or_directory() {
        for p in [
            WHEREABOUTS,
            "/host/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig",
            "/etc/cni/net.d/whereabouts.d/kubeconfig",
            "/etc/kubernetes/cni/net.d/whereabouts.d/sub/token.kubeconfig",
            "/var/lib/whereabouts.kubeconfig",
        ] {
            assert!(is_whereabouts_kubeconfig(Path::new(p)), "{p}");
        }
        for p in [
            OURS,
            GIVEN,
            "/etc/cni/net.d/whereabouts.d",
            "/etc/cni/net.d/not-whereabouts.d/kubeconfig",
            "/etc/cni/net.d/whereabouts.kubeconfig.bak",
        ] {
            assert!(!is_whereabouts_kubeconfig(Path::new(p)), "{p}");
        }
    }
}
