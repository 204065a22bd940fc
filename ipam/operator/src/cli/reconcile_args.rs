//! The reconciler's flags, shared by `tether reconcile`, `tether node-agent` and (filled in by
//! the command) `tether controller`, and the options they make.

use std::path::PathBuf;

use clap::Args;
use tether_kube_store::KubeSettings;

use crate::options;
use crate::reconcile;

/// Reconciler flags shared by `reconcile` and `node-agent`.
#[derive(Args, Debug, Clone)]
pub struct ReconcileArgs {
    /// This node's name (default: $NODE_NAME).
    #[arg(long)]
    pub node: Option<String>,
    /// Leases younger than this are never released (an ADD in flight holds its lease before its
    /// pod shows any network status).
    #[arg(long, default_value_t = options::DEFAULT_GRACE_S)]
    pub grace_s: u64,
    /// Seconds between periodic full passes (pod deletions trigger a pass at once).
    #[arg(long, default_value_t = options::DEFAULT_INTERVAL_S)]
    pub interval_s: u64,
    /// Namespace of the node-agent's pods: the nodes running one are the live nodes, and the one
    /// agent that sweeps leases of deleted nodes is chosen among them. Default: $POD_NAMESPACE,
    /// else the service account's namespace file, else kube-system.
    #[arg(long)]
    pub agent_namespace: Option<String>,
    /// Label selector of the node-agent's pods (the DaemonSet's pod label).
    #[arg(long, default_value = options::DEFAULT_AGENT_SELECTOR)]
    pub agent_selector: String,
    /// Do not reclaim leases of deleted nodes (only this node's).
    #[arg(long)]
    pub no_sweep: bool,
    /// Serve Prometheus metrics here (`IP:PORT`, `[IPv6]:PORT`, `:PORT`); off when unset. The
    /// DaemonSet passes `$(POD_IP):9464`. See docs/monitoring.md.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Seconds between the monitor's rounds: conflict Events and the pool gauges.
    #[arg(long, default_value_t = options::DEFAULT_MONITOR_INTERVAL_S)]
    pub monitor_interval_s: u64,
    /// Do not post an AddressConflict Event on a pod whose ADD met an address in use.
    #[arg(long)]
    pub no_conflict_events: bool,
    /// Do not watch the masters of this node's leased addresses for another host claiming one
    /// (the conflict guard: an AddressConflict Event, a metric and a mark on the IPLease).
    #[arg(long)]
    pub no_conflict_guard: bool,
}

impl ReconcileArgs {
    /// [`ReconcileArgs::options`] for a command (`who`) that cannot work without the API.
    pub(super) fn api_options(
        &self,
        kubeconfig: Option<PathBuf>,
        data_dir: Option<PathBuf>,
        who: &str,
    ) -> Result<reconcile::Options, String> {
        let opts = self.options(kubeconfig, data_dir)?;
        if opts.kube.is_none() {
            return Err(format!(
                "{who} needs the Kubernetes API to see which pods exist: pass --kubeconfig, set KUBECONFIG, \
                 or run in a pod"
            ));
        }
        Ok(opts)
    }

    /// Reconciler options; `kube` from `kubeconfig`, else in-cluster/KUBECONFIG when available.
    pub fn options(
        &self,
        kubeconfig: Option<PathBuf>,
        data_dir: Option<PathBuf>,
    ) -> Result<reconcile::Options, String> {
        let node = self
            .node
            .clone()
            .or_else(|| std::env::var("NODE_NAME").ok())
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .ok_or("no node name: pass --node or set NODE_NAME (the DaemonSet sets it from spec.nodeName)")?;
        if self.interval_s == 0 {
            return Err("--interval-s must be at least 1".into());
        }
        let mut o = reconcile::Options::new(node);
        o.kube = match kubeconfig {
            Some(p) => Some(KubeSettings::with_kubeconfig(p)),
            None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
                || std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty()) =>
            {
                Some(KubeSettings::default())
            }
            None => None,
        };
        o.data_dir = data_dir;
        o.grace_s = self.grace_s;
        o.interval = std::time::Duration::from_secs(self.interval_s);
        o.sweep_dead_nodes = !self.no_sweep;
        o.agent_namespace = match self.agent_namespace.as_deref().map(str::trim) {
            Some("") => return Err("--agent-namespace must not be empty".into()),
            Some(ns) => ns.to_string(),
            None => options::default_agent_namespace(),
        };
        if self.agent_selector.trim().is_empty() {
            return Err("--agent-selector must not be empty (it would take every pod of the namespace for an agent)".into());
        }
        o.agent_selector = self.agent_selector.trim().to_string();
        o.metrics_addr = self
            .metrics_addr
            .as_deref()
            .map(crate::metrics::parse_listen_addr)
            .transpose()?;
        if self.monitor_interval_s == 0 {
            return Err("--monitor-interval-s must be at least 1".into());
        }
        o.monitor_interval = std::time::Duration::from_secs(self.monitor_interval_s);
        o.conflict_events = !self.no_conflict_events;
        o.conflict_guard = !self.no_conflict_guard;
        Ok(o)
    }
}
