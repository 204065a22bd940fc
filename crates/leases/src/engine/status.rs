//! STATUS and usage: per-range counts of leased, quarantined and cooling-down records, and
//! whether a new ADD could still get an address.

use super::{AllocError, Allocator};
use crate::model::{Lease, LeaseState};

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

impl Allocator<'_> {
    /// STATUS: per-range occupancy; `Err` when the store cannot be used or some range has no
    /// address left for a new ADD (every usable address leased or quarantined).
    pub fn status(&self) -> Result<Vec<RangeStatus>, AllocError> {
        let all = self.store.list(&self.scope)?;
        let now = self.clock.now();
        let mut out = Vec::new();
        for i in 0..self.ranges.len() {
            let st = self.range_status(i, all.iter(), now);
            if st.free == 0 {
                return Err(self.exhausted(st));
            }
            out.push(st);
        }
        Ok(out)
    }

    /// Every range's counts, full ones included (STATUS fails at the first full range): for
    /// monitoring, where a full range is the number that matters most.
    pub fn usage(&self) -> Result<Vec<RangeStatus>, AllocError> {
        let all = self.store.list(&self.scope)?;
        let now = self.clock.now();
        Ok((0..self.ranges.len())
            .map(|i| self.range_status(i, all.iter(), now))
            .collect())
    }

    /// The error of a range with nothing left to hand out, with its counts.
    pub(super) fn exhausted(&self, st: RangeStatus) -> AllocError {
        AllocError::Exhausted {
            network: self.scope.network.clone(),
            range: st.range,
            usable: st.usable,
            leased: st.leased,
            quarantined: st.quarantined,
            cooling: st.cooling,
        }
    }

    pub(super) fn range_status<'l>(
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
}
