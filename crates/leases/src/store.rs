//! The lease store contract: snapshots plus compare-and-swap on single records.
//!
//! A store keeps at most one record per address of a uniqueness domain ([`Scope`]), whichever
//! network wrote it. Every write is conditional: create-if-absent, or replace/delete only the
//! version the caller saw. That maps onto one Kubernetes object per address of a domain (create →
//! 409 AlreadyExists; replace with `resourceVersion`; delete with a uid/resourceVersion
//! precondition → 409 Conflict) and onto the node-local file store (a counter per domain under an
//! exclusive lock). A point-lookup store also offers an
//! [`AttachmentIndex`] (the node journal implements it) so ADD and DEL need no LIST.

use std::error::Error;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::model::{Lease, LeaseState, PodRef, Scope};

/// Result of a conditional write: the outer error is the store failing, the inner `Err` is a
/// lost race (the record is not as expected).
pub type CasResult<T> = Result<Result<T, Taken>, StoreError>;

/// A conditional write lost: the record is not as the caller expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The current record, when the store knows it (`None`: there is no record, or the store
    /// could not tell).
    pub current: Option<Lease>,
}

impl fmt::Display for Taken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.current {
            Some(l) => write!(
                f,
                "{} is now {:?} by container {} interface {} (pod {})",
                l.address, l.state, l.container_id, l.ifname, l.pod
            ),
            None => f.write_str("the record no longer exists"),
        }
    }
}

/// Errors of a lease store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A backend failed with an error of its own that says what went wrong, shown as it is;
    /// the backend gets it back (e.g.
    /// [`FileStoreError::from_store_error`](crate::FileStoreError::from_store_error)) and says
    /// whether retrying later may succeed (CNI code 11).
    #[error(transparent)]
    Backend(BackendFailure),
    /// A caller broke the store contract (a bug, not an operator problem).
    #[error("lease store misuse: {0}")]
    Invalid(String),
}

impl StoreError {
    /// Worth retrying later (CNI code 11)?
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Backend(e) => e.is_transient(),
            StoreError::Invalid(_) => false,
        }
    }
}

/// A backend's own error inside [`StoreError::Backend`]: displayed as it is (its `source` is the
/// error's own), and classified transient or permanent by the backend that raised it.
#[derive(Debug)]
pub struct BackendFailure {
    error: Box<dyn Error + Send + Sync>,
    transient: bool,
}

impl BackendFailure {
    /// Wrap a backend's `error`; `transient` marks errors worth retrying (CNI code 11).
    pub fn new(error: impl Into<Box<dyn Error + Send + Sync>>, transient: bool) -> BackendFailure {
        BackendFailure {
            error: error.into(),
            transient,
        }
    }

    /// Worth retrying later (CNI code 11)?
    pub fn is_transient(&self) -> bool {
        self.transient
    }

    /// The backend's error, if it is an `E`.
    pub fn downcast_ref<E: Error + 'static>(&self) -> Option<&E> {
        self.error.downcast_ref::<E>()
    }
}

impl fmt::Display for BackendFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl Error for BackendFailure {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.error.source()
    }
}

