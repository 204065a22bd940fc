//! The conflict probe as a step of the ADD. The first pass over the ranges only claims: each
//! address that needs probing waits in [`ProbeStep::pending`]. Then one step probes them all at
//! once, so an IPv4 and an IPv6 range cost one probe budget, not two. A range whose address
//! answered starts over with its candidates probed one at a time ([`ProbeStep::deferring`] off),
//! exactly as a walk meets a conflict: quarantine, next candidate.

use std::any::Any;
use std::net::IpAddr;

use tether_pool::IpRange;

use super::AllocError;
use crate::model::Lease;
use crate::probe::{Candidate, ProbeError, ProbeOutcome, Prober};

/// One answer of a step: the range, the address and what the wire said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Answer {
    pub(super) range: usize,
    pub(super) address: IpAddr,
    pub(super) outcome: ProbeOutcome,
}

/// What an ADD has sent to probe, what answered and what still waits.
pub(super) struct ProbeStep {
    /// Claimed and not probed yet: (range index, address), in claim order.
    pending: Vec<(usize, IpAddr)>,
    /// Claims wait for [`ProbeStep::run`] (the first pass over the ranges) rather than being
    /// probed at once.
    pub(super) deferring: bool,
    /// Probed in this ADD; nobody answered.
    proved: Vec<IpAddr>,
    /// Probed in this ADD and answered: (range index, address, MAC), in probe order.
    answered: Vec<(usize, IpAddr, String)>,
    /// What the probes left to release once the reply is out.
    release_later: Vec<Box<dyn Any>>,
}

impl Default for ProbeStep {
    fn default() -> ProbeStep {
        ProbeStep {
            pending: Vec::new(),
            deferring: true,
            proved: Vec::new(),
            answered: Vec::new(),
            release_later: Vec::new(),
        }
    }
}

impl ProbeStep {
    /// `address`, claimed in range `range`, is probed by the next [`ProbeStep::run`].
    pub(super) fn wait_for(&mut self, range: usize, address: IpAddr) {
        self.pending.push((range, address));
    }

    /// Probe every pending address in one call of `prober`; the answers come in claim order.
    pub(super) fn run(
        &mut self,
        prober: &dyn Prober,
        ranges: &[IpRange],
    ) -> Result<Vec<Answer>, AllocError> {
        let pending = std::mem::take(&mut self.pending);
        if pending.is_empty() {
            return Ok(Vec::new());
        }
        let candidates: Vec<Candidate<'_>> = pending
            .iter()
            .map(|&(i, address)| Candidate {
                address,
                range: &ranges[i],
            })
            .collect();
        let failed = |source| AllocError::Probe {
            addresses: pending.iter().map(|&(_, a)| a).collect(),
            source,
        };
        let probed = prober.probe(&candidates).map_err(failed)?;
        self.release_later.extend(probed.release_later);
        if probed.outcomes.len() != pending.len() {
            return Err(failed(ProbeError::Failed(format!(
                "the prober answered {} of {} addresses",
                probed.outcomes.len(),
                pending.len()
            ))));
        }
        let answers: Vec<Answer> = pending
            .into_iter()
            .zip(probed.outcomes)
            .map(|((range, address), outcome)| Answer {
                range,
                address,
                outcome,
            })
            .collect();
        for a in &answers {
            match &a.outcome {
                ProbeOutcome::Free => self.proved.push(a.address),
                ProbeOutcome::InUse { mac } => {
                    self.answered.push((a.range, a.address, mac.clone()));
                }
            }
        }
        Ok(answers)
    }

    /// The addresses of range `range` that answered in this ADD, with the MAC that answered.
    pub(super) fn answered_in(&self, range: usize) -> Vec<(IpAddr, String)> {
        self.answered
            .iter()
            .filter(|(i, _, _)| *i == range)
            .map(|(_, a, mac)| (*a, mac.clone()))
            .collect()
    }

    /// The addresses this ADD probed and found unused, and what the probes left to release.
    pub(super) fn finish(self) -> (Vec<IpAddr>, Vec<Box<dyn Any>>) {
        (self.proved, self.release_later)
    }
}

