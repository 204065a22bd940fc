mod common;

use std::collections::HashSet;
use std::net::IpAddr;

use common::*;
use tether_leases::{
    AllocError, Allocator, Attachment, Candidate, Clock, FakeClock, FileStore, Lease, LeaseState,
    LeaseStore, NoProbe, Policy, ProbeError, ProbeOutcome, Probed, Prober, ScriptedProber,
    start_offset,
};
use tether_pool::IpRange;

const NET: &str = "net-a";
const T0: u64 = 1_700_000_000;

struct Fx {
    _dir: TempDir,
    store: FileStore,
    clock: FakeClock,
    prober: ScriptedProber,
    ranges: Vec<IpRange>,
    policy: Policy,
}

impl Fx {
    fn new(ranges: &[&str]) -> Fx {
        let dir = TempDir::new("engine");
        let store = FileStore::new(dir.sub("state"));
        Fx {
            _dir: dir,
            store,
            clock: FakeClock::new(T0),
            prober: ScriptedProber::new(),
            ranges: ranges.iter().map(|r| range(r)).collect(),
            policy: Policy {
                cooldown_s: 60,
                quarantine_s: 600,
                ..Policy::default()
            },
        }
    }
    fn a(&self) -> Allocator<'_> {
        Allocator::new(
            scope(NET),
            self.ranges.clone(),
            self.policy.clone(),
            &self.store,
            &self.prober,
            &self.clock,
        )
    }
    fn leases(&self) -> Vec<Lease> {
        let mut v = self.store.list(&scope(NET)).unwrap();
        v.sort_by_key(|l| l.address);
        v
    }
    fn rec(&self, a: IpAddr) -> Option<Lease> {
        self.leases().into_iter().find(|l| l.address == a)
    }
    /// The address at which the pool walk of `cid`/`ifname` starts in range `i`.
    fn first_candidate(&self, cid: &str, ifname: &str, i: usize) -> IpAddr {
        let r = &self.ranges[i];
        r.nth(start_offset(cid, ifname, i) % r.usable_count())
            .unwrap()
    }
    /// A container ID whose walk in range 0 starts at `target`.
    fn cid_starting_at(&self, target: IpAddr, ifname: &str) -> String {
        (0..100_000)
            .map(|n| format!("cid-start-{n}"))
            .find(|c| self.first_candidate(c, ifname, 0) == target)
            .expect("some container ID hashes onto the target")
    }
}

fn addrs(v: &[Lease]) -> Vec<IpAddr> {
    v.iter().map(|l| l.address).collect()
}

#[test]
fn idempotent_add_del_check() {
    let fx = Fx::new(&["10.0.0.0/24", "fd00::/64"]);
    let a = fx.a();
    let req = add_req("c1", "net1", pod("ns", "p1", "u1"));
    let first = a.add(&req).unwrap();
    assert_eq!(first.len(), 2);
    assert!(first[0].address.is_ipv4() && first[1].address.is_ipv6());
    assert_eq!(first[0].prefix_len, 24);
    assert_eq!(first[1].prefix_len, 64);
    assert_eq!(first[0].range_index, Some(0));
    assert_eq!(first[0].node.as_deref(), Some("node-a"));
    assert_eq!(first[0].since, T0);
    // Second ADD: same leases, nothing new.
    let again = a.add(&req).unwrap();
    assert_eq!(addrs(&again), addrs(&first));
    assert_eq!(fx.leases().len(), 2);
    // CHECK
    assert_eq!(addrs(&a.check("c1", "net1").unwrap()), addrs(&first));
    let e = a.check("c2", "net1").unwrap_err().to_string();
    assert!(
        e.contains("c2") && e.contains("net1") && e.contains("no lease"),
        "{e}"
    );
    // DEL, twice
    fx.clock.advance(5);
    let rel = a.del("c1", "net1").unwrap();
    assert_eq!(rel.len(), 2);
    assert!(
        rel.iter()
            .all(|l| l.state == LeaseState::Released { at: T0 + 5 })
    );
    assert!(a.del("c1", "net1").unwrap().is_empty());
    assert!(
        fx.leases()
            .iter()
            .all(|l| matches!(l.state, LeaseState::Released { .. }))
    );
    // Released records keep the pod identity (for sticky/cooldown).
    assert!(
        fx.leases()
            .iter()
            .all(|l| l.pod == pod("ns", "p1", "u1") && l.container_id == "c1")
    );
    let e = a.check("c1", "net1").unwrap_err().to_string();
    assert!(e.contains("Released"), "{e}");
    // DEL of something never added is fine.
    assert!(a.del("never", "eth0").unwrap().is_empty());
}

