//! ADD: one lease per range, the order in which candidates are tried (the attachment's own
//! lease, a requested address, a re-created sandbox's lease, the sticky address, the pool), the
//! node journal of a point-mode store, and the rollback that makes an ADD all or nothing.

use std::collections::HashMap;
use std::net::IpAddr;

use tether_pool::RequestedIp;

use super::call::{Call, Journaling};
use super::claim::{Claimed, Wire};
use super::probe_step::AddOutcome;
use super::{AllocError, Allocator};
use crate::model::{Lease, LeaseState, PodRef};
use crate::probe::ProbeOutcome;
use crate::store::JournalEntry;

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

/// Whose journal records [`Allocator::find_held`] looks among.
#[derive(Debug, Clone, Copy)]
enum Holder {
    ThisAttachment,
    PodsOtherSandboxes,
}

impl Allocator<'_> {
    /// ADD: one lease per range entry, in range order (`result[i].range_index == Some(i)` for
    /// new leases). Idempotent per (container_id, ifname). All or nothing: if any range fails,
    /// every record written by this call is restored and the error returned.
    ///
    /// With a store that keeps a node journal ([`LeaseStore::index`]) the ADD reads single
    /// records instead of a snapshot: see `walk_points`.
    ///
    /// [`LeaseStore::index`]: crate::LeaseStore::index
    pub fn add(&self, req: &AddRequest) -> Result<Vec<Lease>, AllocError> {
        self.add_probed(req).map(|a| a.leases)
    }

    /// [`Allocator::add`], with what its probe step found: the ranges are claimed first, then
    /// every address that needs it is probed in one step (see `probe_step`).
    pub fn add_probed(&self, req: &AddRequest) -> Result<AddOutcome, AllocError> {
        let wanted = self.wanted_per_range(req)?;
        let mut call = self.begin(req)?;
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
        if failed.is_none() {
            failed = self.probe_claimed(req, &wanted, &mut call, &mut out).err();
        }
        // The store is unreachable and nothing was written: the journal may answer.
        if let (Some(e), Some(j)) = (&failed, &mut call.journal)
            && call.written.is_empty()
            && e.is_unreachable()
            && let Some(leases) =
                self.add_from_journal(req, &wanted, j, &mut call.probes, &call.unanswered)?
        {
            return Ok(AddOutcome::new(leases, call.probes));
        }
        self.conclude(&mut call, &out, failed.is_some())?;
        if let Some(e) = failed {
            return Err(e);
        }
        for l in &out {
            log::info!(
                "network {}: {} for container {} interface {} (pod {})",
                self.scope.network,
                l.cidr(),
                l.container_id,
                l.ifname,
                l.pod
            );
        }
        Ok(AddOutcome::new(out, call.probes))
    }

    /// The probe step: every address the ranges claimed, probed at once. A range whose address
    /// answered has it quarantined and starts over, probing each candidate as it claims it; a
    /// requested address that answered fails the ADD.
    fn probe_claimed(
        &self,
        req: &AddRequest,
        wanted: &[Option<RequestedIp>],
        call: &mut Call<'_>,
        out: &mut [Lease],
    ) -> Result<(), AllocError> {
        let answers = call.probes.run(self.prober, &self.ranges)?;
        call.probes.deferring = false;
        for a in answers {
            let ProbeOutcome::InUse { mac } = a.outcome else {
                continue;
            };
            let i = a.range;
            self.quarantine(&out[i], &mac, call)?;
            if wanted[i].is_some() {
                return Err(AllocError::RequestedInUse {
                    network: self.scope.network.clone(),
                    address: a.address,
                    mac,
                    quarantine_s: self.policy.quarantine_s,
                });
            }
            out[i] = self.add_one(i, req, None, call)?;
        }
        Ok(())
    }

    /// The requested address of each range (CNI_ARGS `IP=`, `runtimeConfig.ips`), by range
    /// index; two different addresses for one range are an error.
    fn wanted_per_range(&self, req: &AddRequest) -> Result<Vec<Option<RequestedIp>>, AllocError> {
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
        Ok(wanted)
    }

    /// The call's state: with a node journal, what it says of this attachment (pending work
    /// settled first); without, a snapshot of the network.
    fn begin(&self, req: &AddRequest) -> Result<Call<'_>, AllocError> {
        let Some(ix) = self.store.index() else {
            let mut call = Call::default();
            self.snapshot(&mut call)?;
            return Ok(call);
        };
        self.settle_quietly();
        let lookup = ix.lookup(
            &self.scope.network,
            &req.container_id,
            &req.ifname,
            &req.pod,
        )?;
        let entry = JournalEntry {
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
            pod: req.pod.clone(),
            leases: lookup
                .mine
                .as_ref()
                .map(|e| e.leases.clone())
                .unwrap_or_default(),
            pending: None,
        };
        // Claims an earlier call left unanswered and the settling could not fence yet: carried
        // until it can.
        let unanswered = lookup
            .mine
            .iter()
            .flat_map(|e| {
                e.leases
                    .iter()
                    .filter(|l| e.unanswered().contains(&l.address))
            })
            .cloned()
            .collect();
        Ok(Call {
            journal: Some(Journaling {
                index: ix,
                entry,
                lookup,
            }),
            unanswered,
            ..Call::default()
        })
    }

    /// After the ranges: on failure, restore every record this call wrote; then journal what the
    /// attachment holds now. A journal that cannot be written fails a successful ADD (rolled
    /// back: a lease the node does not know of would leak); after a failure it is only logged.
    fn conclude(&self, call: &mut Call<'_>, out: &[Lease], failed: bool) -> Result<(), AllocError> {
        let kept = if failed {
            // What the attachment held before this call stays journaled, with whatever could
            // not be rolled back.
            let mut kept = self.rollback(std::mem::take(&mut call.written));
            if let Some(j) = &call.journal {
                for l in j.lookup.mine.iter().flat_map(|e| e.held()) {
                    if !kept.iter().any(|k| k.address == l.address) {
                        kept.push(l.clone());
                    }
                }
            }
            kept
        } else {
            out.to_vec()
        };
        let Some(j) = &mut call.journal else {
            return Ok(());
        };
        // What this attachment holds now; anything it was about to claim and did not is dropped
        // (or the whole entry, when the ADD failed and was rolled back), unless its claim went
        // unanswered.
        j.entry.leases = kept;
        j.entry.pending = None;
        j.entry
            .keep_unanswered(std::mem::take(&mut call.unanswered));
        if let Err(e) = j.index.record(&self.scope.network, &j.entry) {
            if !failed {
                self.rollback(std::mem::take(&mut call.written));
                return Err(e.into());
            }
            log::error!("network {}: {e}", self.scope.network);
        }
        self.forget_taken_over(j);
        Ok(())
    }

    /// Every record of the network into `call.view` (one `list`); what this call read or wrote
    /// itself is newer than a snapshot served from a cache and wins.
    fn snapshot(&self, call: &mut Call<'_>) -> Result<(), AllocError> {
        for l in self.store.list(&self.scope)? {
            if !call.seen.contains(&l.address) {
                call.view.insert(l.address, l);
            }
        }
        call.complete = true;
        Ok(())
    }

    /// The record of `address`: from the snapshot, or read once (point mode).
    pub(super) fn load(
        &self,
        call: &mut Call<'_>,
        address: IpAddr,
    ) -> Result<Option<Lease>, AllocError> {
        if !call.complete && call.seen.insert(address) {
            match self.store.get(&self.scope, address)? {
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
    /// journal's records of `whose` attachments.
    fn find_held(
        &self,
        call: &mut Call<'_>,
        i: usize,
        whose: Holder,
        pred: impl Fn(&Lease) -> bool,
    ) -> Result<Option<Lease>, AllocError> {
        let Some(j) = &call.journal else {
            return Ok(self.find(&call.view, i, pred));
        };
        let entries: Vec<JournalEntry> = match whose {
            Holder::ThisAttachment => j.lookup.mine.iter().cloned().collect(),
            Holder::PodsOtherSandboxes => j.lookup.same_pod.clone(),
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

        // 1. Idempotent ADD: the attachment already holds a lease in this range.
        if let Some(l) = self.held_by_attachment(i, req, wanted, call)? {
            return Ok(l);
        }

        // 2. Requested address.
        if let Some(w) = wanted {
            return self.take_requested(i, req, w, call);
        }

        // 3. Sandbox re-create: same pod object and ifname, new container ID, never released.
        if let Some(l) = self.take_over_sandbox(i, req, call)? {
            return Ok(l);
        }

        if !call.complete {
            // 4. Sticky through the store's index by pod identity: found in one read however
            // full the range is. Then 4 + 5 by point reads (the walk finds sticky records the
            // index does not have, e.g. ones written before it existed; see walk_points).
            if let Some(l) = self.take_sticky_by_pod(i, req, call)? {
                return Ok(l);
            }
            if let Some(l) = self.walk_points(i, req, call)? {
                return Ok(l);
            }
            // A long walk: one snapshot, then the same rules as a node-local store.
            log::info!(
                "network {}: no address found within {} reads in range {}; reading the whole network",
                self.scope.network,
                self.policy.max_point_reads,
                range
            );
            self.snapshot(call)?;
            return self.take_from_pool(i, req, call);
        }

        // 4. Sticky: the pod's previous address in this range, if still just released.
        let sticky = self.latest_sticky(call.view.values(), i, req);
        if let Some(l) = self.take_sticky(i, req, sticky, call)? {
            return Ok(l);
        }

        // 5. The pool.
        self.take_from_pool(i, req, call)
    }

    /// The lease the attachment already holds in range `i`, if any; holding another address
    /// than the one it now requests is an error.
    fn held_by_attachment(
        &self,
        i: usize,
        req: &AddRequest,
        wanted: Option<RequestedIp>,
        call: &mut Call<'_>,
    ) -> Result<Option<Lease>, AllocError> {
        let Some(l) = self.find_held(call, i, Holder::ThisAttachment, |l| {
            l.is_leased() && l.is_attachment(&req.container_id, &req.ifname)
        })?
        else {
            return Ok(None);
        };
        match wanted {
            Some(w) if w.address != l.address => Err(AllocError::AttachmentHasOther {
                container_id: req.container_id.clone(),
                ifname: req.ifname.clone(),
                existing: l.address,
                requested: w.address,
                range: self.ranges[i].to_string(),
            }),
            _ => Ok(Some(l)),
        }
    }

    /// A re-created sandbox of the same pod (same pod object and ifname, new container ID)
    /// takes over the lease its old sandbox never released. `None` when there is none, or it
    /// changed under us (the caller then allocates normally).
    fn take_over_sandbox(
        &self,
        i: usize,
        req: &AddRequest,
        call: &mut Call<'_>,
    ) -> Result<Option<Lease>, AllocError> {
        let Some(old) = self.find_held(call, i, Holder::PodsOtherSandboxes, |l| {
            l.is_leased()
                && l.pod.same_pod(&req.pod)
                && l.ifname == req.ifname
                && l.container_id != req.container_id
        })?
        else {
            return Ok(None);
        };
        let new = self.new_lease(req, old.address, old.prefix_len, i, self.clock.now());
        let from = old.container_id.clone();
        let Claimed::Got(l) = self.claim(i, new, Some(old), Wire::Ours, call)? else {
            return Ok(None);
        };
        log::info!(
            "network {}: {} moves from container {} to {} (pod {} re-created its sandbox)",
            self.scope.network,
            l.address,
            from,
            req.container_id,
            req.pod
        );
        Ok(Some(l))
    }

    /// The pod's latest just-released record in range `i` from [`LeaseStore::by_pod`], taken
    /// over (probed) if the store still has it as read: a stale read only costs the walk.
    ///
    /// [`LeaseStore::by_pod`]: crate::LeaseStore::by_pod
    fn take_sticky_by_pod(
        &self,
        i: usize,
        req: &AddRequest,
        call: &mut Call<'_>,
    ) -> Result<Option<Lease>, AllocError> {
        if call.by_pod.is_none() {
            call.by_pod = Some(
                self.store
                    .by_pod(&self.scope, &req.pod)?
                    .unwrap_or_default(),
            );
        }
        let records = call.by_pod.iter().flatten();
        let sticky =
            self.latest_sticky(records.filter(|l| !call.seen.contains(&l.address)), i, req);
        self.take_sticky(i, req, sticky, call)
    }

    /// Of `records`, the latest `Released` one of the pod's name and interface in range `i`.
    fn latest_sticky<'r>(
        &self,
        records: impl Iterator<Item = &'r Lease>,
        i: usize,
        req: &AddRequest,
    ) -> Option<Lease> {
        records
            .filter(|l| {
                matches!(l.state, LeaseState::Released { .. })
                    && l.network == self.scope.network
                    && l.pod.same_name(&req.pod)
                    && l.ifname == req.ifname
                    && self.range_of(l) == Some(i)
            })
            .max_by_key(|l| (l.since, l.address))
            .cloned()
    }

    /// Take `old` (a sticky record) over for `req`, probed; `None` when there is none or it was
    /// taken meanwhile or answers on the wire.
    fn take_sticky(
        &self,
        i: usize,
        req: &AddRequest,
        old: Option<Lease>,
        call: &mut Call<'_>,
    ) -> Result<Option<Lease>, AllocError> {
        let Some(old) = old else {
            return Ok(None);
        };
        let now = self.clock.now();
        let new = self.new_lease(req, old.address, self.ranges[i].prefix_len(), i, now);
        Ok(match self.claim(i, new, Some(old), Wire::Probe, call)? {
            Claimed::Got(l) => Some(l),
            Claimed::Lost | Claimed::InUse(_) => None,
        })
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
                            holder: format!(
                                "pod {} (container {}, interface {}, network {})",
                                l.pod, l.container_id, l.ifname, l.network
                            ),
                        });
                    }
                    // Same pod, new sandbox: take it over without probing.
                    self.claim(i, new, current, Wire::Ours, call)?
                }
                // Free, released or quarantined: an explicit request overrides cooldown and
                // quarantine, but is probed.
                _ => self.claim(i, new, current, Wire::Probe, call)?,
            };
            match outcome {
                Claimed::Got(l) => return Ok(l),
                Claimed::Lost => continue,
                Claimed::InUse(mac) => {
                    return Err(AllocError::RequestedInUse {
                        network: self.scope.network.clone(),
                        address: w.address,
                        mac,
                        quarantine_s: self.policy.quarantine_s,
                    });
                }
            }
        }
        Err(AllocError::Contention {
            network: self.scope.network.clone(),
            address: w.address,
            attempts: self.policy.max_attempts,
        })
    }

    /// After a sandbox re-create took a lease over, the old sandbox's journal entry no longer
    /// holds it (one whose take-over went unanswered may still be the old sandbox's).
    pub(super) fn forget_taken_over(&self, j: &Journaling<'_>) {
        for old in &j.lookup.same_pod {
            let kept: Vec<Lease> = old
                .leases
                .iter()
                .filter(|l| !j.entry.held().any(|m| m.address == l.address))
                .cloned()
                .collect();
            if kept.len() != old.leases.len() {
                let mut e = old.clone();
                e.leases = kept;
                if let Err(err) = j.index.record(&self.scope.network, &e) {
                    log::warn!("network {}: {err}", self.scope.network);
                }
            }
        }
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

    pub(super) fn new_lease(
        &self,
        req: &AddRequest,
        address: IpAddr,
        prefix_len: u8,
        i: usize,
        now: u64,
    ) -> Lease {
        Lease {
            network: self.scope.network.clone(),
            domain: self.scope.domain.clone(),
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
