//! The allocation engine: ADD, DEL, CHECK, GC and STATUS over any [`LeaseStore`].
//!
//! The engine never holds a store lock across calls: it reads a snapshot, then claims single
//! records with compare-and-swap, probes the claimed address with no lock held, and moves on to
//! the next candidate when a claim loses a race.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use tether_pool::{IpRange, PoolConfig, RequestError, RequestedIp};

use crate::clock::Clock;
use crate::hash::{fnv1a64, mix64};
use crate::journal::{AttachmentIndex, JournalEntry, Lookup};
use crate::model::{Attachment, Lease, LeaseState, PodRef};
use crate::probe::{ProbeError, ProbeOutcome, Prober};
use crate::store::{LeaseStore, StoreError, Taken};

/// Errors of the allocation engine. Messages name addresses, ranges and holders.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// The lease store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A requested address is malformed or outside every range.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// Two requested addresses fall in the same range entry.
    #[error(
        "requested addresses {first} and {second} are both in range {range}: request at most one address per range"
    )]
    DuplicateRequest {
        /// First request.
        first: IpAddr,
        /// Second request.
        second: IpAddr,
        /// The range.
        range: String,
    },
    /// A requested address is leased by another attachment.
    #[error(
        "requested address {address} is held by pod {holder} (container {container_id}, interface {ifname})"
    )]
    HeldByOther {
        /// The address.
        address: IpAddr,
        /// Holder pod, `namespace/name` or `(unknown pod)`.
        holder: String,
        /// Holder container ID.
        container_id: String,
        /// Holder interface.
        ifname: String,
    },
    /// The attachment already holds another address in the range of a requested one.
    #[error(
        "container {container_id} interface {ifname} already holds {existing} in range {range}, \
         but {requested} was requested: DEL the attachment first"
    )]
    AttachmentHasOther {
        /// Container ID.
        container_id: String,
        /// Interface.
        ifname: String,
        /// Address it holds.
        existing: IpAddr,
        /// Address requested.
        requested: IpAddr,
        /// The range.
        range: String,
    },
    /// The conflict probe found a requested address in use.
    #[error(
        "requested address {address} is already in use on the network by MAC {mac} (conflict probe); \
         it is quarantined for {quarantine_s}s"
    )]
    RequestedInUse {
        /// The address.
        address: IpAddr,
        /// The MAC that answered.
        mac: String,
        /// Quarantine length.
        quarantine_s: u64,
    },
    /// The conflict probe could not run.
    #[error(
        "conflict probe for {address} failed: {source} (set \"probe\": false in the ipam config to skip probing)"
    )]
    Probe {
        /// The address.
        address: IpAddr,
        /// Cause.
        source: ProbeError,
    },
    /// No address is free in a range.
    #[error(
        "no free address in range {range} of network {network}: {usable} usable, {leased} leased, \
         {quarantined} quarantined, {cooling} cooling down"
    )]
    Exhausted {
        /// Network.
        network: String,
        /// The range.
        range: String,
        /// Usable addresses in the range.
        usable: u128,
        /// Leased records in the range.
        leased: usize,
        /// Records in quarantine.
        quarantined: usize,
        /// Released records still within the cooldown.
        cooling: usize,
    },
    /// Too many candidates in a row answered the conflict probe.
    #[error(
        "range {range} of network {network}: {conflicts} candidates answered the conflict probe \
         (last {last} from MAC {mac}); something else hands out addresses from this range"
    )]
    TooManyConflicts {
        /// Network.
        network: String,
        /// The range.
        range: String,
        /// How many.
        conflicts: usize,
        /// Last conflicting address.
        last: IpAddr,
        /// Its MAC.
        mac: String,
    },
    /// No address is left in a range, and candidates answered the conflict probe during this ADD:
    /// the range is used by something else on the segment. The answered addresses are quarantined.
    #[error(
        "no free address in range {range} of network {network}: {} answered the conflict probe during this ADD \
         and {} in use on the segment ({}), now quarantined; {usable} usable, {leased} leased, \
         {quarantined} quarantined, {cooling} cooling down",
        if in_use.len() == 1 { "the last candidate".to_string() } else { format!("{} candidates", in_use.len()) },
        if in_use.len() == 1 { "is" } else { "are" },
        in_use.iter().map(|(a, m)| format!("{a} by MAC {m}")).collect::<Vec<_>>().join(", ")
    )]
    InUseOnSegment {
        /// Network.
        network: String,
        /// The range.
        range: String,
        /// The addresses that answered in this ADD, with the answering MAC, in probe order
        /// (boxed: keeps `AllocError` small).
        in_use: Box<[(IpAddr, String)]>,
        /// Usable addresses in the range.
        usable: u128,
        /// Leased records in the range.
        leased: usize,
        /// Records in quarantine (including the ones above).
        quarantined: usize,
        /// Released records still within the cooldown.
        cooling: usize,
    },
    /// A specific address kept changing under us.
    #[error(
        "gave up on {address} in network {network} after {attempts} concurrent changes; try again"
    )]
    Contention {
        /// Network.
        network: String,
        /// The address.
        address: IpAddr,
        /// Attempts made.
        attempts: usize,
    },
    /// CHECK: the attachment holds no lease.
    #[error(
        "container {container_id} interface {ifname} holds no lease in network {network}{detail}"
    )]
    NoLease {
        /// Network.
        network: String,
        /// Container ID.
        container_id: String,
        /// Interface.
        ifname: String,
        /// Extra detail (starts with "; " when not empty).
        detail: String,
    },
    /// CHECK: the attachment holds no lease in one of the ranges.
    #[error(
        "container {container_id} interface {ifname} holds no lease in range {range} of network {network}"
    )]
    MissingRange {
        /// Network.
        network: String,
        /// Container ID.
        container_id: String,
        /// Interface.
        ifname: String,
        /// The range.
        range: String,
    },
    /// GC could not release some leases.
    #[error("garbage collection of network {network} failed for {} record(s): {}", failures.len(), failures.join("; "))]
    Gc {
        /// Network.
        network: String,
        /// One message per failure.
        failures: Vec<String>,
    },
}

