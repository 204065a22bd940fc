//! The engine over a store that keeps a node journal (point mode): the Kubernetes store's way
//! of working, modelled here by one shared file store standing for the cluster and one journal
//! directory per node. What is counted is what costs API requests there: snapshots (LIST),
//! point reads (GET) and conditional writes.

mod common;

use std::cell::{Cell, RefCell};
use std::net::IpAddr;

use common::*;
use tether_leases::{
    AllocError, Allocator, Attachment, AttachmentIndex, BackendFailure, CasResult, FakeClock,
    FileJournal, FileStore, JournalEntry, Lease, LeaseState, LeaseStore, NoProbe, PodRef, Policy,
    Scope, ScriptedProber, StoreError, Taken, walk_start,
};

const NET: &str = "mgmt";

/// One node's view of the shared store: its own journal and name, and counters.
struct Node {
    cluster: FileStore,
    journal: FileJournal,
    name: String,
    lists: Cell<usize>,
    gets: Cell<usize>,
    writes: Cell<usize>,
    /// Answers `by_pod` (as the Kubernetes store's pod label does), counted in `by_pod_reads`.
    pod_index: Cell<bool>,
    by_pod_reads: Cell<usize>,
    /// The store cannot be reached: every request fails as a timed-out one does.
    away: Cell<bool>,
    /// The server hung after the reads of an ADD (SIGSTOP): the writes sent meanwhile are not
    /// answered; they are queued, to run when [`Node::resume`] says.
    hung: Cell<bool>,
    queued: RefCell<Vec<(Lease, Option<Lease>)>>,
}

impl Node {
    fn new(cluster: &TempDir, dir: &TempDir, name: &str) -> Node {
        let journal = FileJournal::new(dir.sub(&format!("journal-{name}")));
        // A fresh journal is authoritative once rebuilt from this node's records.
        let cluster = FileStore::new(cluster.sub("cluster"));
        let node = name.to_string();
        journal
            .rebuild(NET, || {
                Ok(cluster
                    .list(&scope(NET))?
                    .into_iter()
                    .filter(|l| l.node.as_deref() == Some(node.as_str()))
                    .collect())
            })
            .unwrap();
        Node {
            cluster,
            journal,
            name: name.to_string(),
            lists: Cell::new(0),
            gets: Cell::new(0),
            writes: Cell::new(0),
            pod_index: Cell::new(false),
            by_pod_reads: Cell::new(0),
            away: Cell::new(false),
            hung: Cell::new(false),
            queued: RefCell::default(),
        }
    }

    /// The server runs the writes it had queued (and answers again): whether each was made.
    fn resume(&self) -> Vec<bool> {
        self.hung.set(false);
        self.queued
            .take()
            .into_iter()
            .map(|(new, expected)| matches!(self.cluster.claim(new, expected.as_ref()), Ok(Ok(_))))
            .collect()
    }

    /// The Leased records naming pod `p`.
    fn leased_to(&self, p: &PodRef) -> Vec<Lease> {
        self.raw()
            .into_iter()
            .filter(|l| l.is_leased() && l.pod.same_pod(p))
            .collect()
    }

    fn reach(&self) -> Result<(), StoreError> {
        if self.away.get() {
            return Err(StoreError::Backend(BackendFailure::new(
                "the API server did not answer within 10 s",
                true,
            )));
        }
        Ok(())
    }

    fn counts(&self) -> (usize, usize, usize) {
        (self.lists.get(), self.gets.get(), self.writes.get())
    }

    fn reset(&self) {
        self.lists.set(0);
        self.gets.set(0);
        self.writes.set(0);
        self.by_pod_reads.set(0);
    }

    fn raw(&self) -> Vec<Lease> {
        self.cluster.list(&scope(NET)).unwrap()
    }

    fn rec(&self, a: IpAddr) -> Option<Lease> {
        self.raw().into_iter().find(|l| l.address == a)
    }
}

