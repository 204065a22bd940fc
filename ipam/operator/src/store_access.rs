//! Which lease store an operator command works on (`--config`, `--data-dir`, `--kubeconfig`), and
//! reading the network config it names.

use std::path::PathBuf;

use clap::Args;
use serde_json::Value;
use tether_kube_store::{Cluster, KubeSettings, KubeStore, node_agent};
use tether_leases::{FileStore, Lease, LeaseStore};
use tether_pool::{KubeconfigSource, PoolConfig, StoreKind};

/// Which lease store to open: from a network config, or named directly.
///
/// The store is the config's (`--config`), else the file store when `--data-dir` is given, else
/// the Kubernetes store when `--kubeconfig` is given, else the file store in /var/lib/cni/tether.
/// API access (to check pods) comes from `--kubeconfig`, or from the config's `kubernetes`
/// settings.
#[derive(Args, Debug, Clone, Default)]
pub struct StoreArgs {
    /// Take the store settings from this network config (its ipam section).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// File store directory (default /var/lib/cni/tether).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Kubeconfig: the Kubernetes lease store (unless --config or --data-dir name another), and
    /// API access to check whether a lease's pod is alive.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
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
/// or a NetworkAttachmentDefinition object as JSON (`kubectl get net-attach-def NAME -o json`),
/// whose `spec.config` is used with the NAD's name injected as Multus does.
pub fn read_network_config(path: &PathBuf) -> Result<Value, String> {
    read_network_file(path).map(|f| f.config)
}

/// [`read_network_config`], and which NAD the file is, if it is one.
pub fn read_network_file(path: &PathBuf) -> Result<NetworkFile, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut v: Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let mut nad = None;
    if v.get("kind").and_then(Value::as_str) == Some("NetworkAttachmentDefinition") {
        let meta = |key: &str| {
            v.pointer(&format!("/metadata/{key}"))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        nad = meta("name").map(|name| {
            format!(
                "{}/{name}",
                meta("namespace").unwrap_or_else(|| "default".into())
            )
        });
        let config = v
            .pointer("/spec/config")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                format!(
                    "the NetworkAttachmentDefinition in {} has no spec.config",
                    path.display()
                )
            })?;
        let mut inner: Value = serde_json::from_str(config)
            .map_err(|e| format!("spec.config in {} is not JSON: {e}", path.display()))?;
        if let (Some(obj), Some(name)) =
            (inner.as_object_mut(), v.pointer("/metadata/name").cloned())
            && !obj.contains_key("name")
        {
            obj.insert("name".to_string(), name);
        }
        v = inner;
    }
    let Some(plugins) = v.get("plugins").and_then(Value::as_array) else {
        return Ok(NetworkFile { config: v, nad });
    };
    let mut p = plugins
        .iter()
        .find(|p| p.get("ipam").is_some())
        .cloned()
        .ok_or_else(|| format!("no plugin in {} has an ipam section", path.display()))?;
    // A conflist carries name and cniVersion at the top; plugins inherit them.
    for k in ["name", "cniVersion"] {
        if let (Some(obj), Some(val)) = (p.as_object_mut(), v.get(k))
            && !obj.contains_key(k)
        {
            obj.insert(k.to_string(), val.clone());
        }
    }
    Ok(NetworkFile { config: p, nad })
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
    /// (from `--kubeconfig` or the config's `kubernetes`).
    cluster: Option<Cluster>,
}

impl OpenStore {
    pub fn open(args: &StoreArgs) -> Result<(OpenStore, Option<PoolConfig>), String> {
        let cfg = match &args.config {
            // As the plugin on this host reads it.
            Some(p) => Some(
                PoolConfig::from_value(&read_network_config(p)?, &node_agent())
                    .map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        let kind = match &cfg {
            Some(c) => c.store,
            None if args.data_dir.is_none() && args.kubeconfig.is_some() => StoreKind::Kubernetes,
            None => StoreKind::File,
        };
        let settings = || -> Result<Option<KubeSettings>, String> {
            let mut s = match cfg.as_ref().and_then(|c| c.kubernetes.as_ref()) {
                Some(k) => {
                    Some(KubeSettings::from_kubernetes_config(Some(k)).map_err(|e| e.to_string())?)
                }
                None => None,
            };
            if let Some(p) = &args.kubeconfig {
                s.get_or_insert_with(KubeSettings::default).kubeconfig = Some(p.clone());
            }
            Ok(s)
        };

        match kind {
            StoreKind::File => {
                let dir = args
                    .data_dir
                    .clone()
                    .or_else(|| cfg.as_ref().map(|c| c.data_dir.clone()))
                    .unwrap_or_else(|| PathBuf::from("/var/lib/cni/tether"));
                let cluster = match settings()? {
                    Some(s) => Some(Cluster::connect(&s).map_err(|e| e.to_string())?),
                    None => None,
                };
                Ok((
                    OpenStore {
                        backend: Backend::File(FileStore::new(dir)),
                        cluster,
                    },
                    cfg,
                ))
            }
            StoreKind::Kubernetes => {
                let s = settings()?.unwrap_or_default();
                let store = KubeStore::connect(s).map_err(|e| e.to_string())?;
                Ok((
                    OpenStore {
                        cluster: Some(Cluster::new(store.api().clone())),
                        backend: Backend::Kube(store),
                    },
                    cfg,
                ))
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
