//! Probes and announcements on a real segment of this kernel: two netns joined by a veth pair, one of
//! them (the "rogue") holding addresses. Root only; no ipvlan needed.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use tether_link::{NetNs, Netlink};
use tether_wire::{Probe, ProbeBudget, ProbeOutcome, announce, probe};

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
        let ns = NetNs::open(&PathBuf::from(format!("/run/netns/{}", self.us))).unwrap();
        let link = Netlink::in_netns(&ns)
            .unwrap()
            .link_by_name("eth0")
            .unwrap()
            .unwrap();
        let mac: [u8; 6] = link.mac.as_deref().unwrap().try_into().unwrap();
        ns.run(move || f(link.index, mac)).unwrap()
    }

    fn rogue_mac(&self) -> String {
        let out = ip(&self.rogue, "-j link show eth0");
        let v: Vec<serde_like::Link> = serde_like::parse(&out);
        v[0].address.clone()
    }
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