/// What an ADD handed out, and what its probe step found.
pub struct AddOutcome {
    /// One lease per range, in range order.
    pub leases: Vec<Lease>,
    /// Addresses of `leases` that this ADD probed on the wire and found unused.
    pub probed: Vec<IpAddr>,
    /// What the probes left for the caller to release once its reply is out.
    pub release_later: Vec<Box<dyn Any>>,
}

impl AddOutcome {
    pub(super) fn new(leases: Vec<Lease>, probes: ProbeStep) -> AddOutcome {
        let (proved, release_later) = probes.finish();
        let probed = leases
            .iter()
            .map(|l| l.address)
            .filter(|a| proved.contains(a))
            .collect();
        AddOutcome {
            leases,
            probed,
            release_later,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::probe::Probed;

    fn range(s: &str) -> IpRange {
        IpRange::parse(s).unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Answers `in_use` for one address, Free for the rest, and keeps every call's addresses.
    struct Recording {
        in_use: IpAddr,
        calls: RefCell<Vec<Vec<IpAddr>>>,
        answers: Option<usize>,
    }

    impl Prober for Recording {
        fn probe(&self, candidates: &[Candidate<'_>]) -> Result<Probed, ProbeError> {
            self.calls
                .borrow_mut()
                .push(candidates.iter().map(|c| c.address).collect());
            let mut outcomes: Vec<ProbeOutcome> = candidates
                .iter()
                .map(|c| match c.address == self.in_use {
                    true => ProbeOutcome::InUse { mac: "m".into() },
                    false => ProbeOutcome::Free,
                })
                .collect();
            outcomes.truncate(self.answers.unwrap_or(usize::MAX));
            Ok(Probed {
                outcomes,
                release_later: Some(Box::new("socket")),
            })
        }
    }

    #[test]
    fn one_call_for_every_pending_address_answers_in_claim_order() {
        let ranges = [range("10.0.0.0/24"), range("fd00::/120")];
        let prober = Recording {
            in_use: ip("fd00::5"),
            calls: RefCell::default(),
            answers: None,
        };
        let mut step = ProbeStep::default();
        step.wait_for(0, ip("10.0.0.5"));
        step.wait_for(1, ip("fd00::5"));
        let answers = step.run(&prober, &ranges).unwrap();
        assert_eq!(
            *prober.calls.borrow(),
            vec![vec![ip("10.0.0.5"), ip("fd00::5")]]
        );
        assert_eq!(answers[0].outcome, ProbeOutcome::Free);
        assert_eq!((answers[1].range, answers[1].address), (1, ip("fd00::5")));
        assert!(matches!(answers[1].outcome, ProbeOutcome::InUse { .. }));
        assert_eq!(step.answered_in(1), vec![(ip("fd00::5"), "m".to_string())]);
        assert!(step.answered_in(0).is_empty());
        // Nothing pending: no second call.
        assert!(step.run(&prober, &ranges).unwrap().is_empty());
        assert_eq!(prober.calls.borrow().len(), 1);
        let (proved, release_later) = step.finish();
        assert_eq!(proved, vec![ip("10.0.0.5")]);
        assert_eq!(release_later.len(), 1);
    }

    #[test]
    fn a_prober_that_answers_short_fails_the_step() {
        let ranges = [range("10.0.0.0/24")];
        let prober = Recording {
            in_use: ip("10.0.0.9"),
            calls: RefCell::default(),
            answers: Some(1),
        };
        let mut step = ProbeStep::default();
        step.wait_for(0, ip("10.0.0.5"));
        step.wait_for(0, ip("10.0.0.6"));
        let e = step.run(&prober, &ranges).unwrap_err();
        assert!(
            e.to_string().contains(
                "conflict probe for 10.0.0.5 and 10.0.0.6 failed: the prober answered 1 of 2"
            ),
            "{e}"
        );
        assert!(
            step.finish().0.is_empty(),
            "nothing is proved by a failed step"
        );
    }
}