impl AllocError {
    /// Worth retrying later (CNI code 11)?
    pub fn is_transient(&self) -> bool {
        match self {
            AllocError::Store(e) => e.is_transient(),
            AllocError::Contention { .. } => true,
            _ => false,
        }
    }
}

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

/// An ADD.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AddRequest {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// Pod identity from `CNI_ARGS`.
    pub pod: PodRef,
    /// Node name, recorded on the lease.
    pub node: Option<String>,
    /// Requested addresses (at most one per range entry).
    pub requested: Vec<RequestedIp>,
}

/// Result of GC.
#[derive(Debug, Default)]
pub struct GcReport {
    /// Leases released because their attachment is not valid any more.
    pub released: Vec<Lease>,
    /// Old released/quarantine records deleted.
    pub pruned: usize,
    /// What failed (GC kept going).
    pub errors: Vec<AllocError>,
}

impl GcReport {
    /// `Err(AllocError::Gc)` listing every failure, if there was any.
    pub fn into_result(self, network: &str) -> Result<GcReport, AllocError> {
        if self.errors.is_empty() {
            Ok(self)
        } else {
            Err(AllocError::Gc {
                network: network.to_string(),
                failures: self.errors.iter().map(|e| e.to_string()).collect(),
            })
        }
    }
}

/// Occupancy of one range (STATUS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeStatus {
    /// The range, displayed.
    pub range: String,
    /// Usable addresses.
    pub usable: u128,
    /// Leased records.
    pub leased: usize,
    /// Active quarantine records.
    pub quarantined: usize,
    /// Released records within the cooldown (still allocatable as a last resort).
    pub cooling: usize,
    /// Addresses an ADD could get: `usable - leased - quarantined`.
    pub free: u128,
}

/// The allocation engine for one network. See the crate docs for the semantics.
pub struct Allocator<'a> {
    network: String,
    ranges: Vec<IpRange>,
    policy: Policy,
    store: &'a dyn LeaseStore,
    prober: &'a dyn Prober,
    clock: &'a dyn Clock,
}

/// A record this ADD wrote, with the record it replaced (for rollback).
struct Written {
    now: Lease,
    prev: Option<Lease>,
}

#[allow(clippy::large_enum_variant)]
enum Claimed {
    Got(Lease),
    Lost,
    InUse(String),
}

/// The node journal while an ADD runs (point mode).
struct Journaling<'j> {
    index: &'j dyn AttachmentIndex,
    /// This attachment's entry: every address it holds or is about to claim.
    entry: JournalEntry,
    /// What the journal knew before the ADD.
    lookup: Lookup,
}

/// What one ADD has read and written.
#[derive(Default)]
struct Call<'j> {
    /// Records known: every record of the network once `complete` (a snapshot), else those
    /// read so far.
    view: HashMap<IpAddr, Lease>,
    /// Point mode: the addresses read or written (present in `view` or known absent).
    seen: HashSet<IpAddr>,
    complete: bool,
    /// Records written, for rollback.
    written: Vec<Written>,
    journal: Option<Journaling<'j>>,
}

/// Probe conflicts met in one range during one ADD.
#[derive(Default)]
struct Conflicts {
    in_use: Vec<(IpAddr, String)>,
}

impl Conflicts {
    /// Count one; too many in a row means something else hands out this range.
    fn add(&mut self, a: &Allocator<'_>, range: &IpRange, address: IpAddr, mac: String) -> Result<(), AllocError> {
        self.in_use.push((address, mac.clone()));
        if self.in_use.len() >= a.policy.max_probe_conflicts {
            return Err(AllocError::TooManyConflicts {
                network: a.network.clone(),
                range: range.to_string(),
                conflicts: self.in_use.len(),
                last: address,
                mac,
            });
        }
        Ok(())
    }
}

#[derive(PartialEq, Eq)]
enum Class {
    Free,
    Blocked,
    Cooling,
}

