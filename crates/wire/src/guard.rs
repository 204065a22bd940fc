//! The conflict guard: ongoing address conflict detection and, where asked, defence (RFC 5227
//! §2.4), after the probe of the ADD has handed an address out.
//!
//! [`Guard`] judges frames: a *claim* is a frame in which another MAC speaks as a watched address
//! (ARP with that sender address, an NA for it, an NS sent from it). Another host's probe for the
//! address (sender 0.0.0.0, or a DAD NS from `::`) is no claim: it asks, and the holder's stack
//! answers it. Each claimant MAC is reported once per `report_every` per address, so a host that
//! keeps announcing costs one report per interval; an address marked for defence gets at most one
//! announcement per [`DEFEND_INTERVAL`] (§2.4 (b)), whatever the claimant does.
//!
//! [`run`] is the socket loop on one interface: one AF_PACKET socket with the ARP/ICMPv6 filter,
//! a receive queue of [`QUEUE_BYTES`] so that bursts of chatter are not dropped, the kernel's
//! drop count read at each tick. It sends nothing unless an address marked for defence is claimed.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::WireError;
use crate::frame::{self, Mac, NDP_NA, NDP_NS};
use crate::socket::{self, Filter, PacketSocket};

/// RFC 5227's DEFEND_INTERVAL: at most one defending announcement per address in this time.
pub const DEFEND_INTERVAL: Duration = Duration::from_secs(10);

/// The receive queue asked of the kernel (as root; the kernel's default is about 200 KiB, which a
/// 10,000-frame/s burst can overrun while the loop is descheduled).
pub const QUEUE_BYTES: usize = 4 << 20;

/// Another MAC speaking as a watched address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Claim {
    pub address: IpAddr,
    pub mac: Mac,
}

/// What the guard made of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub claim: Claim,
    /// The announcement sent in defence, if the address is defended and was not defended within
    /// [`DEFEND_INTERVAL`].
    pub defended: bool,
}

/// One watched address.
#[derive(Debug, Clone, Default)]
struct Watch {
    defend: bool,
    last_defence: Option<Instant>,
    /// Claimant MAC → when last reported.
    reported: HashMap<Mac, Instant>,
}

/// The addresses watched on one interface whose MAC (the one the pods' addresses answer with) is
/// `ours`.
#[derive(Debug, Clone)]
pub struct Guard {
    ours: Mac,
    report_every: Duration,
    watch: HashMap<IpAddr, Watch>,
}

impl Guard {
    pub fn new(ours: Mac, report_every: Duration) -> Guard {
        Guard {
            ours,
            report_every,
            watch: HashMap::new(),
        }
    }

    /// Watch exactly `addresses` (address → defend it) from now on. An address watched before
    /// keeps its report and defence times, so a refresh does not reset the rate limits.
    pub fn set_watch(&mut self, addresses: impl IntoIterator<Item = (IpAddr, bool)>) {
        let mut next = HashMap::new();
        for (a, defend) in addresses {
            let mut w = self.watch.remove(&a).unwrap_or_default();
            w.defend = defend;
            next.insert(a, w);
        }
        self.watch = next;
    }

    /// How many addresses are watched.
    pub fn watched(&self) -> usize {
        self.watch.len()
    }

    /// Judge one received frame at `now`: a report when it is a claim not reported within the
    /// interval, with the announcement to send in defence, if any.
    pub fn on_frame(&mut self, f: &[u8], now: Instant) -> Option<(Report, Option<Vec<u8>>)> {
        let claim = self.claim_in(f)?;
        let ours = self.ours;
        let every = self.report_every;
        let w = self.watch.get_mut(&claim.address)?;
        let defence = (w.defend
            && w.last_defence
                .is_none_or(|t| now.duration_since(t) >= DEFEND_INTERVAL))
        .then(|| {
            w.last_defence = Some(now);
            announcement(ours, claim.address)
        });
        let due = w
            .reported
            .get(&claim.mac)
            .is_none_or(|t| now.duration_since(*t) >= every);
        if !due && defence.is_none() {
            return None;
        }
        if due {
            w.reported.insert(claim.mac, now);
        }
        let report = Report {
            claim,
            defended: defence.is_some(),
        };
        Some((report, defence))
    }

    /// The claim a frame makes on a watched address, if it makes one.
    fn claim_in(&self, f: &[u8]) -> Option<Claim> {
        let (address, mac) = if let Some(a) = frame::parse_arp(f) {
            // A probe (sender 0.0.0.0) is never a claim; the sender address is.
            (IpAddr::V4(a.spa), a.sha)
        } else {
            let n = frame::parse_ndp(f)?;
            match n.kind {
                NDP_NA => (IpAddr::V6(n.target), n.tlla.unwrap_or(n.eth_src)),
                // An NS sent from the address speaks as it; a DAD NS (from ::) only asks.
                NDP_NS if !n.src.is_unspecified() => (IpAddr::V6(n.src), n.eth_src),
                _ => return None,
            }
        };
        (mac != self.ours && self.watch.contains_key(&address)).then_some(Claim { address, mac })
    }
}

/// The announcement of `address` from `mac`: gratuitous ARP, or an unsolicited NA.
fn announcement(mac: Mac, address: IpAddr) -> Vec<u8> {
    match address {
        IpAddr::V4(v4) => frame::arp_announce(mac, v4),
        IpAddr::V6(v6) => frame::ndp_announce(mac, v6),
    }
}

/// What the socket saw since the last tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// Frames the filter let through.
    pub frames: u64,
    /// Frames the kernel dropped because the queue was full.
    pub dropped: u64,
}

