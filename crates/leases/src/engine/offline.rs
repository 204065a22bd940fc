//! While the store cannot be reached (point mode, a node journal): what the journal alone may
//! answer, and the work it then owes the store.
//!
//! A pod's sandbox is re-created for the same pod object when its node reboots or its sandbox
//! dies; the kubelet first stops the old sandbox (CNI DEL) and only then creates the new one (CNI
//! ADD), and retries both until they succeed. Without the API server neither could, and the pod
//! would stay down for as long as the outage lasts. So, when the store is unreachable:
//!
//! - **DEL** of an attachment the journal knows is recorded as a *pending release* and succeeds.
//!   The address stays `Leased` in the store until the release is done, so nobody else can take
//!   it meanwhile: the outage delays its reuse, it never frees it early.
//! - **ADD** of a sandbox of the same pod object (namespace, name **and UID**) on the same
//!   interface, with one address per range in the journal, gets those addresses again, after a
//!   probe of the wire finds none of them in use. The new attachment's entry is a *pending
//!   re-key* (the store's records still name the old container).
//! - Every other ADD fails as before (code 11): a new pod's address needs the store, the one
//!   place that keeps an address to one holder cluster-wide.
//!
//! The first call of the network on this node that reaches the store settles the pending work
//! before its own ([`Allocator::settle_pending`]), each step a conditional write: a re-key takes
//! the record over from the old container only if it is still as journaled (or free again); a
//! record another pod took meanwhile is left to that pod and logged as an error.
//!
//! A claim whose answer never came (a timeout or a reset while the server hangs) is the same
//! kind of work: the server may have made it, or may make it when it resumes, so the failed
//! ADD keeps it in the journal, marked *unanswered*. Settling *fences* it with one conditional
//! write: a record the claim made is released (the ADD failed, nobody uses it); any other
//! record is rewritten, so the claim, made on an older version or on none, fails if it still
//! runs. The runtime's DEL of the failed sandbox settles it first (or, while the store is still
//! away, records that it is owed), so a retried ADD never finds its pod holding two addresses.

use super::add::AddRequest;
use super::call::Journaling;
use super::probe_step::ProbeStep;
use super::{AllocError, Allocator};
use crate::model::{Lease, LeaseState};
use crate::probe::ProbeOutcome;
use crate::store::Taken;
use crate::store::{AttachmentIndex, JournalEntry, Pending};
use tether_pool::RequestedIp;

/// How long an unanswered take-over of the pod's earlier sandbox's lease is watched for: a
/// server that hung runs what it had queued within moments of resuming.
const UNANSWERED_OPEN_S: u64 = 600;

