//! Which lease store an operator command works on (`--config`, `--data-dir`, `--kubeconfig`), and
//! reading the network config it names.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::Value;
use tether_cluster::Cluster;
use tether_kube_store::{KubeSettings, KubeStore, node_agent};
use tether_leases::{FileStore, Lease, LeaseStore};
use tether_pool::{KubeconfigSource, NodeAgent, PoolConfig, StoreKind};

use crate::find_cluster::{Found, Places, find_cluster};
use crate::manifests::{plugins_of, read_documents};

/// Where the file store is when nothing names another place (the plugin's `dataDir` default).
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/tether";

/// Which lease store to open: from a network config, or named directly.
///
/// The store is the file store in `--data-dir` when it is given; else the config's (`--config`,
/// read as on a node of a cluster that runs tether); else the cluster store when credentials are
/// found ([`find_cluster`]: `--kubeconfig`, `KUBECONFIG`, `~/.kube/config`, a pod's service
/// account, the node-agent's kubeconfig); else the file store in /var/lib/cni/tether. The same
/// credentials check whether a lease's pod is alive.
#[derive(Args, Debug, Clone, Default)]
pub struct StoreArgs {
    /// Take the store settings from this network config (its ipam section).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The node-local file store in this directory (default /var/lib/cni/tether when no cluster
    /// credentials are found).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Kubeconfig of the cluster (default: KUBECONFIG, ~/.kube/config, a pod's service account,
    /// this node's tether credential, as kubectl looks, then the node).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig's context to use (default: its current-context).
    #[arg(long)]
    pub context: Option<String>,
}

/// A network config file as read by [`read_network_file`].
#[derive(Debug, Clone)]
pub struct NetworkFile {
    /// The configuration with an `ipam` section (the plugin's, from a conflist).
    pub config: Value,
    /// `namespace/name` when the file is a NetworkAttachmentDefinition object (namespace
    /// `default` when it names none).
    pub nad: Option<String>,
}

/// Read a network config file: a single config, or a conflist whose plugin with an `ipam` is used,
/// or a NetworkAttachmentDefinition object as JSON or YAML (`kubectl get net-attach-def NAME -o
/// yaml`), whose `spec.config` is used with the NAD's name injected as Multus does; and which NAD
/// the file is, if it is one. The file holds one network ([`read_documents`]; `tether validate`
/// takes manifests of several). Read it once: it may be a pipe.
pub fn read_network_file(path: &Path) -> Result<NetworkFile, String> {
    let mut found = read_documents(path)?.networks;
    if found.len() != 1 {
        return Err(format!(
            "{} holds {} network configs; give a file with one (tether validate takes manifests of several)",
            path.display(),
            found.len()
        ));
    }
    let doc = found.remove(0);
    Ok(NetworkFile {
        config: plugin_with_ipam(doc.config, &path.display().to_string())?,
        nad: doc.nad,
    })
}

/// The configuration a network's IPAM reads: the config itself, or a conflist's plugin with an
/// `ipam` section ([`plugins_of`]).
pub fn plugin_with_ipam(v: Value, source: &str) -> Result<Value, String> {
    plugins_of(&v)
        .into_iter()
        .find(|p| p.get("ipam").is_some())
        .ok_or_else(|| format!("no plugin in {source} has an ipam section"))
}

/// The store behind an [`OpenStore`].
#[allow(clippy::large_enum_variant)]
pub enum Backend {
    /// Node-local files.
    File(FileStore),
    /// IPLease objects.
    Kube(KubeStore),
}

/// An opened store, the networks it can list, and API access when there is some.
pub struct OpenStore {
    pub backend: Backend,
    /// API access (to check pods): on the Kubernetes store's client, or next to a file store
    /// (the credentials found).
    cluster: Option<Cluster>,
    /// Which store this is, and where its credentials came from, in words.
    pub description: String,
    /// The `--config` file, read once (it may be a pipe).
    pub config: Option<NetworkFile>,
}