impl LeaseStore for Node {
    fn list(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        self.reach()?;
        self.lists.set(self.lists.get() + 1);
        self.cluster.list(scope)
    }
    fn get(&self, scope: &Scope, address: IpAddr) -> Result<Option<Lease>, StoreError> {
        self.reach()?;
        self.gets.set(self.gets.get() + 1);
        Ok(self
            .cluster
            .list(scope)?
            .into_iter()
            .find(|l| l.address == address))
    }
    fn claim(&self, new: Lease, expected: Option<&Lease>) -> CasResult<Lease> {
        if self.hung.get() {
            self.queued.borrow_mut().push((new, expected.cloned()));
            return Err(StoreError::Backend(BackendFailure::new(
                "the API server did not answer the write within 10 s",
                true,
            )));
        }
        self.reach()?;
        self.writes.set(self.writes.get() + 1);
        let r = self.cluster.claim(new, expected);
        // The Kubernetes store reads the record a lost write met (409 → GET): count it.
        if let Ok(Err(Taken { current: Some(_) })) = &r {
            self.gets.set(self.gets.get() + 1);
        }
        r
    }
    fn remove(&self, expected: &Lease) -> Result<Result<(), Taken>, StoreError> {
        self.reach()?;
        self.writes.set(self.writes.get() + 1);
        self.cluster.remove(expected)
    }
    fn index(&self) -> Option<&dyn AttachmentIndex> {
        Some(&self.journal)
    }
    fn by_pod(&self, scope: &Scope, pod: &PodRef) -> Result<Option<Vec<Lease>>, StoreError> {
        self.reach()?;
        if !self.pod_index.get() {
            return Ok(None);
        }
        self.by_pod_reads.set(self.by_pod_reads.get() + 1);
        Ok(Some(
            self.cluster
                .list(scope)?
                .into_iter()
                .filter(|l| l.pod.same_name(pod))
                .collect(),
        ))
    }
    fn list_mine(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        self.reach()?;
        self.lists.set(self.lists.get() + 1);
        Ok(self
            .cluster
            .list(scope)?
            .into_iter()
            .filter(|l| l.node.as_deref() == Some(self.name.as_str()))
            .collect())
    }
}

fn alloc<'a>(
    node: &'a Node,
    r: &str,
    prober: &'a dyn tether_leases::Prober,
    clock: &'a FakeClock,
) -> Allocator<'a> {
    Allocator::new(
        scope(NET),
        vec![range(r)],
        Policy::default(),
        node,
        prober,
        clock,
    )
}

fn req_on(node: &Node, cid: &str, p: tether_leases::PodRef) -> tether_leases::AddRequest {
    let mut r = add_req(cid, "net1", p);
    r.node = Some(node.name.clone());
    r
}