#[test]
fn check_requires_every_range() {
    let fx = Fx::new(&["10.0.0.0/24"]);
    fx.a()
        .add(&add_req("c1", "net1", pod("ns", "p", "u")))
        .unwrap();
    let two = Allocator::new(
        scope(NET),
        vec![range("10.0.0.0/24"), range("fd00::/64")],
        fx.policy.clone(),
        &fx.store,
        &fx.prober,
        &fx.clock,
    );
    let e = two.check("c1", "net1").unwrap_err();
    assert!(matches!(e, AllocError::MissingRange { .. }), "{e}");
    assert!(e.to_string().contains("fd00::/64"));
    // ADD with the extended config fills the missing range, keeps the existing one.
    let before = fx.a().check("c1", "net1").unwrap();
    let now = two
        .add(&add_req("c1", "net1", pod("ns", "p", "u")))
        .unwrap();
    assert_eq!(now[0].address, before[0].address);
    assert!(now[1].address.is_ipv6());
    two.check("c1", "net1").unwrap();
}

#[test]
fn del_releases_only_its_own_lease() {
    let fx = Fx::new(&["10.0.0.0/24"]);
    let a = fx.a();
    let l11 = a
        .add(&add_req("c1", "net1", pod("ns", "p1", "u1")))
        .unwrap()[0]
        .address;
    let l12 = a
        .add(&add_req("c1", "net2", pod("ns", "p1", "u1")))
        .unwrap()[0]
        .address;
    let l21 = a
        .add(&add_req("c2", "net1", pod("ns", "p2", "u2")))
        .unwrap()[0]
        .address;
    assert_eq!(HashSet::from([l11, l12, l21]).len(), 3);
    let rel = a.del("c1", "net1").unwrap();
    assert_eq!(addrs(&rel), vec![l11]);
    assert!(matches!(
        fx.rec(l11).unwrap().state,
        LeaseState::Released { .. }
    ));
    assert!(fx.rec(l12).unwrap().is_leased());
    assert!(fx.rec(l21).unwrap().is_leased());
    a.check("c1", "net2").unwrap();
    a.check("c2", "net1").unwrap();
    assert!(a.check("c1", "net1").is_err());
}

#[test]
fn requested_addresses() {
    let fx = Fx::new(&["10.0.0.0/24", "fd00::/64"]);
    let a = fx.a();
    // without prefix → the range's prefix; with prefix → kept
    let got = a
        .add(&with_requested(
            add_req("c1", "net1", pod("ns", "p1", "u1")),
            &["10.0.0.77", "fd00::77/120"],
        ))
        .unwrap();
    assert_eq!(got[0].cidr(), "10.0.0.77/24");
    assert_eq!(got[1].cidr(), "fd00::77/120");
    // requested in only one range: the other comes from the pool
    let got = a
        .add(&with_requested(
            add_req("c2", "net1", pod("ns", "p2", "u2")),
            &["fd00::99"],
        ))
        .unwrap();
    assert_eq!(got[1].address, ip("fd00::99"));
    assert!(got[0].address.is_ipv4() && got[0].address != ip("10.0.0.77"));
    // outside every range
    let e = a
        .add(&with_requested(
            add_req("c3", "net1", pod("ns", "p3", "u3")),
            &["10.9.9.9"],
        ))
        .unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("10.9.9.9") && m.contains("10.0.0.0/24") && m.contains("fd00::/64"),
        "{m}"
    );
    // held by another attachment
    let e = a
        .add(&with_requested(
            add_req("c3", "net1", pod("ns", "p3", "u3")),
            &["10.0.0.77"],
        ))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "requested address 10.0.0.77 is held by pod ns/p1 (container c1, interface net1, network net-a)"
    );
    // the gateway/network address cannot be requested
    let e = a
        .add(&with_requested(
            add_req("c3", "net1", pod("ns", "p3", "u3")),
            &["10.0.0.0"],
        ))
        .unwrap_err();
    assert!(e.to_string().contains("network address"), "{e}");
    // two in one range
    let e = a
        .add(&with_requested(
            add_req("c3", "net1", pod("ns", "p3", "u3")),
            &["10.0.0.5", "10.0.0.6"],
        ))
        .unwrap_err();
    assert!(matches!(e, AllocError::DuplicateRequest { .. }), "{e}");
    // none of the failures allocated anything
    assert!(fx.leases().iter().all(|l| l.container_id != "c3"));
    // idempotent ADD with the same request is fine; a different one is an error
    a.add(&with_requested(
        add_req("c1", "net1", pod("ns", "p1", "u1")),
        &["10.0.0.77"],
    ))
    .unwrap();
    let e = a
        .add(&with_requested(
            add_req("c1", "net1", pod("ns", "p1", "u1")),
            &["10.0.0.78"],
        ))
        .unwrap_err();
    assert!(matches!(e, AllocError::AttachmentHasOther { .. }), "{e}");
    // A requested address inside its cooldown is granted (explicit request).
    a.del("c1", "net1").unwrap();
    let got = a
        .add(&with_requested(
            add_req("c4", "net1", pod("ns", "p4", "u4")),
            &["10.0.0.77"],
        ))
        .unwrap();
    assert_eq!(got[0].address, ip("10.0.0.77"));
}

