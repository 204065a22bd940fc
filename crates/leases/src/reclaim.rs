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
        }
    }
}

/// Pods that exist: (namespace, name) → uid.
pub type PodIndex = HashMap<(String, String), String>;

/// The leases to release: `Leased`, older than `grace_s`, naming a pod that is gone or replaced.
/// Leases without a pod namespace and name (cnitool, plain runtimes) are left to CNI GC: nothing
/// here can tell whether they are alive.
pub fn stale<'a>(
    leases: &'a [Lease],
    pods: &PodIndex,
    now: u64,
    grace_s: u64,
) -> Vec<(&'a Lease, StaleReason)> {
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
                    _ => None,
                },
            }
        })
        .collect()
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
}