/// A lease store with optimistic concurrency. See the module docs.
///
/// A store keeps at most one record per address of a uniqueness domain ([`Scope::domain`]):
/// networks whose ranges overlap in one domain share the record of an address in both, so a
/// record read for one network may be another network's.
pub trait LeaseStore {
    /// Snapshot of the records an allocation in `scope` must respect: every record of its
    /// network in its domain, and those of other networks of the domain where the store can tell
    /// without reading the whole domain (a node-local store can; a cluster-wide one cannot, and
    /// its conditional create is what finds them). In any order.
    fn list(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError>;

    /// The record of `address` in the domain of `scope`, whichever network holds it. The
    /// default reads a snapshot; a store that serves point reads (one object per address)
    /// overrides it.
    fn get(&self, scope: &Scope, address: IpAddr) -> Result<Option<Lease>, StoreError> {
        Ok(self.list(scope)?.into_iter().find(|l| l.address == address))
    }

    /// Where this node's attachments and their leases are recorded, for a store whose
    /// snapshots are too costly to take on every ADD and DEL. `Some` switches the engine to
    /// point lookups (see [`crate::journal`]); `None` (the default) makes it work from one
    /// snapshot per call.
    fn index(&self) -> Option<&dyn AttachmentIndex> {
        None
    }

    /// The records of `scope`'s network (in its domain) that name the pod `pod` (same namespace
    /// and name), for a store that can answer that without a snapshot (an index by pod
    /// identity): a re-created pod finds its sticky address in one read however full the pool
    /// is. `None` (the default): no such index; the engine finds the sticky address on its walk.
    /// Entries may be stale (a cache): a claim is still conditional on what is stored.
    fn by_pod(&self, scope: &Scope, pod: &PodRef) -> Result<Option<Vec<Lease>>, StoreError> {
        let _ = (scope, pod);
        Ok(None)
    }

    /// The records GC on this node may judge: `scope`'s network's own (never another network's,
    /// whose runtime lists other attachments), for a node-local store all of them, for a
    /// cluster-wide store only those this node holds.
    fn list_mine(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        Ok(self
            .list(scope)?
            .into_iter()
            .filter(|l| l.network == scope.network)
            .collect())
    }

    /// Create `new` if no record exists for its address in its domain (`expected = None`), or
    /// replace `expected` with `new` only if the stored record still has `expected.version`.
    /// On success returns the stored record with its new `version`. `new.version` is ignored.
    fn claim(&self, new: Lease, expected: Option<&Lease>) -> CasResult<Lease>;

    /// Delete the record `expected` only if it still has `expected.version`.
    fn remove(&self, expected: &Lease) -> CasResult<()>;

    /// Replace `expected` with `new` if unchanged (e.g. our lease → Quarantined).
    fn update(&self, new: Lease, expected: &Lease) -> CasResult<Lease> {
        self.claim(new, Some(expected))
    }

    /// Turn `lease` into `Released { at }` (keeping its holder identity for sticky and
    /// cooldown) if unchanged: a release never frees a record someone took since.
    fn release(&self, lease: &Lease, at: u64) -> CasResult<Lease> {
        let mut n = lease.clone();
        n.state = LeaseState::Released { at };
        n.since = at;
        n.version = None;
        self.update(n, lease)
    }
}

impl<T: LeaseStore + ?Sized> LeaseStore for &T {
    fn list(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        (**self).list(scope)
    }
    fn get(&self, scope: &Scope, address: IpAddr) -> Result<Option<Lease>, StoreError> {
        (**self).get(scope, address)
    }
    fn index(&self) -> Option<&dyn AttachmentIndex> {
        (**self).index()
    }
    fn list_mine(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        (**self).list_mine(scope)
    }
    fn by_pod(&self, scope: &Scope, pod: &PodRef) -> Result<Option<Vec<Lease>>, StoreError> {
        (**self).by_pod(scope, pod)
    }
    fn claim(&self, new: Lease, expected: Option<&Lease>) -> CasResult<Lease> {
        (**self).claim(new, expected)
    }
    fn remove(&self, expected: &Lease) -> CasResult<()> {
        (**self).remove(expected)
    }
    fn update(&self, new: Lease, expected: &Lease) -> CasResult<Lease> {
        (**self).update(new, expected)
    }
    fn release(&self, lease: &Lease, at: u64) -> CasResult<Lease> {
        (**self).release(lease, at)
    }
}

/// Contract checks every store should apply to `claim`: `expected` must be a stored record
/// (has a version) of the same address in the same domain as `new` (its network may differ: an
/// address passes between the networks of a domain).
pub fn validate_claim(new: &Lease, expected: Option<&Lease>) -> Result<(), StoreError> {
    if let Some(e) = expected {
        if e.domain != new.domain || e.address != new.address {
            return Err(StoreError::Invalid(format!(
                "claim of {} in {} expects the record of {} in {}",
                new.address,
                domain_text(new.domain.as_deref()),
                e.address,
                domain_text(e.domain.as_deref())
            )));
        }
        if e.version.is_none() {
            return Err(StoreError::Invalid(format!(
                "claim of {} in network {} expects a record without a version (never stored)",
                new.address, new.network
            )));
        }
    }
    Ok(())
}

/// A domain as the operator reads it: "the cluster" or "isolated fabric `name`".
pub fn domain_text(domain: Option<&str>) -> String {
    match domain {
        None => "the cluster-wide domain".to_string(),
        Some(d) => format!("isolated fabric {d}"),
    }
}

// ----- the attachment index: how a point-lookup store finds an attachment's leases (the node
// journal, `journal.rs`, is the one implementation) -----

/// Work an entry still owes the store, recorded while the store could not be reached.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// The store's records still name this container, the pod's previous sandbox: they are
    /// rewritten to this attachment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rekey_from: Option<String>,
    /// The runtime ran DEL: the records are released.
    #[serde(default)]
    pub release: bool,
    /// Addresses of `leases` whose claim was sent but never answered (a timeout, a reset, a
    /// server that hung): the store may have made it, or may still make it when it resumes. Each
    /// is fenced by a write of this node before it is forgotten (see `engine::offline`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unanswered: Vec<IpAddr>,
}

