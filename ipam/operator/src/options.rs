//! How the reconciler, the controller and the monitor are told to run: the operator's options
//! and their defaults (shared by the CLI, the node-agent and each of them).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tether_kube_store::KubeSettings;

/// Default grace period: leases younger than this are never judged.
pub const DEFAULT_GRACE_S: u64 = 120;
/// Default interval between periodic full passes.
pub const DEFAULT_INTERVAL_S: u64 = 600;
/// Default grace of a silent node (no kubelet heartbeat, not `Ready`) before the controller
/// releases the leases of its pods: detected within
/// [`silence_check_every`](crate::reconcile::silence_check_every) more, so a silent
/// node's addresses are back within 5 minutes.
pub const DEFAULT_NODE_LOST_GRACE_S: u64 = 240;
/// The shortest node-lost grace accepted: above the node lifecycle controller's own
/// `--node-monitor-grace-period` (50 s since Kubernetes 1.32, 40 s before), so a node is never
/// judged lost by tether before Kubernetes marks it so.
pub const MIN_NODE_LOST_GRACE_S: u64 = 60;
/// Default time between the monitor's rounds (conflicts, pool gauges).
pub const DEFAULT_MONITOR_INTERVAL_S: u64 = 30;
/// Default label selector of the node-agent's pods (the DaemonSet's pod label).
pub const DEFAULT_AGENT_SELECTOR: &str = "app.kubernetes.io/name=tether";
/// Namespace of the node-agent's pods when neither `POD_NAMESPACE` nor the service account's
/// namespace file says.
pub const FALLBACK_AGENT_NAMESPACE: &str = "kube-system";
/// The service account's namespace, as mounted in every pod.
pub const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The node-agent's namespace by default: `$POD_NAMESPACE`, else the service account's namespace
/// file, else `kube-system`.
pub fn default_agent_namespace() -> String {
    std::env::var("POD_NAMESPACE")
        .ok()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE_FILE)
                .ok()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| FALLBACK_AGENT_NAMESPACE.to_string())
}

/// How to reconcile.
#[derive(Debug, Clone)]
pub struct Options {
    /// This node's name (`--node`, `NODE_NAME`).
    pub node: String,
    /// API access; `None`: no Kubernetes (nothing can be reconciled, as pods cannot be seen).
    pub kube: Option<KubeSettings>,
    /// The node-local file store to reconcile, if any.
    pub data_dir: Option<PathBuf>,
    /// Leases younger than this many seconds are left alone.
    pub grace_s: u64,
    /// Time between periodic full passes.
    pub interval: Duration,
    /// Reclaim leases of nodes that no longer run an agent while this agent is the sweeper.
    /// Where the node-scope policy is installed (deploy/base/policy.yaml) a node's credential may
    /// not do this: the controller does (`controller`), and the DaemonSet passes `--no-sweep`.
    pub sweep_dead_nodes: bool,
    /// Run as the cluster's controller (`tether controller`) instead of a node's agent: every pass
    /// judges the leases of the nodes that run no agent pod, and nothing else (no node of its
    /// own, no file store, no monitor; its watch is of the agent pods' namespace). Replicas elect
    /// one that passes (leader.rs; the Lease in `agent_namespace`, `node` its identity). Its
    /// credential is one no node holds (deploy/base/controller.yaml).
    pub controller: bool,
    /// Controller only: release the leases of pods bound to a node that has not renewed its
    /// heartbeat Lease (`kube-node-lease`) for this long and is not `Ready` (the node stopped
    /// reporting without being deleted). 0: never. See
    /// [`Reconciler::silence_pass`](crate::reconcile::Reconciler::silence_pass).
    pub node_lost_grace_s: u64,
    /// Namespace of the node-agent's pods (`--agent-namespace`).
    pub agent_namespace: String,
    /// Label selector of the node-agent's pods (`--agent-selector`): the nodes running one are
    /// the live nodes and the sweeper candidates.
    pub agent_selector: String,
    /// Wait this long after a pod event before the pass, gathering further events.
    pub debounce: Duration,
    /// Server-side timeout of one pod watch request (re-issued from the last resourceVersion).
    pub watch_timeout: Duration,
    /// Serve Prometheus metrics on this address (`--metrics-addr`); `None`: not served.
    pub metrics_addr: Option<SocketAddr>,
    /// Post a Warning Event on the pod whose ADD met an address conflict.
    pub conflict_events: bool,
    /// Run the conflict guard ([`crate::conflict_guard`]): watch the masters of this node's
    /// leased addresses for another MAC claiming one (an agent's, not the controller's).
    pub conflict_guard: bool,
    /// Time between the monitor's rounds (conflicts, pool gauges).
    pub monitor_interval: Duration,
    /// The node's lease service, shown in the metrics (the agent sets it when it runs one).
    pub lease_service: Option<tether_lease_service::ServiceGauges>,
    /// The node's CNI calls the agent takes in, shown in the metrics.
    pub cni_calls: Option<crate::metrics::CniCalls>,
    /// What the agent installed on the node: `/readyz` answers ready only while it is in place
    /// (`None`: the controller, or `tether reconcile`, which install nothing).
    pub installed: Option<crate::installed::Installed>,
}

impl Options {
    /// Defaults for `node`.
    pub fn new(node: impl Into<String>) -> Options {
        Options {
            node: node.into(),
            kube: None,
            data_dir: None,
            grace_s: DEFAULT_GRACE_S,
            interval: Duration::from_secs(DEFAULT_INTERVAL_S),
            sweep_dead_nodes: true,
            controller: false,
            node_lost_grace_s: DEFAULT_NODE_LOST_GRACE_S,
            agent_namespace: default_agent_namespace(),
            agent_selector: DEFAULT_AGENT_SELECTOR.to_string(),
            debounce: Duration::from_millis(500),
            watch_timeout: Duration::from_secs(300),
            metrics_addr: None,
            conflict_events: true,
            conflict_guard: false,
            monitor_interval: Duration::from_secs(DEFAULT_MONITOR_INTERVAL_S),
            lease_service: None,
            cni_calls: None,
            installed: None,
        }
    }
}

/// Settings for a long-lived client: the same credentials; every call gets its own budget
/// (`restart_budget`), at least 30 s.
pub(crate) fn long_lived(s: &KubeSettings) -> KubeSettings {
    let mut s = s.clone();
    s.timeout = s.timeout.max(Duration::from_secs(30));
    s.field_manager = "tether-operator".into();
    s
}
