//! The allocation engine: ADD, DEL, CHECK, GC and STATUS over any [`LeaseStore`].
//!
//! The engine never holds a store lock across calls: it reads a snapshot, then claims single
//! records with compare-and-swap, moving on to the next candidate when a claim loses a race, and
//! probes what it claimed with no lock held.
//!
//! One file per question:
//!
//! - `error`: what can go wrong ([`AllocError`]);
//! - `add`: ADD — the order of candidates, the node journal, all or nothing;
//! - `walk`: where a new address comes from (the pool walks, point reads or one snapshot);
//! - `claim`: taking one address (compare-and-swap, probe, quarantine);
//! - `probe_step`: the conflict probe of an ADD, every range's address in one step;
//! - `rollback`: undoing what a failed ADD wrote;
//! - `release`: DEL;
//! - `check`: CHECK;
//! - `gc`: GC ([`GcReport`]);
//! - `offline`: what the node journal answers while the store is unreachable, and settling up;
//! - `prune`: deleting old released and quarantine records (DEL and GC);
//! - `status`: STATUS and usage counts ([`RangeStatus`]).

use tether_pool::{IpRange, PoolConfig};

use crate::clock::Clock;
use crate::model::{Lease, Scope};
use crate::probe::Prober;
use crate::store::LeaseStore;

mod add;
mod call;
mod check;
mod claim;
mod error;
mod gc;
mod offline;
mod probe_step;
mod prune;
mod release;
mod rollback;
mod status;
mod walk;

pub use add::AddRequest;
pub use error::AllocError;
pub use gc::GcReport;
pub use probe_step::AddOutcome;
pub use status::RangeStatus;
pub use walk::{start_offset, walk_start};

/// Timing and limits of the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// A released address goes to another pod only after this many seconds (unless nothing
    /// else is free). 0 → at once.
    pub cooldown_s: u64,
    /// An address a probe found in use is not offered for this many seconds.
    pub quarantine_s: u64,
    /// Released records (and expired quarantine records) older than this and past their
    /// cooldown/quarantine are deleted by DEL (a few at a time) and GC. Sticky re-use works
    /// within this window. Default one day.
    pub retain_released_s: u64,
    /// At most this many probe conflicts per range per ADD before giving up. Default 16.
    pub max_probe_conflicts: usize,
    /// Compare-and-swap attempts on one specific address (requested, sticky, re-create, DEL)
    /// before giving up. Default 8.
    pub max_attempts: usize,
    /// At most this many old records are pruned by one DEL. Default 16.
    pub prune_per_del: usize,
    /// Point mode (a store with a node journal): reads of single records one ADD makes in a
    /// range before it takes one snapshot of the network instead. Default 32.
    pub max_point_reads: usize,
    /// Point mode: once a free record of another pod is found, how many more candidates are
    /// read looking for an address nobody had, or this pod's own previous one. Default 4.
    pub sticky_horizon: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            cooldown_s: tether_pool::config::DEFAULT_COOLDOWN_S,
            quarantine_s: tether_pool::config::DEFAULT_QUARANTINE_S,
            retain_released_s: 86_400,
            max_probe_conflicts: 16,
            max_attempts: 8,
            prune_per_del: 16,
            max_point_reads: 32,
            sticky_horizon: 4,
        }
    }
}

impl Policy {
    /// Defaults with `cooldown_s` and `quarantine_s` from the config.
    pub fn from_config(cfg: &PoolConfig) -> Policy {
        Policy {
            cooldown_s: cfg.cooldown_s,
            quarantine_s: cfg.quarantine_s,
            ..Policy::default()
        }
    }
}

/// The allocation engine for one network in its uniqueness domain. See the crate docs for the
/// semantics.
pub struct Allocator<'a> {
    scope: Scope,
    ranges: Vec<IpRange>,
    policy: Policy,
    store: &'a dyn LeaseStore,
    prober: &'a dyn Prober,
    clock: &'a dyn Clock,
}

impl<'a> Allocator<'a> {
    /// An engine for the network and domain of `scope`, with `ranges`.
    pub fn new(
        scope: Scope,
        ranges: Vec<IpRange>,
        policy: Policy,
        store: &'a dyn LeaseStore,
        prober: &'a dyn Prober,
        clock: &'a dyn Clock,
    ) -> Allocator<'a> {
        Allocator {
            scope,
            ranges,
            policy,
            store,
            prober,
            clock,
        }
    }

    /// An engine for the network, domain, ranges, cooldown and quarantine of `cfg`.
    pub fn from_config(
        cfg: &PoolConfig,
        store: &'a dyn LeaseStore,
        prober: &'a dyn Prober,
        clock: &'a dyn Clock,
    ) -> Allocator<'a> {
        Allocator::new(
            Scope::new(cfg.network_name.clone(), cfg.domain.clone()),
            cfg.ranges.clone(),
            Policy::from_config(cfg),
            store,
            prober,
            clock,
        )
    }

    /// The network and its domain.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The range entry a record belongs to: its recorded `range_index` if that range still
    /// holds the address, else the first range that does.
    fn range_of(&self, l: &Lease) -> Option<usize> {
        if let Some(ri) = l.range_index
            && self.ranges.get(ri).is_some_and(|r| r.contains(l.address))
        {
            return Some(ri);
        }
        self.ranges.iter().position(|r| r.contains(l.address))
    }
}
