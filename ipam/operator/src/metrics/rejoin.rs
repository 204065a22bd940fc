//! The families of a node back from a partition ([`crate::reconcile`]'s rejoin): leases its
//! agent took back for the node's running pods, and addresses those pods use that the store
//! leases to another node's pod.

use std::collections::BTreeMap;

use super::{State, labels};
use crate::report::PassReport;

/// What the rejoin counts.
#[derive(Default)]
pub(super) struct RejoinState {
    /// Network → leases taken back.
    taken_back: BTreeMap<String, u64>,
    /// (network, address) → (the other pod, its node), as the last pass that compared the
    /// journal found them.
    elsewhere: BTreeMap<(String, String), (String, String)>,
}

/// Count what pass `r` found.
pub(super) fn record(s: &mut State, r: &PassReport) {
    let j = &mut s.rejoin;
    for l in &r.taken_back {
        *j.taken_back.entry(l.network.clone()).or_insert(0) += 1;
    }
    // A pass that could not compare (no LIST) says nothing about what is still held twice.
    if r.journal_compared {
        j.elsewhere = r
            .held_elsewhere
            .iter()
            .map(|x| {
                (
                    (x.ours.network.clone(), x.ours.address.to_string()),
                    (
                        x.theirs.pod.to_string(),
                        x.theirs.node.clone().unwrap_or_default(),
                    ),
                )
            })
            .collect();
    }
}

/// Render the families with `family` (name, type, help, samples).
pub(super) fn families(s: &State, family: &mut impl FnMut(&str, &str, &str, Vec<(String, f64)>)) {
    let j = &s.rejoin;
    family(
        "tether_leases_taken_back_total",
        "counter",
        "Leases this node's agent wrote back for its running pods after the store released them while the node was cut off.",
        j.taken_back
            .iter()
            .map(|(n, v)| (labels(&[("network", n)]), *v as f64))
            .collect(),
    );
    family(
        "tether_address_leased_elsewhere",
        "gauge",
        "1 for each address a running pod of this node uses while the store leases it to a pod of another node (pod, node): two pods answer for it.",
        j.elsewhere
            .iter()
            .map(|((n, a), (p, node))| {
                (
                    labels(&[("network", n), ("address", a), ("pod", p), ("node", node)]),
                    1.0,
                )
            })
            .collect(),
    );
}

#[cfg(test)]
mod tests {
    use crate::metrics::Registry;
    use crate::report::{HeldElsewhere, PassReport};
    use tether_leases::{Lease, LeaseState, PodRef};

    fn lease(pod: &str, node: &str) -> Lease {
        Lease {
            network: "mgmt".into(),
            domain: None,
            address: "10.0.0.9".parse().unwrap(),
            prefix_len: 24,
            range_index: Some(0),
            container_id: "c".into(),
            ifname: "net1".into(),
            pod: PodRef::new("ml", pod, "u"),
            node: Some(node.into()),
            state: LeaseState::Leased,
            since: 1,
            version: None,
        }
    }

    #[test]
    fn taken_back_counts_and_held_elsewhere_follows_the_last_comparing_pass() {
        let r = Registry::default();
        let found = PassReport {
            taken_back: vec![lease("p", "b")],
            held_elsewhere: vec![HeldElsewhere {
                ours: lease("p", "b"),
                theirs: lease("q", "a"),
            }],
            journal_compared: true,
            ..PassReport::default()
        };
        r.record_pass(&found, true, 10);
        let text = r.render();
        assert!(
            text.contains("tether_leases_taken_back_total{network=\"mgmt\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("tether_address_leased_elsewhere{network=\"mgmt\",address=\"10.0.0.9\",pod=\"ml/q\",node=\"a\"} 1"),
            "{text}"
        );
        // A pass that could not compare keeps the finding; one that did and found none ends it.
        r.record_pass(&PassReport::default(), false, 11);
        assert!(r.render().contains("tether_address_leased_elsewhere{"));
        let clean = PassReport {
            journal_compared: true,
            ..PassReport::default()
        };
        r.record_pass(&clean, false, 12);
        let text = r.render();
        assert!(!text.contains("tether_address_leased_elsewhere{"), "{text}");
        assert!(text.contains("tether_leases_taken_back_total{network=\"mgmt\"} 1"));
    }
}
