//! Records named by network (`<network>.<address>`, as tether named them before uniqueness
//! domains) on a real API server (TETHER_TEST_KUBECONFIG; see common/mod.rs): the mirrors kept
//! while an older tether may run, an old lease winning over a new claim, and the move of old
//! records into their domain, old node journals included.
//!
//! The cluster-wide domain is shared by every test of the run: these use 10.204.0.0/16, which no
//! other test uses, and clear it before and after.

mod common;

use std::net::IpAddr;

use common::*;
use tether_kube_store::convert::{Naming, naming_of, to_named_object};
use tether_kube_store::{Kinds, KubeSettings, KubeStore, LegacyMirrors, network_object_name};
use tether_leases::{AllocError, JournalEntry, Lease, LeaseState, LeaseStore, Scope};
use tether_pool::IpRange;

/// Every record in `subnet`, of every kind, from a consistent list.
fn records(env: &Env, subnet: &str) -> Vec<Lease> {
    let net = IpRange::parse(subnet).unwrap();
    KubeStore::connect(KubeSettings {
        list_from_cache: false,
        ..env.settings()
    })
    .unwrap()
    .list_every(Kinds::All)
    .unwrap()
    .into_iter()
    .filter(|l| net.contains(l.address))
    .collect()
}

struct Subnet<'e> {
    env: &'e Env,
    cidr: &'static str,
}

impl<'e> Subnet<'e> {
    fn cleared(env: &'e Env, cidr: &'static str) -> Subnet<'e> {
        let s = Subnet { env, cidr };
        s.clear();
        s
    }
    fn clear(&self) {
        let store = self.env.store();
        for l in records(self.env, self.cidr) {
            let _ = store.remove(&l);
        }
    }
    fn at(&self, addr: &str) -> Vec<(Naming, Lease)> {
        records(self.env, self.cidr)
            .into_iter()
            .filter(|l| l.address == ip(addr))
            .map(|l| (naming_of(&l), l))
            .collect()
    }
}

impl Drop for Subnet<'_> {
    fn drop(&mut self) {
        self.clear();
    }
}

/// A lease as a tether before uniqueness domains wrote it: `<network>.<address>`, no fabric.
fn old_record(env: &Env, network: &str, addr: &str, cid: &str, state: LeaseState) {
    let mut l = lease(network, addr, cid);
    l.domain = None;
    l.state = state;
    env.create_object(&to_named_object(&l, None, Naming::ByNetwork).unwrap());
}

fn mirrored_store(env: &Env, node: &str) -> KubeStore {
    env.store_with(|s| {
        s.node = Some(node.to_string());
        s.journal_dir = Some(env.dir.path().join(format!("journal-{node}")));
        s.legacy_mirrors = LegacyMirrors::new(true);
    })
}

/// While mirrors are kept, a lease's mirror follows it: made with the lease, released with it;
/// the store's own reads never show it.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn a_mirror_follows_its_lease_while_old_plugins_may_run() {
    let env = Env::new("mirror");
    let sub = Subnet::cleared(&env, "10.204.0.0/24");
    let net = format!("{}-m", env.network);
    let store = mirrored_store(&env, "node-a");
    let a = allocator(Scope::cluster(&net), "10.204.0.1-10.204.0.3/24", &store);
    let got = a
        .add(&add_req("c1", "net1", pod("ns", "p1", "u1")))
        .unwrap()[0]
        .clone();
    let addr = got.address.to_string();
    let mirror = env
        .object(&network_object_name(&net, got.address))
        .expect("a mirror under the network's name");
    assert_eq!(
        mirror["metadata"]["labels"]["ipam.tether.dev/mirror"],
        "true"
    );
    assert_eq!(mirror["spec"]["state"], "Leased");
    assert_eq!(mirror["spec"]["containerID"], "c1");
    // The store reads only the domain's record.
    let listed = store.list(&Scope::cluster(&net)).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(naming_of(&listed[0]), Naming::Domain);
    a.del("c1", "net1").unwrap();
    let both = sub.at(&addr);
    assert_eq!(both.len(), 2, "{both:?}");
    assert!(
        both.iter()
            .all(|(_, l)| matches!(l.state, LeaseState::Released { .. })),
        "{both:?}"
    );
}

/// A lease an older tether-ipam holds under `<network>.<address>` wins: a new claim of that
/// address in that network is undone, and the walk moves on.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn a_lease_an_old_plugin_holds_wins_and_the_new_claim_is_undone() {
    let env = Env::new("oldwins");
    let sub = Subnet::cleared(&env, "10.204.1.0/24");
    let net = format!("{}-o", env.network);
    old_record(&env, &net, "10.204.1.5", "old-ctr", LeaseState::Leased);
    let store = mirrored_store(&env, "node-a");
    let a = allocator(Scope::cluster(&net), "10.204.1.5-10.204.1.6/24", &store);
    let mut handed = Vec::new();
    for c in ["c1", "c2"] {
        match a.add(&add_req(c, "net1", pod("ns", c, "u"))) {
            Ok(l) => handed.push(l[0].address),
            Err(e) => assert!(matches!(e, AllocError::Exhausted { .. }), "{e}"),
        }
    }
    assert_eq!(handed, vec![ip("10.204.1.6")]);
    let five = sub.at("10.204.1.5");
    assert_eq!(five.len(), 1, "the new claim of .5 was undone: {five:?}");
    assert_eq!(five[0].0, Naming::ByNetwork);
    assert_eq!(five[0].1.container_id, "old-ctr");
    // A requested address an old plugin holds: refused, naming it.
    let e = a
        .add(&with_requested(
            add_req("c3", "net1", pod("ns", "c3", "u")),
            &["10.204.1.5"],
        ))
        .unwrap_err();
    assert!(e.to_string().contains("10.204.1.5"), "{e}");
    assert_eq!(sub.at("10.204.1.5").len(), 1);
}

