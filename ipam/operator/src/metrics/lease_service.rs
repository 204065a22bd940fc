//! The node's lease service's families ([`tether_lease_service`]): the plugin calls it took, how
//! it answered them, and the networks it keeps by a watch.

use std::sync::atomic::Ordering;

use tether_lease_service::ServiceGauges;

use super::labels;

/// Render the lease service's families with `family` (name, type, help, samples).
pub(super) fn families(
    g: &ServiceGauges,
    family: &mut impl FnMut(&str, &str, &str, Vec<(String, f64)>),
) {
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed) as f64;
    let st = g.stats();
    family(
        "tether_lease_service_connections_total",
        "counter",
        "Plugin calls that connected to the node's lease service: welcomed, or refused (another store, busy, stopping: the plugin went straight to the API).",
        vec![
            (labels(&[("outcome", "welcomed")]), load(&st.welcomed)),
            (labels(&[("outcome", "refused")]), load(&st.refused)),
        ],
    );
    let requests = st.requests.load(Ordering::Relaxed);
    let from_cache = st.from_cache.load(Ordering::Relaxed);
    family(
        "tether_lease_service_requests_total",
        "counter",
        "Lease-store requests the lease service answered: from the networks it keeps in memory, or with an API request.",
        vec![
            (labels(&[("answered", "memory")]), from_cache as f64),
            (
                labels(&[("answered", "api")]),
                requests.saturating_sub(from_cache) as f64,
            ),
        ],
    );
    family(
        "tether_lease_service_network_records",
        "gauge",
        "Records of a network the lease service keeps by a watch; standing synced (answers from memory), filling, or off (not kept: too large, or its watch failed).",
        g.networks()
            .into_iter()
            .map(|n| {
                (
                    labels(&[("network", &n.network), ("standing", n.standing.as_str())]),
                    n.records as f64,
                )
            })
            .collect(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Registry;

    #[test]
    fn the_lease_service_shows_what_it_answered_and_how() {
        let g = ServiceGauges::default();
        let st = g.stats();
        st.welcomed.store(7, Ordering::Relaxed);
        st.refused.store(1, Ordering::Relaxed);
        st.requests.store(20, Ordering::Relaxed);
        st.from_cache.store(12, Ordering::Relaxed);
        let t = Registry::default().serving(Some(g)).render();
        for line in [
            "tether_lease_service_connections_total{outcome=\"welcomed\"} 7\n",
            "tether_lease_service_connections_total{outcome=\"refused\"} 1\n",
            "tether_lease_service_requests_total{answered=\"memory\"} 12\n",
            "tether_lease_service_requests_total{answered=\"api\"} 8\n",
            "# TYPE tether_lease_service_network_records gauge\n",
        ] {
            assert!(t.contains(line), "{line} in {t}");
        }
    }
}
