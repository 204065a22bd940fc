//! The node-agent's Prometheus metrics: a registry the reconciler and the monitor
//! ([`crate::monitor`]) fill, rendered in the text exposition format (0.0.4) by a small HTTP
//! server on its own thread (`GET /metrics`). Hand-written: a dozen metric families do not need
//! a metrics crate, and the agent stays one small static binary. docs/monitoring.md lists them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tether_kube_store::ApiTraffic;
use tether_lease_service::ServiceGauges;
use tether_leases::RangeStatus;

use crate::report::{PassReport, StoreName};

mod cni_calls;
mod endpoint;
mod guard;
mod lease_service;
mod nad_overlaps;
mod rejoin;
pub use cni_calls::{Absorbed, CniCalls};
pub use endpoint::{parse_listen_addr, serve, start};

/// Counts of one range of one network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolGauge {
    pub network: String,
    pub store: StoreName,
    /// Set for file-store pools: they are per node.
    pub node: Option<String>,
    pub status: RangeStatus,
}

/// What the agent counts and measures; shared by its threads.
#[derive(Default)]
pub struct Registry {
    state: Mutex<State>,
    /// When the reconcile loop last made progress (unix seconds; 0: not started): `/healthz`.
    heartbeat: AtomicU64,
    /// What the agent's API clients sent and read: the clients count into it, this serves it.
    traffic: ApiTraffic,
    /// The node's lease service, when this agent runs one.
    lease_service: Option<ServiceGauges>,
    /// The node's CNI calls, when this agent takes in the plugins' records.
    cni_calls: Option<CniCalls>,
}

#[derive(Default)]
struct State {
    pools: Vec<PoolGauge>,
    /// Whether this process reports the cluster-wide pools (the leading controller, or a sweeping
    /// agent that is the sweeper); `None`: not known yet.
    pool_reporter: Option<bool>,
    /// (network, store, state) → records of this node.
    node_leases: BTreeMap<(String, &'static str, &'static str), u64>,
    /// (network, address, mac) → conflicts detected.
    conflicts: BTreeMap<(String, String, String), u64>,
    /// (network, address, mac) → when, for the quarantine records of this node.
    conflict_times: BTreeMap<(String, String, String), u64>,
    /// Conflict Events: posted / failed.
    events: BTreeMap<&'static str, u64>,
    /// (network, reason) → leases released by the reconciler.
    reclaimed: BTreeMap<(String, &'static str), u64>,
    pruned: u64,
    /// "full" / "event" → passes.
    passes: BTreeMap<&'static str, u64>,
    pass_errors: u64,
    last_pass: Option<u64>,
    /// When the last pass without an error ended: the last time this agent was in sync.
    last_clean_pass: Option<u64>,
    monitor_errors: u64,
    last_monitor: Option<u64>,
    /// The controller's word on lease names: (mirrors kept, records named by network,
    /// addresses with two holders); `None` until its first pass.
    lease_names: Option<(bool, usize, usize)>,
    /// The leading controller's overlap findings by kind (`None`: not checked here).
    nad_overlaps: Option<BTreeMap<&'static str, u64>>,
    guard: guard::GuardState,
    rejoin: rejoin::RejoinState,
}

/// Label name of a store.
pub fn store_label(s: StoreName) -> &'static str {
    match s {
        StoreName::Kubernetes => "kubernetes",
        StoreName::File => "file",
    }
}

impl Registry {
    /// A registry serving the API counters of the clients given `traffic`.
    pub fn counting(traffic: ApiTraffic) -> Registry {
        Registry {
            traffic,
            ..Registry::default()
        }
    }

    /// The same, also showing the lease service's counters and networks.
    pub fn serving(mut self, lease_service: Option<ServiceGauges>) -> Registry {
        self.lease_service = lease_service;
        self
    }

