//! The lease reconciler: releases leases whose pod is gone, or whose pod name now belongs to
//! another pod (another uid), and never a live one. Run by the node-agent on every node, or as
//! `tether reconcile`.
//!
//! # What it releases, and why that is safe
//!
//! A lease is released only when all of these hold (the decision itself is
//! [`tether_leases::reclaim::stale`]):
//!
//! 1. it is `Leased` and names a pod (namespace and name; records of cnitool or plain runtimes
//!    are left to CNI GC);
//! 2. it is older than the grace period (`--grace-s`, default 120 s): an ADD in flight holds its
//!    lease before its pod shows any network status, and caches lag;
//! 3. the pod cache says its pod is gone or replaced, **and a fresh GET of that pod from the API
//!    server confirms it** (404, or a pod of that name with another uid). The cache only finds
//!    candidates; the decision is made on an authoritative read, so a lagging or partial cache
//!    (or a node-name mismatch between the plugin and the agent) can never free a live address;
//! 4. the write is conditional: `release` replaces the record only if it still has the version
//!    read (Kubernetes: the object's uid and resourceVersion; file store: its counter). A lease
//!    taken over, renewed or released since is never touched; losing that race is normal.
//!
//! Released records stay as `Released` (not deleted), so cooldown and sticky re-use by the same
//! pod name (a StatefulSet pod's replacement) keep working.
//!
//! # Which leases each agent looks at
//!
//! Several agents run at once, one per node. Each agent reconciles:
//!
//! - **its own node's Kubernetes-store leases** (`LIST ipleases -l ipam.tether.dev/node=<node>`),
//!   against a pod cache of its own node (`spec.nodeName=<node>`), event-driven: a pod deletion
//!   seen on the watch triggers a pass within `debounce` (default 0.5 s);
//! - **its node's file-store leases** (every network state file in `--data-dir`), in the same
//!   passes;
//! - **leases of nodes that no longer run an agent**, in periodic passes only, and only while it
//!   is the *sweeper*.
//!
//! # Dead nodes and the sweeper, from the agent's own pods
//!
//! The agent never reads Node objects (its RBAC is the lease resource and pods get/list/watch,
//! nothing else). Instead, the nodes that are alive *for tether* are the nodes that run a pod of
//! the node-agent DaemonSet: one LIST of the pods in `--agent-namespace` (default `$POD_NAMESPACE`,
//! else the service account's namespace, else `kube-system`) matching `--agent-selector`
//! (default `app.kubernetes.io/name=tether`, the DaemonSet's pod label), keeping each pod's
//! `spec.nodeName` ([`KubeStore::agent_nodes`]). From that one set:
//!
//! - the *sweeper* is the node with the lowest hash among the agent nodes ([`sweeper`]). Every
//!   agent computes the same one, so one agent does the cluster-wide part (one metadata-only LIST
//!   of the leases' node labels, then one LIST per dead node and one pod GET per candidate). An
//!   agent whose own pod is not in the set (a wrong `--agent-namespace`/`--agent-selector`, or
//!   `reconcile` run by hand for a node without an agent) is never the sweeper, so a set that is
//!   empty or incomplete because of a misconfiguration sweeps nothing. During churn two agents
//!   may both think they are the sweeper for a moment; conditional writes make that harmless;
//! - *dead-node* leases are those whose node label names no agent node: the node was deleted
//!   (its DaemonSet pod went with it), or its agent pod is absent for a while (a rolling update,
//!   an eviction, a node that stopped running the DaemonSet).
//!
//! Judging a node that is in fact alive is **safe**, as the rules above do not depend on which
//! node a lease belongs to: every release of a dead-node lease still needs a fresh GET of its pod
//! confirming that the pod is gone or replaced, and a conditional write. A node whose agent pod
//! is briefly absent during a rolling update may be judged, but none of its live pods' leases can
//! be freed (each pod is checked with a GET); only leases of pods that are really gone are, which
//! that node's own agent would have released anyway. A node that is down but still runs (or
//! still lists) its agent pod keeps its leases until it comes back or its pod is deleted with it.
//!
//! Needs `list` on pods in the agent namespace (the ClusterRole grants it cluster-wide); without
//! it the agent logs once that dead nodes' leases are not reclaimed and carries on with its own
//! node.
//!
//! # Memory
//!
//! Only (namespace, name) → uid of the pods of this node is cached (metadata-only list and watch;
//! page by page), plus the leases of one node or one dead node during a pass, and during a sweep
//! the names of the nodes running an agent pod (the agent pods are read page by page and only
//! their `spec.nodeName` is kept). On watch expiry (`410 Gone`) the cache is rebuilt from a
//! fresh list.
//!
//! # Metrics and conflict Events
//!
//! [`Reconciler::run`] also runs the monitor ([`crate::operator::monitor`]: conflict Events on pods, pool
//! and record gauges) on a thread of its own, and with `metrics_addr` serves the Prometheus
//! metrics ([`crate::operator::metrics`]) on another. The cluster-wide pools are reported by the
//! leading controller (its monitor reports nothing else), or, on a cluster without the node-scope
//! policy, by the agent that is the sweeper: no agent of the shipped DaemonSet reads other nodes.