/// Guard interface `ifindex` until `tick` says stop: every `every`, `tick` gets the guard (to
/// change what it watches) and what the socket saw since the last tick; each report goes to
/// `report` as it happens, after its defence was sent. Runs in the calling thread's netns.
pub fn run(
    ifindex: u32,
    guard: &mut Guard,
    every: Duration,
    mut tick: impl FnMut(&mut Guard, Seen) -> bool,
    mut report: impl FnMut(Report),
) -> Result<(), WireError> {
    let sock = PacketSocket::open(ifindex, Filter::ArpOrIcmpv6)
        .map_err(|source| WireError::Open { ifindex, source })?;
    // Without CAP_NET_ADMIN the default queue stays: the guard works, bursts may drop.
    if let Err(e) = sock.set_recv_buffer(QUEUE_BYTES) {
        log::debug!("interface #{ifindex}: keeping the default receive queue: {e}");
    }
    let mut buf = [0u8; 2048];
    let mut frames = 0u64;
    let mut next_tick = Instant::now() + every;
    loop {
        while let Some(n) = sock
            .try_recv(&mut buf)
            .map_err(|source| WireError::Recv { ifindex, source })?
        {
            frames += 1;
            if let Some((r, defence)) = guard.on_frame(&buf[..n], Instant::now()) {
                if let Some(f) = defence {
                    sock.send(&f)
                        .map_err(|source| WireError::Send { ifindex, source })?;
                }
                report(r);
            }
        }
        let now = Instant::now();
        if now >= next_tick {
            let dropped = sock
                .drops()
                .map_err(|source| WireError::Recv { ifindex, source })?;
            if !tick(guard, Seen { frames, dropped }) {
                return Ok(());
            }
            frames = 0;
            next_tick = now + every;
        }
        let mut fds = [libc::pollfd {
            fd: sock.raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        socket::poll(
            &mut fds,
            next_tick.saturating_duration_since(Instant::now()),
        )
        .map_err(|source| WireError::Recv { ifindex, source })?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Mac = [2, 0, 0, 0, 0, 1];
    const THEM: Mac = [2, 0, 0, 0, 0, 2];
    const OTHER: Mac = [2, 0, 0, 0, 0, 3];

    fn v4(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn guard(defend: bool) -> Guard {
        let mut g = Guard::new(US, Duration::from_secs(5));
        g.set_watch([(v4("10.1.0.5"), defend), (v4("fd00::5"), defend)]);
        g
    }

    #[test]
    fn claims_are_other_macs_speaking_as_a_watched_address() {
        let g = guard(false);
        let claim = |f: Vec<u8>| g.claim_in(&f);
        let at = |a: &str, mac| {
            Some(Claim {
                address: v4(a),
                mac,
            })
        };
        assert_eq!(
            claim(frame::arp_announce(THEM, "10.1.0.5".parse().unwrap())),
            at("10.1.0.5", THEM)
        );
        assert_eq!(
            claim(frame::ndp_announce(THEM, "fd00::5".parse().unwrap())),
            at("fd00::5", THEM)
        );
        // Our own announcements, addresses not watched, and probes are not claims.
        assert_eq!(
            claim(frame::arp_announce(US, "10.1.0.5".parse().unwrap())),
            None
        );
        assert_eq!(
            claim(frame::arp_announce(THEM, "10.1.0.6".parse().unwrap())),
            None
        );
        assert_eq!(
            claim(frame::arp_probe(THEM, "10.1.0.5".parse().unwrap())),
            None
        );
        assert_eq!(
            claim(frame::ndp_probe(THEM, "fd00::5".parse().unwrap())),
            None
        );
        assert_eq!(claim(vec![0; 60]), None);
    }

    #[test]
    fn reports_once_per_interval_per_mac_and_defends_once_per_defend_interval() {
        let t0 = Instant::now();
        let mut g = guard(true);
        let f = frame::arp_announce(THEM, "10.1.0.5".parse().unwrap());
        let (r, defence) = g.on_frame(&f, t0).expect("first claim reported");
        assert!(r.defended);
        assert_eq!(
            defence,
            Some(frame::arp_announce(US, "10.1.0.5".parse().unwrap()))
        );
        // Again within 5 s: nothing; a second claimant is reported on its own, not defended again.
        assert_eq!(g.on_frame(&f, t0 + Duration::from_secs(1)), None);
        let other = frame::arp_announce(OTHER, "10.1.0.5".parse().unwrap());
        let (r, defence) = g.on_frame(&other, t0 + Duration::from_secs(2)).unwrap();
        assert_eq!((r.claim.mac, r.defended, defence), (OTHER, false, None));
        // After 6 s the first is reported again; defence waits for DEFEND_INTERVAL.
        let (r, defence) = g.on_frame(&f, t0 + Duration::from_secs(6)).unwrap();
        assert!(!r.defended && defence.is_none());
        let (r, defence) = g.on_frame(&f, t0 + DEFEND_INTERVAL).unwrap();
        assert!(r.defended && defence.is_some());
        // A refresh keeps the times; an address no longer watched is forgotten.
        g.set_watch([(v4("10.1.0.5"), true)]);
        assert_eq!(g.on_frame(&f, t0 + Duration::from_millis(10_500)), None);
        g.set_watch([]);
        assert_eq!(g.on_frame(&f, t0 + Duration::from_secs(60)), None);
        assert_eq!(g.watched(), 0);
    }

    #[test]
    fn without_defence_nothing_is_sent() {
        let mut g = guard(false);
        let f = frame::ndp_announce(THEM, "fd00::5".parse().unwrap());
        let (r, defence) = g.on_frame(&f, Instant::now()).unwrap();
        assert!(!r.defended && defence.is_none());
    }
}