    /// The same, also showing the node's CNI calls.
    pub fn with_calls(mut self, cni_calls: Option<CniCalls>) -> Registry {
        self.cni_calls = cni_calls;
        self
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Count what a reconcile pass did.
    pub fn record_pass(&self, r: &PassReport, full: bool, now: u64) {
        let mut s = self.state();
        for x in &r.released {
            let reason = match x.reason {
                tether_leases::reclaim::StaleReason::PodGone => "pod_gone",
                tether_leases::reclaim::StaleReason::PodReplaced { .. } => "pod_replaced",
                tether_leases::reclaim::StaleReason::NodeLost { .. } => "node_lost",
                tether_leases::reclaim::StaleReason::Superseded { .. } => "superseded",
            };
            *s.reclaimed
                .entry((x.lease.network.clone(), reason))
                .or_insert(0) += 1;
        }
        s.pruned += r.pruned as u64;
        *s.passes
            .entry(if full { "full" } else { "event" })
            .or_insert(0) += 1;
        s.pass_errors += r.errors.len() as u64;
        s.last_pass = Some(now);
        if r.errors.is_empty() {
            s.last_clean_pass = Some(now);
        }
        if let Some(me) = r.sweeper {
            s.pool_reporter = Some(me);
        }
        rejoin::record(&mut s, r);
    }

    /// The reconcile loop is alive at `now` (unix seconds).
    pub fn beat(&self, now: u64) {
        self.heartbeat.store(now, Ordering::Relaxed);
    }

    /// `/healthz`: the reconcile loop made progress within [`STALL_S`]. Not whether the API
    /// server answers: restarting every agent during an outage would not bring it back, and
    /// each request is bounded, so a loop that stops beating is wedged.
    pub fn health(&self, now: u64) -> Result<(), String> {
        match self.heartbeat.load(Ordering::Relaxed) {
            0 => Ok(()), // starting: its first pass is under way
            t if now.saturating_sub(t) <= STALL_S => Ok(()),
            t => Err(format!(
                "the reconcile loop has made no progress for {} s",
                now.saturating_sub(t)
            )),
        }
    }

    /// Does this process report the cluster-wide pools? (The leading controller; an agent that
    /// sweeps, on a cluster without the node-scope policy, when it is the sweeper.)
    pub fn pool_reporter(&self) -> bool {
        self.state().pool_reporter == Some(true)
    }

    /// Whether this process reports the cluster-wide pools (the controller: while it leads).
    pub fn set_pool_reporter(&self, reporter: bool) {
        self.state().pool_reporter = Some(reporter);
    }

    /// Replace the pool gauges.
    pub fn set_pools(&self, pools: Vec<PoolGauge>) {
        self.state().pools = pools;
    }

    /// The controller's last pass over lease names (see `crate::lease_names`).
    pub fn set_lease_names(&self, mirrors: bool, by_network: usize, duplicates: usize) {
        self.state().lease_names = Some((mirrors, by_network, duplicates));
    }

    /// Replace this node's record counts.
    pub fn set_node_leases(&self, counts: BTreeMap<(String, &'static str, &'static str), u64>) {
        self.state().node_leases = counts;
    }

    /// One conflict detected.
    pub fn conflict(&self, network: &str, address: &str, mac: &str) {
        *self
            .state()
            .conflicts
            .entry((network.to_string(), address.to_string(), mac.to_string()))
            .or_insert(0) += 1;
    }

    /// The quarantine records of this node now: (network, address, mac) → when.
    pub fn set_conflict_times(&self, times: BTreeMap<(String, String, String), u64>) {
        self.state().conflict_times = times;
    }

    /// One conflict Event posted (`true`) or not (`false`).
    pub fn event(&self, posted: bool) {
        *self
            .state()
            .events
            .entry(if posted { "posted" } else { "failed" })
            .or_insert(0) += 1;
    }

    /// One monitor round done at `now`, with `errors` failures.
    pub fn monitored(&self, errors: usize, now: u64) {
        let mut s = self.state();
        s.monitor_errors += errors as u64;
        s.last_monitor = Some(now);
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let s = self.state();
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, f64)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let pool = |f: fn(&RangeStatus) -> f64| -> Vec<(String, f64)> {
            s.pools
                .iter()
                .map(|p| {
                    let mut l = vec![
                        ("network", p.network.as_str()),
                        ("range", p.status.range.as_str()),
                        ("store", store_label(p.store)),
                    ];
                    if let Some(n) = &p.node {
                        l.push(("node", n));
                    }
                    (labels(&l), f(&p.status))
                })
                .collect()
        };
        family(
            "tether_pool_size",
            "gauge",
            "Usable addresses of a range of a network.",
            pool(|r| r.usable as f64),
        );
        family(
            "tether_pool_leased",
            "gauge",
            "Leased addresses of a range.",
            pool(|r| r.leased as f64),
        );
        family(
            "tether_pool_quarantined",
            "gauge",
            "Addresses of a range quarantined after a conflict probe was answered.",
            pool(|r| r.quarantined as f64),
        );
        family(
            "tether_pool_cooling",
            "gauge",
            "Released addresses of a range still in their cooldown.",
            pool(|r| r.cooling as f64),
        );
        family(
            "tether_pool_free",
            "gauge",
            "Addresses of a range an ADD could get: size - leased - quarantined.",
            pool(|r| r.free as f64),
        );
        family(
            "tether_pool_reporter",
            "gauge",
            "1 when this agent reports the pools of the cluster-wide (kubernetes) store: one agent does, the dead-node sweeper.",
            vec![(
                String::new(),
                if s.pool_reporter == Some(true) {
                    1.0
                } else {
                    0.0
                },
            )],
        );
        family(
            "tether_node_lease_records",
            "gauge",
            "Lease records of this node by network, store and state.",
            s.node_leases
                .iter()
                .map(|((n, st, state), v)| {
                    (
                        labels(&[("network", n), ("store", st), ("state", state)]),
                        *v as f64,
                    )
                })
                .collect(),
        );
        family(
            "tether_address_conflicts_total",
            "counter",
            "Address conflicts detected on this node: a probed address answered by another MAC (the address is quarantined).",
            s.conflicts
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
            "tether_address_conflict_timestamp_seconds",
            "gauge",
            "When the address answered a conflict probe on this node (unix time), while its quarantine record exists: alert on time() minus this.",
            s.conflict_times
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
            "tether_conflict_events_total",
            "counter",
            "Warning Events (reason AddressConflict) this agent posted on pods, or failed to post.",
            s.events
                .iter()
                .map(|(r, v)| (labels(&[("result", r)]), *v as f64))
                .collect(),
        );
        family(
            "tether_leases_reclaimed_total",
            "counter",
            "Leases the reconciler released because their pod is gone or was replaced.",
            s.reclaimed
                .iter()
                .map(|((n, r), v)| (labels(&[("network", n), ("reason", r)]), *v as f64))
                .collect(),
        );
        family(
            "tether_lease_records_pruned_total",
            "counter",
            "Day-old released or quarantined records of this node deleted.",
            vec![(String::new(), s.pruned as f64)],
        );
        family(
            "tether_reconcile_passes_total",
            "counter",
            "Reconcile passes: full (periodic) or event (after pod deletions).",
            ["full", "event"]
                .iter()
                .map(|k| {
                    (
                        labels(&[("kind", k)]),
                        s.passes.get(k).copied().unwrap_or(0) as f64,
                    )
                })
                .collect(),
        );
        family(
            "tether_reconcile_errors_total",
            "counter",
            "Failures within reconcile passes (each pass goes on past them; see the log).",
            vec![(String::new(), s.pass_errors as f64)],
        );
        family(
            "tether_reconcile_last_success_timestamp_seconds",
            "gauge",
            "When the last reconcile pass without an error ended (unix time): the agent was in sync with the API then.",
            s.last_clean_pass
                .map(|t| (String::new(), t as f64))
                .into_iter()
                .collect(),
        );
        family(
            "tether_reconcile_last_pass_timestamp_seconds",
            "gauge",
            "When the last reconcile pass ended (unix time).",
            s.last_pass
                .map(|t| (String::new(), t as f64))
                .into_iter()
                .collect(),
        );
        family(
            "tether_monitor_errors_total",
            "counter",
            "Failures reading leases or NetworkAttachmentDefinitions for these metrics (see the log).",
            vec![(String::new(), s.monitor_errors as f64)],
        );
        family(
            "tether_monitor_last_run_timestamp_seconds",
            "gauge",
            "When the pool and conflict metrics were last refreshed (unix time).",
            s.last_monitor
                .map(|t| (String::new(), t as f64))
                .into_iter()
                .collect(),
        );
        if let Some((mirrors, by_network, duplicates)) = s.lease_names {
            family(
                "tether_lease_names_mirrored",
                "gauge",
                "1 while leases keep mirrors under the names tether used before uniqueness domains (a node-agent of that version may run).",
                vec![(String::new(), f64::from(u8::from(mirrors)))],
            );
            family(
                "tether_lease_records_named_by_network",
                "gauge",
                "Leases still named <network>.<address>, as before uniqueness domains, when the controller last looked.",
                vec![(String::new(), by_network as f64)],
            );
            family(
                "tether_lease_duplicates",
                "gauge",
                "Addresses the controller found leased twice in one domain (one named by network, one by address): one pod must get another address.",
                vec![(String::new(), duplicates as f64)],
            );
        }
        family(
            "tether_nad_overlaps",
            "gauge",
            "Overlap findings among the cluster's NADs (the leading controller): ranges of two uniqueness domains on one master, or of one domain with another prefix or gateway.",
            nad_overlaps::samples(&s),
        );
        guard::families(&s, &mut family);
        rejoin::families(&s, &mut family);
        drop(s);
        family(
            "tether_api_requests_total",
            "counter",
            "Kubernetes API requests of this agent by verb.",
            self.traffic
                .requests()
                .into_iter()
                .map(|(v, n)| (labels(&[("verb", v)]), n as f64))
                .collect(),
        );
        family(
            "tether_api_objects_read_total",
            "counter",
            "Objects this agent received from the Kubernetes API by resource: the items of LIST answers and the events of watches.",
            self.traffic
                .objects_read()
                .into_iter()
                .map(|(r, n)| (labels(&[("resource", &r)]), n as f64))
                .collect(),
        );
        family(
            "tether_api_errors_total",
            "counter",
            "Failed Kubernetes API requests of this agent by verb and code (HTTP status, timeout, network, decode).",
            self.traffic
                .errors()
                .into_iter()
                .map(|(v, c, n)| (labels(&[("verb", v), ("code", &c)]), n as f64))
                .collect(),
        );
        if let Some(g) = &self.lease_service {
            lease_service::families(g, &mut family);
        }
        if let Some(c) = &self.cni_calls {
            out.push_str(&c.render());
        }
        out
    }
}