#[test]
fn add_del_check_cost_single_records_and_never_a_list() {
    let (c, d) = (TempDir::new("pm-cost-c"), TempDir::new("pm-cost-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&n, "10.0.0.0/16", &NoProbe, &clock);
    let req = req_on(&n, "c1", pod("ns", "p1", "u1"));

    let got = a.add(&req).unwrap();
    assert_eq!(
        n.counts(),
        (0, 0, 1),
        "uncontended ADD: one create, no read"
    );
    let start = range("10.0.0.0/16")
        .nth(walk_start(&req, 0) % range("10.0.0.0/16").usable_count())
        .unwrap();
    assert_eq!(
        got[0].address, start,
        "the walk starts where the pod's identity says"
    );

    n.reset();
    assert_eq!(a.add(&req).unwrap(), got, "repeated ADD");
    assert_eq!(
        n.counts(),
        (0, 1, 0),
        "repeated ADD: one read of the journaled record"
    );

    n.reset();
    assert_eq!(a.check("c1", "net1").unwrap()[0].address, got[0].address);
    assert_eq!(n.counts(), (0, 1, 0));

    n.reset();
    assert_eq!(a.del("c1", "net1").unwrap().len(), 1);
    assert_eq!(n.counts(), (0, 0, 1), "DEL: one conditional write, no read");
    assert!(matches!(
        n.rec(got[0].address).unwrap().state,
        LeaseState::Released { .. }
    ));

    n.reset();
    assert!(a.del("c1", "net1").unwrap().is_empty());
    assert!(a.del("never-added", "net1").unwrap().is_empty());
    assert_eq!(
        n.counts(),
        (0, 0, 0),
        "DEL of an attachment this node does not hold: no request"
    );
    assert!(a.check("c1", "net1").is_err());
}

#[test]
fn cost_does_not_grow_with_the_leases_of_the_network() {
    let (c, d) = (TempDir::new("pm-scale-c"), TempDir::new("pm-scale-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&n, "10.0.0.0/16", &NoProbe, &clock);
    // (The file store standing for the cluster rewrites one file per write: keep it small.)
    for i in 0..300 {
        a.add(&req_on(
            &n,
            &format!("fill-{i}"),
            pod("ns", &format!("fill-{i}"), "u"),
        ))
        .unwrap();
    }
    let mut reads = 0;
    for i in 0..50 {
        n.reset();
        a.add(&req_on(
            &n,
            &format!("m-{i}"),
            pod("ns", &format!("m-{i}"), "u"),
        ))
        .unwrap();
        let (lists, gets, writes) = n.counts();
        assert_eq!((lists, writes), (0, 1), "ADD {i}");
        reads += gets;
        n.reset();
        a.del(&format!("m-{i}"), "net1").unwrap();
        assert_eq!(n.counts(), (0, 0, 1));
    }
    // 300 of 65,534 addresses leased: a walk rarely meets a leased one.
    assert!(reads <= 50 + 5, "{reads} reads for 50 ADDs");
}

#[test]
fn a_claim_cut_short_is_found_by_the_journal() {
    // A process killed after its CREATE but before it recorded the result: the journal holds
    // the address it was about to claim, so a repeated ADD returns it and DEL releases it.
    let (c, d) = (TempDir::new("pm-crash-c"), TempDir::new("pm-crash-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&n, "10.0.0.0/24", &NoProbe, &clock);
    let req = req_on(&n, "c1", pod("ns", "p1", "u1"));
    let addr = ip("10.0.0.77");
    let lease = Lease {
        network: NET.into(),
        domain: None,
        address: addr,
        prefix_len: 24,
        range_index: Some(0),
        container_id: "c1".into(),
        ifname: "net1".into(),
        pod: req.pod.clone(),
        node: Some("a".into()),
        state: LeaseState::Leased,
        since: 1_000_000,
        version: None,
    };
    let entry = JournalEntry {
        container_id: "c1".into(),
        ifname: "net1".into(),
        pod: req.pod.clone(),
        leases: vec![lease.clone()],
        pending: None,
    };
    n.journal.record(NET, &entry).unwrap();
    n.cluster.claim(lease, None).unwrap().unwrap();

    assert_eq!(a.add(&req).unwrap()[0].address, addr);
    n.journal.record(NET, &entry).unwrap(); // back to the version-less record
    n.reset();
    assert_eq!(a.del("c1", "net1").unwrap()[0].address, addr);
    assert_eq!(
        n.counts(),
        (0, 1, 1),
        "a version-less record is read, then released"
    );
}

#[test]
fn sandbox_recreate_and_sticky_without_a_list() {
    let (c, d) = (TempDir::new("pm-sticky-c"), TempDir::new("pm-sticky-d"));
    let (na, nb) = (Node::new(&c, &d, "a"), Node::new(&c, &d, "b"));
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&na, "10.0.0.0/24", &NoProbe, &clock);
    let b = alloc(&nb, "10.0.0.0/24", &NoProbe, &clock);

    let first = a
        .add(&req_on(&na, "c1", pod("ns", "train-0", "u1")))
        .unwrap()[0]
        .address;
    // The kubelet re-creates the sandbox without a DEL: the same pod object, a new container.
    na.reset();
    let again = a
        .add(&req_on(&na, "c2", pod("ns", "train-0", "u1")))
        .unwrap();
    assert_eq!(again[0].address, first);
    assert_eq!(again[0].container_id, "c2");
    assert_eq!(na.counts().0, 0);
    assert!(
        na.journal
            .lookup(NET, "c1", "net1", &Default::default())
            .unwrap()
            .mine
            .is_none(),
        "the old sandbox's entry lets go"
    );
    // Other pods fill the addresses right after train-0's, then train-0 goes away.
    for i in 0..5 {
        a.add(&req_on(
            &na,
            &format!("o{i}"),
            pod("ns", &format!("other-{i}"), "u"),
        ))
        .unwrap();
    }
    a.del("c2", "net1").unwrap();
    clock.advance(3600); // past the cooldown
    // The StatefulSet brings train-0 back on another node, with a new UID: same address.
    nb.reset();
    let back = b
        .add(&req_on(&nb, "c3", pod("ns", "train-0", "u2")))
        .unwrap();
    assert_eq!(back[0].address, first, "sticky across nodes");
    // The CREATE meets its record (409), the read shows it is train-0's, the UPDATE takes it.
    assert_eq!(nb.counts(), (0, 1, 2));
}

#[test]
fn a_free_candidate_is_created_at_once_and_a_busy_walk_reads_first() {
    let (c, d) = (TempDir::new("pm-busy-c"), TempDir::new("pm-busy-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&n, "10.0.0.0/24", &NoProbe, &clock);
    let r = range("10.0.0.0/24");
    let req = req_on(&n, "c1", pod("ns", "train-5", "u1"));
    let start = walk_start(&req, 0) % r.usable_count();
    // Other pods hold the first three candidates of train-5's walk.
    for k in 0..3 {
        let at = r.nth((start + k) % r.usable_count()).unwrap().to_string();
        a.add(&with_requested(
            req_on(&n, &format!("s{k}"), pod("ns", &format!("squat-{k}"), "u")),
            &[&at],
        ))
        .unwrap();
    }
    n.reset();
    let got = a.add(&req).unwrap()[0].address;
    assert_eq!(got, r.nth((start + 3) % r.usable_count()).unwrap());
    // The first CREATE is refused (and its record read); the walk is busy from there: the next
    // two are read (one request each, not two), the fourth is read free and created.
    assert_eq!(n.counts(), (0, 4, 2));
}

#[test]
fn sticky_beyond_a_free_address() {
    // train-1's walk first meets a record another pod released long ago (free), then its own:
    // the horizon finds its own.
    let (c, d) = (TempDir::new("pm-horizon-c"), TempDir::new("pm-horizon-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&n, "10.0.0.0/24", &NoProbe, &clock);
    let r = range("10.0.0.0/24");
    let probe = req_on(&n, "c1", pod("ns", "train-1", "u1"));
    let start = walk_start(&probe, 0) % r.usable_count();
    let second = r.nth((start + 1) % r.usable_count()).unwrap();
    // Someone holds train-1's first candidate, so train-1 gets the second.
    let squat = with_requested(
        req_on(&n, "s", pod("ns", "squatter", "u")),
        &[&r.nth(start).unwrap().to_string()],
    );
    a.add(&squat).unwrap();
    assert_eq!(a.add(&probe).unwrap()[0].address, second);
    a.del("c1", "net1").unwrap();
    a.del("s", "net1").unwrap();
    clock.advance(3600);
    let back = a
        .add(&req_on(&n, "c2", pod("ns", "train-1", "u2")))
        .unwrap();
    assert_eq!(
        back[0].address, second,
        "its own released record wins over an older free one"
    );
}

#[test]
fn sticky_far_along_the_walk_is_found_by_the_pod_index_in_one_read() {
    // train-2's walk meets seven free records before its own, more than the sticky horizon
    // lets the walk look past: without an index it gets the first free one, with the store's
    // index by pod identity its own, in one read and no LIST.
    let run = |indexed: bool| {
        let tag = if indexed { "idx" } else { "walk" };
        let (c, d) = (
            TempDir::new(&format!("pm-{tag}-c")),
            TempDir::new(&format!("pm-{tag}-d")),
        );
        let n = Node::new(&c, &d, "a");
        n.pod_index.set(indexed);
        let clock = FakeClock::new(1_000_000);
        let a = alloc(&n, "10.0.0.0/24", &NoProbe, &clock);
        let r = range("10.0.0.0/24");
        let probe = req_on(&n, "c1", pod("ns", "train-2", "u1"));
        let start = walk_start(&probe, 0) % r.usable_count();
        for k in 0..7 {
            let at = r.nth((start + k) % r.usable_count()).unwrap().to_string();
            a.add(&with_requested(
                req_on(&n, &format!("s{k}"), pod("ns", &format!("squat-{k}"), "u")),
                &[&at],
            ))
            .unwrap();
        }
        let own = a.add(&probe).unwrap()[0].address;
        a.del("c1", "net1").unwrap();
        for k in 0..7 {
            a.del(&format!("s{k}"), "net1").unwrap();
        }
        clock.advance(3600); // every record past its cooldown: the squatters' are free again
        n.reset();
        let back = a
            .add(&req_on(&n, "c2", pod("ns", "train-2", "u2")))
            .unwrap()[0]
            .address;
        (own, back, n.counts(), n.by_pod_reads.get())
    };
    let (own, back, _, _) = run(false);
    assert_ne!(
        back, own,
        "the walk alone stops before train-2's own record"
    );
    let (own, back, (lists, _, writes), reads) = run(true);
    assert_eq!(back, own, "the pod index finds it");
    assert_eq!((lists, writes, reads), (0, 1, 1));
}

#[test]
fn small_range_exhausted_with_exact_counts_without_a_list() {
    let (c, d) = (TempDir::new("pm-full-c"), TempDir::new("pm-full-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let prober = ScriptedProber::new();
    let a = alloc(&n, "10.20.30.241-10.20.30.250/24", &prober, &clock);
    prober.in_use(ip("10.20.30.250"), "02:00:00:00:00:99");
    for i in 0..9 {
        a.add(&req_on(
            &n,
            &format!("c{i}"),
            pod("ns", &format!("p{i}"), "u"),
        ))
        .unwrap();
    }
    n.reset();
    let e = a
        .add(&req_on(&n, "late", pod("ns", "late", "u")))
        .unwrap_err();
    assert!(
        matches!(
            e,
            AllocError::Exhausted {
                leased: 9,
                quarantined: 1,
                usable: 10,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("10 usable, 9 leased, 1 quarantined"),
        "{e}"
    );
    assert_eq!(n.counts().0, 0, "a range of 10 is read address by address");
    assert!(
        n.journal
            .lookup(NET, "late", "net1", &Default::default())
            .unwrap()
            .mine
            .is_none()
    );
}

#[test]
fn a_nearly_full_large_range_falls_back_to_one_list() {
    let (c, d) = (TempDir::new("pm-fallback-c"), TempDir::new("pm-fallback-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let r = range("10.0.0.0/25"); // 126 usable, more than max_point_reads
    let a = alloc(&n, "10.0.0.0/25", &NoProbe, &clock);
    let last_req = req_on(&n, "last", pod("ns", "last", "u"));
    // Every address but the one 100 places into the last pod's walk is taken.
    let start = walk_start(&last_req, 0) % r.usable_count();
    let spare = r.nth((start + 100) % r.usable_count()).unwrap();
    for (i, addr) in r.candidates(0).filter(|x| *x != spare).enumerate() {
        let q = with_requested(
            req_on(&n, &format!("c{i}"), pod("ns", &format!("p{i}"), "u")),
            &[&addr.to_string()],
        );
        a.add(&q).unwrap();
    }
    n.reset();
    let last = a.add(&last_req).unwrap();
    assert_eq!(last[0].address, spare);
    let (lists, gets, _) = n.counts();
    assert_eq!(lists, 1, "one snapshot after the bounded walk");
    assert_eq!(gets, Policy::default().max_point_reads);
    let e = a
        .add(&req_on(&n, "more", pod("ns", "more", "u")))
        .unwrap_err();
    assert!(
        matches!(e, AllocError::Exhausted { leased: 126, .. }),
        "{e}"
    );
}

#[test]
fn gc_releases_only_this_nodes_leases() {
    let (c, d) = (TempDir::new("pm-gc-c"), TempDir::new("pm-gc-d"));
    let (na, nb) = (Node::new(&c, &d, "a"), Node::new(&c, &d, "b"));
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&na, "10.0.0.0/24", &NoProbe, &clock);
    let b = alloc(&nb, "10.0.0.0/24", &NoProbe, &clock);
    let a1 = a.add(&req_on(&na, "a1", pod("ns", "a1", "u"))).unwrap()[0].address;
    let a2 = a.add(&req_on(&na, "a2", pod("ns", "a2", "u"))).unwrap()[0].address;
    let b1 = b.add(&req_on(&nb, "b1", pod("ns", "b1", "u"))).unwrap()[0].address;
    // A CNI 1.1 runtime on node a knows only a1.
    let report = a.gc(&[Attachment::new("a1", "net1")]).unwrap();
    assert_eq!(
        report
            .released
            .iter()
            .map(|l| l.address)
            .collect::<Vec<_>>(),
        vec![a2]
    );
    assert!(na.rec(a1).unwrap().is_leased());
    assert!(
        na.rec(b1).unwrap().is_leased(),
        "node b's lease is not node a's to judge"
    );
    assert!(
        na.journal
            .lookup(NET, "a2", "net1", &Default::default())
            .unwrap()
            .mine
            .is_none()
    );
    assert!(b.check("b1", "net1").is_ok());
}

#[test]
fn journal_rebuild_finds_this_nodes_leases_once() {
    let (c, d) = (TempDir::new("pm-rebuild-c"), TempDir::new("pm-rebuild-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&n, "10.0.0.0/24", &NoProbe, &clock);
    let held = a.add(&req_on(&n, "c1", pod("ns", "p1", "u"))).unwrap()[0].address;
    // The node's /var/lib is wiped: a new journal is rebuilt from the store, once.
    std::fs::remove_dir_all(n.journal.dir()).unwrap();
    assert!(!n.journal.is_complete(NET));
    let calls = Cell::new(0);
    let rebuild = || {
        n.journal
            .rebuild(NET, || {
                calls.set(calls.get() + 1);
                n.list_mine(&scope(NET))
            })
            .unwrap()
    };
    rebuild();
    rebuild();
    assert_eq!(calls.get(), 1);
    assert!(n.journal.is_complete(NET));
    n.reset();
    assert_eq!(a.del("c1", "net1").unwrap()[0].address, held);
    assert_eq!(n.counts(), (0, 0, 1));
}

#[test]
fn a_failed_repeat_add_keeps_what_the_attachment_held() {
    // A second range is added to the config; the repeated ADD fails there (exhausted): the
    // lease of the first range stays held and journaled, so DEL still finds it.
    let (c, d) = (TempDir::new("pm-keep-c"), TempDir::new("pm-keep-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let one = Allocator::new(
        scope(NET),
        vec![range("10.0.0.0/24")],
        Policy::default(),
        &n,
        &NoProbe,
        &clock,
    );
    let req = req_on(&n, "c1", pod("ns", "p1", "u1"));
    let held = one.add(&req).unwrap()[0].address;
    let full = with_requested(req_on(&n, "other", pod("ns", "other", "u")), &["10.9.0.1"]);
    let two = Allocator::new(
        scope(NET),
        vec![range("10.0.0.0/24"), range("10.9.0.1-10.9.0.1/24")],
        Policy::default(),
        &n,
        &NoProbe,
        &clock,
    );
    let mut f = full.clone();
    f.requested
        .insert(0, tether_pool::RequestedIp::parse("10.0.0.200").unwrap());
    two.add(&f).unwrap();
    assert!(matches!(
        two.add(&req).unwrap_err(),
        AllocError::Exhausted { .. }
    ));
    assert!(n.rec(held).unwrap().is_leased());
    assert_eq!(one.del("c1", "net1").unwrap()[0].address, held);
}

/// Issue 22, part 5: a node reboot or a dead sandbox while the API server is away. The kubelet
/// stops the old sandbox (DEL) before it creates the new one (ADD) and retries both: DEL is
/// recorded in the journal, the new sandbox of the same pod object gets its address from the
/// journal, a new pod does not; once the store answers, the next call settles it.
#[test]
fn a_sandbox_re_created_during_an_outage_keeps_its_address_and_the_store_catches_up() {
    let (c, d) = (TempDir::new("pm-away-c"), TempDir::new("pm-away-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&n, "10.0.0.0/24", &NoProbe, &clock);
    let first = a.add(&req_on(&n, "c1", pod("ns", "p1", "u1"))).unwrap();
    let addr = first[0].address;

    n.away.set(true);
    assert!(a.del("c1", "net1").unwrap().is_empty(), "DEL succeeds");
    assert!(
        n.rec(addr).unwrap().is_leased(),
        "the address stays held until the store hears of the release"
    );
    let again = a.add(&req_on(&n, "c2", pod("ns", "p1", "u1"))).unwrap();
    assert_eq!(again[0].address, addr, "the same pod object gets it back");
    assert_eq!(again[0].container_id, "c2");
    assert_eq!(
        a.add(&req_on(&n, "c2", pod("ns", "p1", "u1"))).unwrap(),
        again,
        "a retried ADD"
    );
    for (cid, p) in [
        ("c3", pod("ns", "other", "u3")),
        ("c4", pod("ns", "p1", "u-new")),
    ] {
        let e = a.add(&req_on(&n, cid, p.clone())).unwrap_err();
        assert!(e.is_transient(), "{p}: {e}");
    }
    assert_eq!(
        n.rec(addr).unwrap().container_id,
        "c1",
        "nothing reached the store"
    );

    // Back: the next call of the network settles first (here a CHECK of the new sandbox).
    n.away.set(false);
    let held = a.check("c2", "net1").unwrap();
    assert_eq!(held[0].address, addr);
    let rec = n.rec(addr).unwrap();
    assert!(rec.is_leased() && rec.container_id == "c2", "{rec:?}");
    assert!(
        n.journal.take_pending(NET).unwrap().is_empty(),
        "nothing left pending"
    );
    assert_eq!(a.del("c2", "net1").unwrap().len(), 1);
    assert!(matches!(
        n.rec(addr).unwrap().state,
        LeaseState::Released { .. }
    ));
}

#[test]
fn a_del_during_an_outage_is_done_when_the_store_answers() {
    let (c, d) = (TempDir::new("pm-away-del-c"), TempDir::new("pm-away-del-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&n, "10.0.0.0/24", &NoProbe, &clock);
    let addr = a.add(&req_on(&n, "c1", pod("ns", "p1", "u1"))).unwrap()[0].address;
    n.away.set(true);
    assert!(a.del("c1", "net1").unwrap().is_empty());
    assert!(a.gc(&[]).unwrap_err().is_transient(), "GC needs the store");
    n.away.set(false);
    // Another pod's ADD is the first call that reaches the store.
    let other = a.add(&req_on(&n, "c9", pod("ns", "p9", "u9"))).unwrap();
    assert_ne!(
        other[0].address, addr,
        "cooling down, not handed out at once"
    );
    let rec = n.rec(addr).unwrap();
    assert!(matches!(rec.state, LeaseState::Released { .. }), "{rec:?}");
    assert_eq!(
        rec.pod,
        pod("ns", "p1", "u1"),
        "released as the pod's own (sticky)"
    );
}

#[test]
fn an_outage_never_hands_out_a_journaled_address_someone_answers_for() {
    let (c, d) = (
        TempDir::new("pm-away-probe-c"),
        TempDir::new("pm-away-probe-d"),
    );
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let prober = ScriptedProber::new();
    let a = alloc(&n, "10.0.0.0/24", &prober, &clock);
    let addr = a.add(&req_on(&n, "c1", pod("ns", "p1", "u1"))).unwrap()[0].address;
    n.away.set(true);
    prober.in_use(addr, "02:00:00:00:00:99");
    let e = a.add(&req_on(&n, "c2", pod("ns", "p1", "u1"))).unwrap_err();
    assert!(e.is_transient(), "the store's error, retried later: {e}");
}

#[test]
fn a_journaled_address_taken_by_another_pod_meanwhile_stays_with_that_pod() {
    let (c, d) = (
        TempDir::new("pm-away-taken-c"),
        TempDir::new("pm-away-taken-d"),
    );
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&n, "10.0.0.0/24", &NoProbe, &clock);
    let addr = a.add(&req_on(&n, "c1", pod("ns", "p1", "u1"))).unwrap()[0].address;
    n.away.set(true);
    a.add(&req_on(&n, "c2", pod("ns", "p1", "u1"))).unwrap();
    // Meanwhile, elsewhere (the node was cut off long enough for the controller to release its
    // leases), the address went to another pod.
    let rec = n.cluster.list(&scope(NET)).unwrap().remove(0);
    let released = n.cluster.release(&rec, 1_000_100).unwrap().unwrap();
    let mut theirs = released.clone();
    theirs.state = LeaseState::Leased;
    theirs.pod = pod("ns", "q", "uq");
    theirs.container_id = "cq".into();
    theirs.node = Some("b".into());
    n.cluster.claim(theirs, Some(&released)).unwrap().unwrap();
    n.away.set(false);
    let _ = a.check("c2", "net1");
    let rec = n.rec(addr).unwrap();
    assert_eq!(
        rec.pod,
        pod("ns", "q", "uq"),
        "never taken from its holder: {rec:?}"
    );
    assert!(n.journal.take_pending(NET).unwrap().is_empty());
}

/// Issue 40, part 4: a claim whose answer never came (the API server hung while a pod started).
/// The ADD fails; the write may run when the server resumes. The journal keeps the address,
/// marked unanswered, and the runtime's DEL of the failed sandbox releases it whether the write
/// ran before it or not.
#[test]
fn an_unanswered_claim_that_ran_is_released_by_the_del_of_the_failed_sandbox() {
    let (c, d) = (TempDir::new("pm-hang-c"), TempDir::new("pm-hang-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&n, "10.0.0.0/24", &NoProbe, &clock);
    let p1 = pod("ns", "p1", "u1");
    n.hung.set(true);
    let e = a.add(&req_on(&n, "c1", p1.clone())).unwrap_err();
    assert!(e.is_transient(), "{e}");
    let mine = n
        .journal
        .lookup(NET, "c1", "net1", &PodRef::default())
        .unwrap()
        .mine
        .expect("the failed ADD's entry stays");
    assert_eq!(mine.unanswered().len(), 1, "{mine:?}");
    let sent = mine.unanswered()[0];
    assert_eq!(n.resume(), [true], "the server ran the queued create");
    assert_eq!(n.leased_to(&p1).len(), 1);

    // The runtime's sequence: DEL of the failed sandbox, then ADD of a new one.
    assert!(a.del("c1", "net1").unwrap().is_empty());
    assert!(
        n.leased_to(&p1).is_empty(),
        "the DEL released what the unanswered claim made: {:?}",
        n.raw()
    );
    assert!(
        n.journal
            .lookup(NET, "c1", "net1", &PodRef::default())
            .unwrap()
            .mine
            .is_none()
    );
    let again = a.add(&req_on(&n, "c2", p1.clone())).unwrap();
    assert_eq!(again[0].address, sent, "the pod's address, sticky");
    assert_eq!(n.leased_to(&p1).len(), 1, "one lease: {:?}", n.raw());
    assert!(n.journal.take_pending(NET).unwrap().is_empty());
}

#[test]
fn an_unanswered_claim_that_runs_after_the_del_can_no_longer_take_the_address() {
    let (c, d) = (TempDir::new("pm-late-c"), TempDir::new("pm-late-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&n, "10.0.0.0/24", &NoProbe, &clock);
    let p1 = pod("ns", "p1", "u1");
    n.hung.set(true);
    a.add(&req_on(&n, "c1", p1.clone())).unwrap_err();
    n.hung.set(false);
    n.away.set(true);
    assert!(
        a.del("c1", "net1").unwrap().is_empty(),
        "DEL succeeds while the server is away; the release is owed"
    );
    // The server answers again, its queued write not run yet (the worst order): the next call
    // of the network on the node (another pod's ADD) fences the address before its own work.
    n.away.set(false);
    let p9 = pod("ns", "p9", "u9");
    a.add(&req_on(&n, "c9", p9.clone())).unwrap();
    assert_eq!(n.resume(), [false], "the late create meets the fence");
    assert!(n.leased_to(&p1).is_empty(), "{:?}", n.raw());
    assert_eq!(n.leased_to(&p9).len(), 1, "{:?}", n.raw());
    assert!(n.journal.take_pending(NET).unwrap().is_empty());

    // A take-over of a Released record read first (the pod's sticky address, found by the pod
    // index): the late write expects the record's version, and the fence moves it on.
    a.add(&req_on(&n, "c2", p1.clone())).unwrap();
    a.del("c2", "net1").unwrap();
    clock.advance(10);
    n.pod_index.set(true);
    n.hung.set(true);
    a.add(&req_on(&n, "c3", p1.clone())).unwrap_err();
    n.hung.set(false);
    assert!(a.del("c3", "net1").unwrap().is_empty());
    assert!(
        n.queued.borrow()[0].1.is_some(),
        "the claim expected a version: {:?}",
        n.queued.borrow()
    );
    assert_eq!(n.resume(), [false], "the late take-over meets the fence");
    assert!(n.leased_to(&p1).is_empty(), "{:?}", n.raw());
    let left = n.journal.entries(NET).unwrap();
    assert!(
        left.len() == 1 && left[0].container_id == "c9" && left[0].pending.is_none(),
        "only p9's entry, settled: {left:?}"
    );
}

#[test]
fn a_repeated_add_after_an_unanswered_claim_holds_one_address() {
    let (c, d) = (TempDir::new("pm-rep-c"), TempDir::new("pm-rep-d"));
    let n = Node::new(&c, &d, "a");
    let clock = FakeClock::new(1_000_000);
    let a = alloc(&n, "10.0.0.0/24", &NoProbe, &clock);
    let p1 = pod("ns", "p1", "u1");
    for ran in [true, false] {
        let cid = format!("c-{ran}");
        n.hung.set(true);
        a.add(&req_on(&n, &cid, p1.clone())).unwrap_err();
        if ran {
            assert_eq!(n.resume(), [true]);
        } else {
            n.hung.set(false);
        }
        let got = a.add(&req_on(&n, &cid, p1.clone())).unwrap();
        assert!(n.resume().iter().all(|made| !made), "ran={ran}");
        let held = n.leased_to(&p1);
        assert_eq!(held.len(), 1, "ran={ran}: {held:?}");
        assert_eq!(held[0].address, got[0].address);
        assert_eq!(held[0].container_id, cid);
        let mine = n
            .journal
            .lookup(NET, &cid, "net1", &PodRef::default())
            .unwrap()
            .mine
            .unwrap();
        assert!(mine.pending.is_none(), "ran={ran}: {mine:?}");
        assert_eq!(a.del(&cid, "net1").unwrap().len(), 1);
    }
}

#[test]
fn every_entry_reads_each_network_and_follows_nothing_else() {
    // What the node's reconciler compares with the store after a partition: every network's
    // entries; a stray file or a symlink among the network directories is skipped, not followed.
    let d = TempDir::new("pm-every");
    let journal = FileJournal::new(d.sub("journal"));
    assert!(journal.every_entry().unwrap().is_empty(), "no journal yet");
    for (net, cid, addr) in [("mgmt", "c1", "10.0.0.5"), ("compute", "c2", "10.1.0.5")] {
        let lease = Lease {
            network: net.into(),
            domain: None,
            address: ip(addr),
            prefix_len: 24,
            range_index: Some(0),
            container_id: cid.into(),
            ifname: "net1".into(),
            pod: pod("ns", cid, "u"),
            node: Some("a".into()),
            state: LeaseState::Leased,
            since: 1,
            version: Some("1".into()),
        };
        let entry = JournalEntry {
            container_id: cid.into(),
            ifname: "net1".into(),
            pod: lease.pod.clone(),
            leases: vec![lease],
            pending: None,
        };
        journal.record(net, &entry).unwrap();
    }
    let elsewhere = TempDir::new("pm-every-elsewhere");
    let n = Node::new(&elsewhere, &elsewhere, "b");
    let clock = FakeClock::new(1_000);
    let a = alloc(&n, "10.9.0.0/24", &NoProbe, &clock);
    a.add(&req_on(&n, "c9", pod("ns", "p9", "u9"))).unwrap();
    std::fs::write(d.sub("journal").join("stray"), b"not a network").unwrap();
    // Node b's directory of network mgmt, which holds c9's entry.
    let theirs = std::fs::read_dir(elsewhere.sub("journal-b"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_dir())
        .unwrap();
    assert!(std::fs::read_dir(&theirs).unwrap().count() > 0);
    std::os::unix::fs::symlink(&theirs, d.sub("journal").join("link")).unwrap();
    let mut found: Vec<(String, String)> = journal
        .every_entry()
        .unwrap()
        .into_iter()
        .map(|e| (e.container_id, e.leases[0].network.clone()))
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            ("c1".into(), "mgmt".into()),
            ("c2".into(), "compute".into())
        ]
    );
}