impl Allocator<'_> {
    /// ADD answered from the journal (see the module docs); `None` when it cannot be.
    pub(super) fn add_from_journal(
        &self,
        req: &AddRequest,
        wanted: &[Option<RequestedIp>],
        j: &mut Journaling<'_>,
        probes: &mut ProbeStep,
        unanswered: &[Lease],
    ) -> Result<Option<Vec<Lease>>, AllocError> {
        let mine = j
            .lookup
            .mine
            .iter()
            .filter(|e| e.pending.as_ref().is_none_or(|p| !p.release));
        let others = j
            .lookup
            .same_pod
            .iter()
            .filter(|e| e.ifname == req.ifname && e.pod.same_pod(&req.pod));
        // The attachment's own entry first (a retried ADD), else one other sandbox's (the
        // re-create): never addresses of two sandboxes mixed.
        let Some(entry) = mine.chain(others).find(|e| self.covers(e, wanted)) else {
            return Ok(None);
        };
        let leases: Vec<Lease> = (0..self.ranges.len())
            .filter_map(|i| {
                entry
                    .held()
                    .find(|l| l.is_leased() && self.range_of(l) == Some(i))
                    .cloned()
            })
            .collect();
        if !self.journaled_still_free(&leases, req, probes)? {
            return Ok(None);
        }
        let rekey_from = (entry.container_id != req.container_id)
            .then(|| entry.container_id.clone())
            .or_else(|| entry.pending.as_ref().and_then(|p| p.rekey_from.clone()));
        j.entry.leases = leases.clone();
        j.entry.pending = rekey_from.clone().map(|from| Pending {
            rekey_from: Some(from),
            ..Pending::default()
        });
        j.entry.keep_unanswered(unanswered.to_vec());
        j.index.record(&self.scope.network, &j.entry)?;
        self.forget_taken_over(j);
        if let Some(from) = &rekey_from {
            log::warn!(
                "network {}: the store is unreachable; pod {} (sandbox re-created, container {from} → {}) gets {} \
                 again from the node journal; the store is updated when it answers",
                self.scope.network,
                req.pod,
                req.container_id,
                leases
                    .iter()
                    .map(Lease::cidr)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        Ok(Some(
            leases
                .into_iter()
                .map(|l| Lease {
                    container_id: req.container_id.clone(),
                    ..l
                })
                .collect(),
        ))
    }

    /// Probe the journaled addresses (one per range, in range order) in one step before handing
    /// them out again without the store: `false` when one answers.
    fn journaled_still_free(
        &self,
        leases: &[Lease],
        req: &AddRequest,
        probes: &mut ProbeStep,
    ) -> Result<bool, AllocError> {
        for (i, l) in leases.iter().enumerate() {
            probes.wait_for(i, l.address);
        }
        let mut free = true;
        for a in probes.run(self.prober, &self.ranges)? {
            if let ProbeOutcome::InUse { mac } = a.outcome {
                log::warn!(
                    "network {}: {} (pod {}'s address in the node journal) answered the probe from MAC {mac}; \
                     not handing it out while the store cannot confirm who holds it",
                    self.scope.network,
                    a.address,
                    req.pod
                );
                free = false;
            }
        }
        Ok(free)
    }

    /// Does `e` hold one Leased record in every range, matching what is requested?
    fn covers(&self, e: &JournalEntry, wanted: &[Option<RequestedIp>]) -> bool {
        (0..self.ranges.len()).all(|i| {
            e.held().any(|l| {
                l.is_leased()
                    && self.range_of(l) == Some(i)
                    && wanted[i].is_none_or(|w| w.address == l.address)
            })
        })
    }

    /// DEL while the store is unreachable: the release recorded in `entry`, done later.
    pub(super) fn del_pending(
        &self,
        ix: &dyn AttachmentIndex,
        mut entry: JournalEntry,
    ) -> Result<(), AllocError> {
        let p = entry.pending.get_or_insert_with(Pending::default);
        p.release = true;
        ix.record(&self.scope.network, &entry)?;
        log::warn!(
            "network {}: the store is unreachable; the release of {} (container {} interface {}) is recorded in the \
             node journal and done when it answers (the address stays leased until then)",
            self.scope.network,
            entry
                .leases
                .iter()
                .map(|l| l.address.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            entry.container_id,
            entry.ifname
        );
        Ok(())
    }

    /// Finish the work the journal owes the store (pending releases and re-keys), oldest
    /// knowledge first; an entry that cannot be finished now stays pending. Returns the first
    /// error that says the store is unreachable (the caller's own call would fail the same
    /// way); other failures are logged.
    pub(super) fn settle_pending(&self) -> Result<(), AllocError> {
        let Some(ix) = self.store.index() else {
            return Ok(());
        };
        let entries = ix.take_pending(&self.scope.network)?;
        let mut first_unreachable = None;
        for e in entries {
            match self.settle(&e) {
                Ok(()) => {}
                Err(err) => {
                    if AllocError::is_unreachable(&err) {
                        first_unreachable.get_or_insert(err);
                    } else {
                        log::error!(
                            "network {}: settling container {} interface {} with the store: {err}",
                            self.scope.network,
                            e.container_id,
                            e.ifname
                        );
                    }
                    // Still owed: marked again.
                    if let Err(rec) = ix.record(&self.scope.network, &e) {
                        log::error!("network {}: {rec}", self.scope.network);
                    }
                }
            }
        }
        match first_unreachable {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn settle(&self, e: &JournalEntry) -> Result<(), AllocError> {
        let Some(ix) = self.store.index() else {
            return Ok(());
        };
        let p = e.pending.clone().unwrap_or_default();
        let now = self.clock.now();
        let held_by_entry = |c: &Lease| {
            c.is_leased()
                && c.ifname == e.ifname
                && (c.container_id == e.container_id
                    || p.rekey_from.as_deref() == Some(c.container_id.as_str()))
        };
        let mut kept = Vec::new();
        let mut open = Vec::new();
        for l in &e.leases {
            if e.unanswered().contains(&l.address) {
                if !self.fence(e, l)? {
                    kept.push(l.clone());
                    open.push(l.address);
                }
                continue;
            }
            if !p.release && p.rekey_from.is_none() {
                kept.push(l.clone());
                continue;
            }
            let cur = match l.version {
                Some(_) => Some(l.clone()),
                None => self.store.get(&self.scope, l.address)?,
            };
            let Some(cur) = cur else {
                continue;
            };
            if p.release {
                if let Some(r) = self.release_if_ours(&cur, now, held_by_entry)? {
                    log::info!(
                        "network {}: released {} of container {} (DEL while the store was unreachable)",
                        self.scope.network,
                        r.address,
                        e.container_id
                    );
                }
                continue;
            }
            if let Some(l) = self.rekey(e, l, Some(cur))? {
                kept.push(l);
            }
        }
        // A release still owed for what stays open; a re-key is done.
        let done = JournalEntry {
            leases: kept,
            pending: (!open.is_empty()).then_some(Pending {
                release: p.release,
                unanswered: open,
                rekey_from: None,
            }),
            ..e.clone()
        };
        Ok(ix.record(&self.scope.network, &done)?)
    }

    /// Make sure the unanswered claim of `sent` for `e`'s attachment holds nothing and can no
    /// longer take effect. The ADD that sent it failed, so whatever it made is released; a
    /// record it did not make is rewritten, so that the claim, made on an earlier version of
    /// the record or on none, fails if the server still runs it. `false` while it cannot be
    /// settled yet (see below).
    fn fence(&self, e: &JournalEntry, sent: &Lease) -> Result<bool, AllocError> {
        let ours = |c: &Lease| c.is_attachment(&e.container_id, &e.ifname);
        let mut cur = self.store.get(&self.scope, sent.address)?;
        for _ in 0..self.policy.max_attempts {
            let now = self.clock.now();
            let (new, expected) = match cur {
                Some(c) if ours(&c) && c.is_leased() => {
                    if let Some(r) = self.release_if_ours(&c, now, |c| ours(c) && c.is_leased())? {
                        log::warn!(
                            "network {}: released {} of container {} interface {}: its claim was made, but the \
                             answer never came and the ADD failed",
                            self.scope.network,
                            r.address,
                            e.container_id,
                            e.ifname
                        );
                    }
                    return Ok(true);
                }
                // Our own release or fence: the claim can no longer succeed.
                Some(c) if ours(&c) => return Ok(true),
                // A take-over of the pod's earlier sandbox's lease may still move it; past
                // UNANSWERED_OPEN_S it is left to that sandbox's DEL or the reconciler.
                Some(c) if c.is_leased() && c.pod.same_pod(&e.pod) && c.ifname == e.ifname => {
                    return Ok(now >= sent.since.saturating_add(UNANSWERED_OPEN_S));
                }
                // Another pod's lease: no claim of this node was made on its version.
                Some(c) if c.is_leased() => return Ok(true),
                // Released or quarantined: the same record again, newer.
                Some(c) => (
                    Lease {
                        since: now.max(c.since.saturating_add(1)),
                        version: None,
                        ..c.clone()
                    },
                    Some(c),
                ),
                // None: a released record of this attachment, so the claim's create fails.
                None => (
                    Lease {
                        state: LeaseState::Released { at: now },
                        since: now,
                        version: None,
                        ..sent.clone()
                    },
                    None,
                ),
            };
            match self.store.claim(new, expected.as_ref())? {
                Ok(_) => {
                    log::info!(
                        "network {}: fenced {}: the claim of container {} interface {} was never answered",
                        self.scope.network,
                        sent.address,
                        e.container_id,
                        e.ifname
                    );
                    return Ok(true);
                }
                Err(Taken { current }) => cur = current,
            }
        }
        Err(AllocError::Contention {
            network: self.scope.network.clone(),
            address: sent.address,
            attempts: self.policy.max_attempts,
        })
    }

    /// The record of `journaled`'s address rewritten to the attachment of `e`, starting from
    /// `cur` (what the store has; `None`: no record); `None` when another pod holds it now.
    fn rekey(
        &self,
        e: &JournalEntry,
        journaled: &Lease,
        mut cur: Option<Lease>,
    ) -> Result<Option<Lease>, AllocError> {
        for _ in 0..self.policy.max_attempts {
            if let Some(c) = &cur {
                let ours = c.is_leased() && c.pod.same_pod(&e.pod) && c.ifname == e.ifname;
                if ours && c.container_id == e.container_id {
                    return Ok(Some(c.clone()));
                }
                let free = matches!(c.state, LeaseState::Released { .. });
                if !ours && !free {
                    log::error!(
                        "network {}: {} is held by {} (container {}, {:?}) in the store, but pod {} got it again from the \
                         node journal while the store was unreachable; the two may collide on the wire: delete pod {} so it \
                         gets a new address",
                        self.scope.network,
                        c.address,
                        c.pod,
                        c.container_id,
                        c.state,
                        e.pod,
                        e.pod
                    );
                    return Ok(None);
                }
            }
            let new = Lease {
                container_id: e.container_id.clone(),
                ifname: e.ifname.clone(),
                pod: e.pod.clone(),
                state: LeaseState::Leased,
                since: self.clock.now(),
                version: None,
                ..cur.clone().unwrap_or_else(|| journaled.clone())
            };
            match self.store.claim(new, cur.as_ref())? {
                Ok(l) => {
                    log::info!(
                        "network {}: {} moved to container {} in the store (sandbox re-created while it was unreachable)",
                        self.scope.network,
                        l.address,
                        e.container_id
                    );
                    return Ok(Some(l));
                }
                Err(Taken { current }) => cur = current,
            }
        }
        Err(AllocError::Contention {
            network: self.scope.network.clone(),
            address: journaled.address,
            attempts: self.policy.max_attempts,
        })
    }
}

impl Allocator<'_> {
    /// [`Allocator::settle_pending`] before a call's own work; what is left stays pending, and
    /// the call meets an unreachable store itself.
    pub(super) fn settle_quietly(&self) {
        if let Err(e) = self.settle_pending() {
            log::debug!(
                "network {}: pending journal work left for later: {e}",
                self.scope.network
            );
        }
    }
}
