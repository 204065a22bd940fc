//! The lease reconciler: releases leases whose pod is gone, or whose pod name now belongs to
//! another pod (another uid), and never a live one. Run by the node-agent on every node, or as
//! `tether reconcile`. A node's passes also take back what its running pods use after the
//! controller released it while the node was cut off ([`rejoin`]).
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
//!    **or** another sandbox of the same pod (same uid) holds a strictly newer lease on the same
//!    interface, network and range, in the same LIST of this node's leases. A pod has one sandbox
//!    at a time (the kubelet stops the old one, DEL included, before it creates the next), so the
//!    older is a dead sandbox's: one whose DEL could not release it, or a write of a failed ADD
//!    that the server made after the ADD gave up. No cache and no pod read is involved;
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
//! `spec.nodeName` ([`Cluster::agent_nodes`](tether_cluster::Cluster::agent_nodes)). From that one set:
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
//! The reconciler records its passes in a metrics [`Registry`]; whoever runs it starts the
//! monitor ([`crate::monitor`]: conflict Events on pods, pool and record gauges) and,
//! with `metrics_addr`, the Prometheus endpoint ([`crate::metrics`]) beside it
//! ([`crate::observers`]), so the reconciler knows neither. The cluster-wide pools are reported by the
//! leading controller (its monitor reports nothing else), or, on a cluster without the node-scope
//! policy, by the agent that is the sweeper: no agent of the shipped DaemonSet reads other nodes.

// KubeStoreError is large by design (it carries what the operator needs); this is not a hot path.
#![allow(clippy::result_large_err)]

mod lost_nodes;
mod rejoin;
mod run_loop;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use tether_kube_store::KubeStoreError;
use tether_leases::reclaim::{PodIndex, StaleReason, stale};
use tether_leases::{FileStore, Lease, LeaseStore, StoreError};

use crate::kube::Kube;
use crate::metrics::Registry;
pub use crate::options::Options;
pub use crate::report::{HeldElsewhere, PassReport, Released, StoreName, describe};
use crate::report::{due_at, now_s};
pub use lost_nodes::{silence_check_every, sweeper};
pub use rejoin::SETTLE_S;

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

/// The reconciler of one node.
pub struct Reconciler {
    opts: Options,
    kube: Option<Kube>,
    cache: Arc<Mutex<PodCache>>,
    warned_agents: AtomicBool,
    warned_ready: Mutex<std::collections::HashSet<String>>,
    /// Silent nodes judged since their last heartbeat with nothing left to release (node →
    /// that heartbeat): not listed again until it changes.
    silent_done: Mutex<HashMap<String, u64>>,
    /// UIDs of pods the rejoin found gone or replaced: the journal entries that name them (a
    /// DEL that never reached tether) are not read against the store again.
    gone_pods: Mutex<std::collections::HashSet<String>>,
    /// The double holders whose `AddressConflict` Event the rejoin has posted: occurrence →
    /// when (unix s); posted again only every `rejoin::REPOST_S` while they last.
    posted_elsewhere: Mutex<HashMap<String, u64>>,
    metrics: Arc<Registry>,
}

impl Reconciler {
    /// Connect (no request sent yet).
    pub fn new(opts: Options) -> Result<Reconciler, String> {
        if opts.node.trim().is_empty() {
            return Err("no node name: pass --node or set NODE_NAME".into());
        }
        let kube = match &opts.kube {
            Some(s) => Some(Kube::connect(s)?),
            None => None,
        };
        if opts.controller && kube.is_none() {
            return Err(
                "the controller needs the Kubernetes API: give a kubeconfig, or run it in a pod"
                    .into(),
            );
        }
        if kube.is_none() && opts.data_dir.is_none() {
            return Err(
                "nothing to reconcile: give a kubeconfig (or run in a pod) and/or --data-dir"
                    .into(),
            );
        }
        // Every client built from `opts.kube` counts into its traffic value; the metrics serve it.
        let traffic = opts
            .kube
            .as_ref()
            .map(|k| k.traffic.clone())
            .unwrap_or_default();
        let metrics = Arc::new(
            Registry::counting(traffic)
                .serving(opts.lease_service.clone())
                .with_calls(opts.cni_calls.clone()),
        );
        Ok(Reconciler {
            opts,
            kube,
            cache: Arc::default(),
            warned_agents: AtomicBool::new(false),
            warned_ready: Mutex::default(),
            silent_done: Mutex::default(),
            gone_pods: Mutex::default(),
            posted_elsewhere: Mutex::default(),
            metrics,
        })
    }

    /// The options.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// The registry each pass is recorded in (what the metrics endpoint serves).
    pub fn metrics(&self) -> &Arc<Registry> {
        &self.metrics
    }

    fn pod_selector(&self) -> String {
        format!("spec.nodeName={}", self.opts.node)
    }