// KubeStoreError is large by design (it carries what the operator needs); this is not a hot path.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tether_kube_store::{KubeSettings, KubeStore, KubeStoreError, PodEvent, WatchEnd};
use tether_leases::reclaim::{PodIndex, StaleReason, stale};
use tether_leases::{FileStore, Lease, LeaseStore, StoreError};

use crate::operator::leader;
use crate::operator::metrics::{self, Registry};
use crate::operator::monitor::{self, Monitor};

/// Default grace period: leases younger than this are never judged.
pub const DEFAULT_GRACE_S: u64 = 120;
/// Default interval between periodic full passes.
pub const DEFAULT_INTERVAL_S: u64 = 600;
/// Default grace of a silent node (no kubelet heartbeat, not `Ready`) before the controller
/// releases the leases of its pods: detected within [`silence_check_every`] more, so a silent
/// node's addresses are back within 5 minutes.
pub const DEFAULT_NODE_LOST_GRACE_S: u64 = 240;
/// The shortest node-lost grace accepted: above the node lifecycle controller's own
/// `--node-monitor-grace-period` (50 s since Kubernetes 1.32, 40 s before), so a node is never
/// judged lost by tether before Kubernetes marks it so.
pub const MIN_NODE_LOST_GRACE_S: u64 = 60;
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
    /// reporting without being deleted). 0: never. See [`Reconciler::silence_pass`].
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
    /// Time between the monitor's rounds (conflicts, pool gauges).
    pub monitor_interval: Duration,
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
            monitor_interval: Duration::from_secs(monitor::DEFAULT_INTERVAL_S),
        }
    }
}

/// Which store a lease was in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreName {
    /// The cluster-wide IPLease store.
    Kubernetes,
    /// The node-local file store.
    File,
}

/// One release done by a pass.
#[derive(Debug, Clone)]
pub struct Released {
    /// Where.
    pub store: StoreName,
    /// The lease as it was before the release.
    pub lease: Lease,
    /// Why.
    pub reason: StaleReason,
}

/// What one pass did.
#[derive(Debug, Clone, Default)]
pub struct PassReport {
    /// Leases released.
    pub released: Vec<Released>,
    /// Conditional releases that lost a race (the record changed since it was read): fine.
    pub lost_races: usize,
    /// Candidates whose pod the API server still reports alive (the cache lagged).
    pub confirmed_alive: usize,
    /// Leases looked at.
    pub examined: usize,
    /// Old `Released` and `Quarantined` records of this node deleted (past
    /// [`Policy::retain_released_s`](tether_leases::Policy::retain_released_s)).
    pub pruned: usize,
    /// Whether the dead-node sweep ran (this agent was the sweeper among the agent nodes).
    pub swept: bool,
    /// Whether this agent is the sweeper, when the pass listed the agent nodes (full passes).
    pub sweeper: Option<bool>,
    /// Failures (the pass went on past each).
    pub errors: Vec<String>,
    /// Unix time when a lease now inside its grace period (and whose pod the cache does not
    /// know) leaves it: a pass is due then.
    pub next_due: Option<u64>,
}

pub(crate) fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A pass is due at unix time `t` (the earliest of those asked for).
fn due_at(r: &mut PassReport, t: u64) {
    r.next_due = Some(r.next_due.map_or(t, |d| d.min(t)));
}

/// (namespace, name) → uid of the pods of this node, kept by the watch thread.
#[derive(Default)]
struct PodCache {
    pods: PodIndex,
    synced: bool,
}

/// Why the watch thread wakes the pass loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// A pod was deleted or replaced.
    PodGone,
    /// The cache was rebuilt from a list (events may have been missed).
    Relisted,
}

/// FNV-1a, 64 bit: the sweeper is the agent node with the lowest hash (stable across agents
/// and releases, independent of name order).
pub(crate) fn fnv(s: &str) -> u64 {
    tether_stable_hash::fnv1a64(s.as_bytes(), 0)
}

/// How soon a sweep looks again at a lost node's leases whose pods still exist.
const RECHECK_LOST_NODE_S: u64 = 15;

/// How often the controller reads the kubelets' heartbeats: an eighth of the node-lost grace,
/// between 5 and 30 s (one small LIST served from the watch cache).
pub fn silence_check_every(grace_s: u64) -> Duration {
    Duration::from_secs((grace_s / 8).clamp(5, 30))
}

/// A kubelet renews its Lease every 10 s: a heartbeat this old is late, and the node is looked at
/// again exactly when the grace ends.
const LATE_HEARTBEAT_S: u64 = 30;

/// The sweeper among `candidates` (the nodes that run an agent pod).
pub fn sweeper(candidates: &[String]) -> Option<&str> {
    candidates
        .iter()
        .min_by_key(|n| (fnv(n), n.as_str()))
        .map(String::as_str)
}

