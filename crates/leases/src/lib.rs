//! tether IPAM core: lease records, the allocation engine, the store contract and the
//! node-local file store. No CNI protocol here; the `tether-ipam` binary wires it up.
//!
//! # Model ([`model`])
//!
//! One [`Lease`] record per address of a uniqueness domain ([`Scope`]: the cluster, or an
//! isolated fabric), whichever network handed it out: holder network and attachment
//! (`container_id`, `ifname`),
//! [`PodRef`] (namespace, name, uid), node, [`LeaseState`] (`Leased`, `Released { at }`,
//! `Quarantined { mac, at }`), `since`, and an opaque store `version`.
//!
//! # Store ([`store`])
//!
//! [`LeaseStore`]: `list(scope)` snapshot; `claim(new, expected)` create-if-absent
//! (`expected = None`) or replace-if-unchanged (compare `version`); `remove(expected)`
//! delete-if-unchanged; provided `update(new, expected)` and `release(lease, at)`. Writes
//! return [`CasResult`]: the outer `Err` is a [`StoreError`], the inner `Err` a lost race
//! ([`Taken`], carrying the current record when known).
//!
//! [`FileStore`] ([`mod@file`]) keeps `<dataDir>/<network>.json` under an exclusive `flock` on
//! `<network>.lock`, writes atomically (temp file, fsync, rename, fsync dir), files 0600, dir
//! 0700; [`FileStore::transaction`] runs a whole read-modify-write under one lock. A corrupt
//! file is a [`FileStoreError::Corrupt`] naming it, never reset.
//!
//! # Engine ([`engine`])
//!
//! [`Allocator`] (one network, its ranges, a [`Policy`], a store, a [`Prober`], a [`Clock`]):
//!
//! - [`Allocator::add`]`(&AddRequest)` → one lease per range entry, in range order. Per range:
//!   1. the attachment's existing lease (idempotent ADD; a requested address that differs is
//!      an error);
//!   2. the requested address, if any (must be usable in a range and not leased by another
//!      attachment; overrides cooldown and quarantine; probed; in use → quarantined + error);
//!   3. sandbox re-create: a lease of the same pod (namespace, name, uid) and ifname under
//!      another container ID is taken over (no probe);
//!   4. sticky: the latest `Released` record of the same namespace/name and ifname (probed);
//!   5. the pool: walk [`IpRange::candidates`](tether_pool::IpRange::candidates) from
//!      [`start_offset`] (hash of container ID, ifname, range index), skipping leased,
//!      quarantined (until `quarantine_s` passed) and cooling-down records (released by another
//!      pod less than `cooldown_s` ago); claim; on a lost race move on; probe (no lock held);
//!      on conflict quarantine and move on. If nothing else is free, cooling-down addresses
//!      are used, longest released first. Else [`AllocError::InUseOnSegment`] when candidates
//!      answered the probe during this ADD, or [`AllocError::Exhausted`], both with counts.
//!
//!   All or nothing: on any error every record written by this ADD is restored.
//! - [`Allocator::del`] releases exactly the attachment's leases (→ `Released`), idempotent.
//! - [`Allocator::check`] succeeds iff the attachment holds a `Leased` record in every range.
//! - [`Allocator::gc`]`(valid)` releases `Leased` records of attachments not in `valid`,
//!   continuing past errors ([`GcReport`]).
//! - [`Allocator::status`] fails when the store is unusable or a range has no free address.
//!
//! With a store that keeps a node journal ([`LeaseStore::index`], [`journal`]) the same rules run
//! on point reads instead of one snapshot per call: ADD, DEL and CHECK go to single records and
//! never list (see [`Allocator::add`]).
//!
//! Released records and expired quarantine records older than
//! [`Policy::retain_released_s`] (default a day) are pruned by GC and, a few at a time, by DEL.

pub mod clock;
#[cfg(any(test, feature = "test-doubles"))]
mod doubles;
pub mod engine;
pub mod file;
pub mod journal;
pub mod model;
pub mod probe;
pub mod reclaim;
pub mod store;

pub use clock::{Clock, SystemClock};
#[cfg(any(test, feature = "test-doubles"))]
pub use doubles::{FakeClock, ScriptedProber};
pub use engine::{
    AddOutcome, AddRequest, AllocError, Allocator, GcReport, Policy, RangeStatus, start_offset,
    walk_start,
};
pub use file::{
    FORMAT_VERSION, FileStore, FileStoreError, PER_NETWORK_FORMAT, Transaction, domain_stem,
    file_stem,
};
pub use journal::{FileJournal, JournalBacked, JournalError};
pub use model::{Attachment, Lease, LeaseState, PodRef, Scope, short_id};
pub use probe::{Candidate, NoProbe, ProbeError, ProbeOutcome, Probed, Prober};
pub use store::{
    AttachmentIndex, BackendFailure, CasResult, JournalEntry, LeaseStore, Lookup, Pending,
    StoreError, Taken, domain_text, validate_claim,
};
