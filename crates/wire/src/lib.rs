//! ARP and NDP on the wire, for one purpose each:
//! - [`probe`]: is this candidate address already used by someone on the segment? (RFC 5227 ARP probe
//!   with sender IP 0.0.0.0; IPv6 DAD Neighbor Solicitation from `::`.)
//! - [`announce`]: tell the segment an address now lives here (gratuitous ARP, unsolicited NA), sent
//!   only after the address is configured.
//!
//! - [`guard`]: after the ADD, watch the segment for another host speaking as a pod's address
//!   (RFC 5227 §2.4), and defend it where asked.
//!
//! Sockets are AF_PACKET, opened for the call and closed after (see [`socket`]). Probes of several
//! addresses run at the same time on one socket and cost one budget ([`Probe`]).

pub mod frame;
pub mod guard;
pub mod socket;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use frame::{Mac, NDP_NA, NDP_NS, format_mac};
use socket::{Filter, PacketSocket, schedule};

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("cannot open a packet socket on interface #{ifindex}: {source}")]
    Open {
        ifindex: u32,
        source: std::io::Error,
    },
    #[error(
        "cannot widen the packet filter on interface #{ifindex} to another address family: {source}"
    )]
    Filter {
        ifindex: u32,
        source: std::io::Error,
    },
    #[error("sending on interface #{ifindex}: {source}")]
    Send {
        ifindex: u32,
        source: std::io::Error,
    },
    #[error("receiving on interface #{ifindex}: {source}")]
    Recv {
        ifindex: u32,
        source: std::io::Error,
    },
}

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    Free,
    /// Someone answered for the address, or is probing for it too; `mac` is theirs.
    InUse {
        mac: String,
    },
}

/// How long to listen and how many probes to send in that time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeBudget {
    pub timeout: Duration,
    pub attempts: u32,
}

impl Default for ProbeBudget {
    fn default() -> Self {
        ProbeBudget {
            timeout: Duration::from_millis(100),
            attempts: 1,
        }
    }
}

/// Probe `candidate` on interface `ifindex` whose MAC is `mac`. Listens for the whole budget unless a
/// conflict shows up earlier.
pub fn probe(
    ifindex: u32,
    mac: Mac,
    candidate: IpAddr,
    budget: ProbeBudget,
) -> Result<ProbeOutcome, WireError> {
    Probe::start(ifindex, mac, candidate, budget)?
        .wait()
        .pop()
        .expect("one address, one outcome")
}

/// Probes under way on one interface: one packet socket, opened when the first address is probed,
/// queues every ARP or ICMPv6 frame from then on, so the caller may do other work (claim the next
/// address) and add the next address ([`Probe::add`]) before waiting for all of them at once: the
/// addresses of one ADD cost one budget and one socket, whatever their families. One socket matters:
/// closing a packet socket waits for an RCU grace period (several ms).
pub struct Probe {
    sock: PacketSocket,
    ifindex: u32,
    mac: Mac,
    filter: Filter,
    candidates: Vec<Candidate>,
}

/// One address being probed.
struct Candidate {
    address: IpAddr,
    packet: Vec<u8>,
    start: Instant,
    /// Offsets from `start` of the sends still to do.
    sends: std::vec::IntoIter<Duration>,
    budget: Duration,
    /// Set once a conflict is heard, the budget is over, or sending failed.
    outcome: Option<Result<ProbeOutcome, WireError>>,
}

fn filter_for(address: IpAddr) -> Filter {
    match address {
        IpAddr::V4(_) => Filter::Arp,
        IpAddr::V6(_) => Filter::Icmpv6,
    }
}

impl Candidate {
    fn new(mac: Mac, address: IpAddr, budget: ProbeBudget) -> Candidate {
        let packet = match address {
            IpAddr::V4(v4) => frame::arp_probe(mac, v4),
            IpAddr::V6(v6) => frame::ndp_probe(mac, v6),
        };
        Candidate {
            address,
            packet,
            start: Instant::now(),
            sends: schedule(budget.timeout, budget.attempts).into_iter(),
            budget: budget.timeout,
            outcome: None,
        }
    }

