//! The leases of nodes that are gone: deleted nodes (no agent pod; the sweeper's part, or the
//! controller's) and silent nodes (no heartbeat, not Ready; the controller's). See the
//! reconcile module's docs for why judging a live node is safe.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tether_kube_store::KubeStoreError;
use tether_leases::Lease;
use tether_leases::reclaim::PodIndex;

use super::Reconciler;
use crate::kube::Kube;
use crate::report::{PassReport, StoreName, due_at, now_s};

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

impl Reconciler {
    /// Leases of nodes that run no agent pod (deleted nodes), when this agent is the sweeper.
    /// Records in `r.sweeper` whether it is.
    pub(super) fn sweep(&self, now: u64, kube: &Kube, r: &mut PassReport) {
        let (ns, sel) = (
            self.opts.agent_namespace.as_str(),
            self.opts.agent_selector.as_str(),
        );
        let missed = "leases of deleted nodes are not reclaimed";
        kube.restart_budget();
        // The live nodes, and the sweeper candidates: the nodes running an agent pod.
        let live = match kube.cluster.agent_nodes(ns, sel) {
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
        kube.restart_budget();
        let labels = match kube.leases.lease_node_labels() {
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
            kube.restart_budget();
            let leases = match kube.leases.list_node_label(label) {
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
            self.judge(StoreName::Kubernetes, &leases, &pods, now, kube, r);
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
        if let Some(kube) = self.kube.as_ref().filter(|_| self.opts.controller) {
            self.reclaim_silent_nodes(now_s(), kube, &mut r)
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
    pub(super) fn reclaim_silent_nodes(&self, now: u64, kube: &Kube, r: &mut PassReport) {
        let grace = self.opts.node_lost_grace_s;
        if grace == 0 {
            return;
        }
        kube.restart_budget();
        let beats = match kube.cluster.node_heartbeats() {
            Ok(b) => b,
            Err(e) => {
                return r.errors.push(format!(
                    "listing the kubelets' heartbeats (leases in {}): {e}",
                    tether_cluster::NODE_LEASE_NAMESPACE
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
            kube.restart_budget();
            let health = match kube.cluster.node_health(node) {
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
            kube.restart_budget();
            let label = tether_kube_store::crd::label_value(node);
            let leases = match kube.leases.list_node_label(&label) {
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
            if self.judge_lost_node(node, silent, &leases, now, kube, r) {
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
        kube: &Kube,
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
            if let Some(reason) = self.confirm(lease, ns, name, Some((node, silent_s)), kube, r) {
                self.release(StoreName::Kubernetes, lease, reason, now, kube, r);
            }
            settled &= r.errors.len() == errors;
        }
        settled
    }
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
