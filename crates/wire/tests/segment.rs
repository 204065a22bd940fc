//! Probes and announcements on a real segment of this kernel: two netns joined by a veth pair, one of
//! them (the "rogue") holding addresses. Root only; no ipvlan needed.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, Ordering};

use tether_link::{NetNs, Netlink};
use tether_wire::socket::{Filter, PacketSocket};
use tether_wire::{Probe, ProbeBudget, ProbeOutcome, announce, frame, guard, probe};

struct Segment {
    us: String,
    rogue: String,
}

fn ip(ns: &str, args: &str) -> String {
    let out = Command::new("ip")
        .args(["-n", ns])
        .args(args.split_whitespace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ip -n {ns} {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

impl Segment {
    fn new(tag: &str) -> Segment {
        let s = Segment {
            us: format!("tw-{tag}-us-{}", std::process::id()),
            rogue: format!("tw-{tag}-ro-{}", std::process::id()),
        };
        for n in [&s.us, &s.rogue] {
            let _ = Command::new("ip")
                .args(["netns", "del", n])
                .stderr(std::process::Stdio::null())
                .status();
            assert!(
                Command::new("ip")
                    .args(["netns", "add", n])
                    .status()
                    .unwrap()
                    .success()
            );
        }
        ip(
            &s.us,
            &format!("link add eth0 type veth peer name eth0 netns {}", s.rogue),
        );
        ip(&s.us, "link set eth0 up");
        ip(&s.rogue, "link set eth0 up");
        ip(&s.rogue, "addr add 10.77.0.9/24 dev eth0");
        ip(&s.rogue, "addr add fd00:77::9/64 dev eth0 nodad");
        s
    }

    /// Run `f(ifindex, mac)` in our netns.
    fn on_us<T: Send>(&self, f: impl FnOnce(u32, [u8; 6]) -> T + Send) -> T {
        on_eth0(&self.us, f)
    }

    /// Run `f(ifindex, mac)` in the rogue's netns.
    fn on_rogue<T: Send>(&self, f: impl FnOnce(u32, [u8; 6]) -> T + Send) -> T {
        on_eth0(&self.rogue, f)
    }

    fn rogue_mac(&self) -> String {
        let out = ip(&self.rogue, "-j link show eth0");
        let v: Vec<serde_like::Link> = serde_like::parse(&out);
        v[0].address.clone()
    }
}

/// Run `f(ifindex, mac)` of eth0 in netns `ns`.
fn on_eth0<T: Send>(ns: &str, f: impl FnOnce(u32, [u8; 6]) -> T + Send) -> T {
    let ns = NetNs::open(&PathBuf::from(format!("/run/netns/{ns}"))).unwrap();
    let link = Netlink::in_netns(&ns)
        .unwrap()
        .link_by_name("eth0")
        .unwrap()
        .unwrap();
    let mac: [u8; 6] = link.mac.as_deref().unwrap().try_into().unwrap();
    ns.run(move || f(link.index, mac)).unwrap()
}

impl Drop for Segment {
    fn drop(&mut self) {
        for n in [&self.us, &self.rogue] {
            let _ = Command::new("ip")
                .args(["netns", "del", n])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// Just enough of `ip -j link` to read a MAC, without a JSON dependency in this crate.
mod serde_like {
    pub struct Link {
        pub address: String,
    }
    pub fn parse(s: &str) -> Vec<Link> {
        let i = s.find("\"address\":\"").expect("address in ip -j output") + 11;
        vec![Link {
            address: s[i..i + 17].to_string(),
        }]
    }
}

#[test]
fn ipv4_probe_finds_the_holder_and_not_a_free_address() {
    let seg = Segment::new("v4");
    let rogue = seg.rogue_mac();
    let held: IpAddr = "10.77.0.9".parse().unwrap();
    let free: IpAddr = "10.77.0.10".parse().unwrap();
    let (a, b) = seg.on_us(|ifindex, mac| {
        (
            probe(ifindex, mac, held, ProbeBudget::default()).unwrap(),
            probe(ifindex, mac, free, ProbeBudget::default()).unwrap(),
        )
    });
    assert_eq!(a, ProbeOutcome::InUse { mac: rogue });
    assert_eq!(b, ProbeOutcome::Free);
    // The probe's sender IP is 0.0.0.0, so the rogue learnt no neighbour entry from it.
    let neigh = ip(&seg.rogue, "neigh show dev eth0");
    assert!(
        !neigh.contains("10.77.0.10"),
        "probe polluted the peer's cache: {neigh}"
    );
}

#[test]
fn ipv6_probe_finds_the_holder_and_not_a_free_address() {
    let seg = Segment::new("v6");
    let rogue = seg.rogue_mac();
    let held: IpAddr = "fd00:77::9".parse().unwrap();
    let free: IpAddr = "fd00:77::10".parse().unwrap();
    let (a, b) = seg.on_us(|ifindex, mac| {
        (
            probe(ifindex, mac, held, ProbeBudget::default()).unwrap(),
            probe(ifindex, mac, free, ProbeBudget::default()).unwrap(),
        )
    });
    assert_eq!(a, ProbeOutcome::InUse { mac: rogue });
    assert_eq!(b, ProbeOutcome::Free);
}

#[test]
fn free_probe_takes_the_budget_and_no_more() {
    let seg = Segment::new("budget");
    let budget = ProbeBudget {
        timeout: Duration::from_millis(60),
        attempts: 3,
    };
    let took = seg.on_us(|ifindex, mac| {
        let t = Instant::now();
        assert_eq!(
            probe(ifindex, mac, "10.77.0.11".parse().unwrap(), budget).unwrap(),
            ProbeOutcome::Free
        );
        t.elapsed()
    });
    assert!(
        took >= Duration::from_millis(60) && took < Duration::from_millis(400),
        "{took:?}"
    );
}

/// An IPv4 and an IPv6 probe started one after the other on one socket and waited for together cost
/// one budget, and each still finds its holder (or nobody), also when the other family's holder
/// answers first.
#[test]
fn concurrent_probes_share_one_budget() {
    let seg = Segment::new("both");
    let rogue = seg.rogue_mac();
    let budget = ProbeBudget {
        timeout: Duration::from_millis(150),
        attempts: 1,
    };
    let cases: [(&str, Option<&str>); 4] = [
        ("10.77.0.12", None),
        ("fd00:77::12", None),
        ("10.77.0.9", Some(&rogue)),
        ("fd00:77::9", Some(&rogue)),
    ];
    for pair in [[0, 1], [2, 1], [0, 3], [2, 3]] {
        let (took, outcomes) = seg.on_us(move |ifindex, mac| {
            let t = Instant::now();
            let mut probe =
                Probe::start(ifindex, mac, cases[pair[0]].0.parse().unwrap(), budget).unwrap();
            // Work between the starts (the engine claims the next address) does not add to the budget.
            std::thread::sleep(Duration::from_millis(30));
            probe
                .add(cases[pair[1]].0.parse().unwrap(), budget)
                .unwrap();
            let o: Vec<ProbeOutcome> = probe.wait().into_iter().map(Result::unwrap).collect();
            (t.elapsed(), o)
        });
        for (k, &i) in pair.iter().enumerate() {
            let want = match cases[i].1 {
                Some(m) => ProbeOutcome::InUse { mac: m.to_string() },
                None => ProbeOutcome::Free,
            };
            assert_eq!(outcomes[k], want, "{}", cases[i].0);
        }
        if pair.iter().all(|&i| cases[i].1.is_none()) {
            assert!(
                took >= Duration::from_millis(150) && took < Duration::from_millis(280),
                "two free probes took {took:?}"
            );
        }
    }
}

#[test]
fn gratuitous_arp_updates_the_peer_cache() {
    let seg = Segment::new("garp");
    ip(&seg.us, "addr add 10.77.0.20/24 dev eth0");
    // A stale entry for .20 on the rogue, pointing at a MAC that no longer holds it.
    ip(
        &seg.rogue,
        "neigh replace 10.77.0.20 lladdr 02:de:ad:be:ef:01 dev eth0 nud stale",
    );
    let ours = seg.on_us(|ifindex, mac| {
        announce(
            ifindex,
            mac,
            &["10.77.0.20".parse().unwrap()],
            1,
            Duration::ZERO,
        )
        .unwrap();
        tether_wire::frame::format_mac(&mac)
    });
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let neigh = ip(&seg.rogue, "neigh show 10.77.0.20 dev eth0");
        if neigh.contains(&ours) {
            break;
        }
        assert!(Instant::now() < deadline, "peer cache still stale: {neigh}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The guard's run on our side while `rogue` acts on the other: the reports, what the socket
/// saw, and the guard thread's CPU time. The guard stops once `rogue` has returned and a tick
/// has passed after it.
fn guarded<T: Send>(
    seg: &Segment,
    watch: &[(&str, bool)],
    rogue: impl FnOnce(u32, [u8; 6], [u8; 6]) -> T + Send,
) -> (Vec<guard::Report>, guard::Seen, Duration, T) {
    let watch: Vec<(IpAddr, bool)> = watch
        .iter()
        .map(|(a, d)| (a.parse().unwrap(), *d))
        .collect();
    let done = AtomicBool::new(false);
    let listening = AtomicBool::new(false);
    let us_mac = seg.on_us(|_, mac| mac);
    std::thread::scope(|s| {
        let guard_side = s.spawn(|| {
            seg.on_us(|ifindex, mac| {
                let mut g = guard::Guard::new(mac, Duration::from_secs(5));
                g.set_watch(watch);
                let (mut reports, mut seen) = (Vec::new(), guard::Seen::default());
                let cpu = thread_cpu();
                let mut last = false;
                guard::run(
                    ifindex,
                    &mut g,
                    Duration::from_millis(20),
                    |_, s| {
                        listening.store(true, Ordering::SeqCst);
                        seen.frames += s.frames;
                        seen.dropped += s.dropped;
                        // One more tick after the rogue is done: what it sent is drained.
                        let stop = last;
                        last = done.load(Ordering::SeqCst);
                        !stop
                    },
                    |r| reports.push(r),
                )
                .unwrap();
                (reports, seen, thread_cpu() - cpu)
            })
        });
        while !listening.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let out = seg.on_rogue(|ifindex, mac| rogue(ifindex, mac, us_mac));
        done.store(true, Ordering::SeqCst);
        let (reports, seen, cpu) = guard_side.join().unwrap();
        (reports, seen, cpu, out)
    })
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Frames queued on `sock` from `from` speaking as `address` (ARP sender, or NA target).
fn count_from(sock: &PacketSocket, from: [u8; 6], address: IpAddr) -> usize {
    let mut buf = [0u8; 2048];
    let mut n = 0;
    while let Some(len) = sock.try_recv(&mut buf).unwrap() {
        let f = &buf[..len];
        let speaks = match (frame::parse_arp(f), frame::parse_ndp(f)) {
            (Some(a), _) => a.sha == from && IpAddr::V4(a.spa) == address,
            (None, Some(n)) => n.eth_src == from && IpAddr::V6(n.target) == address,
            _ => false,
        };
        n += usize::from(speaks);
    }
    n
}

/// A host that announces a pod's address five times is reported once, with its MAC, and a
/// defended address is announced once in reply, not once per claim.
#[test]
fn guard_reports_a_host_taking_a_watched_address_and_defends_it_once() {
    let seg = Segment::new("guard");
    for (address, defend) in [("10.77.0.30", true), ("fd00:77::30", false)] {
        let a: IpAddr = address.parse().unwrap();
        let (reports, _, _, defences) = guarded(&seg, &[(address, defend)], |ifindex, mac, us| {
            let sock = PacketSocket::open(ifindex, Filter::ArpOrIcmpv6).unwrap();
            let claim = match a {
                IpAddr::V4(v4) => frame::arp_announce(mac, v4),
                IpAddr::V6(v6) => frame::ndp_announce(mac, v6),
            };
            for _ in 0..5 {
                sock.send(&claim).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
            // The defence is sent before the report, within a few ms of the first claim.
            std::thread::sleep(Duration::from_millis(200));
            count_from(&sock, us, a)
        });
        let rogue = seg.rogue_mac();
        assert_eq!(reports.len(), 1, "{address}: {reports:?}");
        assert_eq!(reports[0].claim.address, a);
        assert_eq!(frame::format_mac(&reports[0].claim.mac), rogue);
        assert_eq!(reports[0].defended, defend);
        assert_eq!(
            defences,
            usize::from(defend),
            "{address}: defences on the wire"
        );
    }
}

/// 10,000 ARP frames a second of ordinary chatter (requests between other hosts, announcements
/// of other addresses, probes of a watched one): nothing reported, nothing sent. Prints the
/// guard's CPU cost.
#[test]
fn guard_is_silent_and_cheap_under_arp_chatter() {
    let seg = Segment::new("chatter");
    const FRAMES: u32 = 30_000;
    let watched: Vec<String> = (40..104).map(|i| format!("10.77.0.{i}")).collect();
    let watch: Vec<(&str, bool)> = watched.iter().map(|a| (a.as_str(), true)).collect();
    let (reports, seen, cpu, sent_to_rogue) = guarded(&seg, &watch, |ifindex, mac, us| {
        let sock = PacketSocket::open(ifindex, Filter::Arp).unwrap();
        let start = Instant::now();
        for i in 0..FRAMES {
            let other = std::net::Ipv4Addr::new(10, 77, 1 + (i % 200) as u8, (i % 250) as u8 + 1);
            let f = match i % 3 {
                0 => frame::arp_announce(mac, other),
                // Another host probing a watched address asks; it does not claim.
                1 => frame::arp_probe(mac, watched[i as usize % watched.len()].parse().unwrap()),
                _ => frame::arp_probe(mac, other),
            };
            sock.send(&f).unwrap();
            // 10,000 a second, in bursts of 100.
            if i % 100 == 99 {
                let due = start + Duration::from_micros(100) * (i + 1);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        let us_frames = (40..104)
            .map(|i| count_from(&sock, us, format!("10.77.0.{i}").parse().unwrap()))
            .sum::<usize>();
        (us_frames, start.elapsed())
    });
    let (sent, took) = sent_to_rogue;
    assert!(reports.is_empty(), "chatter reported: {reports:?}");
    assert_eq!(sent, 0, "the guard sent frames while nothing conflicted");
    assert!(
        seen.frames + seen.dropped >= u64::from(FRAMES),
        "the guard saw {} frames and the kernel dropped {} of {FRAMES}",
        seen.frames,
        seen.dropped
    );
    println!(
        "guard under chatter: {} frames in {:.2} s ({:.0}/s), {} dropped; {:.1} us of CPU per frame, {:.1} % of one core",
        seen.frames,
        took.as_secs_f64(),
        f64::from(FRAMES) / took.as_secs_f64(),
        seen.dropped,
        cpu.as_secs_f64() * 1e6 / seen.frames.max(1) as f64,
        100.0 * cpu.as_secs_f64() / took.as_secs_f64()
    );
}
