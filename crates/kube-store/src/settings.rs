//! Settings of the Kubernetes lease store, from the `ipam.kubernetes` object.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tether_pool::{KubernetesConfig, PoolConfig};

use crate::crd::GROUP;
use crate::error::KubeStoreError;
use crate::traffic::ApiTraffic;

/// Default time budget of one CNI call against the API server.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default page size of paginated lists.
pub const DEFAULT_PAGE_SIZE: u32 = 500;

/// Settings of [`KubeStore`](crate::KubeStore).
///
/// From `ipam.kubernetes`:
///
/// | key | default | meaning |
/// |---|---|---|
/// | `kubeconfig` | — | kubeconfig file (whereabouts' key; tether-pool puts tether's node-agent's here when the config names none, or names whereabouts', and the agent is installed: [`crate::node_agent()`]). Without it: the in-cluster service account when `KUBERNETES_SERVICE_HOST` is set, else `KUBECONFIG`. |
/// | `k8s_api_root` | — | API server URL overriding the kubeconfig's (whereabouts' key). |
/// | `timeout_s` | 10 | Total time budget of one CNI call against the API server, seconds (fractions allowed). |
/// | `list_from_cache` | true | List from the API server's watch cache (`resourceVersion=0`, or not older than the newest version this store has seen; one unpaginated request); `false`: a consistent, paginated list, which etcd serves by reading every IPLease of the cluster. |
/// | `page_size` | 500 | `limit` of paginated lists. |
///
/// Not from the config: [`KubeSettings::node`] and [`KubeSettings::journal_dir`], which the
/// binary sets (the node's name, `<dataDir>/journal`).
#[derive(Debug, Clone, PartialEq)]
pub struct KubeSettings {
    /// `kubernetes.kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig's context to use (default: its current-context). Not from a network
    /// config: the operator's `--context`.
    pub context: Option<String>,
    /// `kubernetes.k8s_api_root`: overrides the server URL.
    pub api_root: Option<String>,
    /// `kubernetes.timeout_s`: total budget per CNI call (per store, see
    /// [`KubeStore::restart_budget`](crate::KubeStore::restart_budget)).
    pub timeout: Duration,
    /// `kubernetes.list_from_cache`.
    pub list_from_cache: bool,
    /// `kubernetes.page_size`.
    pub page_size: u32,
    /// This node's name: recorded on leases, and the scope of GC and of the node journal.
    pub node: Option<String>,
    /// The node journal's directory (see [`tether_leases::journal`]). With `node`, ADD, DEL and
    /// CHECK read single objects instead of listing the network.
    pub journal_dir: Option<PathBuf>,
    /// The field manager of every write (`managedFields`, audit logs): which program changed an
    /// object. `tether-ipam` for the plugin; the operator sets its own.
    pub field_manager: String,
    /// API group of the lease resource. Tests point it at a group that does not exist to see a
    /// real server's "not installed" answer; nothing else should change it.
    #[doc(hidden)]
    pub group: String,
    /// Where the client counts what it sent and read. The node-agent hands every client one
    /// shared value and its metrics endpoint reads it; by default each client has its own.
    pub traffic: ApiTraffic,
    /// Whether every write of a domain's record keeps its mirror under the name a tether before
    /// uniqueness domains would use (see [`crate::by_network`]), while one may still run
    /// somewhere. Off by default; the plugin reads it from what the node-agent wrote, the
    /// node-agent from the controller. Shared: the node-agent turns it for its lease service.
    pub legacy_mirrors: LegacyMirrors,
}

/// Whether a store keeps mirrors under network names (see [`KubeSettings::legacy_mirrors`]); one
/// value shared by every clone, so whoever made it can turn it while stores use it.
#[derive(Clone, Default)]
pub struct LegacyMirrors(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl LegacyMirrors {
    /// A new value, `on` or off.
    pub fn new(on: bool) -> LegacyMirrors {
        LegacyMirrors(std::sync::Arc::new(std::sync::atomic::AtomicBool::new(on)))
    }

    /// Are mirrors kept?
    pub fn on(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Keep them (`true`) or not, for every store sharing this value.
    pub fn set(&self, on: bool) {
        self.0.store(on, std::sync::atomic::Ordering::Relaxed)
    }
}

impl std::fmt::Debug for LegacyMirrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LegacyMirrors({})", self.on())
    }
}

