//! Conflict probing seam. The engine calls [`Prober::probe`] after it has claimed a candidate
//! and outside any store lock; tether-ipam's prober sends ARP/NDP probes on the wire.

use std::net::IpAddr;

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