impl OpenStore {
    /// The store an operator command names ([`StoreArgs`]), and the config it read.
    pub fn open(args: &StoreArgs) -> Result<(OpenStore, Option<PoolConfig>), String> {
        let found = find_cluster(
            args.kubeconfig.as_deref(),
            args.context.as_deref(),
            &Places::of_this_process(),
        )?;
        let config = args.config.as_deref().map(read_network_file).transpose()?;
        let cfg = match &config {
            Some(f) => Some(
                PoolConfig::from_value(&f.config, &NodeAgent::on_every_node())
                    .map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        let file_dir = args.data_dir.clone().or_else(|| match &cfg {
            Some(c) if c.store == StoreKind::File => Some(c.data_dir.clone()),
            Some(_) => None,
            None => found.is_none().then(|| PathBuf::from(DEFAULT_DATA_DIR)),
        });
        if let Some(dir) = file_dir {
            let cluster = match &found {
                Some((s, _)) => Some(Cluster::connect(s).map_err(|e| e.to_string())?),
                None => None,
            };
            let why = match (&args.data_dir, &cfg, &found) {
                (Some(_), _, _) => "--data-dir",
                (None, Some(_), _) => "the config's store",
                _ => {
                    "no cluster credentials were found (--kubeconfig, KUBECONFIG, ~/.kube/config, a pod's service \
                     account, this node's tether credential)"
                }
            };
            return Ok((
                OpenStore {
                    description: format!("the node-local file store in {} ({why})", dir.display()),
                    backend: Backend::File(FileStore::new(dir)),
                    cluster,
                    config,
                },
                cfg,
            ));
        }
        let (mut settings, found) = match (cfg.as_ref().and_then(|c| c.kubernetes.as_ref()), found)
        {
            // A kubeconfig the config names itself, when it is here and no flag overrides it.
            (Some(k), _)
                if args.kubeconfig.is_none()
                    && k.source == KubeconfigSource::Config
                    && k.kubeconfig.as_ref().is_some_and(|p| p.is_file()) =>
            {
                let p = k.kubeconfig.clone().unwrap_or_default();
                (KubeSettings::with_kubeconfig(p.clone()), Found::Config(p))
            }
            (_, Some(f)) => f,
            (_, None) => {
                return Err(
                    "the config keeps its leases in the cluster store, and no cluster credentials were found: pass \
                     --kubeconfig, set KUBECONFIG, or run where ~/.kube/config or this node's tether credential is"
                        .into(),
                );
            }
        };
        if let Some(k) = cfg.as_ref().and_then(|c| c.kubernetes.as_ref()) {
            let from_config =
                KubeSettings::from_kubernetes_config(Some(k)).map_err(|e| e.to_string())?;
            settings.api_root = from_config.api_root;
            settings.timeout = from_config.timeout;
        }
        let store = KubeStore::connect(settings).map_err(|e| e.to_string())?;
        let description = format!(
            "the cluster store at {} (credentials: {found}{})",
            store.api().server(),
            args.context
                .as_deref()
                .map(|c| format!(", context {c}"))
                .unwrap_or_default()
        );
        Ok((
            OpenStore {
                cluster: Some(Cluster::new(store.api().clone())),
                backend: Backend::Kube(store),
                description,
                config,
            },
            cfg,
        ))
    }

    /// The store `tether doctor` checks: that of `config` (read by [`read_network_file`]), as
    /// the plugin on this node uses it, with its own credentials.
    pub fn as_the_plugin(config: &Value) -> Result<OpenStore, String> {
        let cfg = PoolConfig::from_value(config, &node_agent()).map_err(|e| e.to_string())?;
        match cfg.store {
            StoreKind::File => Ok(OpenStore {
                description: format!("the node-local file store in {}", cfg.data_dir.display()),
                backend: Backend::File(FileStore::new(cfg.data_dir.clone())),
                // Pods are checked with the config's `kubernetes` credentials, when it has some.
                cluster: match &cfg.kubernetes {
                    Some(k) => Some(
                        Cluster::connect(
                            &KubeSettings::from_kubernetes_config(Some(k))
                                .map_err(|e| e.to_string())?,
                        )
                        .map_err(|e| e.to_string())?,
                    ),
                    None => None,
                },
                config: None,
            }),
            StoreKind::Kubernetes => {
                let s = KubeSettings::from_kubernetes_config(cfg.kubernetes.as_ref())
                    .map_err(|e| e.to_string())?;
                let store = KubeStore::connect(s).map_err(|e| e.to_string())?;
                Ok(OpenStore {
                    description: format!("the cluster store at {}", store.api().server()),
                    cluster: Some(Cluster::new(store.api().clone())),
                    backend: Backend::Kube(store),
                    config: None,
                })
            }
        }
    }

    /// The lease store.
    pub fn store(&self) -> &dyn LeaseStore {
        match &self.backend {
            Backend::File(f) => f,
            Backend::Kube(k) => {
                k.restart_budget();
                k
            }
        }
    }

    /// API access (on the Kubernetes store's client, or `--kubeconfig` next to a file store),
    /// with a fresh time budget.
    pub fn cluster(&self) -> Option<&Cluster> {
        let c = self.cluster.as_ref();
        if let Some(c) = c {
            c.restart_budget();
        }
        c
    }

    /// Leases of `only` (those its network holds, in any domain), or of every network.
    pub fn leases(&self, only: Option<&str>) -> Result<Vec<Lease>, String> {
        let all = match &self.backend {
            Backend::File(fs) => fs.records().map_err(|e| e.to_string())?,
            Backend::Kube(k) => {
                k.restart_budget();
                k.list_all().map_err(|e| e.to_string())?
            }
        };
        Ok(match only {
            Some(n) => all.into_iter().filter(|l| l.network == n).collect(),
            None => all,
        })
    }
}

/// Which store `cfg` uses, why, and with whose kubeconfig, in words (`validate`, `doctor`).
pub fn describe_store(cfg: &PoolConfig) -> String {
    let kind = match cfg.store {
        StoreKind::File => "file store",
        StoreKind::Kubernetes => "Kubernetes store",
    };
    let credential = match cfg.kubernetes.as_ref().map(|k| (&k.source, &k.kubeconfig)) {
        Some((KubeconfigSource::NodeAgent, Some(ours))) => {
            format!(", with tether's node-agent kubeconfig {}", ours.display())
        }
        Some((KubeconfigSource::InsteadOfWhereabouts(theirs), Some(ours))) => format!(
            ", with tether's node-agent kubeconfig {} in place of whereabouts' {}",
            ours.display(),
            theirs.display()
        ),
        _ => String::new(),
    };
    format!("{kind} ({}{credential})", cfg.store_source)
}