    fn deadline(&self) -> Instant {
        self.start + self.budget
    }

    /// Send every probe whose time has come; the next send's time, if any is left.
    fn send_due(
        &mut self,
        sock: &PacketSocket,
        ifindex: u32,
    ) -> Result<Option<Instant>, WireError> {
        let now = Instant::now();
        while let Some(at) = self.sends.as_slice().first().map(|d| self.start + *d) {
            if at > now {
                return Ok(Some(at));
            }
            self.sends.next();
            sock.send(&self.packet)
                .map_err(|source| WireError::Send { ifindex, source })?;
        }
        Ok(None)
    }
}

impl Probe {
    /// Open the socket (in the calling thread's netns) and send the first probe for `candidate`.
    pub fn start(
        ifindex: u32,
        mac: Mac,
        candidate: IpAddr,
        budget: ProbeBudget,
    ) -> Result<Probe, WireError> {
        let filter = filter_for(candidate);
        let sock = PacketSocket::open(ifindex, filter)
            .map_err(|source| WireError::Open { ifindex, source })?;
        let mut p = Probe {
            sock,
            ifindex,
            mac,
            filter,
            candidates: Vec::new(),
        };
        p.add(candidate, budget)?;
        Ok(p)
    }

    /// Probe one more address on the same socket, from now on, for its own full budget. Frames of its
    /// family are let through from now on too.
    pub fn add(&mut self, candidate: IpAddr, budget: ProbeBudget) -> Result<(), WireError> {
        let ifindex = self.ifindex;
        let wanted = self.filter.with(filter_for(candidate));
        if wanted != self.filter {
            self.sock
                .set_filter(wanted)
                .map_err(|source| WireError::Filter { ifindex, source })?;
            self.filter = wanted;
        }
        let mut c = Candidate::new(self.mac, candidate, budget);
        c.send_due(&self.sock, ifindex)?;
        self.candidates.push(c);
        Ok(())
    }

    /// The addresses probed, in the order they were added.
    pub fn candidates(&self) -> Vec<IpAddr> {
        self.candidates.iter().map(|c| c.address).collect()
    }

