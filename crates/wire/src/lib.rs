//! ARP and NDP on the wire, for one purpose each:
//! - [`probe`]: is this candidate address already used by someone on the segment? (RFC 5227 ARP probe
//!   with sender IP 0.0.0.0; IPv6 DAD Neighbor Solicitation from `::`.)
//! - [`announce`]: tell the segment an address now lives here (gratuitous ARP, unsolicited NA), sent
//!   only after the address is configured.
//!
//! Sockets are AF_PACKET, opened for the call and closed after (see [`socket`]).

pub mod frame;
pub mod socket;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use frame::{Mac, NDP_NA, NDP_NS, format_mac};
use socket::{Filter, PacketSocket, schedule};

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("cannot open a packet socket on interface #{ifindex}: {source}")]
    Open { ifindex: u32, source: std::io::Error },
    #[error("sending on interface #{ifindex}: {source}")]
    Send { ifindex: u32, source: std::io::Error },
    #[error("receiving on interface #{ifindex}: {source}")]
    Recv { ifindex: u32, source: std::io::Error },
}

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    Free,
    /// Someone answered for the address, or is probing for it too; `mac` is theirs.
    InUse { mac: String },
}

/// How long to listen and how many probes to send in that time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeBudget {
    pub timeout: Duration,
    pub attempts: u32,
}

impl Default for ProbeBudget {
    fn default() -> Self {
        ProbeBudget { timeout: Duration::from_millis(100), attempts: 1 }
    }
}

/// Probe `candidate` on interface `ifindex` whose MAC is `mac`. Listens for the whole budget unless a
/// conflict shows up earlier.
pub fn probe(ifindex: u32, mac: Mac, candidate: IpAddr, budget: ProbeBudget) -> Result<ProbeOutcome, WireError> {
    let (filter, packet) = match candidate {
        IpAddr::V4(v4) => (Filter::Arp, frame::arp_probe(mac, v4)),
        IpAddr::V6(v6) => (Filter::Icmpv6, frame::ndp_probe(mac, v6)),
    };
    let sock = PacketSocket::open(ifindex, filter).map_err(|source| WireError::Open { ifindex, source })?;
    let start = Instant::now();
    let deadline = start + budget.timeout;
    let mut sends = schedule(budget.timeout, budget.attempts).into_iter().peekable();
    let mut buf = [0u8; 2048];
    loop {
        while sends.peek().is_some_and(|at| start + *at <= Instant::now()) {
            sends.next();
            sock.send(&packet).map_err(|source| WireError::Send { ifindex, source })?;
        }
        let wake = sends.peek().map_or(deadline, |at| (start + *at).min(deadline));
        match sock.recv_until(wake, &mut buf).map_err(|source| WireError::Recv { ifindex, source })? {
            Some(n) => {
                if let Some(holder) = conflict(&buf[..n], mac, candidate) {
                    return Ok(ProbeOutcome::InUse { mac: format_mac(&holder) });
                }
            }
            None if Instant::now() >= deadline => return Ok(ProbeOutcome::Free),
            None => {}
        }
    }
}

/// The MAC of whoever the frame shows using or claiming `candidate`, if anyone.
fn conflict(f: &[u8], ours: Mac, candidate: IpAddr) -> Option<Mac> {
    match candidate {
        IpAddr::V4(c) => {
            let a = frame::parse_arp(f)?;
            // Anyone speaking as the candidate, or another host probing for it (RFC 5227 §2.1.1).
            let speaks = a.spa == c;
            let probes = a.spa.is_unspecified() && a.tpa == c && !a.is_reply && a.sha != ours;
            (speaks || probes).then_some(a.sha)
        }
        IpAddr::V6(c) => {
            let n = frame::parse_ndp(f)?;
            if n.target != c {
                return None;
            }
            match n.kind {
                NDP_NA => Some(n.tlla.unwrap_or(n.eth_src)),
                // Another host's DAD for the same address.
                NDP_NS if n.src.is_unspecified() && n.eth_src != ours => Some(n.eth_src),
                _ => None,
            }
        }
    }
}

/// Announce each address `count` times, `interval` apart: gratuitous ARP for IPv4, unsolicited NA for
/// IPv6. Call only once the addresses are configured.
pub fn announce(ifindex: u32, mac: Mac, addrs: &[IpAddr], count: u32, interval: Duration) -> Result<(), WireError> {
    if addrs.is_empty() {
        return Ok(());
    }
    let frames: Vec<Vec<u8>> = addrs
        .iter()
        .map(|a| match a {
            IpAddr::V4(v4) => frame::arp_announce(mac, *v4),
            IpAddr::V6(v6) => frame::ndp_announce(mac, *v6),
        })
        .collect();
    // The filter only governs receiving; this socket never reads.
    let sock = PacketSocket::open(ifindex, Filter::Arp).map_err(|source| WireError::Open { ifindex, source })?;
    for i in 0..count {
        if i > 0 {
            std::thread::sleep(interval);
        }
        for f in &frames {
            sock.send(f).map_err(|source| WireError::Send { ifindex, source })?;
        }
    }
    Ok(())
}

/// Parse `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<Mac> {
    let parts: Vec<u8> = s.split(':').map(|p| u8::from_str_radix(p, 16)).collect::<Result<_, _>>().ok()?;
    parts.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Mac = [2, 0, 0, 0, 0, 1];
    const THEM: Mac = [2, 0, 0, 0, 0, 2];

    #[test]
    fn arp_conflict_rules() {
        let c: IpAddr = "10.1.2.9".parse().unwrap();
        // Someone announcing the candidate.
        assert_eq!(conflict(&frame::arp_announce(THEM, "10.1.2.9".parse().unwrap()), US, c), Some(THEM));
        // Another prober for the same address.
        assert_eq!(conflict(&frame::arp_probe(THEM, "10.1.2.9".parse().unwrap()), US, c), Some(THEM));
        // Our own probe echoed back, or traffic about other addresses: no conflict.
        assert_eq!(conflict(&frame::arp_probe(US, "10.1.2.9".parse().unwrap()), US, c), None);
        assert_eq!(conflict(&frame::arp_announce(THEM, "10.1.2.8".parse().unwrap()), US, c), None);
    }

    #[test]
    fn ndp_conflict_rules() {
        let c: IpAddr = "fd00::9".parse().unwrap();
        assert_eq!(conflict(&frame::ndp_announce(THEM, "fd00::9".parse().unwrap()), US, c), Some(THEM));
        assert_eq!(conflict(&frame::ndp_probe(THEM, "fd00::9".parse().unwrap()), US, c), Some(THEM));
        assert_eq!(conflict(&frame::ndp_probe(US, "fd00::9".parse().unwrap()), US, c), None);
        assert_eq!(conflict(&frame::ndp_announce(THEM, "fd00::8".parse().unwrap()), US, c), None);
    }

    #[test]
    fn mac_parsing() {
        assert_eq!(parse_mac("02:00:00:00:00:0a"), Some([2, 0, 0, 0, 0, 10]));
        assert_eq!(parse_mac("02:00:00:00:00"), None);
        assert_eq!(parse_mac("zz:00:00:00:00:00"), None);
    }

    #[test]
    fn schedule_spreads_attempts() {
        assert_eq!(schedule(Duration::from_millis(100), 1), vec![Duration::ZERO]);
        assert_eq!(schedule(Duration::from_millis(90), 3), vec![Duration::ZERO, Duration::from_millis(30), Duration::from_millis(60)]);
        assert_eq!(schedule(Duration::from_millis(90), 0).len(), 1);
    }
}
