//! Test doubles of the engine's seams: a clock that moves when told and a prober that answers
//! as scripted. Built for this crate's tests and, with the `test-doubles` feature, for the tests
//! of the crates above it; never in a plugin.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::Clock;
use crate::probe::{Candidate, ProbeError, ProbeOutcome, Probed, Prober};

/// A clock that only moves when told to (tests).
#[derive(Debug, Default)]
pub struct FakeClock(AtomicU64);

impl FakeClock {
    /// A clock showing `now`.
    pub fn new(now: u64) -> FakeClock {
        FakeClock(AtomicU64::new(now))
    }

    /// Set the time.
    pub fn set(&self, now: u64) {
        self.0.store(now, Ordering::SeqCst);
    }

    /// Move the time forward by `secs`.
    pub fn advance(&self, secs: u64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A scripted prober for tests: per-address answers (default Free) and a record of calls.
#[derive(Debug, Default)]
pub struct ScriptedProber {
    answers: Mutex<HashMap<IpAddr, Result<ProbeOutcome, String>>>,
    calls: Mutex<Vec<IpAddr>>,
    steps: Mutex<Vec<Vec<IpAddr>>>,
}

impl ScriptedProber {
    /// Everything Free.
    pub fn new() -> ScriptedProber {
        ScriptedProber::default()
    }

    /// From now on, `address` is answered by `mac`.
    pub fn in_use(&self, address: IpAddr, mac: &str) {
        self.answers.lock().unwrap().insert(
            address,
            Ok(ProbeOutcome::InUse {
                mac: mac.to_string(),
            }),
        );
    }

    /// From now on, probing `address` fails with `message`.
    pub fn fail(&self, address: IpAddr, message: &str) {
        self.answers
            .lock()
            .unwrap()
            .insert(address, Err(message.to_string()));
    }

    /// From now on, `address` is Free again.
    pub fn clear(&self, address: IpAddr) {
        self.answers.lock().unwrap().remove(&address);
    }

    /// Every address probed so far, in order.
    pub fn calls(&self) -> Vec<IpAddr> {
        self.calls.lock().unwrap().clone()
    }

    /// The addresses of each probe call so far, one list per call.
    pub fn steps(&self) -> Vec<Vec<IpAddr>> {
        self.steps.lock().unwrap().clone()
    }
}

impl Prober for ScriptedProber {
    fn probe(&self, candidates: &[Candidate<'_>]) -> Result<Probed, ProbeError> {
        let addresses: Vec<IpAddr> = candidates.iter().map(|c| c.address).collect();
        self.calls.lock().unwrap().extend(&addresses);
        self.steps.lock().unwrap().push(addresses.clone());
        let answers = self.answers.lock().unwrap();
        let mut outcomes = Vec::with_capacity(addresses.len());
        for a in &addresses {
            outcomes.push(match answers.get(a) {
                None => ProbeOutcome::Free,
                Some(Ok(o)) => o.clone(),
                Some(Err(m)) => return Err(ProbeError::Failed(m.clone())),
            });
        }
        Ok(Probed::answers(outcomes))
    }
}
