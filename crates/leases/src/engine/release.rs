//! DEL: release exactly the attachment's leases (they become `Released` records that keep the
//! pod's identity, for sticky addresses and the cooldown), never a record someone took since.

use super::{AllocError, Allocator};
use crate::model::{Lease, PodRef};
use crate::store::{JournalEntry, Taken};

impl Allocator<'_> {
    /// DEL: release exactly the leases of (`container_id`, `ifname`) — they become
    /// `Released { at: now }` records keeping the pod identity. Idempotent. Returns the
    /// released records. Tries every lease even if one fails, then reports the first error.
    ///
    /// With a node journal: one conditional write per lease the journal lists (no read), and
    /// nothing at all for an attachment it does not know. While the store is unreachable, the
    /// release is recorded in the journal and done later (see `offline`).
    pub fn del(&self, container_id: &str, ifname: &str) -> Result<Vec<Lease>, AllocError> {
        let now = self.clock.now();
        let ours = |c: &Lease| c.is_leased() && c.is_attachment(container_id, ifname);
        let (candidates, all, entry) = match self.store.index() {
            Some(ix) => {
                self.settle_quietly();
                let entry = ix
                    .lookup(
                        &self.scope.network,
                        container_id,
                        ifname,
                        &PodRef::default(),
                    )?
                    .mine;
                let Some(entry) = entry else {
                    return Ok(Vec::new());
                };
                match self.journaled_candidates(&entry, ours)? {
                    Some(cands) => (cands, Vec::new(), Some((ix, entry))),
                    None => return self.del_pending(ix, entry).map(|()| Vec::new()),
                }
            }
            None => {
                let all = self.store.list(&self.scope)?;
                let cands = all.iter().filter(|l| ours(l)).cloned().collect();
                (cands, all, None)
            }
        };
        let (released, first_err) = self.release_all(&candidates, now, ours);
        if let Some(e) = first_err {
            // Unreachable: what was not released is released later, and the DEL succeeds.
            if let (true, Some((ix, mut entry))) = (e.is_unreachable(), entry) {
                entry
                    .leases
                    .retain(|l| !released.iter().any(|r| r.address == l.address));
                self.del_pending(ix, entry)?;
                return Ok(released);
            }
            return Err(e);
        }
        if let Some((ix, mut entry)) = entry {
            // A claim still unanswered stays, its release owed, until the next call that
            // reaches the store fences it (see `offline`).
            let open = entry.unanswered().to_vec();
            entry.leases.retain(|l| open.contains(&l.address));
            if let Some(p) = &mut entry.pending {
                p.release = true;
            }
            ix.record(&self.scope.network, &entry)?;
        }
        for l in &released {
            log::info!(
                "network {}: released {} of container {} interface {}",
                self.scope.network,
                l.address,
                container_id,
                ifname
            );
        }
        let mut errs = Vec::new();
        self.prune(&all, now, self.policy.prune_per_del, &mut errs);
        for e in errs {
            log::warn!("network {}: pruning old records: {e}", self.scope.network);
        }
        Ok(released)
    }

    /// The records to release for the journal's `entry`, read where it has no version (written
    /// before its claim). `None`: the release must wait for the store — the entry was re-keyed
    /// while the store was away, or the store cannot be read now.
    fn journaled_candidates(
        &self,
        entry: &JournalEntry,
        ours: impl Fn(&Lease) -> bool,
    ) -> Result<Option<Vec<Lease>>, AllocError> {
        // Re-keyed while the store was away: its records still name the old sandbox.
        if entry
            .pending
            .as_ref()
            .is_some_and(|p| p.rekey_from.is_some())
        {
            return Ok(None);
        }
        let mut cands = Vec::new();
        for l in entry.held() {
            let cur = match l.version {
                Some(_) => Some(l.clone()),
                None => match self.store.get(&self.scope, l.address) {
                    Ok(c) => c,
                    Err(e) if e.is_transient() => return Ok(None),
                    Err(e) => return Err(e.into()),
                },
            };
            cands.extend(cur.filter(|c| ours(c)));
        }
        Ok(Some(cands))
    }

    /// Release every candidate still ours, going on past a failure: what was released, and the
    /// first error.
    fn release_all(
        &self,
        candidates: &[Lease],
        now: u64,
        ours: impl Fn(&Lease) -> bool + Copy,
    ) -> (Vec<Lease>, Option<AllocError>) {
        let mut released = Vec::new();
        let mut first_err = None;
        for l in candidates {
            match self.release_if_ours(l, now, ours) {
                Ok(Some(r)) => released.push(r),
                Ok(None) => {}
                Err(e) => {
                    log::error!(
                        "network {}: releasing {} failed: {e}",
                        self.scope.network,
                        l.address
                    );
                    first_err.get_or_insert(e);
                }
            }
        }
        (released, first_err)
    }

    /// Release `l` if unchanged; on a lost race, retry while `still_ours(current)`.
    pub(super) fn release_if_ours(
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
            network: self.scope.network.clone(),
            address: l.address,
            attempts: self.policy.max_attempts,
        })
    }
}
