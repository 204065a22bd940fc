//! Which leases have leaked: the decision of the reconciler, kept free of any API so it is tested
//! exhaustively. The caller supplies a view of the pods that exist and releases what this returns,
//! each release conditional on the record being unchanged (a lease taken since is never freed).

use std::collections::HashMap;

use crate::model::{Lease, LeaseState};

/// Why a lease is stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StaleReason {
    /// No pod of that namespace/name exists.
    PodGone,
    /// A pod of that namespace/name exists, but it is another pod (another UID) than the holder.
    PodReplaced { current_uid: String },
    /// The pod still exists, bound to a node that stopped reporting (no heartbeat for
    /// `silent_s` seconds, not `Ready`) longer than the controller's node-lost grace.
    NodeLost { node: String, silent_s: u64 },
    /// Another sandbox of the same pod (container `by`) holds a newer lease on the same
    /// interface, network and range. A pod has one sandbox at a time (the kubelet stops the old
    /// one before it creates the next), so this one is dead: its DEL could not release the
    /// lease, or a write of its failed ADD was made after the ADD gave up.
    Superseded { by: String },
}

impl std::fmt::Display for StaleReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StaleReason::PodGone => f.write_str("its pod no longer exists"),
            StaleReason::PodReplaced { current_uid } => {
                write!(f, "its pod was replaced by another (uid {current_uid})")
            }
            StaleReason::NodeLost { node, silent_s } => write!(
                f,
                "its pod is bound to node {node}, which has not reported for {silent_s} s and is not Ready"
            ),
            StaleReason::Superseded { by } => write!(
                f,
                "its sandbox is gone: the pod's sandbox {} holds a newer lease on the same interface",
                crate::model::short_id(by)
            ),
        }
    }
}

/// Pods that exist: (namespace, name) → uid.
pub type PodIndex = HashMap<(String, String), String>;

/// The leases to release: `Leased`, older than `grace_s`, naming a pod that is gone or replaced,
/// or held by a sandbox of a pod whose later sandbox holds a newer lease in the same place.
/// Leases without a pod namespace and name (cnitool, plain runtimes) are left to CNI GC: nothing
/// here can tell whether they are alive.
pub fn stale<'a>(
    leases: &'a [Lease],
    pods: &PodIndex,
    now: u64,
    grace_s: u64,
) -> Vec<(&'a Lease, StaleReason)> {
    let newest = newest_per_place(leases);
    leases
        .iter()
        .filter(|l| matches!(l.state, LeaseState::Leased))
        // An ADD in flight holds its lease before the pod shows its network status; and a pod cache
        // may lag the API by a moment. Young leases are never judged.
        .filter(|l| now.saturating_sub(l.since) >= grace_s)
        .filter_map(|l| {
            let (ns, name) = (l.pod.namespace.clone()?, l.pod.name.clone()?);
            match pods.get(&(ns, name)) {
                None => Some((l, StaleReason::PodGone)),
                Some(uid) => match &l.pod.uid {
                    Some(held) if held != uid => Some((
                        l,
                        StaleReason::PodReplaced {
                            current_uid: uid.clone(),
                        },
                    )),
                    _ => superseded(l, &newest).map(|r| (l, r)),
                },
            }
        })
        .collect()
}

/// Where one sandbox of a pod holds its lease: the pod (namespace, name, uid), the interface,
/// the network and the range.
type Place<'a> = (&'a str, &'a str, &'a str, &'a str, &'a str, Option<usize>);

fn place(l: &Lease) -> Option<Place<'_>> {
    Some((
        l.pod.namespace.as_deref()?,
        l.pod.name.as_deref()?,
        l.pod.uid.as_deref()?,
        &l.ifname,
        &l.network,
        l.range_index,
    ))
}

/// The newest `Leased` record of each place.
fn newest_per_place(leases: &[Lease]) -> HashMap<Place<'_>, &Lease> {
    let mut newest: HashMap<Place<'_>, &Lease> = HashMap::new();
    for l in leases.iter().filter(|l| l.is_leased()) {
        if let Some(p) = place(l) {
            let e = newest.entry(p).or_insert(l);
            if l.since > e.since {
                *e = l;
            }
        }
    }
    newest
}