#[test]
fn sandbox_recreate_keeps_address() {
    let fx = Fx::new(&["10.0.0.0/24", "fd00::/64"]);
    let a = fx.a();
    let p = pod("ns", "p1", "uid-1");
    let first = a.add(&add_req("sandbox-1", "net1", p.clone())).unwrap();
    // The runtime re-creates the sandbox without a DEL.
    let second = a.add(&add_req("sandbox-2", "net1", p.clone())).unwrap();
    assert_eq!(addrs(&second), addrs(&first));
    assert!(
        second
            .iter()
            .all(|l| l.container_id == "sandbox-2" && l.is_leased())
    );
    // still one lease per range, now owned by the new container
    assert_eq!(fx.leases().len(), 2);
    assert!(a.check("sandbox-1", "net1").is_err());
    a.check("sandbox-2", "net1").unwrap();
    // the late DEL of the old sandbox must not free the new owner's lease
    assert!(a.del("sandbox-1", "net1").unwrap().is_empty());
    a.check("sandbox-2", "net1").unwrap();
    // A different ifname of the same pod is a different attachment.
    let other = a.add(&add_req("sandbox-3", "net2", p.clone())).unwrap();
    assert!(addrs(&other).iter().all(|x| !addrs(&first).contains(x)));
    // A new pod object of the same name (new UID) does not take over a live lease.
    let new_uid = a
        .add(&add_req("sandbox-4", "net1", pod("ns", "p1", "uid-2")))
        .unwrap();
    assert!(addrs(&new_uid).iter().all(|x| !addrs(&first).contains(x)));
    a.check("sandbox-2", "net1").unwrap();
}

#[test]
fn sticky_re_add_gets_previous_address() {
    let fx = Fx::new(&["10.0.0.0/24"]);
    let a = fx.a();
    let first = a
        .add(&add_req("c-old", "net1", pod("ns", "web-0", "uid-1")))
        .unwrap()[0]
        .address;
    a.del("c-old", "net1").unwrap();
    // pick a new container ID whose own walk would start elsewhere
    let cid = (0..)
        .map(|n| format!("c-new-{n}"))
        .find(|c| fx.first_candidate(c, "net1", 0) != first)
        .unwrap();
    fx.clock.advance(3600); // well past cooldown: sticky is not just cooldown
    let again = a
        .add(&add_req(&cid, "net1", pod("ns", "web-0", "uid-2")))
        .unwrap()[0]
        .address;
    assert_eq!(again, first);
    // another pod name does not get it
    a.del(&cid, "net1").unwrap();
    let other_cid = fx.cid_starting_at(ip("10.0.0.200"), "net1");
    let other = a
        .add(&add_req(&other_cid, "net1", pod("ns", "web-1", "uid-3")))
        .unwrap()[0]
        .address;
    assert_eq!(other, ip("10.0.0.200"));
    // sticky needs the same ifname
    let cid2 = (0..)
        .map(|n| format!("c-if-{n}"))
        .find(|c| fx.first_candidate(c, "net2", 0) != first)
        .unwrap();
    let diff_if = a
        .add(&add_req(&cid2, "net2", pod("ns", "web-0", "uid-4")))
        .unwrap()[0]
        .address;
    assert_ne!(diff_if, first);
}

#[test]
fn cooldown_blocks_other_pods_until_it_passes() {
    let fx = Fx::new(&["10.0.0.0/24"]);
    let a = fx.a();
    let x = ip("10.0.0.50");
    let cid_b = fx.cid_starting_at(x, "net1");
    a.add(&with_requested(
        add_req("c-a", "net1", pod("ns", "a", "ua")),
        &["10.0.0.50"],
    ))
    .unwrap();
    a.del("c-a", "net1").unwrap();
    // before the cooldown: B's walk starts at X but must skip it
    fx.clock.advance(59);
    let b = a
        .add(&add_req(&cid_b, "net1", pod("ns", "b", "ub")))
        .unwrap()[0]
        .address;
    assert_ne!(b, x);
    assert_eq!(b, ip("10.0.0.51"));
    // after the cooldown: X is just a free address
    a.del(&cid_b, "net1").unwrap();
    fx.clock.advance(1);
    let c = a
        .add(&add_req(&cid_b, "net1", pod("ns", "c", "uc")))
        .unwrap()[0]
        .address;
    assert_eq!(c, x);
    // the record is overwritten, not duplicated
    assert_eq!(fx.leases().iter().filter(|l| l.address == x).count(), 1);
}