/// Records named by network move into their domain: each gets its domain's record, the old
/// one becomes its mirror (mirrors kept) or goes (not kept); two holders of one address are
/// reported, never resolved. A node journal written by the older tether still releases the
/// moved lease.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn records_named_by_network_move_into_their_domain() {
    let env = Env::new("adopt");
    let sub = Subnet::cleared(&env, "10.204.2.0/24");
    let net = format!("{}-a", env.network);
    let scope = Scope::cluster(&net);
    // The node journal as the older tether left it: c1 holds .1 (its version names the old
    // object), written before the move.
    let node = mirrored_store(&env, "node-a");
    let journal = node.index().unwrap();
    journal
        .lookup(&net, "c1", "net1", &pod("ns", "pod-c1", "uid-c1"))
        .unwrap();
    old_record(&env, &net, "10.204.2.1", "c1", LeaseState::Leased);
    old_record(
        &env,
        &net,
        "10.204.2.2",
        "c2",
        LeaseState::Released { at: 5 },
    );
    old_record(&env, &net, "10.204.2.3", "c3", LeaseState::Leased);
    let mut old_c1 = sub.at("10.204.2.1")[0].1.clone();
    old_c1.version = old_c1
        .version
        .map(|v| v.trim_end_matches("/by-network").to_string());
    journal
        .record(
            &net,
            &JournalEntry {
                container_id: "c1".into(),
                ifname: "net1".into(),
                pod: pod("ns", "pod-c1", "uid-c1"),
                leases: vec![old_c1],
                pending: None,
            },
        )
        .unwrap();
    // Someone else holds .3 in the domain already: a duplicate from before.
    let other = env.store();
    let mut dup = lease(&net, "10.204.2.3", "c-new");
    dup.domain = None;
    other.claim(dup, None).unwrap().unwrap();

    let admin = env.store();
    let a = admin.adopt(&records(&env, sub.cidr), &|_| None, true);
    assert_eq!((a.moved, a.left, a.duplicates.len()), (2, 1, 1), "{a:?}");
    assert!(a.errors.is_empty(), "{:?}", a.errors);
    for (addr, state) in [("10.204.2.1", "leased"), ("10.204.2.2", "released")] {
        let kinds: Vec<Naming> = sub.at(addr).into_iter().map(|(n, _)| n).collect();
        assert!(
            kinds.contains(&Naming::Domain) && kinds.contains(&Naming::Mirror),
            "{addr} ({state}): {kinds:?}"
        );
    }
    // The store reads the moved records.
    let mine = admin.list(&scope).unwrap();
    assert!(
        mine.iter()
            .any(|l| l.address == ip("10.204.2.1") && l.is_leased())
    );

    // The older journal's DEL releases the moved lease (its version names the old object: the
    // write meets the new one, sees it is still c1's, and releases it).
    allocator(Scope::cluster(&net), "10.204.2.1-10.204.2.9/24", &node)
        .del("c1", "net1")
        .unwrap();
    let one = sub.at("10.204.2.1");
    let domain = one.iter().find(|(n, _)| *n == Naming::Domain).unwrap();
    assert!(
        matches!(domain.1.state, LeaseState::Released { .. }),
        "{one:?}"
    );

    // No longer kept: the mirrors go; the duplicate stays named by network until resolved.
    let b = admin.adopt(&records(&env, sub.cidr), &|_| None, false);
    assert_eq!(b.mirrors_deleted, 2, "{b:?}");
    assert_eq!(b.left, 1);
    let kinds: Vec<Naming> = records(&env, sub.cidr).iter().map(naming_of).collect();
    assert!(!kinds.contains(&Naming::Mirror), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == Naming::ByNetwork).count(), 1);
}

/// Mirrors turned on again (an older agent came back): every leased domain record gets one.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn mirrors_are_made_again_for_leases_written_without() {
    let env = Env::new("ensure");
    let sub = Subnet::cleared(&env, "10.204.3.0/24");
    let net = format!("{}-e", env.network);
    let plain = env.node_store("node-a");
    let a = allocator(Scope::cluster(&net), "10.204.3.1-10.204.3.4/24", &plain);
    let mut got: Vec<IpAddr> = Vec::new();
    for c in ["c1", "c2", "c3"] {
        got.push(a.add(&add_req(c, "net1", pod("ns", c, "u"))).unwrap()[0].address);
    }
    a.del("c3", "net1").unwrap();
    let (made, errors) = env.store().ensure_mirrors(&records(&env, sub.cidr));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(made, 2, "the two leased records, not the released one");
    for addr in &got[..2] {
        let m = env.object(&network_object_name(&net, *addr)).unwrap();
        assert_eq!(m["metadata"]["labels"]["ipam.tether.dev/mirror"], "true");
    }
    let again = env.store().ensure_mirrors(&records(&env, sub.cidr));
    assert_eq!(again.0, 0);
}