/// `{a="x",b="y"}` with values escaped; empty for no labels.
fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let body: Vec<String> = pairs
        .iter()
        .map(|(k, v)| {
            format!(
                "{k}=\"{}\"",
                v.replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n")
            )
        })
        .collect();
    format!("{{{}}}", body.join(","))
}

/// How long the reconcile loop may make no progress before `/healthz` fails. A pass's every
/// request is bounded (30 s), and the loop beats between requests.
pub const STALL_S: u64 = 120;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_format() {
        let r = Registry::default();
        r.set_pools(vec![PoolGauge {
            network: "mgmt".into(),
            store: StoreName::Kubernetes,
            node: None,
            status: RangeStatus {
                range: "10.0.0.241-10.0.0.250".into(),
                usable: 10,
                leased: 9,
                quarantined: 1,
                cooling: 0,
                free: 0,
            },
        }]);
        r.conflict("mgmt", "10.0.0.245", "02:00:00:00:00:01");
        r.conflict("mgmt", "10.0.0.245", "02:00:00:00:00:01");
        let t = r.render();
        assert!(t.contains("# TYPE tether_pool_size gauge\ntether_pool_size{network=\"mgmt\",range=\"10.0.0.241-10.0.0.250\",store=\"kubernetes\"} 10\n"), "{t}");
        assert!(t.contains("tether_pool_leased{network=\"mgmt\",range=\"10.0.0.241-10.0.0.250\",store=\"kubernetes\"} 9\n"), "{t}");
        assert!(t.contains("tether_address_conflicts_total{network=\"mgmt\",address=\"10.0.0.245\",mac=\"02:00:00:00:00:01\"} 2\n"), "{t}");
        assert!(
            t.contains("tether_pool_reporter 0\n")
                && t.contains("tether_reconcile_passes_total{kind=\"full\"} 0\n"),
            "{t}"
        );
        // Every sample line belongs to the family announced above it.
        let mut family = String::new();
        for l in t.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap().to_string();
            } else if !l.starts_with('#') {
                assert!(l.starts_with(&family), "{l} outside {family}");
            }
        }
        assert_eq!(labels(&[("a", "x\"y\\z\nw")]), "{a=\"x\\\"y\\\\z\\nw\"}");
        assert!(
            !t.contains("tether_lease_service"),
            "no lease service, no lease-service families"
        );
    }
}