    /// The pods of this node: the watch's cache when it is synced, else a fresh list.
    fn node_pods(&self, kube: &Kube) -> Result<PodIndex, KubeStoreError> {
        {
            let c = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if c.synced {
                return Ok(c.pods.clone());
            }
        }
        let mut pods = PodIndex::new();
        kube.restart_budget();
        kube.cluster.visit_pods(Some(&self.pod_selector()), |k| {
            pods.insert((k.namespace, k.name), k.uid);
        })?;
        Ok(pods)
    }

    /// One pass: this node's Kubernetes and file-store leases; with `full`, also the dead-node
    /// sweep (when this agent is the sweeper).
    pub fn pass(&self, full: bool) -> PassReport {
        let mut r = PassReport::default();
        let now = now_s();
        let Some(kube) = &self.kube else {
            r.errors.push(
                "no Kubernetes API access: pods cannot be seen, so no lease can be judged; give --kubeconfig".into(),
            );
            return r;
        };
        if self.opts.controller {
            self.sweep(now, kube, &mut r);
            self.reclaim_silent_nodes(now, kube, &mut r);
            if full {
                let names = crate::lease_names::controller_pass(
                    kube,
                    &self.opts.agent_namespace,
                    &self.opts.agent_selector,
                    now,
                );
                self.metrics.set_lease_names(
                    names.mirrors,
                    names.by_network,
                    names.adoption.duplicates.len(),
                );
                r.errors.extend(names.adoption.errors);
            }
            return r;
        }
        let pods = match self.node_pods(kube) {
            Ok(p) => p,
            Err(e) => {
                r.errors
                    .push(format!("listing the pods of node {}: {e}", self.opts.node));
                return r;
            }
        };
        // This node's cluster-wide leases.
        kube.restart_budget();
        match kube.leases.list_node(&self.opts.node) {
            Ok(leases) => {
                self.judge(StoreName::Kubernetes, &leases, &pods, now, kube, &mut r);
                self.prune(&leases, now, kube, &mut r);
                self.rejoin(&leases, now, kube, &mut r);
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
            match FileStore::new(dir.clone()).records() {
                Ok(leases) => self.judge(StoreName::File, &leases, &pods, now, kube, &mut r),
                Err(e) => r
                    .errors
                    .push(format!("reading the leases in {}: {e}", dir.display())),
            }
        }
        // Only an agent that sweeps (a cluster without the node-scope policy) lists the other
        // nodes: the cluster-wide pool metrics are the controller's.
        if full && self.opts.sweep_dead_nodes {
            self.sweep(now, kube, &mut r);
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
        kube: &Kube,
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
        for (lease, found) in stale(leases, pods, now, self.opts.grace_s) {
            // A long pass (many candidates, a slow server) is progress, not a wedged loop.
            self.metrics.beat(now_s());
            let (Some(ns), Some(name)) = (&lease.pod.namespace, &lease.pod.name) else {
                continue;
            };
            // A superseded sandbox is judged from the leases alone (read in this pass), whatever
            // the pod's state; the pod cache's findings are confirmed on the server.
            let reason = match found {
                StaleReason::Superseded { .. } => found,
                _ => match self.confirm(lease, ns, name, None, kube, r) {
                    Some(reason) => reason,
                    None => continue,
                },
            };
            self.release(which, lease, reason, now, kube, r);
        }
    }

    /// Delete this node's records released (or quarantined) longer ago than the retention
    /// (a day): DEL keeps a `Released` record for the cooldown and for sticky re-use and, in
    /// the cluster store, never lists the network to tidy up, so the node's agent does. Each
    /// delete carries the record's uid and resourceVersion: one re-leased since stays.
    fn prune(&self, leases: &[Lease], now: u64, kube: &Kube, r: &mut PassReport) {
        let retain = tether_leases::Policy::default().retain_released_s;
        for l in leases
            .iter()
            .filter(|l| !l.is_leased() && now.saturating_sub(l.since) >= retain)
        {
            kube.restart_budget();
            match kube.leases.remove(l) {
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
        kube: &Kube,
        r: &mut PassReport,
    ) -> Option<StaleReason> {
        kube.restart_budget();
        // Where the node does not matter, the pod's metadata is enough (a smaller answer).
        let pod = match lost {
            None => kube
                .cluster
                .pod_uid(ns, name)
                .map(|u| u.map(|uid| (uid, None))),
            Some(_) => kube
                .cluster
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
        kube: &Kube,
        r: &mut PassReport,
    ) {
        let outcome: Result<Result<Lease, tether_leases::Taken>, StoreError> = match which {
            StoreName::Kubernetes => {
                kube.restart_budget();
                kube.leases.release(lease, now)
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
                    tether_leases::short_id(&lease.container_id),
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
}