impl<'a> Allocator<'a> {
    /// An engine for `network` with `ranges`.
    pub fn new(
        network: impl Into<String>,
        ranges: Vec<IpRange>,
        policy: Policy,
        store: &'a dyn LeaseStore,
        prober: &'a dyn Prober,
        clock: &'a dyn Clock,
    ) -> Allocator<'a> {
        Allocator {
            network: network.into(),
            ranges,
            policy,
            store,
            prober,
            clock,
        }
    }

    /// An engine for the network, ranges, cooldown and quarantine of `cfg`.
    pub fn from_config(
        cfg: &PoolConfig,
        store: &'a dyn LeaseStore,
        prober: &'a dyn Prober,
        clock: &'a dyn Clock,
    ) -> Allocator<'a> {
        Allocator::new(
            cfg.network_name.clone(),
            cfg.ranges.clone(),
            Policy::from_config(cfg),
            store,
            prober,
            clock,
        )
    }

    /// The network name.
    pub fn network(&self) -> &str {
        &self.network
    }

    /// The ranges.
    pub fn ranges(&self) -> &[IpRange] {
        &self.ranges
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// ADD: one lease per range entry, in range order (`result[i].range_index == Some(i)` for
    /// new leases). Idempotent per (container_id, ifname). All or nothing: if any range fails,
    /// every record written by this call is restored and the error returned.
    ///
    /// With a store that keeps a node journal ([`LeaseStore::index`]) the ADD reads single
    /// records instead of a snapshot: see `walk_points`.
    pub fn add(&self, req: &AddRequest) -> Result<Vec<Lease>, AllocError> {
        let mut wanted: Vec<Option<RequestedIp>> = vec![None; self.ranges.len()];
        for r in &req.requested {
            let i = r.find_range(&self.ranges)?;
            match wanted[i] {
                Some(prev) if prev.address != r.address => {
                    return Err(AllocError::DuplicateRequest {
                        first: prev.address,
                        second: r.address,
                        range: self.ranges[i].to_string(),
                    });
                }
                Some(_) => {}
                None => wanted[i] = Some(*r),
            }
        }
        let mut call = match self.store.index() {
            Some(ix) => {
                let lookup = ix.lookup(&self.network, &req.container_id, &req.ifname, &req.pod)?;
                let entry = JournalEntry {
                    container_id: req.container_id.clone(),
                    ifname: req.ifname.clone(),
                    pod: req.pod.clone(),
                    leases: lookup.mine.as_ref().map(|e| e.leases.clone()).unwrap_or_default(),
                };
                Call {
                    view: HashMap::new(),
                    seen: HashSet::new(),
                    complete: false,
                    written: Vec::new(),
                    journal: Some(Journaling { index: ix, entry, lookup }),
                }
            }
            None => {
                let mut call = Call::default();
                self.snapshot(&mut call)?;
                call
            }
        };
        let mut out = Vec::with_capacity(self.ranges.len());
        let mut failed = None;
        for (i, w) in wanted.iter().enumerate() {
            match self.add_one(i, req, *w, &mut call) {
                Ok(l) => out.push(l),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let kept = match &failed {
            Some(_) => {
                // What the attachment held before this call stays journaled, with whatever
                // could not be rolled back.
                let mut kept = self.rollback(std::mem::take(&mut call.written));
                if let Some(j) = &call.journal {
                    for l in j.lookup.mine.iter().flat_map(|e| &e.leases) {
                        if !kept.iter().any(|k| k.address == l.address) {
                            kept.push(l.clone());
                        }
                    }
                }
                kept
            }
            None => out.clone(),
        };
        if let Some(j) = &mut call.journal {
            // What this attachment holds now; anything it was about to claim and did not is
            // dropped (or the whole entry, when the ADD failed and was rolled back).
            j.entry.leases = kept;
            if let Err(e) = j.index.record(&self.network, &j.entry) {
                if failed.is_none() {
                    self.rollback(std::mem::take(&mut call.written));
                    return Err(e.into());
                }
                log::error!("network {}: {e}", self.network);
            }
            self.forget_taken_over(j);
        }
        if let Some(e) = failed {
            return Err(e);
        }
        for l in &out {
            log::info!(
                "network {}: {} for container {} interface {} (pod {})",
                self.network,
                l.cidr(),
                l.container_id,
                l.ifname,
                l.pod
            );
        }
        Ok(out)
    }

    /// Every record of the network into `call.view` (one `list`); what this call read or wrote
    /// itself is newer than a snapshot served from a cache and wins.
    fn snapshot(&self, call: &mut Call<'_>) -> Result<(), AllocError> {
        for l in self.store.list(&self.network)? {
            if !call.seen.contains(&l.address) {
                call.view.insert(l.address, l);
            }
        }
        call.complete = true;
        Ok(())
    }

    /// The record of `address`: from the snapshot, or read once (point mode).
    fn load(&self, call: &mut Call<'_>, address: IpAddr) -> Result<Option<Lease>, AllocError> {
        if !call.complete && call.seen.insert(address) {
            match self.store.get(&self.network, address)? {
                Some(l) => call.view.insert(address, l),
                None => call.view.remove(&address),
            };
        }
        Ok(call.view.get(&address).cloned())
    }

    /// The records of range `i` that the journal lists in `entries`, as the store has them now.
    fn journaled(
        &self,
        call: &mut Call<'_>,
        i: usize,
        entries: &[JournalEntry],
    ) -> Result<Vec<Lease>, AllocError> {
        let mut out = Vec::new();
        for l in entries.iter().flat_map(|e| &e.leases) {
            if self.range_of(l) == Some(i)
                && let Some(cur) = self.load(call, l.address)?
            {
                out.push(cur);
            }
        }
        Ok(out)
    }

    /// A record of range `i` satisfying `pred`: from the snapshot, or (point mode) among the
    /// journal's records of this attachment (`mine`) or of the pod's other sandboxes.
    fn find_held(
        &self,
        call: &mut Call<'_>,
        i: usize,
        mine: bool,
        pred: impl Fn(&Lease) -> bool,
    ) -> Result<Option<Lease>, AllocError> {
        let Some(j) = &call.journal else {
            return Ok(self.find(&call.view, i, pred));
        };
        let entries: Vec<JournalEntry> = if mine {
            j.lookup.mine.iter().cloned().collect()
        } else {
            j.lookup.same_pod.clone()
        };
        Ok(self
            .journaled(call, i, &entries)?
            .into_iter()
            .filter(|l| pred(l))
            .min_by_key(|l| l.address))
    }

    fn add_one(
        &self,
        i: usize,
        req: &AddRequest,
        wanted: Option<RequestedIp>,
        call: &mut Call<'_>,
    ) -> Result<Lease, AllocError> {
        let range = &self.ranges[i];
        let now = self.clock.now();

        // 1. Idempotent ADD: the attachment already holds a lease in this range.
        if let Some(l) = self.find_held(call, i, true, |l| {
            l.is_leased() && l.is_attachment(&req.container_id, &req.ifname)
        })? {
            if let Some(w) = wanted
                && w.address != l.address
            {
                return Err(AllocError::AttachmentHasOther {
                    container_id: req.container_id.clone(),
                    ifname: req.ifname.clone(),
                    existing: l.address,
                    requested: w.address,
                    range: range.to_string(),
                });
            }
            return Ok(l);
        }

        // 2. Requested address.
        if let Some(w) = wanted {
            return self.take_requested(i, req, w, call);
        }

        // 3. Sandbox re-create: same pod object and ifname, new container ID, never released.
        if let Some(old) = self.find_held(call, i, false, |l| {
            l.is_leased()
                && l.pod.same_pod(&req.pod)
                && l.ifname == req.ifname
                && l.container_id != req.container_id
        })? {
            let new = self.new_lease(req, old.address, old.prefix_len, i, now);
            let from = old.container_id.clone();
            if let Claimed::Got(l) = self.claim(i, new, Some(old), false, call)? {
                log::info!(
                    "network {}: {} moves from container {} to {} (pod {} re-created its sandbox)",
                    self.network,
                    l.address,
                    from,
                    req.container_id,
                    req.pod
                );
                return Ok(l);
            }
            // changed under us: allocate normally below
        }

        if !call.complete {
            // 4 + 5 by point reads; sticky is found on the walk (see walk_points).
            if let Some(l) = self.walk_points(i, req, call)? {
                return Ok(l);
            }
            // A long walk: one snapshot, then the same rules as a node-local store.
            log::info!(
                "network {}: no address found within {} reads in range {}; reading the whole network",
                self.network,
                self.policy.max_point_reads,
                range
            );
            self.snapshot(call)?;
            return self.take_from_pool(i, req, call);
        }

        // 4. Sticky: the pod's previous address in this range, if still just released.
        let sticky = call
            .view
            .values()
            .filter(|l| {
                matches!(l.state, LeaseState::Released { .. })
                    && l.pod.same_name(&req.pod)
                    && l.ifname == req.ifname
                    && self.range_of(l) == Some(i)
            })
            .max_by_key(|l| (l.since, l.address))
            .cloned();
        if let Some(old) = sticky {
            let new = self.new_lease(req, old.address, range.prefix_len(), i, now);
            match self.claim(i, new, Some(old), true, call)? {
                Claimed::Got(l) => return Ok(l),
                Claimed::Lost | Claimed::InUse(_) => {}
            }
        }

        // 5. The pool.
        self.take_from_pool(i, req, call)
    }

    fn take_requested(
        &self,
        i: usize,
        req: &AddRequest,
        w: RequestedIp,
        call: &mut Call<'_>,
    ) -> Result<Lease, AllocError> {
        let range = &self.ranges[i];
        let prefix = w.prefix_len.unwrap_or(range.prefix_len());
        for _ in 0..self.policy.max_attempts {
            let now = self.clock.now();
            let current = self.load(call, w.address)?;
            let new = self.new_lease(req, w.address, prefix, i, now);
            let outcome = match &current {
                Some(l) if l.is_leased() => {
                    if l.is_attachment(&req.container_id, &req.ifname) {
                        return Ok(l.clone());
                    }
                    if !(l.pod.same_pod(&req.pod) && l.ifname == req.ifname) {
                        return Err(AllocError::HeldByOther {
                            address: w.address,
                            holder: l.pod.to_string(),
                            container_id: l.container_id.clone(),
                            ifname: l.ifname.clone(),
                        });
                    }
                    // Same pod, new sandbox: take it over without probing.
                    self.claim(i, new, current, false, call)?
                }
                // Free, released or quarantined: an explicit request overrides cooldown and
                // quarantine, but is probed.
                _ => self.claim(i, new, current, true, call)?,
            };
            match outcome {
                Claimed::Got(l) => return Ok(l),
                Claimed::Lost => continue,
                Claimed::InUse(mac) => {
                    return Err(AllocError::RequestedInUse {
                        address: w.address,
                        mac,
                        quarantine_s: self.policy.quarantine_s,
                    });
                }
            }
        }
        Err(AllocError::Contention {
            network: self.network.clone(),
            address: w.address,
            attempts: self.policy.max_attempts,
        })
    }

    /// The pool walk by point reads, for a store without cheap snapshots: O(1) requests in the
    /// steady state, whatever the number of leases.
    ///
    /// Candidates come in an order derived from the pod's identity ([`walk_start`]), so a pod
    /// that comes back (a StatefulSet pod on any node) meets its previous address early. Each
    /// candidate is read once: no record → claim it at once; this pod's own `Released` record
    /// (same namespace/name and ifname) → claim it (sticky); leased, quarantined → skip;
    /// released by another pod within the cooldown → keep for last. A record released by
    /// another pod longer ago is free, but the walk goes on for up to
    /// [`Policy::sticky_horizon`] more reads looking for an address nobody had or this pod's
    /// own, so that pod keeps its sticky address too. Then the free records in walk order,
    /// then the cooling ones, longest released first.
    ///
    /// `Ok(None)` after [`Policy::max_point_reads`] reads without an address (a nearly full
    /// range): the caller takes one snapshot and finishes like a node-local store. A range no
    /// larger than that is read whole, so its exhaustion is reported with exact counts.
    fn walk_points(
        &self,
        i: usize,
        req: &AddRequest,
        call: &mut Call<'_>,
    ) -> Result<Option<Lease>, AllocError> {
        let range = &self.ranges[i];
        let prefix = range.prefix_len();
        let now = self.clock.now();
        let mut reads = 0usize;
        let mut free: Vec<Lease> = Vec::new();
        let mut cooling: Vec<Lease> = Vec::new();
        let mut conflicts = Conflicts::default();
        let mut whole = true;
        for cand in range.candidates(walk_start(req, i)) {
            if !free.is_empty() && reads >= self.policy.sticky_horizon {
                whole = false;
                break;
            }
            if reads >= self.policy.max_point_reads {
                return Ok(None);
            }
            reads += 1;
            let expected = match self.load(call, cand)? {
                None => None,
                Some(l)
                    if matches!(l.state, LeaseState::Released { .. })
                        && l.pod.same_name(&req.pod)
                        && l.ifname == req.ifname =>
                {
                    Some(l)
                }
                Some(l) => match self.classify(&l, &req.pod, now) {
                    // An expired quarantine is nobody's sticky address: as good as none.
                    Class::Free if matches!(l.state, LeaseState::Quarantined { .. }) => Some(l),
                    Class::Free => {
                        if free.is_empty() {
                            // From here on, the walk is bounded by the horizon.
                            reads = 0;
                        }
                        free.push(l);
                        continue;
                    }
                    Class::Cooling => {
                        cooling.push(l);
                        continue;
                    }
                    Class::Blocked => continue,
                },
            };
            let new = self.new_lease(req, cand, prefix, i, self.clock.now());
            match self.claim(i, new, expected, true, call)? {
                Claimed::Got(l) => return Ok(Some(l)),
                Claimed::Lost => {}
                Claimed::InUse(mac) => conflicts.add(self, range, cand, mac)?,
            }
        }
        cooling.sort_by_key(|l| (l.since, l.address));
        if let Some(l) = self.claim_seen(i, req, free.into_iter().chain(cooling), now, call, &mut conflicts)? {
            return Ok(Some(l));
        }
        if !whole {
            return Ok(None);
        }
        // Every candidate of the range was read: the view holds the whole range.
        Err(self.no_address(i, conflicts, &call.view))
    }

    fn take_from_pool(
        &self,
        i: usize,
        req: &AddRequest,
        call: &mut Call<'_>,
    ) -> Result<Lease, AllocError> {
        let range = &self.ranges[i];
        let now = self.clock.now();
        let prefix = range.prefix_len();
        let mut conflicts = Conflicts::default();
        let mut cooling: Vec<Lease> = Vec::new();

        // Every record in the range blocks at most one candidate, so if the blocking records
        // cover the range the walk is pointless.
        let blocking = call
            .view
            .values()
            .filter(|l| range.contains(l.address) && self.classify(l, &req.pod, now) != Class::Free)
            .count() as u128;
        let walk = blocking < range.usable_count();

        if walk {
            let offset = start_offset(&req.container_id, &req.ifname, i);
            for cand in range.candidates(offset) {
                let expected = match call.view.get(&cand) {
                    None => None,
                    Some(l) => match self.classify(l, &req.pod, now) {
                        Class::Blocked => continue,
                        Class::Cooling => {
                            cooling.push(l.clone());
                            continue;
                        }
                        Class::Free => Some(l.clone()),
                    },
                };
                let new = self.new_lease(req, cand, prefix, i, self.clock.now());
                match self.claim(i, new, expected, true, call)? {
                    Claimed::Got(l) => return Ok(l),
                    Claimed::Lost => continue,
                    Claimed::InUse(mac) => conflicts.add(self, range, cand, mac)?,
                }
            }
        } else {
            cooling = call
                .view
                .values()
                .filter(|l| {
                    range.contains(l.address) && self.classify(l, &req.pod, now) == Class::Cooling
                })
                .cloned()
                .collect();
        }

        // Nothing else is free: reuse cooling-down addresses, longest released first.
        cooling.sort_by_key(|l| (l.since, l.address));
        if let Some(l) = self.claim_seen(i, req, cooling, now, call, &mut conflicts)? {
            return Ok(l);
        }
        Err(self.no_address(i, conflicts, &call.view))
    }

    /// Claim the first of `seen` (records read earlier in this ADD, in order of preference) that
    /// is still claimable; say so when it is a cooling-down one, reused because nothing else is.
    fn claim_seen(
        &self,
        i: usize,
        req: &AddRequest,
        seen: impl IntoIterator<Item = Lease>,
        now: u64,
        call: &mut Call<'_>,
        conflicts: &mut Conflicts,
    ) -> Result<Option<Lease>, AllocError> {
        let range = &self.ranges[i];
        for old in seen {
            // The view may have changed since the record was seen.
            let Some(cur) = call.view.get(&old.address).cloned() else {
                continue;
            };
            if self.classify(&cur, &req.pod, now) == Class::Blocked {
                continue;
            }
            let new = self.new_lease(req, old.address, range.prefix_len(), i, self.clock.now());
            match self.claim(i, new, Some(cur), true, call)? {
                Claimed::Got(l) => {
                    if matches!(old.state, LeaseState::Released { at } if now < at.saturating_add(self.policy.cooldown_s)) {
                        log::warn!(
                            "network {}: range {} has no address outside its cooldown; reusing {} released at {}",
                            self.network,
                            range,
                            l.address,
                            old.since
                        );
                    }
                    return Ok(Some(l));
                }
                Claimed::Lost => {}
                Claimed::InUse(mac) => conflicts.add(self, range, old.address, mac)?,
            }
        }
        Ok(None)
    }

    /// The error of a range with nothing left, with counts from `view` (which holds the range).
    fn no_address(&self, i: usize, conflicts: Conflicts, view: &HashMap<IpAddr, Lease>) -> AllocError {
        let st = self.range_status(i, view.values(), self.clock.now());
        if !conflicts.in_use.is_empty() {
            // Say why: the last free candidates are used by someone else on the segment.
            return AllocError::InUseOnSegment {
                network: self.network.clone(),
                range: st.range,
                in_use: conflicts.in_use.into_boxed_slice(),
                usable: st.usable,
                leased: st.leased,
                quarantined: st.quarantined,
                cooling: st.cooling,
            };
        }
        AllocError::Exhausted {
            network: self.network.clone(),
            range: st.range,
            usable: st.usable,
            leased: st.leased,
            quarantined: st.quarantined,
            cooling: st.cooling,
        }
    }

    /// Claim one record; probe it (when `probe`) with no lock held; quarantine it on conflict.
    /// With a journal, the address is recorded for this attachment before it is claimed.
    fn claim(
        &self,
        i: usize,
        new: Lease,
        expected: Option<Lease>,
        probe: bool,
        call: &mut Call<'_>,
    ) -> Result<Claimed, AllocError> {
        let address = new.address;
        if let Some(j) = &mut call.journal
            && !j.entry.leases.iter().any(|l| l.address == address)
        {
            j.entry.leases.push(new.clone());
            j.index.record(&self.network, &j.entry)?;
        }
        call.seen.insert(address);
        let got = match self.store.claim(new, expected.as_ref())? {
            Ok(l) => l,
            Err(Taken { current }) => {
                match current {
                    Some(c) => call.view.insert(address, c),
                    None => call.view.remove(&address),
                };
                return Ok(Claimed::Lost);
            }
        };
        call.view.insert(address, got.clone());
        call.written.push(Written {
            now: got.clone(),
            prev: expected,
        });
        if !probe {
            return Ok(Claimed::Got(got));
        }
        match self.prober.probe(address, &self.ranges[i]) {
            Ok(ProbeOutcome::Free) => Ok(Claimed::Got(got)),
            Ok(ProbeOutcome::InUse { mac }) => {
                let at = self.clock.now();
                log::warn!(
                    "network {}: {} answered the conflict probe from MAC {}; quarantining it for {}s",
                    self.network,
                    address,
                    mac,
                    self.policy.quarantine_s
                );
                let mut q = got.clone();
                q.state = LeaseState::Quarantined {
                    mac: mac.clone(),
                    at,
                };
                q.since = at;
                q.version = None;
                match self.store.update(q, &got)? {
                    Ok(stored) => {
                        call.view.insert(address, stored);
                        call.written.pop(); // a quarantine record is evidence, not an allocation
                    }
                    Err(Taken { current }) => {
                        log::warn!(
                            "network {}: could not quarantine {address}: it changed meanwhile",
                            self.network
                        );
                        match current {
                            Some(c) => call.view.insert(address, c),
                            None => call.view.remove(&address),
                        };
                        call.written.pop();
                    }
                }
                Ok(Claimed::InUse(mac))
            }
            Err(source) => Err(AllocError::Probe { address, source }),
        }
    }

    /// Restore what an ADD wrote, newest first. Returns the records that could not be
    /// restored (still held by the attachment: GC, DEL or the reconciler release them).
    fn rollback(&self, written: Vec<Written>) -> Vec<Lease> {
        let mut stuck = Vec::new();
        for w in written.into_iter().rev() {
            let addr = w.now.address;
            let res: Result<Option<Taken>, StoreError> = match w.prev {
                Some(mut p) => {
                    p.version = None;
                    self.store.claim(p, Some(&w.now)).map(|r| r.err())
                }
                None => self.store.remove(&w.now).map(|r| r.err()),
            };
            match res {
                Ok(None) => log::debug!("network {}: rolled back {addr}", self.network),
                Ok(Some(t)) => {
                    log::warn!("network {}: rollback of {addr} skipped: {t}", self.network)
                }
                Err(e) => {
                    log::error!(
                        "network {}: rollback of {addr} failed: {e}; GC or DEL will release it",
                        self.network
                    );
                    stuck.push(w.now);
                }
            }
        }
        stuck
    }

    /// After a sandbox re-create took a lease over, the old sandbox's journal entry no longer
    /// holds it.
    fn forget_taken_over(&self, j: &Journaling<'_>) {
        for old in &j.lookup.same_pod {
            let kept: Vec<Lease> = old
                .leases
                .iter()
                .filter(|l| !j.entry.leases.iter().any(|m| m.address == l.address))
                .cloned()
                .collect();
            if kept.len() != old.leases.len() {
                let mut e = old.clone();
                e.leases = kept;
                if let Err(err) = j.index.record(&self.network, &e) {
                    log::warn!("network {}: {err}", self.network);
                }
            }
        }
    }

    /// DEL: release exactly the leases of (`container_id`, `ifname`) — they become
    /// `Released { at: now }` records keeping the pod identity. Idempotent. Returns the
    /// released records. Tries every lease even if one fails, then reports the first error.
    ///
    /// With a node journal: one conditional write per lease the journal lists (no read), and
    /// nothing at all for an attachment it does not know.
    pub fn del(&self, container_id: &str, ifname: &str) -> Result<Vec<Lease>, AllocError> {
        let now = self.clock.now();
        let ours = |c: &Lease| c.is_leased() && c.is_attachment(container_id, ifname);
        let (candidates, all, entry) = match self.store.index() {
            Some(ix) => {
                let entry = ix
                    .lookup(&self.network, container_id, ifname, &PodRef::default())?
                    .mine;
                let Some(entry) = entry else {
                    return Ok(Vec::new());
                };
                let mut cands = Vec::new();
                for l in &entry.leases {
                    // A record written before its claim has no version: read what is there.
                    let cur = match l.version {
                        Some(_) => Some(l.clone()),
                        None => self.store.get(&self.network, l.address)?,
                    };
                    cands.extend(cur.filter(|c| ours(c)));
                }
                (cands, Vec::new(), Some((ix, entry)))
            }
            None => {
                let all = self.store.list(&self.network)?;
                let cands = all.iter().filter(|l| ours(l)).cloned().collect();
                (cands, all, None)
            }
        };
        let mut released = Vec::new();
        let mut first_err: Option<AllocError> = None;
        for l in &candidates {
            match self.release_if_ours(l, now, ours) {
                Ok(Some(r)) => released.push(r),
                Ok(None) => {}
                Err(e) => {
                    log::error!(
                        "network {}: releasing {} failed: {e}",
                        self.network,
                        l.address
                    );
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if let Some((ix, mut entry)) = entry {
            entry.leases.clear();
            ix.record(&self.network, &entry)?;
        }
        for l in &released {
            log::info!(
                "network {}: released {} of container {} interface {}",
                self.network,
                l.address,
                container_id,
                ifname
            );
        }
        let mut errs = Vec::new();
        self.prune(&all, now, self.policy.prune_per_del, &mut errs);
        for e in errs {
            log::warn!("network {}: pruning old records: {e}", self.network);
        }
        Ok(released)
    }

    /// Release `l` if unchanged; on a lost race, retry while `still_ours(current)`.
    fn release_if_ours(
        &self,
        l: &Lease,
        now: u64,
        still_ours: impl Fn(&Lease) -> bool,
    ) -> Result<Option<Lease>, AllocError> {
        let mut cur = l.clone();
        for _ in 0..self.policy.max_attempts {
            match self.store.release(&cur, now)? {
                Ok(r) => return Ok(Some(r)),
                Err(Taken { current: Some(c) }) if still_ours(&c) => cur = c,
                Err(_) => return Ok(None), // no longer ours: someone else's now, leave it
            }
        }
        Err(AllocError::Contention {
            network: self.network.clone(),
            address: l.address,
            attempts: self.policy.max_attempts,
        })
    }

    /// Delete released and expired quarantine records of `all` older than
    /// [`Policy::retain_released_s`] (and past their cooldown or quarantine), at most `max`.
    pub fn prune(&self, all: &[Lease], now: u64, max: usize, errors: &mut Vec<AllocError>) -> usize {
        let mut n = 0;
        for l in all {
            if n >= max {
                break;
            }
            let window = match l.state {
                LeaseState::Leased => continue,
                LeaseState::Released { .. } => self.policy.cooldown_s,
                LeaseState::Quarantined { .. } => self.policy.quarantine_s,
            };
            if now.saturating_sub(l.since) < window.max(self.policy.retain_released_s) {
                continue;
            }
            match self.store.remove(l) {
                Ok(Ok(())) => n += 1,
                Ok(Err(_)) => {}
                Err(e) => errors.push(e.into()),
            }
        }
        n
    }

    /// CHECK: `Ok(leases)` (one per range, in range order) iff the attachment holds a Leased
    /// record in every range. With a node journal: one read per lease the journal lists.
    pub fn check(&self, container_id: &str, ifname: &str) -> Result<Vec<Lease>, AllocError> {
        let all = match self.store.index() {
            Some(ix) => {
                let mut cur = Vec::new();
                let entry = ix.lookup(&self.network, container_id, ifname, &PodRef::default())?;
                for l in entry.mine.iter().flat_map(|e| &e.leases) {
                    cur.extend(self.store.get(&self.network, l.address)?);
                }
                cur
            }
            None => self.store.list(&self.network)?,
        };
        let mine: Vec<&Lease> = all
            .iter()
            .filter(|l| l.is_attachment(container_id, ifname))
            .collect();
        let leased: Vec<&Lease> = mine.iter().copied().filter(|l| l.is_leased()).collect();
        if leased.is_empty() {
            let detail = match mine.first() {
                Some(l) => format!(
                    "; its record of {} is {:?} since {}",
                    l.address, l.state, l.since
                ),
                None => String::new(),
            };
            return Err(AllocError::NoLease {
                network: self.network.clone(),
                container_id: container_id.to_string(),
                ifname: ifname.to_string(),
                detail,
            });
        }
        let mut out = Vec::new();
        for (i, r) in self.ranges.iter().enumerate() {
            match leased.iter().find(|l| self.range_of(l) == Some(i)) {
                Some(l) => out.push((*l).clone()),
                None => {
                    return Err(AllocError::MissingRange {
                        network: self.network.clone(),
                        container_id: container_id.to_string(),
                        ifname: ifname.to_string(),
                        range: r.to_string(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// GC: release every Leased record this node may judge ([`LeaseStore::list_mine`]: all of a
    /// node-local store, only this node's in a cluster-wide one) whose attachment is not in
    /// `valid`, forget such attachments in the node journal, and delete this node's
    /// released/quarantine records past their retention. Keeps going after errors; they are in
    /// the report (`GcReport::into_result` turns them into one error). `Err` only when the store
    /// cannot even be listed.
    pub fn gc(&self, valid: &[Attachment]) -> Result<GcReport, AllocError> {
        let now = self.clock.now();
        let keep: HashSet<(&str, &str)> = valid
            .iter()
            .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
            .collect();
        let all = self.store.list_mine(&self.network)?;
        let mut report = GcReport::default();
        for l in all.iter().filter(|l| l.is_leased()) {
            if keep.contains(&(l.container_id.as_str(), l.ifname.as_str())) {
                continue;
            }
            let (cid, ifn) = (l.container_id.clone(), l.ifname.clone());
            match self.release_if_ours(l, now, |c| c.is_leased() && c.is_attachment(&cid, &ifn)) {
                Ok(Some(r)) => {
                    log::info!(
                        "network {}: GC released {} of container {} interface {}",
                        self.network,
                        r.address,
                        cid,
                        ifn
                    );
                    report.released.push(r);
                }
                Ok(None) => {}
                Err(e) => report.errors.push(e),
            }
        }
        if let Some(ix) = self.store.index() {
            match ix.entries(&self.network) {
                Ok(entries) => {
                    for mut e in entries {
                        if !keep.contains(&(e.container_id.as_str(), e.ifname.as_str())) {
                            e.leases.clear();
                            if let Err(err) = ix.record(&self.network, &e) {
                                report.errors.push(err.into());
                            }
                        }
                    }
                }
                Err(e) => report.errors.push(e.into()),
            }
        }
        report.pruned = self.prune(&all, now, usize::MAX, &mut report.errors);
        Ok(report)
    }

    /// STATUS: per-range occupancy; `Err` when the store cannot be used or some range has no
    /// address left for a new ADD (every usable address leased or quarantined).
    pub fn status(&self) -> Result<Vec<RangeStatus>, AllocError> {
        let all = self.store.list(&self.network)?;
        let now = self.clock.now();
        let mut out = Vec::new();
        for i in 0..self.ranges.len() {
            let st = self.range_status(i, all.iter(), now);
            if st.free == 0 {
                return Err(AllocError::Exhausted {
                    network: self.network.clone(),
                    range: st.range,
                    usable: st.usable,
                    leased: st.leased,
                    quarantined: st.quarantined,
                    cooling: st.cooling,
                });
            }
            out.push(st);
        }
        Ok(out)
    }

    /// Every range's counts, full ones included (STATUS fails at the first full range): for
    /// monitoring, where a full range is the number that matters most.
    pub fn usage(&self) -> Result<Vec<RangeStatus>, AllocError> {
        let all = self.store.list(&self.network)?;
        let now = self.clock.now();
        Ok((0..self.ranges.len()).map(|i| self.range_status(i, all.iter(), now)).collect())
    }

    fn range_status<'l>(
        &self,
        i: usize,
        leases: impl Iterator<Item = &'l Lease>,
        now: u64,
    ) -> RangeStatus {
        let range = &self.ranges[i];
        let (mut leased, mut quarantined, mut cooling) = (0usize, 0usize, 0usize);
        for l in leases.filter(|l| range.contains(l.address)) {
            match &l.state {
                LeaseState::Leased => leased += 1,
                LeaseState::Quarantined { at, .. }
                    if now < at.saturating_add(self.policy.quarantine_s) =>
                {
                    quarantined += 1
                }
                LeaseState::Released { at } if now < at.saturating_add(self.policy.cooldown_s) => {
                    cooling += 1
                }
                _ => {}
            }
        }
        let usable = range.usable_count();
        RangeStatus {
            range: range.to_string(),
            usable,
            leased,
            quarantined,
            cooling,
            free: usable.saturating_sub((leased + quarantined) as u128),
        }
    }

    fn classify(&self, l: &Lease, pod: &PodRef, now: u64) -> Class {
        match &l.state {
            LeaseState::Leased => Class::Blocked,
            LeaseState::Quarantined { at, .. } => {
                if now < at.saturating_add(self.policy.quarantine_s) {
                    Class::Blocked
                } else {
                    Class::Free
                }
            }
            LeaseState::Released { at } => {
                if now < at.saturating_add(self.policy.cooldown_s) && !l.pod.same_name(pod) {
                    Class::Cooling
                } else {
                    Class::Free
                }
            }
        }
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

    fn find(
        &self,
        view: &HashMap<IpAddr, Lease>,
        i: usize,
        pred: impl Fn(&Lease) -> bool,
    ) -> Option<Lease> {
        view.values()
            .filter(|l| pred(l) && self.range_of(l) == Some(i))
            .min_by_key(|l| l.address)
            .cloned()
    }

    fn new_lease(
        &self,
        req: &AddRequest,
        address: IpAddr,
        prefix_len: u8,
        i: usize,
        now: u64,
    ) -> Lease {
        Lease {
            network: self.network.clone(),
            address,
            prefix_len,
            range_index: Some(i),
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
            pod: req.pod.clone(),
            node: req.node.clone(),
            state: LeaseState::Leased,
            since: now,
            version: None,
        }
    }
}

/// Where the pool walk of range `index` starts for this attachment: a stable hash of the
/// container ID (and ifname and range index), so concurrent ADDs rarely race for one address.
pub fn start_offset(container_id: &str, ifname: &str, index: usize) -> u128 {
    let mut key = Vec::with_capacity(container_id.len() + ifname.len() + 10);
    key.extend_from_slice(container_id.as_bytes());
    key.push(0);
    key.extend_from_slice(ifname.as_bytes());
    key.push(0);
    key.extend_from_slice(&(index as u64).to_le_bytes());
    let hi = mix64(fnv1a64(&key, 0));
    let lo = mix64(fnv1a64(&key, 0x9e37_79b9_7f4a_7c15));
    ((hi as u128) << 64) | lo as u128
}

/// Where the point-mode walk of range `index` starts for this ADD: a hash of the pod's
/// namespace and name (or the container ID, when the runtime did not say) with the ifname, so
/// the same pod meets the same candidates first on every node and after every restart.
pub fn walk_start(req: &AddRequest, index: usize) -> u128 {
    match (&req.pod.namespace, &req.pod.name) {
        (Some(ns), Some(name)) => start_offset(&format!("{ns}/{name}"), &req.ifname, index),
        _ => start_offset(&req.container_id, &req.ifname, index),
    }
}
