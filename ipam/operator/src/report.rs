//! What a reconciler pass did: the report each pass returns, the metrics record and the CLI prints.

use tether_leases::Lease;
use tether_leases::reclaim::StaleReason;

/// Which store a lease was in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreName {
    /// The cluster-wide IPLease store.
    Kubernetes,
    /// The node-local file store.
    File,
}

/// One release done by a pass.
#[derive(Debug, Clone)]
pub struct Released {
    /// Where.
    pub store: StoreName,
    /// The lease as it was before the release.
    pub lease: Lease,
    /// Why.
    pub reason: StaleReason,
}

/// What one pass did.
#[derive(Debug, Clone, Default)]
pub struct PassReport {
    /// Leases released.
    pub released: Vec<Released>,
    /// Conditional releases that lost a race (the record changed since it was read): fine.
    pub lost_races: usize,
    /// Candidates whose pod the API server still reports alive (the cache lagged).
    pub confirmed_alive: usize,
    /// Leases looked at.
    pub examined: usize,
    /// Old `Released` and `Quarantined` records of this node deleted (past
    /// [`Policy::retain_released_s`](tether_leases::Policy::retain_released_s)).
    pub pruned: usize,
    /// Whether the dead-node sweep ran (this agent was the sweeper among the agent nodes).
    pub swept: bool,
    /// Whether this agent is the sweeper, when the pass listed the agent nodes (full passes).
    pub sweeper: Option<bool>,
    /// Failures (the pass went on past each).
    pub errors: Vec<String>,
    /// Unix time when a lease now inside its grace period (and whose pod the cache does not
    /// know) leaves it: a pass is due then.
    pub next_due: Option<u64>,
}

pub(crate) fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A pass is due at unix time `t` (the earliest of those asked for).
pub(crate) fn due_at(r: &mut PassReport, t: u64) {
    r.next_due = Some(r.next_due.map_or(t, |d| d.min(t)));
}

pub(crate) fn log_report(r: &PassReport, full: bool) {
    for e in &r.errors {
        log::error!("reconcile: {e}");
    }
    if !r.released.is_empty() || r.lost_races > 0 || r.pruned > 0 {
        log::warn!(
            "reconcile ({}): {} record(s) examined, {} released, {} old record(s) deleted, {} changed meanwhile, {} alive after all",
            if full { "full pass" } else { "pod event" },
            r.examined,
            r.released.len(),
            r.pruned,
            r.lost_races,
            r.confirmed_alive
        );
    } else {
        log::debug!(
            "reconcile ({}): {} record(s) examined, nothing to release",
            if full { "full pass" } else { "pod event" },
            r.examined
        );
    }
}

/// One line per release, for `--once` and tests.
pub fn describe(r: &Released) -> String {
    format!(
        "released {} network {} ({}) pod {} uid {}: {}",
        r.lease.address,
        r.lease.network,
        match r.store {
            StoreName::Kubernetes => "kubernetes",
            StoreName::File => "file",
        },
        r.lease.pod,
        r.lease.pod.uid.as_deref().unwrap_or("?"),
        r.reason
    )
}
