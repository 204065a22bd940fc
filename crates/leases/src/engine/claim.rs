//! Taking one address: write it to the node journal first (point mode), claim it with
//! compare-and-swap, have it probed with no lock held (in the ADD's probe step, or at once once a
//! range starts over), and quarantine it when something answers.

use super::call::{Call, Written};
use super::{AllocError, Allocator};
use crate::model::{Lease, LeaseState};
use crate::probe::ProbeOutcome;
use crate::store::Taken;

/// Whether a claimed address is probed on the wire first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wire {
    /// A new holder: something on the segment may use the address.
    Probe,
    /// The attachment's own address (a re-created sandbox of the same pod): it answers for it.
    Ours,
}

/// What became of one claim.
#[allow(clippy::large_enum_variant)]
pub(super) enum Claimed {
    Got(Lease),
    Lost,
    InUse(String),
}

impl Allocator<'_> {
    /// Claim one record. Unless it is [`Wire::Ours`], it is probed with no lock held: later, by
    /// the ADD's probe step, while the step defers; else now, and quarantined on conflict.
    /// With a journal, the address is recorded for this attachment before it is claimed.
    pub(super) fn claim(
        &self,
        i: usize,
        new: Lease,
        expected: Option<Lease>,
        wire: Wire,
        call: &mut Call<'_>,
    ) -> Result<Claimed, AllocError> {
        let address = new.address;
        if let Some(j) = &mut call.journal
            && !j.entry.leases.iter().any(|l| l.address == address)
        {
            j.entry.leases.push(new.clone());
            j.index.record(&self.scope.network, &j.entry)?;
        }
        call.seen.insert(address);
        // Kept while journaling: a claim whose answer never came may still be made.
        let sent = call.journal.is_some().then(|| new.clone());
        let got = match self.store.claim(new, expected.as_ref()) {
            Ok(Ok(l)) => l,
            Err(e) => {
                if e.is_transient()
                    && let Some(sent) = sent
                {
                    call.unanswered.push(sent);
                }
                return Err(e.into());
            }
            Ok(Err(Taken { current })) => {
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
        if wire == Wire::Ours {
            return Ok(Claimed::Got(got));
        }
        call.probes.wait_for(i, address);
        if call.probes.deferring {
            return Ok(Claimed::Got(got));
        }
        let answer = call.probes.run(self.prober, &self.ranges)?.pop();
        match answer.map(|a| a.outcome) {
            Some(ProbeOutcome::InUse { mac }) => {
                self.quarantine(&got, &mac, call)?;
                Ok(Claimed::InUse(mac))
            }
            _ => Ok(Claimed::Got(got)),
        }
    }

    /// `got`, claimed by this ADD, answered the probe from `mac`: it becomes a quarantine record,
    /// which is evidence, not an allocation (the rollback leaves it).
    pub(super) fn quarantine(
        &self,
        got: &Lease,
        mac: &str,
        call: &mut Call<'_>,
    ) -> Result<(), AllocError> {
        let address = got.address;
        let at = self.clock.now();
        log::warn!(
            "network {}: {} answered the conflict probe from MAC {}; quarantining it for {}s",
            self.scope.network,
            address,
            mac,
            self.policy.quarantine_s
        );
        let mut q = got.clone();
        q.state = LeaseState::Quarantined {
            mac: mac.to_string(),
            at,
        };
        q.since = at;
        q.version = None;
        let updated = self.store.update(q, got)?;
        call.written.retain(|w| w.now.address != address);
        match updated {
            Ok(stored) => {
                call.view.insert(address, stored);
            }
            Err(Taken { current }) => {
                log::warn!(
                    "network {}: could not quarantine {address}: it changed meanwhile",
                    self.scope.network
                );
                match current {
                    Some(c) => call.view.insert(address, c),
                    None => call.view.remove(&address),
                };
            }
        }
        Ok(())
    }
}