    /// Wait for every address: each listens for its full budget from its own start unless a conflict
    /// settles it sooner. Outcomes come back in the order the addresses were added, and the addresses
    /// leave the probe. The socket stays open until the probe is dropped: closing it waits out an RCU
    /// grace period, which a caller with a reply to send can pay after sending it.
    pub fn wait(&mut self) -> Vec<Result<ProbeOutcome, WireError>> {
        let mut buf = [0u8; 2048];
        loop {
            let mut wake: Option<Instant> = None;
            for c in self.candidates.iter_mut().filter(|c| c.outcome.is_none()) {
                match c.send_due(&self.sock, self.ifindex) {
                    Ok(next) => {
                        let at = next.map_or(c.deadline(), |n| n.min(c.deadline()));
                        wake = Some(wake.map_or(at, |w| w.min(at)));
                    }
                    Err(e) => c.outcome = Some(Err(e)),
                }
            }
            if let Err(source) = self.drain(&mut buf) {
                self.fail_unsettled(&source);
                break;
            }
            if self.candidates.iter().all(|c| c.outcome.is_some()) {
                break;
            }
            let Some(wake) = wake else { break };
            let mut fds = [libc::pollfd {
                fd: self.sock.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            if let Err(source) =
                socket::poll(&mut fds, wake.saturating_duration_since(Instant::now()))
            {
                self.fail_unsettled(&source);
                break;
            }
        }
        std::mem::take(&mut self.candidates)
            .into_iter()
            .map(|c| c.outcome.unwrap_or(Ok(ProbeOutcome::Free)))
            .collect()
    }

    /// Receiving failed: every address not yet settled fails with it.
    fn fail_unsettled(&mut self, source: &std::io::Error) {
        let ifindex = self.ifindex;
        for c in self.candidates.iter_mut().filter(|c| c.outcome.is_none()) {
            c.outcome = Some(Err(WireError::Recv {
                ifindex,
                source: std::io::Error::new(source.kind(), source.to_string()),
            }));
        }
    }

    /// Read what is queued, matching each frame against every address still open; then settle as Free
    /// every address whose budget is over.
    fn drain(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        let last_deadline = self
            .candidates
            .iter()
            .filter(|c| c.outcome.is_none())
            .map(Candidate::deadline)
            .max();
        while let Some(n) = self.sock.try_recv(buf)? {
            for c in self.candidates.iter_mut().filter(|c| c.outcome.is_none()) {
                if let Some(holder) = conflict(&buf[..n], self.mac, c.address) {
                    c.outcome = Some(Ok(ProbeOutcome::InUse {
                        mac: format_mac(&holder),
                    }));
                }
            }
            // A flood of unrelated ARP must not keep the probes past their budget.
            if last_deadline.is_none_or(|d| Instant::now() >= d) {
                break;
            }
        }
        let now = Instant::now();
        for c in self
            .candidates
            .iter_mut()
            .filter(|c| c.outcome.is_none() && now >= c.deadline())
        {
            c.outcome = Some(Ok(ProbeOutcome::Free));
        }
        Ok(())
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
pub fn announce(
    ifindex: u32,
    mac: Mac,
    addrs: &[IpAddr],
    count: u32,
    interval: Duration,
) -> Result<(), WireError> {
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
    let sock = PacketSocket::open(ifindex, Filter::Arp)
        .map_err(|source| WireError::Open { ifindex, source })?;
    for i in 0..count {
        if i > 0 {
            std::thread::sleep(interval);
        }
        for f in &frames {
            sock.send(f)
                .map_err(|source| WireError::Send { ifindex, source })?;
        }
    }
    Ok(())
}

/// Parse `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<Mac> {
    let parts: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16))
        .collect::<Result<_, _>>()
        .ok()?;
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
        assert_eq!(
            conflict(
                &frame::arp_announce(THEM, "10.1.2.9".parse().unwrap()),
                US,
                c
            ),
            Some(THEM)
        );
        // Another prober for the same address.
        assert_eq!(
            conflict(&frame::arp_probe(THEM, "10.1.2.9".parse().unwrap()), US, c),
            Some(THEM)
        );
        // Our own probe echoed back, or traffic about other addresses: no conflict.
        assert_eq!(
            conflict(&frame::arp_probe(US, "10.1.2.9".parse().unwrap()), US, c),
            None
        );
        assert_eq!(
            conflict(
                &frame::arp_announce(THEM, "10.1.2.8".parse().unwrap()),
                US,
                c
            ),
            None
        );
    }

    #[test]
    fn ndp_conflict_rules() {
        let c: IpAddr = "fd00::9".parse().unwrap();
        assert_eq!(
            conflict(
                &frame::ndp_announce(THEM, "fd00::9".parse().unwrap()),
                US,
                c
            ),
            Some(THEM)
        );
        assert_eq!(
            conflict(&frame::ndp_probe(THEM, "fd00::9".parse().unwrap()), US, c),
            Some(THEM)
        );
        assert_eq!(
            conflict(&frame::ndp_probe(US, "fd00::9".parse().unwrap()), US, c),
            None
        );
        assert_eq!(
            conflict(
                &frame::ndp_announce(THEM, "fd00::8".parse().unwrap()),
                US,
                c
            ),
            None
        );
    }

    #[test]
    fn mac_parsing() {
        assert_eq!(parse_mac("02:00:00:00:00:0a"), Some([2, 0, 0, 0, 0, 10]));
        assert_eq!(parse_mac("02:00:00:00:00"), None);
        assert_eq!(parse_mac("zz:00:00:00:00:00"), None);
    }

    #[test]
    fn schedule_spreads_attempts() {
        assert_eq!(
            schedule(Duration::from_millis(100), 1),
            vec![Duration::ZERO]
        );
        assert_eq!(
            schedule(Duration::from_millis(90), 3),
            vec![
                Duration::ZERO,
                Duration::from_millis(30),
                Duration::from_millis(60)
            ]
        );
        assert_eq!(schedule(Duration::from_millis(90), 0).len(), 1);
    }
}