/// `l` is superseded when another sandbox's record of its place is strictly newer (equal times
/// decide nothing).
fn superseded(l: &Lease, newest: &HashMap<Place<'_>, &Lease>) -> Option<StaleReason> {
    let n = newest.get(&place(l)?)?;
    (n.since > l.since && n.container_id != l.container_id).then(|| StaleReason::Superseded {
        by: n.container_id.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PodRef;

    fn lease(
        addr: &str,
        ns: Option<&str>,
        name: Option<&str>,
        uid: Option<&str>,
        since: u64,
        state: LeaseState,
    ) -> Lease {
        Lease {
            network: "n".into(),
            domain: None,
            address: addr.parse().unwrap(),
            prefix_len: 24,
            range_index: Some(0),
            container_id: format!("c-{addr}"),
            ifname: "net1".into(),
            pod: PodRef {
                namespace: ns.map(Into::into),
                name: name.map(Into::into),
                uid: uid.map(Into::into),
            },
            node: Some("node-a".into()),
            state,
            since,
            version: Some("1".into()),
        }
    }

    fn pods(entries: &[(&str, &str, &str)]) -> PodIndex {
        entries
            .iter()
            .map(|(ns, n, u)| ((ns.to_string(), n.to_string()), u.to_string()))
            .collect()
    }

    #[test]
    fn gone_and_replaced_pods_are_stale_live_ones_are_not() {
        let l = vec![
            lease(
                "10.0.0.1",
                Some("ns"),
                Some("alive"),
                Some("u1"),
                0,
                LeaseState::Leased,
            ),
            lease(
                "10.0.0.2",
                Some("ns"),
                Some("gone"),
                Some("u2"),
                0,
                LeaseState::Leased,
            ),
            lease(
                "10.0.0.3",
                Some("ns"),
                Some("sts-0"),
                Some("old"),
                0,
                LeaseState::Leased,
            ),
            lease(
                "10.0.0.4",
                Some("ns"),
                Some("nouid"),
                None,
                0,
                LeaseState::Leased,
            ),
        ];
        let p = pods(&[
            ("ns", "alive", "u1"),
            ("ns", "sts-0", "new"),
            ("ns", "nouid", "x"),
        ]);
        let s = stale(&l, &p, 1000, 120);
        let got: Vec<(String, StaleReason)> = s
            .iter()
            .map(|(l, r)| (l.address.to_string(), r.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("10.0.0.2".to_string(), StaleReason::PodGone),
                (
                    "10.0.0.3".to_string(),
                    StaleReason::PodReplaced {
                        current_uid: "new".into()
                    }
                ),
            ]
        );
    }

    #[test]
    fn young_leases_are_never_judged() {
        let l = vec![lease(
            "10.0.0.2",
            Some("ns"),
            Some("gone"),
            Some("u"),
            950,
            LeaseState::Leased,
        )];
        assert!(
            stale(&l, &PodIndex::new(), 1000, 120).is_empty(),
            "50 s old, grace 120 s"
        );
        assert_eq!(stale(&l, &PodIndex::new(), 1070, 120).len(), 1, "120 s old");
    }

    #[test]
    fn released_quarantined_and_anonymous_records_are_left_alone() {
        let l = vec![
            lease(
                "10.0.0.5",
                Some("ns"),
                Some("gone"),
                Some("u"),
                0,
                LeaseState::Released { at: 0 },
            ),
            lease(
                "10.0.0.6",
                Some("ns"),
                Some("gone"),
                Some("u"),
                0,
                LeaseState::Quarantined {
                    mac: "m".into(),
                    at: 0,
                },
            ),
            lease("10.0.0.7", None, None, None, 0, LeaseState::Leased),
        ];
        assert!(stale(&l, &PodIndex::new(), 1000, 0).is_empty());
    }

    #[test]
    fn of_two_sandboxes_of_one_pod_in_one_place_the_older_lease_is_stale() {
        let sandbox = |addr: &str, cid: &str, since: u64| {
            let mut l = lease(
                addr,
                Some("ns"),
                Some("p"),
                Some("u"),
                since,
                LeaseState::Leased,
            );
            l.container_id = cid.into();
            l
        };
        let live = sandbox("10.0.0.9", "c-live", 500);
        let mut other_if = sandbox("10.0.0.10", "c-dead", 100);
        other_if.ifname = "net2".into();
        let mut other_range = sandbox("10.0.1.1", "c-dead", 100);
        other_range.range_index = Some(1);
        let l = vec![
            sandbox("10.0.0.8", "c-dead", 100),
            live.clone(),
            other_if,
            other_range,
        ];
        let p = pods(&[("ns", "p", "u")]);
        let s = stale(&l, &p, 1000, 120);
        assert_eq!(
            s.len(),
            1,
            "only the older lease in the live one's place: {s:?}"
        );
        assert_eq!(s[0].0.address.to_string(), "10.0.0.8");
        assert_eq!(
            s[0].1,
            StaleReason::Superseded {
                by: "c-live".into()
            }
        );
        // Within its grace, or as old as the other: nothing is decided.
        assert!(stale(&l, &p, 200, 120).is_empty());
        let tie = vec![sandbox("10.0.0.8", "c-a", 500), live];
        assert!(stale(&tie, &p, 1000, 120).is_empty());
    }
}
