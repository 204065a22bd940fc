//! Forgetting old records: released and expired quarantine records past their retention are
//! deleted (a few by each DEL, all by GC), or a wide IPv6 range would grow a record per ADD.

use super::{AllocError, Allocator};
use crate::model::{Lease, LeaseState};

impl Allocator<'_> {
    /// Delete released and expired quarantine records of `all` older than
    /// [`Policy::retain_released_s`] (and past their cooldown or quarantine), at most `max`.
    ///
    /// [`Policy::retain_released_s`]: super::Policy::retain_released_s
    pub fn prune(
        &self,
        all: &[Lease],
        now: u64,
        max: usize,
        errors: &mut Vec<AllocError>,
    ) -> usize {
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
}