/// The reconciler of one node.
pub struct Reconciler {
    opts: Options,
    store: Option<KubeStore>,
    cache: Arc<Mutex<PodCache>>,
    warned_agents: AtomicBool,
    warned_ready: Mutex<std::collections::HashSet<String>>,
    /// Silent nodes judged since their last heartbeat with nothing left to release (node →
    /// that heartbeat): not listed again until it changes.
    silent_done: Mutex<HashMap<String, u64>>,
    metrics: Arc<Registry>,
    metrics_bound: OnceLock<SocketAddr>,
}

impl Reconciler {
    /// Connect (no request sent yet).
    pub fn new(opts: Options) -> Result<Reconciler, String> {
        if opts.node.trim().is_empty() {
            return Err("no node name: pass --node or set NODE_NAME".into());
        }
        let store = match &opts.kube {
            Some(s) => Some(KubeStore::connect(long_lived(s)).map_err(|e| e.to_string())?),
            None => None,
        };
        if opts.controller && store.is_none() {
            return Err(
                "the controller needs the Kubernetes API: give a kubeconfig, or run it in a pod"
                    .into(),
            );
        }
        if store.is_none() && opts.data_dir.is_none() {
            return Err(
                "nothing to reconcile: give a kubeconfig (or run in a pod) and/or --data-dir"
                    .into(),
            );
        }
        Ok(Reconciler {
            opts,
            store,
            cache: Arc::default(),
            warned_agents: AtomicBool::new(false),
            warned_ready: Mutex::default(),
            silent_done: Mutex::default(),
            metrics: Arc::default(),
            metrics_bound: OnceLock::new(),
        })
    }

    /// The options.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The metrics [`Reconciler::run`] serves.
    pub fn metrics(&self) -> &Arc<Registry> {
        &self.metrics
    }