#[test]
fn cooldown_zero_reuses_at_once() {
    let mut fx = Fx::new(&["10.0.0.0/24"]);
    fx.policy.cooldown_s = 0;
    let a = fx.a();
    let x = ip("10.0.0.50");
    let cid_b = fx.cid_starting_at(x, "net1");
    a.add(&with_requested(
        add_req("c-a", "net1", pod("ns", "a", "ua")),
        &["10.0.0.50"],
    ))
    .unwrap();
    a.del("c-a", "net1").unwrap();
    let b = a
        .add(&add_req(&cid_b, "net1", pod("ns", "b", "ub")))
        .unwrap()[0]
        .address;
    assert_eq!(b, x);
}

#[test]
fn cooling_addresses_used_when_nothing_else_is_free_longest_first() {
    let fx = Fx::new(&["10.0.0.0/29"]); // 6 usable
    let a = fx.a();
    let mut got = vec![];
    for n in 0..6 {
        got.push(
            a.add(&add_req(
                &format!("c{n}"),
                "net1",
                pod("ns", &format!("p{n}"), "u"),
            ))
            .unwrap()[0]
                .address,
        );
    }
    let e = a
        .add(&add_req("c-late", "net1", pod("ns", "late", "u")))
        .unwrap_err();
    assert!(matches!(e, AllocError::Exhausted { .. }), "{e}");
    // release c4 first, then c1 ten seconds later
    a.del("c4", "net1").unwrap();
    fx.clock.advance(10);
    a.del("c1", "net1").unwrap();
    fx.clock.advance(1);
    let x = a
        .add(&add_req("c-new", "net1", pod("ns", "new", "u")))
        .unwrap()[0]
        .address;
    assert_eq!(x, got[4], "the longest-released address goes first");
    let y = a
        .add(&add_req("c-new2", "net1", pod("ns", "new2", "u")))
        .unwrap()[0]
        .address;
    assert_eq!(y, got[1]);
    let e = a
        .add(&add_req("c-new3", "net1", pod("ns", "new3", "u")))
        .unwrap_err();
    assert!(matches!(e, AllocError::Exhausted { .. }), "{e}");
}

#[test]
fn quarantine_skips_records_mac_and_expires() {
    let fx = Fx::new(&["10.0.0.0/24"]);
    let a = fx.a();
    let x = ip("10.0.0.60");
    let cid = fx.cid_starting_at(x, "net1");
    fx.prober.in_use(x, "02:00:00:00:00:01");
    let got = a.add(&add_req(&cid, "net1", pod("ns", "p", "u"))).unwrap()[0].address;
    assert_eq!(got, ip("10.0.0.61"));
    assert_eq!(fx.prober.calls(), vec![x, ip("10.0.0.61")]);
    let q = fx.rec(x).unwrap();
    assert_eq!(
        q.state,
        LeaseState::Quarantined {
            mac: "02:00:00:00:00:01".into(),
            at: T0
        }
    );
    // DEL of the attachment leaves the quarantine record alone
    a.del(&cid, "net1").unwrap();
    assert!(matches!(
        fx.rec(x).unwrap().state,
        LeaseState::Quarantined { .. }
    ));
    // within the quarantine, even if the host went away, X is not offered
    // (the same container ID, so the walk starts at X again; other pod names each time)
    fx.prober.clear(x);
    fx.clock.advance(599);
    let got = a
        .add(&add_req(&cid, "net1", pod("ns", "p2", "u2")))
        .unwrap()[0]
        .address;
    assert_ne!(got, x);
    a.del(&cid, "net1").unwrap();
    // after the quarantine it is probed again like any candidate
    fx.clock.advance(1);
    fx.prober.in_use(x, "02:00:00:00:00:02");
    let before = fx.prober.calls().len();
    let got = a
        .add(&add_req(&cid, "net1", pod("ns", "p3", "u3")))
        .unwrap()[0]
        .address;
    assert_ne!(got, x);
    assert_eq!(
        fx.prober.calls()[before],
        x,
        "expired quarantine is probed again"
    );
    assert_eq!(
        fx.rec(x).unwrap().state,
        LeaseState::Quarantined {
            mac: "02:00:00:00:00:02".into(),
            at: T0 + 600
        }
    );
    a.del(&cid, "net1").unwrap();
    fx.clock.advance(600);
    fx.prober.clear(x);
    let got = a
        .add(&add_req(&cid, "net1", pod("ns", "p4", "u4")))
        .unwrap()[0]
        .address;
    assert_eq!(got, x);
    assert!(fx.rec(x).unwrap().is_leased());
}

