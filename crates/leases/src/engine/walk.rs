//! Where a new address comes from: the pool walk from a hashed offset, by point reads (a store
//! with a node journal) or over one snapshot, skipping leased, quarantined and cooling-down
//! records, cooling-down ones used last; and the error when a range has nothing left.

use std::net::IpAddr;

use super::add::AddRequest;
use super::call::Call;
use super::claim::{Claimed, Wire};
use super::{AllocError, Allocator};
use crate::model::{Lease, LeaseState, PodRef};
use tether_stable_hash::{fnv1a64, mix64};

/// What creating a candidate first came to.
// One per candidate, consumed at once.
#[allow(clippy::large_enum_variant)]
enum Tried {
    /// Created: ours.
    Got(Lease),
    /// Created, but the probe found it in use (now quarantined).
    InUse,
    /// Someone's record (or none, gone since): what it is now.
    Held(Option<Lease>),
}

/// What an existing record of the range is to a new ADD: free to take, blocked (leased or
/// quarantined), or cooling down (taken only when nothing else is free).
#[derive(PartialEq, Eq)]
enum Class {
    Free,
    Blocked,
    Cooling,
}

impl Allocator<'_> {
    /// The pool walk by point reads, for a store without cheap snapshots: O(1) requests in the
    /// steady state, whatever the number of leases.
    ///
    /// Candidates come in an order derived from the pod's identity ([`walk_start`]), so a pod
    /// that comes back (a StatefulSet pod on any node) meets its previous address early. Each
    /// candidate is created at once while none was taken (a conditional CREATE: one request
    /// when nobody holds it; see `try_candidate`), read first after that: no record → it is
    /// ours at once; this pod's own `Released` record (same namespace/name and ifname) → claim
    /// it (sticky); leased, quarantined → skip; released by another pod within the cooldown →
    /// keep for last. A record released by
    /// another pod longer ago is free, but the walk goes on for up to
    /// [`Policy::sticky_horizon`] more reads looking for an address nobody had or this pod's
    /// own, so that pod keeps its sticky address too. Then the free records in walk order,
    /// then the cooling ones, longest released first.
    ///
    /// `Ok(None)` after [`Policy::max_point_reads`] reads without an address (a nearly full
    /// range): the caller takes one snapshot and finishes like a node-local store. A range no
    /// larger than that is read whole, so its exhaustion is reported with exact counts.
    ///
    /// [`Policy::sticky_horizon`]: super::Policy::sticky_horizon
    /// [`Policy::max_point_reads`]: super::Policy::max_point_reads
    pub(super) fn walk_points(
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
        let mut whole = true;
        let mut busy = false;
        for cand in range.candidates(walk_start(req, i)) {
            if !free.is_empty() && reads >= self.policy.sticky_horizon {
                whole = false;
                break;
            }
            if reads >= self.policy.max_point_reads {
                return Ok(None);
            }
            reads += 1;
            let current = match self.try_candidate(i, req, cand, &mut busy, call)? {
                Tried::Got(l) => return Ok(Some(l)),
                Tried::InUse => {
                    self.within_conflict_limit(i, call)?;
                    continue;
                }
                Tried::Held(current) => current,
            };
            let expected = match current {
                None => None,
                Some(l)
                    if matches!(l.state, LeaseState::Released { .. })
                        && l.network == self.scope.network
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
            match self.claim(i, new, expected, Wire::Probe, call)? {
                Claimed::Got(l) => return Ok(Some(l)),
                Claimed::Lost => {}
                Claimed::InUse(_) => self.within_conflict_limit(i, call)?,
            }
        }
        cooling.sort_by_key(|l| (l.since, l.address));
        if let Some(l) = self.claim_seen(i, req, free.into_iter().chain(cooling), now, call)? {
            return Ok(Some(l));
        }
        if !whole {
            return Ok(None);
        }
        // Every candidate of the range was read: the view holds the whole range.
        Err(self.no_address(i, call))
    }

    /// A candidate not seen yet in this call is created at once (a conditional CREATE: one
    /// request when nobody holds it, where reading it first would cost two); a taken one is what
    /// the refused CREATE showed (the store reads it after the 409), and makes the walk `busy`:
    /// the range is full around here, so the next candidates are read first (one request each to
    /// skip them, not two). One seen before in this call is read again.
    fn try_candidate(
        &self,
        i: usize,
        req: &AddRequest,
        cand: IpAddr,
        busy: &mut bool,
        call: &mut Call<'_>,
    ) -> Result<Tried, AllocError> {
        if *busy || call.seen.contains(&cand) {
            return Ok(Tried::Held(self.load(call, cand)?));
        }
        let prefix = self.ranges[i].prefix_len();
        let new = self.new_lease(req, cand, prefix, i, self.clock.now());
        Ok(match self.claim(i, new, None, Wire::Probe, call)? {
            Claimed::Got(l) => Tried::Got(l),
            Claimed::InUse(_) => Tried::InUse,
            Claimed::Lost => {
                *busy = true;
                Tried::Held(call.view.get(&cand).cloned())
            }
        })
    }

    pub(super) fn take_from_pool(
        &self,
        i: usize,
        req: &AddRequest,
        call: &mut Call<'_>,
    ) -> Result<Lease, AllocError> {
        let range = &self.ranges[i];
        let now = self.clock.now();
        let prefix = range.prefix_len();
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
                match self.claim(i, new, expected, Wire::Probe, call)? {
                    Claimed::Got(l) => return Ok(l),
                    Claimed::Lost => continue,
                    Claimed::InUse(_) => self.within_conflict_limit(i, call)?,
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
        if let Some(l) = self.claim_seen(i, req, cooling, now, call)? {
            return Ok(l);
        }
        Err(self.no_address(i, call))
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
            match self.claim(i, new, Some(cur), Wire::Probe, call)? {
                Claimed::Got(l) => {
                    if matches!(old.state, LeaseState::Released { at } if now < at.saturating_add(self.policy.cooldown_s))
                    {
                        log::warn!(
                            "network {}: range {} has no address outside its cooldown; reusing {} released at {}",
                            self.scope.network,
                            range,
                            l.address,
                            old.since
                        );
                    }
                    return Ok(Some(l));
                }
                Claimed::Lost => {}
                Claimed::InUse(_) => self.within_conflict_limit(i, call)?,
            }
        }
        Ok(None)
    }

    /// A candidate of range `i` answered the probe: too many in one ADD means something else
    /// hands out this range.
    fn within_conflict_limit(&self, i: usize, call: &Call<'_>) -> Result<(), AllocError> {
        let in_use = call.probes.answered_in(i);
        match in_use.last() {
            Some((last, mac)) if in_use.len() >= self.policy.max_probe_conflicts => {
                Err(AllocError::TooManyConflicts {
                    network: self.scope.network.clone(),
                    range: self.ranges[i].to_string(),
                    conflicts: in_use.len(),
                    last: *last,
                    mac: mac.clone(),
                })
            }
            _ => Ok(()),
        }
    }

    /// The error of a range with nothing left, with counts from the call's view (which holds
    /// the range).
    fn no_address(&self, i: usize, call: &Call<'_>) -> AllocError {
        let st = self.range_status(i, call.view.values(), self.clock.now());
        let in_use = call.probes.answered_in(i);
        if !in_use.is_empty() {
            // Say why: the last free candidates are used by someone else on the segment.
            return AllocError::InUseOnSegment {
                network: self.scope.network.clone(),
                range: st.range,
                in_use: in_use.into_boxed_slice(),
                usable: st.usable,
                leased: st.leased,
                quarantined: st.quarantined,
                cooling: st.cooling,
            };
        }
        self.exhausted(st)
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
