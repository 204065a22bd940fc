//! One allocation of whereabouts made an IPLease: a GET of its pod (gone: whereabouts' own leak,
//! the address is free), then a conditional CREATE of the address's record in its domain. An
//! existing record is judged, never overwritten while it is `Leased` to someone else:
//!
//! | record there | outcome |
//! |---|---|
//! | none | created: imported |
//! | `Leased` to the same attachment (container and interface) or the same pod object | already imported |
//! | `Leased` to another holder | a conflict: two holders of one address, both reported |
//! | `Released` or `Quarantined` | taken over by a conditional UPDATE (uid and resourceVersion): whereabouts' pod is on it now |
//!
//! A write that loses a race judges the record it lost to, a bounded number of times.

use std::net::IpAddr;

use tether_cluster::{Cluster, PodPlacement};
use tether_kube_store::KubeStore;
use tether_leases::{Lease, LeaseState, LeaseStore, PodRef, Taken};

use super::entries::Entry;
use super::networks::Placement;

/// How many times a write that lost a race is judged again.
const ATTEMPTS: usize = 4;

/// The pod of a record already there, for a conflict's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderPod {
    /// It exists (the same pod object, as far as the record says).
    Alive,
    /// It no longer exists: its record is released by the reconciler of its node.
    Gone,
    /// A pod of that name with another uid exists: the record's pod is gone.
    Replaced,
    /// The record names no pod.
    Unnamed,
    /// The GET failed.
    Unknown(String),
}

impl HolderPod {
    /// For tables and JSON.
    pub fn text(&self) -> String {
        match self {
            HolderPod::Alive => "alive".into(),
            HolderPod::Gone => "gone".into(),
            HolderPod::Replaced => "replaced".into(),
            HolderPod::Unnamed => "unnamed".into(),
            HolderPod::Unknown(e) => format!("unknown ({e})"),
        }
    }
}

/// Two holders of one address: whereabouts' and the one tether recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The record the import would have written (whereabouts' holder).
    pub wanted: Lease,
    /// Where whereabouts recorded it.
    pub source: String,
    /// The record there, `Leased` to another holder.
    pub held: Lease,
    /// Whether the record's pod still exists.
    pub held_pod: HolderPod,
}

/// What became of one allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Written (with `--dry-run`: would be); `took_over` names the state of the record replaced.
    Imported {
        /// `released` or `quarantined`, when a record was taken over.
        took_over: Option<&'static str>,
    },
    /// The address is leased to this holder already.
    Already,
    /// The pod does not exist: nothing written (the address is free).
    PodGone,
    /// Nothing written, for this reason (tried again on the next pass with `--follow`).
    NotYet(String),
    /// Another holder has the address.
    Conflict(Box<Conflict>),
    /// A request failed (tried again on the next pass with `--follow`).
    Failed(String),
}

/// Writes the records of allocations.
pub struct Importer<'a> {
    /// The lease store (an admin's credential: it writes the leases of every node).
    pub leases: &'a KubeStore,
    /// Pods, on the same client.
    pub cluster: &'a Cluster,
    /// Judge only; write nothing.
    pub dry_run: bool,
}

/// What to do about a record there.
enum Verdict {
    Done(Outcome),
    TakeOver(Box<Lease>),
}