#[test]
fn requested_address_in_use_is_an_error_and_allocates_nothing() {
    let fx = Fx::new(&["10.0.0.0/24", "fd00::/64"]);
    let a = fx.a();
    fx.prober.in_use(ip("10.0.0.9"), "aa:bb:cc:dd:ee:ff");
    let e = a
        .add(&with_requested(
            add_req("c1", "net1", pod("ns", "p", "u")),
            &["10.0.0.9"],
        ))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "requested address 10.0.0.9 of network net-a is already in use on the segment by MAC aa:bb:cc:dd:ee:ff \
         (it answered the conflict probe): free it on the host with that MAC, or request another address; \
         a retry of this pod probes it again, and the pool keeps it out for 600s"
    );
    assert!(fx.leases().iter().all(|l| !l.is_leased()));
    // v6 first, then a requested v4 in use: the v6 lease is rolled back too
    let e = a
        .add(&with_requested(
            add_req("c2", "net1", pod("ns", "p", "u")),
            &["fd00::5", "10.0.0.9"],
        ))
        .unwrap_err();
    assert!(matches!(e, AllocError::RequestedInUse { .. }));
    assert!(fx.rec(ip("fd00::5")).is_none());
    assert_eq!(fx.leases().len(), 1); // only the quarantine record of 10.0.0.9
}

#[test]
fn probe_failure_fails_the_add_cleanly() {
    let fx = Fx::new(&["10.0.0.0/24"]);
    let a = fx.a();
    let x = ip("10.0.0.70");
    let cid = fx.cid_starting_at(x, "net1");
    fx.prober.fail(x, "raw socket: permission denied");
    let e = a
        .add(&add_req(&cid, "net1", pod("ns", "p", "u")))
        .unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("10.0.0.70") && m.contains("permission denied"),
        "{m}"
    );
    assert!(fx.leases().is_empty());
}

/// The probe runs after the claim and with no store lock held.
#[test]
fn probe_runs_after_claim_outside_lock() {
    struct Checker<'a> {
        store: &'a FileStore,
        seen: std::cell::RefCell<Vec<bool>>,
    }
    impl Prober for Checker<'_> {
        fn probe(&self, candidates: &[Candidate<'_>]) -> Result<Probed, ProbeError> {
            let address = candidates[0].address;
            let lock = std::fs::OpenOptions::new()
                .write(true)
                .open(self.store.lock_path(None))
                .unwrap();
            let unlocked = lock.try_lock().is_ok();
            drop(lock);
            let claimed = self
                .store
                .list(&scope(NET))
                .unwrap()
                .iter()
                .any(|l| l.address == address && l.is_leased());
            self.seen.borrow_mut().push(unlocked && claimed);
            Ok(Probed::answers(vec![ProbeOutcome::Free]))
        }
    }
    let dir = TempDir::new("probe");
    let store = FileStore::new(dir.path());
    let checker = Checker {
        store: &store,
        seen: Default::default(),
    };
    let clock = FakeClock::new(T0);
    let a = Allocator::new(
        scope(NET),
        vec![range("10.0.0.0/24")],
        Policy::default(),
        &store,
        &checker,
        &clock,
    );
    a.add(&add_req("c1", "net1", pod("ns", "p", "u"))).unwrap();
    assert_eq!(*checker.seen.borrow(), vec![true]);
}

