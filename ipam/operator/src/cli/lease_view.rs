//! A lease as the operator shows it: the IPLease's own field and state names (so `tether leases`
//! and `kubectl get ipleases` say the same), RFC 3339 times, and the table columns.

use serde_json::{Value, json};
use tether_kube_store::{ClaimMark, time_text};
use tether_leases::{Lease, LeaseState, short_id};

/// `5s`, `3m`, `2h`, `4d`.
pub fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// The CRD's name of a state.
pub fn state_name(s: &LeaseState) -> &'static str {
    match s {
        LeaseState::Leased => "Leased",
        LeaseState::Released { .. } => "Released",
        LeaseState::Quarantined { .. } => "Quarantined",
    }
}

/// `namespace/name`, else the container it was leased to.
pub fn pod_text(l: &Lease) -> String {
    match (&l.pod.namespace, &l.pod.name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n.clone(),
        _ => format!("(container {})", short_id(&l.container_id)),
    }
}

/// What `release` and `-o name` take: `<network>/<address>`.
pub fn lease_name(l: &Lease) -> String {
    format!("{}/{}", l.network, l.address)
}

/// A time as RFC 3339 (a time past what RFC 3339 can say, which no store writes, as its seconds).
fn time(secs: u64) -> Value {
    match time_text(secs) {
        Ok(t) => json!(t),
        Err(_) => json!(secs),
    }
}

/// A lease as JSON or YAML shows it: the IPLease spec's fields, and its age.
pub fn lease_json(l: &Lease, now: u64) -> Value {
    let mut v = json!({
        "network": l.network,
        "isolatedFabric": l.domain,
        "address": l.address.to_string(),
        "prefixLength": l.prefix_len,
        "containerID": l.container_id,
        "ifname": l.ifname,
        "pod": { "namespace": l.pod.namespace, "name": l.pod.name, "uid": l.pod.uid },
        "node": l.node,
        "state": state_name(&l.state),
        "since": time(l.since),
        "ageSeconds": now.saturating_sub(l.since),
    });
    match &l.state {
        LeaseState::Leased => {}
        LeaseState::Released { at } => v["releasedAt"] = time(*at),
        LeaseState::Quarantined { mac, at } => {
            v["quarantine"] = json!({ "mac": mac, "at": time(*at) })
        }
    }
    v
}

/// The table's header; `wide` adds the fabric, the container and a quarantine's MAC.
pub fn header(wide: bool) -> Vec<&'static str> {
    let mut h = vec![
        "NETWORK",
        "ADDRESS",
        "POD",
        "INTERFACE",
        "NODE",
        "STATE",
        "AGE",
    ];
    if wide {
        h.extend(["ISOLATED-FABRIC", "CONTAINER", "MAC"]);
    }
    h
}

/// The columns of [`header`] that a claim mark changes.
const STATE_COLUMN: usize = 5;
const MAC_COLUMN: usize = 9;

/// The conflict guard's mark on a Leased record, in its JSON: `claimedBy`.
pub fn mark_json(v: &mut Value, m: &ClaimMark) {
    v["claimedBy"] = json!({ "mac": m.mac, "at": time(m.at) });
}

/// The conflict guard's mark on a Leased record, in its row: the state says who claimed the
/// address and when; the wide MAC column is the claimant's.
pub fn mark_row(r: &mut [String], m: &ClaimMark, now: u64) {
    r[STATE_COLUMN] = format!(
        "{}, claimed by {} {} ago",
        r[STATE_COLUMN],
        m.mac,
        age(now.saturating_sub(m.at))
    );
    if let Some(mac) = r.get_mut(MAC_COLUMN) {
        *mac = m.mac.clone();
    }
}

/// One lease's row under [`header`].
pub fn row(l: &Lease, now: u64, wide: bool) -> Vec<String> {
    let mut r = vec![
        l.network.clone(),
        format!("{}/{}", l.address, l.prefix_len),
        pod_text(l),
        l.ifname.clone(),
        l.node.clone().unwrap_or_default(),
        state_name(&l.state).to_string(),
        age(now.saturating_sub(l.since)),
    ];
    if wide {
        r.extend([
            l.domain.clone().unwrap_or_else(|| "-".into()),
            short_id(&l.container_id).to_string(),
            match &l.state {
                LeaseState::Quarantined { mac, .. } => mac.clone(),
                _ => "-".into(),
            },
        ]);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_leases::PodRef;

    fn lease(state: LeaseState) -> Lease {
        Lease {
            network: "mgmt".into(),
            domain: None,
            address: "10.0.0.5".parse().unwrap(),
            prefix_len: 24,
            range_index: None,
            container_id: "0123456789abcdef".into(),
            ifname: "net1".into(),
            pod: PodRef {
                namespace: Some("ml".into()),
                name: Some("trainer-0".into()),
                uid: None,
            },
            node: Some("n1".into()),
            state,
            since: 1_700_000_000,
            version: None,
        }
    }

    #[test]
    fn ages_read_well() {
        assert_eq!(age(5), "5s");
        assert_eq!(age(600), "10m");
        assert_eq!(age(3 * 3600), "3h");
        assert_eq!(age(5 * 86_400), "5d");
    }

    #[test]
    fn json_speaks_the_crds_words_and_rfc3339() {
        let v = lease_json(&lease(LeaseState::Leased), 1_700_000_060);
        assert_eq!(v["state"], "Leased");
        assert_eq!(v["since"], "2023-11-14T22:13:20Z");
        assert_eq!(v["ageSeconds"], 60);
        assert_eq!(v["ifname"], "net1");
        assert!(v.get("releasedAt").is_none());
        let q = lease_json(
            &lease(LeaseState::Quarantined {
                mac: "02:00:00:00:00:01".into(),
                at: 1_700_000_000,
            }),
            0,
        );
        assert_eq!(q["state"], "Quarantined");
        assert_eq!(q["quarantine"]["mac"], "02:00:00:00:00:01");
        assert_eq!(q["quarantine"]["at"], "2023-11-14T22:13:20Z");
        let r = lease_json(&lease(LeaseState::Released { at: 1_700_000_000 }), 0);
        assert_eq!(r["releasedAt"], "2023-11-14T22:13:20Z");
    }

    #[test]
    fn rows_fit_their_header() {
        let l = lease(LeaseState::Leased);
        for wide in [false, true] {
            assert_eq!(row(&l, 0, wide).len(), header(wide).len());
        }
        assert_eq!(row(&l, 0, false)[3], "net1");
        assert_eq!(lease_name(&l), "mgmt/10.0.0.5");
    }

    #[test]
    fn a_claim_mark_shows_in_the_state_and_the_mac() {
        let l = lease(LeaseState::Leased);
        let m = ClaimMark {
            mac: "02:00:00:00:00:99".into(),
            at: 1_700_000_000,
        };
        for wide in [false, true] {
            let mut r = row(&l, 1_700_000_040, wide);
            mark_row(&mut r, &m, 1_700_000_040);
            assert_eq!(
                r[STATE_COLUMN],
                "Leased, claimed by 02:00:00:00:00:99 40s ago"
            );
            assert_eq!(header(wide)[STATE_COLUMN], "STATE");
            if wide {
                assert_eq!(
                    (header(wide)[MAC_COLUMN], r[MAC_COLUMN].as_str()),
                    ("MAC", "02:00:00:00:00:99")
                );
            }
        }
        let mut v = lease_json(&l, 0);
        mark_json(&mut v, &m);
        assert_eq!(v["claimedBy"]["mac"], "02:00:00:00:00:99");
        assert_eq!(v["claimedBy"]["at"], "2023-11-14T22:13:20Z");
    }
}
