//! Conflict probing seam. The engine probes what an ADD claimed in one step, after every range
//! has its candidate and outside any store lock (see `engine::probe_step`); tether-ipam's prober
//! sends ARP/NDP probes on the wire.

use std::any::Any;
use std::net::IpAddr;

use tether_pool::IpRange;

/// One address to probe: about to be handed out from `range` (which knows prefix and gateway).
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'r> {
    /// The address.
    pub address: IpAddr,
    /// Its range entry.
    pub range: &'r IpRange,
}

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

/// The answers to one [`Prober::probe`] call.
pub struct Probed {
    /// One per candidate, in the order they were given.
    pub outcomes: Vec<ProbeOutcome>,
    /// What the probe leaves for the caller to release once its reply is out (open packet
    /// sockets, whose close waits out an RCU grace period); `None` when there is nothing.
    pub release_later: Option<Box<dyn Any>>,
}

impl Probed {
    /// Answers with nothing to release later.
    pub fn answers(outcomes: Vec<ProbeOutcome>) -> Probed {
        Probed {
            outcomes,
            release_later: None,
        }
    }
}

/// A probe could not be carried out. The interface cases are their own variants so that a
/// fault the attacher also meets (a master that is missing or down) gets the attacher's code.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The interface to probe through does not exist.
    #[error("{name:?} was not found {place} for probing")]
    LinkMissing {
        /// The interface.
        name: String,
        /// Where it was looked for, e.g. "on the host".
        place: String,
    },
    /// The interface to probe through is a master, and it is down: a probe through it proves
    /// nothing, and tether never changes a master's state.
    #[error(
        "cannot probe through {name:?} {place}: the link is down, and a probe through a down link proves nothing; \
         bring {name} up (tether never changes the state of a master) or set \"probe\": false; \
         the kubelet retries the pod by itself once the link is up"
    )]
    LinkDown {
        /// The interface.
        name: String,
        /// Where it is, e.g. "on the host".
        place: String,
    },
    /// Anything else, as text.
    #[error("{0}")]
    Failed(String),
    /// Any other error type (e.g. a packet-socket library's), shown as is.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

/// Checks whether addresses are already used on the wire.
pub trait Prober {
    /// Probe every candidate at once, within one budget: one outcome per candidate, in order.
    fn probe(&self, candidates: &[Candidate<'_>]) -> Result<Probed, ProbeError>;
}

/// Never probes: always [`ProbeOutcome::Free`] (`"probe": false`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProbe;

impl Prober for NoProbe {
    fn probe(&self, candidates: &[Candidate<'_>]) -> Result<Probed, ProbeError> {
        Ok(Probed::answers(vec![ProbeOutcome::Free; candidates.len()]))
    }
}