#[test]
fn exhaustion_message_counts() {
    let fx = Fx::new(&["10.0.0.0/29"]); // .1-.6
    let a = fx.a();
    fx.prober.in_use(ip("10.0.0.3"), "02:00:00:00:00:03");
    for n in 0..4 {
        a.add(&add_req(
            &format!("c{n}"),
            "net1",
            pod("ns", &format!("p{n}"), "u"),
        ))
        .unwrap();
    }
    // 4 leased + 1 quarantined; release one → cooling, but it will be reused as a last resort
    a.del("c0", "net1").unwrap();
    a.add(&add_req("c4", "net1", pod("ns", "p4", "u"))).unwrap();
    a.add(&add_req("c5", "net1", pod("ns", "p5", "u"))).unwrap();
    a.del("c1", "net1").unwrap();
    a.del("c2", "net1").unwrap();
    fx.prober.in_use(
        fx.leases()
            .iter()
            .find(|l| l.container_id == "c1")
            .unwrap()
            .address,
        "02:00:00:00:00:99",
    );
    fx.prober.in_use(
        fx.leases()
            .iter()
            .find(|l| l.container_id == "c2")
            .unwrap()
            .address,
        "02:00:00:00:00:98",
    );
    let (c1_addr, c2_addr) = (
        fx.leases()
            .iter()
            .find(|l| l.container_id == "c1")
            .unwrap()
            .address,
        fx.leases()
            .iter()
            .find(|l| l.container_id == "c2")
            .unwrap()
            .address,
    );
    let e = a
        .add(&add_req("c6", "net1", pod("ns", "p6", "u")))
        .unwrap_err();
    // The last two candidates answered during this ADD: the error says they are in use on the
    // segment (and by whom), not just that the range is full.
    assert!(matches!(e, AllocError::InUseOnSegment { .. }), "{e}");
    let m = e.to_string();
    assert!(
        m.starts_with("no free address in range 10.0.0.0/29 of network net-a: 2 candidates answered the conflict probe during this ADD and are in use on the segment ("),
        "{m}"
    );
    assert!(
        m.contains(&format!("{c1_addr} by MAC 02:00:00:00:00:99"))
            && m.contains(&format!("{c2_addr} by MAC 02:00:00:00:00:98")),
        "{m}"
    );
    assert!(
        m.ends_with("now quarantined; 6 usable, 3 leased, 3 quarantined, 0 cooling down"),
        "{m}"
    );
    // STATUS: not ready while a range is full; cooling addresses count as available
    let fx = Fx::new(&["10.0.0.0/30"]); // .1 .2
    let a = fx.a();
    a.add(&add_req("c0", "net1", pod("ns", "p0", "u"))).unwrap();
    a.add(&add_req("c1", "net1", pod("ns", "p1", "u"))).unwrap();
    let e = a
        .add(&add_req("c2", "net1", pod("ns", "p2", "u")))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "no free address in range 10.0.0.0/30 of network net-a: 2 usable, 2 leased, 0 quarantined, 0 cooling down; \
         delete pods that no longer need this network or widen the range, and the pod is retried by itself"
    );
    let st = a.status().unwrap_err();
    assert!(
        st.to_string()
            .starts_with("no free address in range 10.0.0.0/30"),
        "{st}"
    );
    // usage: the counts of a full range too (what monitoring needs most)
    let u = a.usage().unwrap();
    assert_eq!((u.len(), u[0].usable, u[0].leased, u[0].free), (1, 2, 2, 0));
    a.del("c0", "net1").unwrap();
    assert_eq!(a.status().unwrap()[0].cooling, 1);
    assert_eq!(a.usage().unwrap()[0].cooling, 1);
}

#[test]
fn gc_releases_invalid_attachments_and_reports_errors() {
    let dir = TempDir::new("gc");
    let flaky = FlakyStore::new(FileStore::new(dir.path()));
    let clock = FakeClock::new(T0);
    let a = Allocator::new(
        scope(NET),
        vec![range("10.0.0.0/24")],
        Policy::default(),
        &flaky,
        &NoProbe,
        &clock,
    );
    let l1 = a.add(&add_req("c1", "eth0", pod("ns", "p1", "u"))).unwrap()[0].address;
    let l2 = a.add(&add_req("c2", "eth0", pod("ns", "p2", "u"))).unwrap()[0].address;
    let l3 = a.add(&add_req("c3", "eth0", pod("ns", "p3", "u"))).unwrap()[0].address;
    let l4 = a.add(&add_req("c1", "net9", pod("ns", "p1", "u"))).unwrap()[0].address;
    flaky.fail_on(l2);
    let report = a.gc(&[Attachment::new("c1", "eth0")]).unwrap();
    let released: HashSet<IpAddr> = report.released.iter().map(|l| l.address).collect();
    assert_eq!(
        released,
        HashSet::from([l3, l4]),
        "kept going past the failure on {l2}"
    );
    assert_eq!(report.errors.len(), 1);
    assert!(report.errors[0].to_string().contains(&l2.to_string()));
    let e = report.into_result(NET).unwrap_err().to_string();
    assert!(
        e.contains("garbage collection of network net-a failed for 1 record(s)")
            && e.contains(&l2.to_string()),
        "{e}"
    );
    let state = |x| {
        flaky
            .inner
            .list(&scope(NET))
            .unwrap()
            .into_iter()
            .find(|l: &Lease| l.address == x)
            .unwrap()
            .state
    };
    assert_eq!(state(l1), LeaseState::Leased);
    assert_eq!(state(l2), LeaseState::Leased);
    assert!(matches!(state(l3), LeaseState::Released { .. }));
    // GC prunes records past retention.
    flaky.fail.lock().unwrap().clear();
    clock.advance(86_400);
    let report = a.gc(&[Attachment::new("c1", "eth0")]).unwrap();
    assert_eq!(report.released.len(), 1); // l2
    assert_eq!(report.pruned, 2); // l3, l4 released a day ago
    assert!(report.errors.is_empty());
}

