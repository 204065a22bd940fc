//! The allocation engine end-to-end over the Kubernetes store on a real API server
//! (TETHER_TEST_KUBECONFIG; see common/mod.rs). Ignored without one: `make test` starts one.
//! Stores are opened as the plugin opens them (a node name and its journal), so the engine works
//! by single-object reads and never lists on ADD, DEL or CHECK.

mod common;

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Barrier, Mutex};

use common::*;
use tether_kube_store::KubeStore;
use tether_leases::{
    AddRequest, AllocError, Allocator, Attachment, AttachmentIndex, CasResult, FakeClock, Lease,
    LeaseState, LeaseStore, NoProbe, Policy, Scope, ScriptedProber, StoreError, walk_start,
};
use tether_pool::IpRange;

const T0: u64 = 1_700_000_000;

struct Fx {
    env: Env,
    store: KubeStore,
    clock: FakeClock,
    prober: ScriptedProber,
    ranges: Vec<IpRange>,
    policy: Policy,
}

impl Fx {
    fn new(tag: &str, ranges: &[&str]) -> Fx {
        let env = Env::new(tag);
        let store = env.node_store("node-a");
        Fx {
            env,
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
            scope_of(&self.env.network),
            self.ranges.clone(),
            self.policy.clone(),
            &self.store,
            &self.prober,
            &self.clock,
        )
    }
    fn leases(&self) -> Vec<Lease> {
        self.env.leases(&self.env.network)
    }
    fn rec(&self, a: IpAddr) -> Option<Lease> {
        self.leases().into_iter().find(|l| l.address == a)
    }
    /// The first address the walk of `req` reads in range 0.
    fn first_candidate(&self, req: &AddRequest) -> IpAddr {
        let r = &self.ranges[0];
        r.nth(walk_start(req, 0) % r.usable_count()).unwrap()
    }
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn idempotent_add_check_del() {
    let fx = Fx::new("idem", &["10.10.0.0/24", "fd10::/120"]);
    let req = add_req("c1", "net1", pod("ns", "p1", "u1"));
    let before = fx.store.requests();
    let first = fx.a().add(&req).unwrap();
    let spent = fx.store.requests() - before;
    // The node's first call in a network builds its journal from one LIST of this node's leases;
    // one LIST (watch cache) of the records naming this pod, for its sticky address; then one
    // CREATE per range (the addresses are free: no read).
    assert_eq!(
        (spent.list, spent.get, spent.create, spent.total()),
        (2, 0, 2, 4),
        "{spent:?}"
    );
    assert_eq!(first.len(), 2, "one lease per range");
    assert_eq!(first[0].range_index, Some(0));
    assert!(first[1].address.is_ipv6());
    // ADD again (runtime retry): the same leases, no new object.
    let before = fx.store.requests();
    let again = fx.a().add(&req).unwrap();
    assert_eq!(again, first);
    let spent = fx.store.requests() - before;
    assert_eq!(
        (spent.list, spent.create, spent.update, spent.total()),
        (0, 0, 0, 2),
        "{spent:?}"
    );
    assert_eq!(fx.a().check("c1", "net1").unwrap(), first);

    let before = fx.store.requests();
    let released = fx.a().del("c1", "net1").unwrap();
    let spent = fx.store.requests() - before;
    assert_eq!(
        (spent.update, spent.total()),
        (2, 2),
        "one conditional write per lease: {spent:?}"
    );
    assert_eq!(released.len(), 2);
    assert!(
        fx.leases()
            .iter()
            .all(|l| l.state == LeaseState::Released { at: T0 })
    );
    assert!(fx.a().check("c1", "net1").is_err());
    // DEL is idempotent, and free once the journal has let go of the attachment.
    let before = fx.store.requests();
    assert!(fx.a().del("c1", "net1").unwrap().is_empty());
    assert_eq!((fx.store.requests() - before).total(), 0);
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn gc_releases_attachments_not_listed() {
    let fx = Fx::new("gc", &["10.11.0.0/24"]);
    // Another node's attachment, which node a's runtime does not know about.
    let other = fx.env.node_store("node-b");
    let b = Allocator::new(
        scope_of(&fx.env.network),
        fx.ranges.clone(),
        fx.policy.clone(),
        &other,
        &NoProbe,
        &fx.clock,
    );
    let mut on_b = add_req("b0", "net1", pod("ns", "b0", "u"));
    on_b.node = Some("node-b".into());
    let on_b = b.add(&on_b).unwrap()[0].address;
    for i in 0..3 {
        fx.a()
            .add(&add_req(
                &format!("c{i}"),
                "net1",
                pod("ns", &format!("p{i}"), "u"),
            ))
            .unwrap();
    }
    let report = fx.a().gc(&[Attachment::new("c1", "net1")]).unwrap();
    let mut gone: Vec<String> = report
        .released
        .iter()
        .map(|l| l.container_id.clone())
        .collect();
    gone.sort();
    assert_eq!(gone, ["c0", "c2"]);
    assert!(report.errors.is_empty());
    let mut leased: Vec<_> = fx
        .leases()
        .into_iter()
        .filter(|l| l.is_leased())
        .map(|l| l.container_id)
        .collect();
    leased.sort();
    assert_eq!(
        leased,
        ["b0", "c1"],
        "node b's lease is not node a's to judge"
    );
    assert!(
        fx.store
            .lookup(&fx.env.network, "c0", "net1", &Default::default())
            .unwrap()
            .mine
            .is_none(),
        "GC let go of c0 in the journal"
    );
    assert!(b.check("b0", "net1").is_ok());
    assert_eq!(fx.rec(on_b).unwrap().node.as_deref(), Some("node-b"));

    // Past retention, GC deletes node a's released records.
    fx.clock.advance(fx.policy.retain_released_s + 1);
    let report = fx.a().gc(&[Attachment::new("c1", "net1")]).unwrap();
    assert_eq!(report.pruned, 2);
    assert_eq!(fx.leases().len(), 2);
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn cooldown_and_sticky_with_fake_clock() {
    // Two usable addresses.
    let fx = Fx::new("cool", &["10.12.0.1-10.12.0.2/24"]);
    let a1 = fx
        .a()
        .add(&add_req("ca", "net1", pod("ns", "a", "ua")))
        .unwrap()[0]
        .address;
    fx.a().del("ca", "net1").unwrap();
    // Another pod does not get the cooling address while the other is free.
    let b = fx
        .a()
        .add(&add_req("cb", "net1", pod("ns", "b", "ub")))
        .unwrap()[0]
        .address;
    assert_ne!(a1, b);
    fx.a().del("cb", "net1").unwrap();
    // The same pod name (a StatefulSet pod with a new UID) gets its address back (sticky).
    fx.clock.advance(5);
    let a2 = fx
        .a()
        .add(&add_req("ca2", "net1", pod("ns", "a", "ua2")))
        .unwrap()[0]
        .address;
    assert_eq!(a2, a1);
    // Only b is left, cooling: a third pod still gets it (last resort), no exhaustion.
    let c = fx
        .a()
        .add(&add_req("cc", "net1", pod("ns", "c", "uc")))
        .unwrap()[0]
        .address;
    assert_eq!(c, b);
    // After the cooldown, released records are ordinary free addresses.
    fx.a().del("cc", "net1").unwrap();
    fx.clock.advance(fx.policy.cooldown_s + 1);
    let d = fx
        .a()
        .add(&add_req("cd", "net1", pod("ns", "d", "ud")))
        .unwrap()[0]
        .address;
    assert_eq!(d, b);
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn quarantine_with_scripted_prober() {
    let fx = Fx::new("quar", &["10.13.0.0/24"]);
    let req = add_req("cq", "net1", pod("ns", "q", "uq"));
    let first = fx.first_candidate(&req);
    fx.prober.in_use(first, "02:00:00:00:00:99");
    let got = fx.a().add(&req).unwrap()[0].address;
    assert_ne!(got, first);
    assert_eq!(fx.prober.calls()[0], first);
    let q = fx.rec(first).expect("quarantine record");
    assert_eq!(
        q.state,
        LeaseState::Quarantined {
            mac: "02:00:00:00:00:99".into(),
            at: T0
        }
    );
    // Requested while quarantined and still answering: an error naming the MAC.
    let e = fx
        .a()
        .add(&with_requested(
            add_req("cr", "net1", pod("ns", "r", "ur")),
            &[&first.to_string()],
        ))
        .unwrap_err();
    assert!(matches!(e, AllocError::RequestedInUse { .. }), "{e}");
    assert!(e.to_string().contains("02:00:00:00:00:99"));
    // Once quarantine is over and nobody answers, it is handed out again.
    fx.prober.clear(first);
    fx.clock.advance(fx.policy.quarantine_s + 1);
    let name = (0..10_000)
        .map(|n| format!("q2-{n}"))
        .find(|n| fx.first_candidate(&add_req("cq2", "net1", pod("ns", n, "uq2"))) == first)
        .unwrap();
    let again = fx
        .a()
        .add(&add_req("cq2", "net1", pod("ns", &name, "uq2")))
        .unwrap()[0]
        .address;
    assert_eq!(again, first);
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn requested_addresses() {
    let fx = Fx::new("req", &["10.14.0.0/24"]);
    let r = with_requested(
        add_req("c1", "net1", pod("ns", "p1", "u1")),
        &["10.14.0.77"],
    );
    assert_eq!(fx.a().add(&r).unwrap()[0].address, ip("10.14.0.77"));
    let other = with_requested(
        add_req("c2", "net1", pod("ns", "p2", "u2")),
        &["10.14.0.77"],
    );
    let e = fx.a().add(&other).unwrap_err();
    assert!(matches!(e, AllocError::HeldByOther { .. }), "{e}");
    assert!(e.to_string().contains("ns/p1"), "{e}");
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn exhaustion_message_and_rollback() {
    // Range 1 has room, range 2 has a single address.
    let fx = Fx::new("exh", &["10.15.0.0/24", "10.16.0.1-10.16.0.1/24"]);
    fx.a()
        .add(&add_req("c1", "net1", pod("ns", "p1", "u1")))
        .unwrap();
    let before = fx.leases();
    let e = fx
        .a()
        .add(&add_req("c2", "net1", pod("ns", "p2", "u2")))
        .unwrap_err();
    assert!(matches!(e, AllocError::Exhausted { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("no free address in range"), "{msg}");
    assert!(msg.contains(&fx.env.network), "{msg}");
    assert!(msg.contains("1 usable, 1 leased"), "{msg}");
    assert!(!e.is_transient());
    // All or nothing: the lease taken in range 1 for c2 was deleted again.
    assert_eq!(fx.leases(), before);
    let st = fx.a().status();
    assert!(st.is_err(), "STATUS reports the full range");
}

/// A store wrapper that makes the first `claim` of every thread wait until `n` threads have
/// reached their first claim: both allocators read the same absent candidate, then race.
struct Racing<'a> {
    inner: &'a KubeStore,
    barrier: &'a Barrier,
    seen: Mutex<HashSet<std::thread::ThreadId>>,
    lost: Mutex<usize>,
}

impl LeaseStore for Racing<'_> {
    fn list(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        self.inner.list(scope)
    }
    fn get(&self, scope: &Scope, address: IpAddr) -> Result<Option<Lease>, StoreError> {
        self.inner.get(scope, address)
    }
    fn index(&self) -> Option<&dyn AttachmentIndex> {
        self.inner.index()
    }
    fn claim(&self, new: Lease, expected: Option<&Lease>) -> CasResult<Lease> {
        if self
            .seen
            .lock()
            .unwrap()
            .insert(std::thread::current().id())
        {
            self.barrier.wait();
        }
        let r = self.inner.claim(new, expected)?;
        if r.is_err() {
            *self.lost.lock().unwrap() += 1;
        }
        Ok(r)
    }
    fn remove(&self, expected: &Lease) -> CasResult<()> {
        self.inner.remove(expected)
    }
}

/// Checklist item 80: two allocators race for the same candidate; one gets it, the other moves
/// on, both succeed.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn item80_two_allocators_race_for_one_candidate() {
    let fx = Fx::new("race", &["10.17.0.0/24"]);
    // Two pods on two nodes whose walks start at the same address.
    let target = fx.first_candidate(&add_req("race-a", "net1", pod("ns", "race-a", "u")));
    let cid_b = (0..100_000)
        .map(|n| format!("race-b-{n}"))
        .find(|c| fx.first_candidate(&add_req(c, "net1", pod("ns", c, "u"))) == target)
        .unwrap();
    let barrier = Barrier::new(2);
    let stores = [fx.env.node_store("node-a"), fx.env.node_store("node-b")];
    let racers: Vec<Racing> = stores
        .iter()
        .map(|s| Racing {
            inner: s,
            barrier: &barrier,
            seen: Mutex::new(HashSet::new()),
            lost: Mutex::new(0),
        })
        .collect();
    let results: Vec<Vec<Lease>> = std::thread::scope(|sc| {
        let hs: Vec<_> = racers
            .iter()
            .zip(["race-a".to_string(), cid_b.clone()])
            .map(|(r, cid)| {
                let fx = &fx;
                sc.spawn(move || {
                    let a = Allocator::new(
                        scope_of(&fx.env.network),
                        fx.ranges.clone(),
                        fx.policy.clone(),
                        r,
                        &NoProbe,
                        &fx.clock,
                    );
                    a.add(&add_req(&cid, "net1", pod("ns", &cid, "u"))).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let got: Vec<IpAddr> = results.iter().map(|v| v[0].address).collect();
    assert_ne!(got[0], got[1], "distinct addresses");
    assert!(
        got.contains(&target),
        "one of them got the contested candidate"
    );
    let losses: usize = racers.iter().map(|r| *r.lost.lock().unwrap()).sum();
    assert_eq!(losses, 1, "exactly one claim lost the race and moved on");
    let leased: Vec<Lease> = fx.leases().into_iter().filter(|l| l.is_leased()).collect();
    assert_eq!(leased.len(), 2);
}
