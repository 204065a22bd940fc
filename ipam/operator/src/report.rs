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

/// An address this node's running pod uses while the store leases it to another node's pod
/// (see [`crate::reconcile`]'s rejoin).
#[derive(Debug, Clone)]
pub struct HeldElsewhere {
    /// This node's attachment, as its journal names it.
    pub ours: Lease,
    /// The store's record.
    pub theirs: Lease,
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
    /// Leases this node's running pods use that the store had released or lost (a partition),
    /// written back as theirs.
    pub taken_back: Vec<Lease>,
    /// Addresses this node's running pods use that the store leases to another node's pod.
    pub held_elsewhere: Vec<HeldElsewhere>,
    /// Whether the node's journal was compared with the store (so `held_elsewhere` is the
    /// whole finding, not a pass that could not look).
    pub journal_compared: bool,
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
    if !r.released.is_empty()
        || r.lost_races > 0
        || r.pruned > 0
        || !r.taken_back.is_empty()
        || !r.held_elsewhere.is_empty()
    {
        log::warn!(
            "reconcile ({}): {} record(s) examined, {} released, {} taken back, {} leased elsewhere, {} old record(s) deleted, {} changed meanwhile, {} alive after all",
            if full { "full pass" } else { "pod event" },
            r.examined,
            r.released.len(),
            r.taken_back.len(),
            r.held_elsewhere.len(),
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