#[test]
fn dual_stack_rollback_when_v6_is_exhausted() {
    let fx = Fx::new(&["10.0.0.0/24", "fd00::/126"]); // v6: ::1 ::2 ::3
    let a = fx.a();
    for n in 0..3 {
        a.add(&add_req(
            &format!("c{n}"),
            "net1",
            pod("ns", &format!("p{n}"), "u"),
        ))
        .unwrap();
    }
    let before = fx.leases();
    let e = a
        .add(&add_req("c-x", "net1", pod("ns", "x", "u")))
        .unwrap_err();
    assert!(e.to_string().contains("fd00::/126"), "{e}");
    assert_eq!(
        fx.leases(),
        before,
        "the v4 lease of the failed ADD was rolled back"
    );
    assert!(a.check("c-x", "net1").is_err());
    // A rolled-back claim of a released record restores that record (not deletes it).
    a.del("c0", "net1").unwrap();
    let v4_of_c0 = before
        .iter()
        .find(|l| l.container_id == "c0" && l.address.is_ipv4())
        .unwrap()
        .address;
    let released = fx.rec(v4_of_c0).unwrap();
    let held_v6 = before
        .iter()
        .find(|l| l.container_id == "c1" && l.address.is_ipv6())
        .unwrap()
        .address;
    // same pod name → sticky claims c0's released v4; the requested v6 is held by c1 → fails
    let e = a
        .add(&with_requested(
            add_req("c-y", "net1", pod("ns", "p0", "u-new")),
            &[&held_v6.to_string()],
        ))
        .unwrap_err();
    assert!(matches!(e, AllocError::HeldByOther { .. }), "{e}");
    let restored = fx.rec(v4_of_c0).unwrap();
    assert_eq!(
        (restored.state, restored.container_id, restored.pod),
        (released.state, released.container_id, released.pod)
    );
    assert!(fx.leases().iter().all(|l| l.container_id != "c-y"));
}

#[test]
fn ipv6_slash64_allocates_fast_and_distinct() {
    let fx = Fx::new(&["fd00:abcd::/64"]);
    let a = fx.a();
    let mut seen = HashSet::new();
    for n in 0..200 {
        let l = a
            .add(&add_req(
                &format!("c{n}"),
                "net1",
                pod("ns", &format!("p{n}"), "u"),
            ))
            .unwrap();
        assert!(seen.insert(l[0].address));
        assert_eq!(l[0].prefix_len, 64);
    }
}

#[test]
fn status_reports_store_failures() {
    let dir = TempDir::new("status");
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let store = FileStore::new(&file);
    let clock = FakeClock::new(T0);
    let a = Allocator::new(
        scope(NET),
        vec![range("10.0.0.0/24")],
        Policy::default(),
        &store,
        &NoProbe,
        &clock,
    );
    let e = a.status().unwrap_err().to_string();
    assert!(e.contains(file.to_str().unwrap()), "{e}");
    // empty range after exclusions: not ready, and ADD says exhausted
    let store = FileStore::new(dir.sub("ok"));
    let r = range("10.0.0.0/30")
        .with_bounds(
            None,
            None,
            Some(ip("10.0.0.1")),
            vec!["10.0.0.2/32".parse().unwrap()],
        )
        .unwrap();
    let a = Allocator::new(
        scope(NET),
        vec![r],
        Policy::default(),
        &store,
        &NoProbe,
        &clock,
    );
    assert!(a.status().is_err());
    let e = a
        .add(&add_req("c", "eth0", Default::default()))
        .unwrap_err();
    assert!(e.to_string().contains("0 usable"), "{e}");
    let _ = clock.now();
}

#[test]
fn concurrent_adds_through_separate_handles_are_distinct() {
    let dir = TempDir::new("conc");
    let path = dir.sub("state");
    let threads: Vec<_> = (0..64)
        .map(|n| {
            let path = path.clone();
            std::thread::spawn(move || {
                let store = FileStore::new(path);
                let a = Allocator::new(
                    scope(NET),
                    vec![range("10.0.0.0/24")],
                    Policy::default(),
                    &store,
                    &NoProbe,
                    &tether_leases::SystemClock,
                );
                a.add(&add_req(
                    &format!("container-{n}"),
                    "net1",
                    pod("ns", &format!("p{n}"), "u"),
                ))
                .unwrap()[0]
                    .address
            })
        })
        .collect();
    let got: Vec<IpAddr> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(got.iter().collect::<HashSet<_>>().len(), 64);
    let stored = FileStore::new(&path).list(&scope(NET)).unwrap();
    assert_eq!(stored.len(), 64);
    assert!(stored.iter().all(|l| l.is_leased()));
}