/// Settings are equal when their values are; a shared switch is the same switch.
impl PartialEq for LegacyMirrors {
    fn eq(&self, other: &LegacyMirrors) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Default for KubeSettings {
    fn default() -> Self {
        KubeSettings {
            kubeconfig: None,
            context: None,
            api_root: None,
            timeout: DEFAULT_TIMEOUT,
            list_from_cache: true,
            page_size: DEFAULT_PAGE_SIZE,
            node: None,
            journal_dir: None,
            field_manager: "tether-ipam".to_string(),
            group: GROUP.to_string(),
            traffic: ApiTraffic::default(),
            legacy_mirrors: LegacyMirrors::default(),
        }
    }
}

impl KubeSettings {
    /// Defaults with this kubeconfig.
    pub fn with_kubeconfig(path: impl Into<PathBuf>) -> KubeSettings {
        KubeSettings {
            kubeconfig: Some(path.into()),
            ..KubeSettings::default()
        }
    }

    /// From the parsed `ipam` configuration (its `kubernetes` object; absent → defaults).
    pub fn from_pool_config(cfg: &PoolConfig) -> Result<KubeSettings, KubeStoreError> {
        KubeSettings::from_kubernetes_config(cfg.kubernetes.as_ref())
    }

    /// From the `kubernetes` object. Unknown keys are ignored (as the rest of the config does).
    pub fn from_kubernetes_config(
        k: Option<&KubernetesConfig>,
    ) -> Result<KubeSettings, KubeStoreError> {
        let mut s = KubeSettings::default();
        let Some(k) = k else { return Ok(s) };
        s.kubeconfig = k.kubeconfig.clone();
        let bad = |key: &str, v: &Value, reason: &str| KubeStoreError::Config {
            key: key.to_string(),
            value: v.to_string(),
            reason: reason.to_string(),
        };
        for (key, v) in &k.extra {
            if v.is_null() {
                continue;
            }
            match key.as_str() {
                "k8s_api_root" => match v.as_str() {
                    Some(t) if t.trim().is_empty() => {}
                    Some(t) if t.starts_with("http://") || t.starts_with("https://") => {
                        s.api_root = Some(t.trim().trim_end_matches('/').to_string())
                    }
                    _ => return Err(bad(key, v, "expected an http:// or https:// URL")),
                },
                "timeout_s" => match v.as_f64() {
                    Some(t) if t > 0.0 && t <= 3600.0 => s.timeout = Duration::from_secs_f64(t),
                    _ => {
                        return Err(bad(
                            key,
                            v,
                            "expected a number of seconds above 0 and at most 3600",
                        ));
                    }
                },
                "list_from_cache" => match v.as_bool() {
                    Some(b) => s.list_from_cache = b,
                    None => return Err(bad(key, v, "expected true or false")),
                },
                "page_size" => match v.as_u64() {
                    Some(n) if (1..=10_000).contains(&n) => s.page_size = n as u32,
                    _ => return Err(bad(key, v, "expected a whole number between 1 and 10000")),
                },
                _ => {}
            }
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kc(v: Value) -> KubernetesConfig {
        let mut extra = v.as_object().unwrap().clone();
        let kubeconfig = extra
            .remove("kubeconfig")
            .and_then(|p| p.as_str().map(PathBuf::from));
        KubernetesConfig {
            kubeconfig,
            extra,
            ..KubernetesConfig::default()
        }
    }

    #[test]
    fn parses_keys() {
        let s = KubeSettings::from_kubernetes_config(Some(&kc(json!({
            "kubeconfig": "/etc/cni/net.d/tether.d/tether.kubeconfig",
            "timeout_s": 2.5, "list_from_cache": true, "page_size": 50,
            "k8s_api_root": "https://10.0.0.1:6443/"
        }))))
        .unwrap();
        assert_eq!(
            s.kubeconfig.as_deref(),
            Some(std::path::Path::new(
                "/etc/cni/net.d/tether.d/tether.kubeconfig"
            ))
        );
        assert_eq!(s.timeout, Duration::from_millis(2500));
        assert!(s.list_from_cache);
        assert_eq!(s.page_size, 50);
        assert_eq!(s.api_root.as_deref(), Some("https://10.0.0.1:6443"));
        // Equal but for the traffic counters and the mirror switch, which each settings value
        // gets new.
        let absent = KubeSettings::from_kubernetes_config(None).unwrap();
        assert_ne!(absent.traffic, KubeSettings::default().traffic);
        assert_eq!(
            absent,
            KubeSettings {
                traffic: absent.traffic.clone(),
                legacy_mirrors: absent.legacy_mirrors.clone(),
                ..KubeSettings::default()
            }
        );
        assert!(!absent.legacy_mirrors.on());
    }

    #[test]
    fn rejects_bad_values() {
        for (k, v) in [
            ("timeout_s", json!(0)),
            ("timeout_s", json!("10")),
            ("list_from_cache", json!(1)),
            ("page_size", json!(0)),
            ("k8s_api_root", json!("10.0.0.1")),
        ] {
            let e = KubeSettings::from_kubernetes_config(Some(&kc(json!({ k: v })))).unwrap_err();
            assert!(
                e.to_string().starts_with(&format!("ipam.kubernetes.{k} ")),
                "{e}"
            );
        }
    }
}