impl Importer<'_> {
    /// Import `e`, of a pool placed at `p`, as of `now` (unix seconds).
    pub fn import(&self, e: &Entry, p: &Placement, now: u64) -> Outcome {
        self.cluster.restart_budget();
        let pod = match self.cluster.pod_placement(&e.pod_namespace, &e.pod_name) {
            // A lease without a node is judged by no node's reconciler: it would stay forever.
            Ok(Some(pod)) if pod.node.is_none() => {
                return Outcome::NotYet(format!(
                    "pod {} is bound to no node (an earlier pod of that name had the address, or it \
                     is starting): import again once it runs",
                    e.podref()
                ));
            }
            Ok(Some(pod)) => pod,
            Ok(None) => return Outcome::PodGone,
            Err(err) => {
                return Outcome::Failed(format!(
                    "checking pod {} of {}: {err}",
                    e.podref(),
                    e.address
                ));
            }
        };
        let wanted = wanted(e, p, pod, now);
        if self.dry_run {
            return match self.leases.get(&wanted.scope(), wanted.address) {
                Ok(None) => Outcome::Imported { took_over: None },
                Ok(Some(held)) => match self.judge(&wanted, held, &e.source) {
                    Verdict::Done(o) => o,
                    Verdict::TakeOver(held) => Outcome::Imported {
                        took_over: Some(state_text(&held.state)),
                    },
                },
                Err(err) => Outcome::Failed(failed_read(wanted.address, err)),
            };
        }
        self.write(&wanted, &e.source)
    }

    /// CREATE, or UPDATE a record to take over; judge what a lost race left there.
    fn write(&self, wanted: &Lease, source: &str) -> Outcome {
        let mut expected: Option<Lease> = None;
        for _ in 0..ATTEMPTS {
            self.leases.restart_budget();
            match self.leases.claim(wanted.clone(), expected.as_ref()) {
                Ok(Ok(_)) => {
                    return Outcome::Imported {
                        took_over: expected.map(|h| state_text(&h.state)),
                    };
                }
                // Deleted meanwhile: create it.
                Ok(Err(Taken { current: None })) => expected = None,
                Ok(Err(Taken {
                    current: Some(held),
                })) => match self.judge(wanted, held, source) {
                    Verdict::Done(o) => return o,
                    Verdict::TakeOver(held) => expected = Some(*held),
                },
                Err(err) => {
                    return Outcome::Failed(format!(
                        "writing the IPLease of {} ({}): {err}",
                        wanted.address,
                        tether_leases::domain_text(wanted.domain.as_deref())
                    ));
                }
            }
        }
        Outcome::Failed(format!(
            "the IPLease of {} changed {ATTEMPTS} times while it was imported; run the import again",
            wanted.address
        ))
    }

    /// The record `held` is there where `wanted` should be.
    fn judge(&self, wanted: &Lease, held: Lease, source: &str) -> Verdict {
        if !held.is_leased() {
            return Verdict::TakeOver(Box::new(held));
        }
        let same_attachment = !wanted.container_id.is_empty()
            && held.is_attachment(&wanted.container_id, &wanted.ifname);
        if same_attachment || held.pod.same_pod(&wanted.pod) {
            return Verdict::Done(Outcome::Already);
        }
        let held_pod = self.holder_pod(&held.pod);
        Verdict::Done(Outcome::Conflict(Box::new(Conflict {
            wanted: wanted.clone(),
            source: source.to_string(),
            held,
            held_pod,
        })))
    }

    fn holder_pod(&self, pod: &PodRef) -> HolderPod {
        let (Some(ns), Some(name)) = (&pod.namespace, &pod.name) else {
            return HolderPod::Unnamed;
        };
        self.cluster.restart_budget();
        match self.cluster.pod_uid(ns, name) {
            Ok(None) => HolderPod::Gone,
            Ok(Some(uid)) if pod.uid.as_ref().is_some_and(|held| *held != uid) => {
                HolderPod::Replaced
            }
            Ok(Some(_)) => HolderPod::Alive,
            Err(e) => HolderPod::Unknown(e.to_string()),
        }
    }
}

/// The record of `e` as tether would hold it: `Leased` since `now`, on the pod's node.
fn wanted(e: &Entry, p: &Placement, pod: PodPlacement, now: u64) -> Lease {
    Lease {
        network: p.scope.network.clone(),
        domain: p.scope.domain.clone(),
        address: e.address,
        prefix_len: e.prefix_len,
        range_index: p.range_index,
        container_id: e.container_id.clone(),
        ifname: e.ifname.clone(),
        pod: PodRef::new(&e.pod_namespace, &e.pod_name, pod.uid),
        node: pod.node,
        state: LeaseState::Leased,
        since: now,
        version: None,
    }
}

fn state_text(s: &LeaseState) -> &'static str {
    match s {
        LeaseState::Leased => "leased",
        LeaseState::Released { .. } => "released",
        LeaseState::Quarantined { .. } => "quarantined",
    }
}

fn failed_read(address: IpAddr, err: tether_leases::StoreError) -> String {
    format!("reading the IPLease of {address}: {err}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_leases::Scope;

    use super::super::networks::Matched;

    #[test]
    fn the_record_names_the_pod_its_node_and_the_nads_scope() {
        let e = Entry {
            pool: 0,
            address: "10.203.0.7".parse().unwrap(),
            prefix_len: 26,
            container_id: "c7".into(),
            ifname: String::new(),
            pod_namespace: "ml".into(),
            pod_name: "p7".into(),
            source: "IPPool kube-system/10.203.0.0-26 key 7".into(),
        };
        let p = Placement {
            scope: Scope::new("mgmt", Some("rail-1".into())),
            nad: Some("ml/mgmt".into()),
            matched: Matched::Name,
            range_index: Some(1),
            others: Vec::new(),
        };
        let pod = PodPlacement {
            uid: "u7".into(),
            node: Some("gpu-3".into()),
            terminating: false,
        };
        let l = wanted(&e, &p, pod, 1_000);
        assert_eq!(l.scope(), p.scope);
        assert_eq!(l.cidr(), "10.203.0.7/26");
        assert_eq!(l.pod, PodRef::new("ml", "p7", "u7"));
        assert_eq!(l.node.as_deref(), Some("gpu-3"));
        assert_eq!((l.range_index, l.since), (Some(1), 1_000));
        assert!(l.is_leased() && l.version.is_none() && l.ifname.is_empty());
    }
}