#[test]
fn concurrent_adds_on_a_tight_range() {
    let dir = TempDir::new("tight");
    let path = dir.sub("state");
    // 64 usable addresses, 80 contenders: exactly 64 win, the rest see exhaustion.
    let threads: Vec<_> = (0..80)
        .map(|n| {
            let path = path.clone();
            std::thread::spawn(move || {
                let store = FileStore::new(path);
                let r = range("10.1.0.0/25")
                    .with_bounds(Some(ip("10.1.0.10")), Some(ip("10.1.0.73")), None, vec![])
                    .unwrap();
                assert_eq!(r.usable_count(), 64);
                let a = Allocator::new(
                    scope(NET),
                    vec![r],
                    Policy::default(),
                    &store,
                    &NoProbe,
                    &tether_leases::SystemClock,
                );
                a.add(&add_req(
                    &format!("container-{n}"),
                    "net1",
                    pod("ns", &format!("p{n}"), "u"),
                ))
                .map(|v| v[0].address)
            })
        })
        .collect();
    let results: Vec<Result<IpAddr, AllocError>> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    let ok: Vec<IpAddr> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    assert_eq!(ok.len(), 64);
    assert_eq!(ok.iter().collect::<HashSet<_>>().len(), 64);
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(matches!(r, AllocError::Exhausted { .. }), "{r}");
    }
}

/// Both ranges of a dual-stack ADD are claimed first, then probed in one step: one budget.
#[test]
fn every_range_is_probed_in_one_step() {
    let fx = Fx::new(&["10.0.0.0/24", "fd00::/120"]);
    let out = fx
        .a()
        .add_probed(&add_req("c1", "net1", pod("ns", "p", "u")))
        .unwrap();
    let addrs: Vec<IpAddr> = out.leases.iter().map(|l| l.address).collect();
    assert_eq!(fx.prober.steps(), vec![addrs.clone()]);
    assert_eq!(out.probed, addrs, "both were probed and found unused");
}

/// The redo path: the IPv6 address answers in the step. It is quarantined and only that range
/// starts over, its next candidate probed on its own; the IPv4 lease stays as claimed.
#[test]
fn a_range_whose_address_answers_starts_over_alone() {
    let fx = Fx::new(&["10.0.0.0/24", "fd00::/120"]);
    let req = add_req("c1", "net1", pod("ns", "p", "u"));
    // Where this attachment's walk of the IPv6 range starts, from a scratch store.
    let first = {
        let scratch = Fx::new(&["10.0.0.0/24", "fd00::/120"]);
        scratch.a().add(&req).unwrap()
    };
    fx.prober.in_use(first[1].address, "02:00:00:00:00:66");
    let out = fx.a().add_probed(&req).unwrap();
    assert_eq!(out.leases[0].address, first[0].address);
    let second = out.leases[1].address;
    assert_ne!(second, first[1].address);
    assert_eq!(
        fx.prober.steps(),
        vec![vec![first[0].address, first[1].address], vec![second],]
    );
    assert_eq!(out.probed, vec![first[0].address, second]);
    let records = fx.leases();
    let q = records
        .iter()
        .find(|l| l.address == first[1].address)
        .unwrap();
    assert!(
        matches!(&q.state, LeaseState::Quarantined { mac, .. } if mac == "02:00:00:00:00:66"),
        "{q:?}"
    );
    assert_eq!(records.iter().filter(|l| l.is_leased()).count(), 2);
}

/// A requested address that answers in the step fails the ADD as a whole: the other range's
/// claim is rolled back, the answering address is kept out as evidence.
#[test]
fn a_requested_address_that_answers_in_the_step_fails_the_add() {
    let fx = Fx::new(&["10.0.0.0/24", "fd00::/120"]);
    fx.prober.in_use(ip("fd00::9"), "02:00:00:00:00:77");
    let req = with_requested(add_req("c1", "net1", pod("ns", "p", "u")), &["fd00::9"]);
    let e = fx.a().add(&req).unwrap_err();
    assert!(matches!(e, AllocError::RequestedInUse { .. }), "{e}");
    assert_eq!(
        fx.prober.steps().len(),
        1,
        "one step, no retry of a request"
    );
    let records = fx.leases();
    assert!(records.iter().all(|l| !l.is_leased()), "{records:?}");
    assert!(
        records.iter().any(
            |l| l.address == ip("fd00::9") && matches!(l.state, LeaseState::Quarantined { .. })
        )
    );
}

/// A step that fails names every address it probed and leaves nothing leased.
#[test]
fn a_failed_step_rolls_every_range_back() {
    let fx = Fx::new(&["10.0.0.0/24", "fd00::/120"]);
    let req = with_requested(
        add_req("c1", "net1", pod("ns", "p", "u")),
        &["10.0.0.9", "fd00::9"],
    );
    fx.prober
        .fail(ip("fd00::9"), "packet socket: permission denied");
    let e = fx.a().add(&req).unwrap_err();
    assert!(
        e.to_string().starts_with(
            "conflict probe for 10.0.0.9 and fd00::9 failed: packet socket: permission denied"
        ),
        "{e}"
    );
    assert!(fx.leases().is_empty());
}
