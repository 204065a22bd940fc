//! Conflict probing seam. The engine calls [`Prober::probe`] after it has claimed a candidate
//! and outside any store lock; a later implementation sends ARP/NDP probes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use tether_pool::IpRange;

/// What a probe saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Nobody answered for the address.
    Free,
    /// A host with `mac` answered for the address.
    InUse {
        /// The MAC that answered, e.g. `02:42:ac:11:00:02`.
        mac: String,
    },
}

/// A probe could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Anything else, as text.
    #[error("{0}")]
    Failed(String),
    /// Any other error type (e.g. a packet-socket library's), shown as is.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

/// Checks whether an address is already used on the wire.
pub trait Prober {
    /// Probe `address`, about to be handed out from `range` (which knows prefix and gateway).
    fn probe(&self, address: IpAddr, range: &IpRange) -> Result<ProbeOutcome, ProbeError>;
}

/// Never probes: always [`ProbeOutcome::Free`] (`"probe": false`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProbe;

impl Prober for NoProbe {
    fn probe(&self, _address: IpAddr, _range: &IpRange) -> Result<ProbeOutcome, ProbeError> {
        Ok(ProbeOutcome::Free)
    }
}

/// A scripted prober for tests: per-address answers (default Free) and a record of calls.
#[derive(Debug, Default)]
pub struct ScriptedProber {
    answers: Mutex<HashMap<IpAddr, Result<ProbeOutcome, String>>>,
    calls: Mutex<Vec<IpAddr>>,
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
}

impl Prober for ScriptedProber {
    fn probe(&self, address: IpAddr, _range: &IpRange) -> Result<ProbeOutcome, ProbeError> {
        self.calls.lock().unwrap().push(address);
        match self.answers.lock().unwrap().get(&address) {
            None => Ok(ProbeOutcome::Free),
            Some(Ok(o)) => Ok(o.clone()),
            Some(Err(m)) => Err(ProbeError::Failed(m.clone())),
        }
    }
}
