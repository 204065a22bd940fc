//! The conflict guard's families ([`crate::conflict_guard`]): claims another MAC made on the wire
//! on addresses leased to this node's pods, what each interface watches, and the frames the
//! kernel dropped before the guard read them.

use std::collections::BTreeMap;

use super::{Registry, State, labels};

/// How long the time of a claim is served after it was last reported: an alert over it fires
/// for its own window (15 min) and then quiets; the counter keeps the total.
const CLAIM_TIME_KEPT_S: u64 = 3600;

/// What the guard counts.
#[derive(Default)]
pub(super) struct GuardState {
    /// (network, address, mac) → claims reported.
    claims: BTreeMap<(String, String, String), u64>,
    /// (network, address, mac) → when last reported (unix seconds), for an hour.
    claim_times: BTreeMap<(String, String, String), u64>,
    /// Interface → addresses watched on it.
    watched: BTreeMap<String, u64>,
    /// Interface → frames dropped for a full receive queue.
    dropped: BTreeMap<String, u64>,
}

impl Registry {
    /// One claim on `address` of `network` by `mac`, reported at `at` (unix seconds).
    pub fn claim(&self, network: &str, address: &str, mac: &str, at: u64) {
        let key = (network.to_string(), address.to_string(), mac.to_string());
        let mut s = self.state();
        *s.guard.claims.entry(key.clone()).or_insert(0) += 1;
        s.guard
            .claim_times
            .retain(|_, t| at.saturating_sub(*t) < CLAIM_TIME_KEPT_S);
        s.guard.claim_times.insert(key, at);
    }

    /// The addresses watched by interface (interfaces not named watch nothing now).
    pub fn set_guarded(&self, watched: BTreeMap<String, u64>) {
        let mut s = self.state();
        for i in watched.keys() {
            s.guard.dropped.entry(i.clone()).or_insert(0);
        }
        s.guard.watched = watched;
    }

    /// Frames the kernel dropped on `interface` before the guard read them.
    pub fn guard_dropped(&self, interface: &str, n: u64) {
        *self
            .state()
            .guard
            .dropped
            .entry(interface.into())
            .or_insert(0) += n;
    }
}

/// Render the guard's families with `family` (name, type, help, samples).
pub(super) fn families(s: &State, family: &mut impl FnMut(&str, &str, &str, Vec<(String, f64)>)) {
    let g = &s.guard;
    family(
        "tether_address_claims_total",
        "counter",
        "Claims seen on the wire by the conflict guard: another MAC speaking as an address leased to a pod of this node.",
        g.claims
            .iter()
            .map(|((n, a, m), v)| {
                (
                    labels(&[("network", n), ("address", a), ("mac", m)]),
                    *v as f64,
                )
            })
            .collect(),
    );
    family(
        "tether_address_claim_timestamp_seconds",
        "gauge",
        "When the conflict guard last reported another MAC claiming the address (unix time), for an hour: alert on time() minus this.",
        g.claim_times
            .iter()
            .map(|((n, a, m), v)| {
                (
                    labels(&[("network", n), ("address", a), ("mac", m)]),
                    *v as f64,
                )
            })
            .collect(),
    );
    let by_interface = |m: &BTreeMap<String, u64>| {
        m.iter()
            .map(|(i, v)| (labels(&[("interface", i)]), *v as f64))
            .collect()
    };
    family(
        "tether_guard_watched_addresses",
        "gauge",
        "Addresses of this node's pods the conflict guard watches, by host interface.",
        by_interface(&g.watched),
    );
    family(
        "tether_guard_frames_dropped_total",
        "counter",
        "ARP/NDP frames the kernel dropped before the conflict guard read them (its queue was full).",
        by_interface(&g.dropped),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_and_interfaces_are_rendered() {
        let r = Registry::default();
        r.claim("mgmt", "10.0.0.4", "02:00:00:00:00:08", 1_000);
        r.claim("mgmt", "10.0.0.5", "02:00:00:00:00:09", 5_000);
        r.claim("mgmt", "10.0.0.5", "02:00:00:00:00:09", 5_060);
        r.set_guarded(BTreeMap::from([("eth1".to_string(), 3)]));
        r.guard_dropped("eth1", 7);
        let t = r.render();
        for want in [
            "tether_address_claims_total{network=\"mgmt\",address=\"10.0.0.5\",mac=\"02:00:00:00:00:09\"} 2\n",
            "tether_address_claim_timestamp_seconds{network=\"mgmt\",address=\"10.0.0.5\",mac=\"02:00:00:00:00:09\"} 5060\n",
            "tether_guard_watched_addresses{interface=\"eth1\"} 3\n",
            "tether_guard_frames_dropped_total{interface=\"eth1\"} 7\n",
        ] {
            assert!(t.contains(want), "{want} not in:\n{t}");
        }
        assert!(
            !t.contains(
                "tether_address_claim_timestamp_seconds{network=\"mgmt\",address=\"10.0.0.4\""
            ),
            "a claim time is served for an hour: {t}"
        );
        r.set_guarded(BTreeMap::new());
        assert!(!r.render().contains("tether_guard_watched_addresses{"));
    }
}