    /// Where the metrics are served, once [`Reconciler::run`] has bound `metrics_addr`.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_bound.get().copied()
    }

    fn pod_selector(&self) -> String {
        format!("spec.nodeName={}", self.opts.node)
    }

    /// The pods of this node: the watch's cache when it is synced, else a fresh list.
    fn node_pods(&self, store: &KubeStore) -> Result<PodIndex, KubeStoreError> {
        {
            let c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if c.synced {
                return Ok(c.pods.clone());
            }
        }
        let mut pods = PodIndex::new();
        store.restart_budget();
        store.visit_pods(Some(&self.pod_selector()), |k| {
            pods.insert((k.namespace, k.name), k.uid);
        })?;
        Ok(pods)
    }

    /// One pass: this node's Kubernetes and file-store leases; with `full`, also the dead-node
    /// sweep (when this agent is the sweeper).
    pub fn pass(&self, full: bool) -> PassReport {
        let mut r = PassReport::default();
        let now = now_s();
        let Some(store) = &self.store else {
            r.errors.push(
                "no Kubernetes API access: pods cannot be seen, so no lease can be judged; give --kubeconfig".into(),
            );
            return r;
        };
        if self.opts.controller {
            self.sweep(now, store, &mut r);
            self.reclaim_silent_nodes(now, store, &mut r);
            return r;
        }
        let pods = match self.node_pods(store) {
            Ok(p) => p,
            Err(e) => {
                r.errors
                    .push(format!("listing the pods of node {}: {e}", self.opts.node));
                return r;
            }
        };
        // This node's cluster-wide leases.
        store.restart_budget();
        match store.list_node(&self.opts.node) {
            Ok(leases) => {
                self.judge(StoreName::Kubernetes, &leases, &pods, now, store, &mut r);
                self.prune(&leases, now, store, &mut r);
            }
            Err(KubeStoreError::CrdMissing { .. }) => {
                log::debug!("the IPLease CRD is not installed: no cluster-wide leases to reconcile")
            }
            Err(e) => r.errors.push(format!(
                "listing the leases of node {}: {e}",
                self.opts.node
            )),
        }
        // The node-local file store.
        if let Some(dir) = &self.opts.data_dir {
            let fs = FileStore::new(dir.clone());
            match fs.networks() {
                Ok(nets) => {
                    for n in nets {
                        match fs.list(&n) {
                            Ok(leases) => {
                                self.judge(StoreName::File, &leases, &pods, now, store, &mut r)
                            }
                            Err(e) => r
                                .errors
                                .push(format!("reading network {n} in {}: {e}", dir.display())),
                        }
                    }
                }
                Err(e) => r
                    .errors
                    .push(format!("listing the networks in {}: {e}", dir.display())),
            }
        }
        // Only an agent that sweeps (a cluster without the node-scope policy) lists the other
        // nodes: the cluster-wide pool metrics are the controller's.
        if full && self.opts.sweep_dead_nodes {
            self.sweep(now, store, &mut r);
        }
        r
    }

    /// Judge `leases` against `pods` (a cache: only finds candidates), confirm each candidate with
    /// a GET of its pod, release conditionally.
    fn judge(
        &self,
        which: StoreName,
        leases: &[Lease],
        pods: &PodIndex,
        now: u64,
        store: &KubeStore,
        r: &mut PassReport,
    ) {
        r.examined += leases.len();
        for l in leases {
            // A young lease whose pod the cache does not show: look again when its grace ends.
            if l.is_leased() && now.saturating_sub(l.since) < self.opts.grace_s {
                let known = match (&l.pod.namespace, &l.pod.name) {
                    (Some(ns), Some(n)) => pods
                        .get(&(ns.clone(), n.clone()))
                        .is_some_and(|u| l.pod.uid.as_ref().is_none_or(|h| h == u)),
                    _ => true,
                };
                if !known {
                    due_at(r, l.since + self.opts.grace_s);
                }
            }
        }
        for (lease, _) in stale(leases, pods, now, self.opts.grace_s) {
            // A long pass (many candidates, a slow server) is progress, not a wedged loop.
            self.metrics.beat(now_s());
            let (Some(ns), Some(name)) = (&lease.pod.namespace, &lease.pod.name) else {
                continue;
            };
            let Some(reason) = self.confirm(lease, ns, name, None, store, r) else {
                continue;
            };
            self.release(which, lease, reason, now, store, r);
        }
    }

    /// Delete this node's records released (or quarantined) longer ago than the retention
    /// (a day): DEL keeps a `Released` record for the cooldown and for sticky re-use and, in
    /// the cluster store, never lists the network to tidy up, so the node's agent does. Each
    /// delete carries the record's uid and resourceVersion: one re-leased since stays.
    fn prune(&self, leases: &[Lease], now: u64, store: &KubeStore, r: &mut PassReport) {
        let retain = tether_leases::Policy::default().retain_released_s;
        for l in leases
            .iter()
            .filter(|l| !l.is_leased() && now.saturating_sub(l.since) >= retain)
        {
            store.restart_budget();
            match store.remove(l) {
                Ok(Ok(())) => r.pruned += 1,
                Ok(Err(_)) => r.lost_races += 1,
                Err(e) => r.errors.push(format!(
                    "deleting the old record of {} in network {}: {e}",
                    l.address, l.network
                )),
            }
        }
    }

    /// Why `lease` (of pod `ns/name`) is stale, decided on a fresh GET of its pod: gone, or
    /// another pod (uid) of that name, or — with `lost` (a lost node, silent for so long) — still
    /// bound to that node. `None`: the pod is alive (counted), or the GET failed (in `r.errors`).
    fn confirm(
        &self,
        lease: &Lease,
        ns: &str,
        name: &str,
        lost: Option<(&str, u64)>,
        store: &KubeStore,
        r: &mut PassReport,
    ) -> Option<StaleReason> {
        store.restart_budget();
        // Where the node does not matter, the pod's metadata is enough (a smaller answer).
        let pod = match lost {
            None => store.pod_uid(ns, name).map(|u| u.map(|uid| (uid, None))),
            Some(_) => store
                .pod_placement(ns, name)
                .map(|p| p.map(|p| (p.uid, p.node))),
        };
        let reason = match pod {
            Ok(None) => StaleReason::PodGone,
            Ok(Some((uid, _))) if lease.pod.uid.as_ref().is_some_and(|held| *held != uid) => {
                StaleReason::PodReplaced { current_uid: uid }
            }
            Ok(Some((_, Some(bound)))) if lost.is_some_and(|(n, _)| n == bound) => {
                let (node, silent_s) = lost.unwrap_or_default();
                StaleReason::NodeLost {
                    node: node.to_string(),
                    silent_s,
                }
            }
            Ok(Some(_)) => {
                r.confirmed_alive += 1;
                return None;
            }
            Err(e) => {
                r.errors.push(format!(
                    "checking pod {ns}/{name} of {}: {e}",
                    lease.address
                ));
                return None;
            }
        };
        Some(reason)
    }

    fn release(
        &self,
        which: StoreName,
        lease: &Lease,
        reason: StaleReason,
        now: u64,
        store: &KubeStore,
        r: &mut PassReport,
    ) {
        let outcome: Result<Result<Lease, tether_leases::Taken>, StoreError> = match which {
            StoreName::Kubernetes => {
                store.restart_budget();
                store.release(lease, now)
            }
            StoreName::File => match &self.opts.data_dir {
                Some(d) => FileStore::new(d.clone()).release(lease, now),
                None => return,
            },
        };
        match outcome {
            Ok(Ok(_)) => {
                log::warn!(
                    "reconcile: released {} of network {} ({:?} store): held by pod {} (uid {}), container {}, {}: {reason}",
                    lease.address,
                    lease.network,
                    which,
                    lease.pod,
                    lease.pod.uid.as_deref().unwrap_or("?"),
                    &lease.container_id[..lease.container_id.len().min(12)],
                    lease.ifname
                );
                r.released.push(Released {
                    store: which,
                    lease: lease.clone(),
                    reason,
                });
            }
            Ok(Err(taken)) => {
                log::info!(
                    "reconcile: {} of network {} changed meanwhile ({taken}); left alone",
                    lease.address,
                    lease.network
                );
                r.lost_races += 1;
            }
            Err(e) => r.errors.push(format!(
                "releasing {} of network {}: {e}",
                lease.address, lease.network
            )),
        }
    }

    /// Leases of nodes that run no agent pod (deleted nodes), when this agent is the sweeper.
    /// Records in `r.sweeper` whether it is.
    fn sweep(&self, now: u64, store: &KubeStore, r: &mut PassReport) {
        let (ns, sel) = (
            self.opts.agent_namespace.as_str(),
            self.opts.agent_selector.as_str(),
        );
        let missed = "leases of deleted nodes are not reclaimed";
        store.restart_budget();
        // The live nodes, and the sweeper candidates: the nodes running an agent pod.
        let live = match store.agent_nodes(ns, sel) {
            Ok(n) => n,
            Err(e) => {
                if !self.warned_agents.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "reconcile: cannot list the node-agent's pods (namespace {ns}, selector {sel}), so {missed} by this agent: {e}"
                    );
                }
                return;
            }
        };
        if self.opts.controller {
            // Leading (it passes only then); its pool reporting follows the election.
        } else if !live.contains(&self.opts.node) {
            r.sweeper = Some(false);
            if !self.warned_agents.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "reconcile: no pod of namespace {ns} matching {sel} runs on node {}, so {missed} by this agent; if it is \
                     a node-agent, check --agent-namespace and --agent-selector",
                    self.opts.node
                );
            }
            return;
        } else {
            let me = sweeper(&live) == Some(self.opts.node.as_str());
            r.sweeper = Some(me);
            if !me {
                return;
            }
        }
        r.swept = true;
        store.restart_budget();
        let labels = match store.lease_node_labels() {
            Ok(l) => l,
            Err(KubeStoreError::CrdMissing { .. }) => return,
            Err(e) => return r.errors.push(format!("listing the leases' nodes: {e}")),
        };
        let live_labels: std::collections::HashSet<String> = live
            .iter()
            .map(|n| tether_kube_store::crd::label_value(n))
            .collect();
        for label in labels
            .keys()
            .filter(|l| !l.is_empty() && !live_labels.contains(*l))
        {
            store.restart_budget();
            let leases = match store.list_node_label(label) {
                Ok(l) => l,
                Err(e) => {
                    r.errors.push(format!(
                        "listing the leases of node {label} (no agent pod): {e}"
                    ));
                    continue;
                }
            };
            // No cache of other nodes' pods: with an empty index every old Leased record is a
            // candidate, and judge() decides on a GET of its pod. A young one asks for a pass when
            // its grace ends: seen on the e2e node, a deleted node's pods younger than the grace
            // otherwise waited for the next periodic pass.
            let pods = PodIndex::new();
            let alive = r.confirmed_alive;
            log::info!(
                "reconcile: node {label} runs no node-agent pod; judging its {} lease record(s)",
                leases.len()
            );
            self.judge(StoreName::Kubernetes, &leases, &pods, now, store, r);
            // Pods of a node that is gone still exist until the pod GC controller deletes them
            // (tens of seconds after the node): look again soon rather than a whole interval on.
            if r.confirmed_alive > alive {
                due_at(r, now + RECHECK_LOST_NODE_S);
            }
        }
    }

    /// The controller's check of silent nodes alone (what its pass loop runs every
    /// [`silence_check_every`]): see [`Reconciler::reclaim_silent_nodes`].
    pub fn silence_pass(&self) -> PassReport {
        let mut r = PassReport::default();
        match &self.store {
            Some(store) if self.opts.controller => {
                self.reclaim_silent_nodes(now_s(), store, &mut r)
            }
            _ => {}
        }
        r
    }

    /// Leases of pods bound to nodes that stopped reporting without being deleted (a crashed or
    /// cut-off node: its pods stay, Terminating at most, until someone deletes the node).
    ///
    /// A node is *lost* when its kubelet has not renewed its heartbeat Lease for
    /// `node_lost_grace_s` **and** its `Ready` condition is not `True` (the node lifecycle
    /// controller's own verdict, so tether never judges a node Kubernetes still trusts). Both are
    /// read fresh (GET) before the node is judged. Then each of its `Leased` records older than
    /// the lease grace is released, conditionally, once a fresh GET of its pod shows the pod gone,
    /// replaced, or still bound to that node.
    ///
    /// The pod of a node cut off from the API server may still run and answer on the segment:
    /// its address is released as that pod's own (sticky for its name), cooling down, and every
    /// ADD probes the wire before it hands an address out, so another pod does not get it while
    /// it answers. Where a network does not probe, raise the grace or set it to 0 (off).
    fn reclaim_silent_nodes(&self, now: u64, store: &KubeStore, r: &mut PassReport) {
        let grace = self.opts.node_lost_grace_s;
        if grace == 0 {
            return;
        }
        store.restart_budget();
        let beats = match store.node_heartbeats() {
            Ok(b) => b,
            Err(e) => {
                return r.errors.push(format!(
                    "listing the kubelets' heartbeats (leases in {}): {e}",
                    tether_kube_store::NODE_LEASE_NAMESPACE
                ));
            }
        };
        let mut done = self.silent_done.lock().unwrap_or_else(|p| p.into_inner());
        done.retain(|n, _| beats.contains_key(n));
        for (node, &beat) in &beats {
            let silent = now.saturating_sub(beat);
            if silent < grace {
                done.remove(node);
                if silent >= LATE_HEARTBEAT_S {
                    due_at(r, beat + grace);
                }
                continue;
            }
            if done.get(node) == Some(&beat) {
                continue;
            }
            self.metrics.beat(now_s());
            store.restart_budget();
            let health = match store.node_health(node) {
                // Deleted meanwhile: its pods go with it, and the agent-pod sweep follows.
                Ok(None) => continue,
                Ok(Some(h)) => h,
                Err(e) => {
                    r.errors.push(format!("checking node {node}: {e}"));
                    continue;
                }
            };
            let silent = now.saturating_sub(health.heartbeat.unwrap_or(beat));
            if silent < grace {
                continue;
            }
            if health.is_ready() {
                let mut warned = self.warned_ready.lock().unwrap_or_else(|p| p.into_inner());
                if warned.insert(node.clone()) {
                    log::warn!(
                        "reconcile: node {node} has not renewed its heartbeat for {silent} s but is still Ready; \
                         its leases are kept until Kubernetes marks it not Ready (is kube-controller-manager running?)"
                    );
                }
                continue;
            }
            store.restart_budget();
            let label = tether_kube_store::crd::label_value(node);
            let leases = match store.list_node_label(&label) {
                Ok(l) => l,
                Err(KubeStoreError::CrdMissing { .. }) => return,
                Err(e) => {
                    r.errors
                        .push(format!("listing the leases of silent node {node}: {e}"));
                    continue;
                }
            };
            let held = leases.iter().filter(|l| l.is_leased()).count();
            if held > 0 {
                log::warn!(
                    "reconcile: node {node} has not reported for {silent} s and is not Ready ({}); judging its {held} lease(s)",
                    health.ready.as_deref().unwrap_or("no Ready condition")
                );
            }
            if self.judge_lost_node(node, silent, &leases, now, store, r) {
                done.insert(node.clone(), beat);
            }
        }
    }

    /// Release `leases` of lost node `node` whose pod a fresh GET shows gone, replaced, or still
    /// bound to `node`. True when nothing is left to look at again (no young record, no error).
    fn judge_lost_node(
        &self,
        node: &str,
        silent_s: u64,
        leases: &[Lease],
        now: u64,
        store: &KubeStore,
        r: &mut PassReport,
    ) -> bool {
        let mut settled = true;
        r.examined += leases.len();
        for lease in leases.iter().filter(|l| l.is_leased()) {
            let (Some(ns), Some(name)) = (&lease.pod.namespace, &lease.pod.name) else {
                continue;
            };
            if now.saturating_sub(lease.since) < self.opts.grace_s {
                due_at(r, lease.since + self.opts.grace_s);
                settled = false;
                continue;
            }
            let errors = r.errors.len();
            if let Some(reason) = self.confirm(lease, ns, name, Some((node, silent_s)), store, r) {
                self.release(StoreName::Kubernetes, lease, reason, now, store, r);
            }
            settled &= r.errors.len() == errors;
        }
        settled
    }

    /// Run until `stop` is set: the pod watch on its own thread, a pass after each pod deletion
    /// (debounced), when a young lease leaves its grace period, and a full pass every interval;
    /// the monitor and the metrics server on threads of their own (see the module docs).
    /// `on_pass` sees each report (after logging).
    pub fn run(
        &self,
        stop: &AtomicBool,
        mut on_pass: impl FnMut(&PassReport),
    ) -> Result<(), String> {
        let (tx, rx) = mpsc::channel();
        let stop_watch = Arc::new(AtomicBool::new(false));
        let watcher = match &self.opts.kube {
            Some(settings) => {
                let store = KubeStore::connect(long_lived(settings)).map_err(|e| e.to_string())?;
                let cache = self.cache.clone();
                // An agent watches its node's pods. The controller watches the node-agent pods'
                // namespace: a node whose agent pod goes (the node was deleted, or drained) is
                // judged at once, not at the next periodic pass; after a relist (the API server
                // back from an outage) too.
                let sel = if self.opts.controller {
                    format!("metadata.namespace={}", self.opts.agent_namespace)
                } else {
                    self.pod_selector()
                };
                let stop_w = stop_watch.clone();
                let timeout = self.opts.watch_timeout;
                Some(
                    std::thread::Builder::new()
                        .name("pod-watch".into())
                        .spawn(move || watch_loop(&store, &sel, timeout, &cache, &tx, &stop_w))
                        .map_err(|e| format!("cannot start the pod watch: {e}"))?,
                )
            }
            None => None,
        };
        let mut helpers = self.start_helpers(&stop_watch);
        // The controller passes only while it holds the election Lease (see leader.rs).
        let leading = Arc::new(AtomicBool::new(false));
        if let (true, Some(settings)) = (self.opts.controller, &self.opts.kube) {
            let store = KubeStore::connect(long_lived(settings)).map_err(|e| e.to_string())?;
            let (ns, id) = (self.opts.agent_namespace.clone(), self.opts.node.clone());
            let (lead, stop_e) = (leading.clone(), stop_watch.clone());
            helpers.push(
                std::thread::Builder::new()
                    .name("election".into())
                    .spawn(move || leader::campaign(&store, &ns, &id, &lead, &stop_e))
                    .map_err(|e| format!("cannot start the election: {e}"))?,
            );
        }
        let result = self.pass_loop(
            stop,
            &rx,
            self.opts.controller.then_some(leading.as_ref()),
            &mut on_pass,
        );
        stop_watch.store(true, Ordering::Relaxed);
        for h in watcher.into_iter().chain(helpers) {
            let _ = h.join();
        }
        result
    }

    /// The metrics server and the monitor, until `stop`. Neither failing to start stops the
    /// reconciler: it is logged.
    fn start_helpers(&self, stop: &Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
        let mut threads = Vec::new();
        if let Some(addr) = self.opts.metrics_addr {
            match metrics::start(addr, self.metrics.clone(), stop.clone()) {
                Ok((bound, h)) => {
                    let _ = self.metrics_bound.set(bound);
                    log::warn!("serving metrics on http://{bound}/metrics");
                    threads.push(h);
                }
                Err(e) => log::error!("cannot serve metrics on {addr}: {e}; going on without"),
            }
        }
        // The controller's monitor only reports the cluster-wide pools: with metrics served.
        let monitor = if self.opts.controller {
            self.opts.metrics_addr.is_some()
        } else {
            self.opts.conflict_events || self.opts.metrics_addr.is_some()
        };
        if monitor {
            let (opts, registry, stop) = (self.opts.clone(), self.metrics.clone(), stop.clone());
            let spawned = std::thread::Builder::new()
                .name("monitor".into())
                .spawn(move || match Monitor::new(&opts, registry) {
                    Ok(mut m) => m.run(opts.monitor_interval, &stop),
                    Err(e) => log::error!("monitor: {e}; no conflict Events or pool metrics"),
                });
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => log::error!("cannot start the monitor: {e}"),
            }
        }
        threads
    }

    fn pass_loop(
        &self,
        stop: &AtomicBool,
        rx: &Receiver<Trigger>,
        leading: Option<&AtomicBool>,
        on_pass: &mut dyn FnMut(&PassReport),
    ) -> Result<(), String> {
        let mut next_full = Instant::now();
        let mut next_due: Option<u64> = None;
        let mut led = false;
        // The controller reads the kubelets' heartbeats on a cadence of its own (cheap), apart
        // from the sweeps (which list every lease's node label).
        let silence_every = (self.opts.controller && self.opts.node_lost_grace_s > 0)
            .then(|| silence_check_every(self.opts.node_lost_grace_s));
        let mut next_silence = Instant::now() + silence_every.unwrap_or_default();
        while !stop.load(Ordering::Relaxed) {
            // A replica that does not lead only waits; one that just took over passes at once.
            if let Some(l) = leading {
                let now_leading = l.load(Ordering::Relaxed);
                if now_leading && !led {
                    next_full = Instant::now();
                }
                led = now_leading;
                self.metrics.set_pool_reporter(led);
                if !led {
                    self.metrics.beat(now_s());
                    while rx.try_recv().is_ok() {}
                    std::thread::sleep(Duration::from_millis(250));
                    continue;
                }
            }
            self.metrics.beat(now_s());
            let now = Instant::now();
            let due_in = next_due.map(|d| Duration::from_secs(d.saturating_sub(now_s())));
            let mut wait = next_full.saturating_duration_since(now);
            if let Some(d) = due_in {
                wait = wait.min(d);
            }
            if let Some(every) = silence_every {
                if now >= next_silence {
                    next_silence = now + every;
                    let report = self.silence_pass();
                    log_report(&report, false);
                    if let Some(d) = report.next_due {
                        next_due = Some(next_due.map_or(d, |n| n.min(d)));
                    }
                    self.metrics.record_pass(&report, false, now_s());
                    on_pass(&report);
                    continue;
                }
                wait = wait.min(next_silence - now);
            }
            // Wake up regularly to notice `stop`.
            let wait = wait.min(Duration::from_millis(250));
            let full = match rx.recv_timeout(wait) {
                Ok(_) => {
                    // Gather the burst (a deleted ReplicaSet, a drained node) into one pass.
                    let until = Instant::now() + self.opts.debounce;
                    while let Some(left) = until.checked_duration_since(Instant::now()) {
                        if rx.recv_timeout(left).is_err() {
                            break;
                        }
                    }
                    false
                }
                Err(RecvTimeoutError::Timeout) => {
                    if Instant::now() >= next_full {
                        true
                    } else if next_due.is_some_and(|d| now_s() >= d) {
                        false
                    } else {
                        continue;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // No watch (file store only, or it ended): periodic passes only.
                    std::thread::sleep(wait);
                    if Instant::now() < next_full && next_due.is_none_or(|d| now_s() < d) {
                        continue;
                    }
                    Instant::now() >= next_full
                }
            };
            if full {
                next_full = Instant::now() + self.opts.interval;
            }
            let report = self.pass(full);
            log_report(&report, full);
            next_due = report.next_due;
            self.metrics.record_pass(&report, full, now_s());
            on_pass(&report);
        }
        Ok(())
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

fn log_report(r: &PassReport, full: bool) {
    for e in &r.errors {
        log::error!("reconcile: {e}");
    }
    if !r.released.is_empty() || r.lost_races > 0 || r.pruned > 0 {
        log::warn!(
            "reconcile ({}): {} record(s) examined, {} released, {} old record(s) deleted, {} changed meanwhile, {} alive after all",
            if full { "full pass" } else { "pod event" },
            r.examined,
            r.released.len(),
            r.pruned,
            r.lost_races,
            r.confirmed_alive
        );
    } else {
        log::debug!(
            "reconcile ({}): {} record(s) examined, nothing to release",
            if full { "full pass" } else { "pod event" },
            r.examined
        );
    }
}

/// Keep `cache` = the pods of this node: list, then watch from the list's resourceVersion;
/// re-list on expiry (410) or error (with backoff). Wakes the pass loop on pod deletions and
/// after each re-list.
fn watch_loop(
    store: &KubeStore,
    sel: &str,
    timeout: Duration,
    cache: &Mutex<PodCache>,
    tx: &Sender<Trigger>,
    stop: &AtomicBool,
) {
    let keep_going = || !stop.load(Ordering::Relaxed);
    let mut backoff = Duration::from_millis(500);
    let sleep = |d: Duration| {
        let until = Instant::now() + d;
        while keep_going() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    'relist: while keep_going() {
        let mut fresh: PodIndex = HashMap::new();
        store.restart_budget();
        let rv = match store.visit_pods(Some(sel), |k| {
            fresh.insert((k.namespace, k.name), k.uid);
        }) {
            Ok(rv) => rv,
            Err(e) => {
                // Jittered, then capped: an agent is back within 30 s of the server.
                let wait = tether_kube_store::jittered(backoff).min(Duration::from_secs(30));
                log::error!(
                    "reconcile: listing pods ({sel}): {e}; retrying in {:.1}s",
                    wait.as_secs_f32()
                );
                cache.lock().unwrap_or_else(|p| p.into_inner()).synced = false;
                sleep(wait);
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        {
            let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
            c.pods = fresh;
            c.pods.shrink_to_fit();
            c.synced = true;
        }
        let _ = tx.send(Trigger::Relisted);
        let mut rv = rv;
        while keep_going() {
            let result = store.watch_pods(Some(sel), &rv, timeout, &keep_going, |ev| {
                let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
                match ev {
                    PodEvent::Upsert(k) => {
                        let replaced = c
                            .pods
                            .get(&(k.namespace.clone(), k.name.clone()))
                            .is_some_and(|u| *u != k.uid);
                        c.pods.insert((k.namespace, k.name), k.uid);
                        if replaced {
                            let _ = tx.send(Trigger::PodGone);
                        }
                    }
                    PodEvent::Deleted(k) => {
                        let key = (k.namespace, k.name);
                        if c.pods.get(&key).is_some_and(|u| *u == k.uid) {
                            c.pods.remove(&key);
                        }
                        let _ = tx.send(Trigger::PodGone);
                    }
                }
            });
            match result {
                Ok(WatchEnd::Closed { resource_version }) => {
                    backoff = Duration::from_millis(500);
                    if resource_version.is_empty() {
                        continue 'relist;
                    }
                    rv = resource_version;
                }
                Ok(WatchEnd::Expired) => {
                    log::info!("reconcile: pod watch expired (410); listing again");
                    continue 'relist;
                }
                Err(e) => {
                    // Jittered, then capped: an agent is back within 30 s of the server.
                    let wait = tether_kube_store::jittered(backoff).min(Duration::from_secs(30));
                    log::error!(
                        "reconcile: watching pods ({sel}): {e}; listing again in {:.1}s",
                        wait.as_secs_f32()
                    );
                    cache.lock().unwrap_or_else(|p| p.into_inner()).synced = false;
                    sleep(wait);
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue 'relist;
                }
            }
        }
    }
}

/// One line per release, for `--once` and tests.
pub fn describe(r: &Released) -> String {
    format!(
        "released {} network {} ({}) pod {} uid {}: {}",
        r.lease.address,
        r.lease.network,
        match r.store {
            StoreName::Kubernetes => "kubernetes",
            StoreName::File => "file",
        },
        r.lease.pod,
        r.lease.pod.uid.as_deref().unwrap_or("?"),
        r.reason
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_sweeper_whatever_the_order() {
        let a: Vec<String> = ["n1", "n2", "n3", "gpu-17"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut b = a.clone();
        b.reverse();
        assert_eq!(sweeper(&a), sweeper(&b));
        assert!(sweeper(&[]).is_none());
    }
}