/// One attachment of this node and the leases it holds or was about to claim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// The pod, when the runtime said.
    #[serde(default)]
    pub pod: PodRef,
    /// Last known records (with the store's version once claimed; without while a claim is in
    /// flight).
    pub leases: Vec<Lease>,
    /// Work left for the store (see the module docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Pending>,
}

impl JournalEntry {
    /// The addresses of claims sent for this attachment whose answer never came.
    pub fn unanswered(&self) -> &[IpAddr] {
        self.pending.as_ref().map_or(&[], |p| &p.unanswered)
    }

    /// The leases the attachment holds or held, without those of unanswered claims.
    pub fn held(&self) -> impl Iterator<Item = &Lease> {
        self.leases
            .iter()
            .filter(|l| !self.unanswered().contains(&l.address))
    }

    /// Keep the claims `sent` whose answer never came, marked, until they are fenced (see
    /// `engine::offline`); an address the entry holds otherwise (its own, re-keyed) is not one.
    pub(crate) fn keep_unanswered(&mut self, sent: Vec<Lease>) {
        for l in sent {
            if self.held().any(|h| h.address == l.address) {
                continue;
            }
            let address = l.address;
            if !self.leases.iter().any(|h| h.address == address) {
                self.leases.push(l);
            }
            let p = self.pending.get_or_insert_with(Pending::default);
            if !p.unanswered.contains(&address) {
                p.unanswered.push(address);
            }
        }
    }
}

/// What the journal knows of one attachment.
#[derive(Debug, Default)]
pub struct Lookup {
    /// The attachment's own entry.
    pub mine: Option<JournalEntry>,
    /// Entries of other sandboxes of the same pod (namespace, name) on the same interface.
    pub same_pod: Vec<JournalEntry>,
}

/// The attachment index the engine uses with a point-lookup store. See the module docs.
pub trait AttachmentIndex {
    /// The entry of (`container_id`, `ifname`) and those of other sandboxes of `pod` on `ifname`.
    fn lookup(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        pod: &PodRef,
    ) -> Result<Lookup, StoreError>;

    /// Write `entry` (replacing the attachment's previous one). An entry without leases is
    /// removed.
    fn record(&self, network: &str, entry: &JournalEntry) -> Result<(), StoreError>;

    /// Every entry of `network` (GC).
    fn entries(&self, network: &str) -> Result<Vec<JournalEntry>, StoreError>;

    /// The entries of `network` with work pending, taking the network's `.pending` mark (one
    /// `stat` when there is none). An entry recorded again with work left marks it again.
    fn take_pending(&self, network: &str) -> Result<Vec<JournalEntry>, StoreError>;
}
