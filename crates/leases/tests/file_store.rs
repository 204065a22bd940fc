mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use tether_leases::{
    AllocError, Allocator, FakeClock, FileStore, FileStoreError, Lease, LeaseState, LeaseStore,
    NoProbe, PodRef, Policy, Scope, StoreError, domain_stem, file_stem,
};

const NET: &str = "net-a";

fn lease(addr: &str, cid: &str) -> Lease {
    Lease {
        network: NET.into(),
        domain: None,
        address: ip(addr),
        prefix_len: 24,
        range_index: Some(0),
        container_id: cid.into(),
        ifname: "eth0".into(),
        pod: PodRef::new("ns", cid, "uid"),
        node: None,
        state: LeaseState::Leased,
        since: 100,
        version: None,
    }
}

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn creates_private_dir_and_files_with_format_version() {
    let tmp = TempDir::new("modes");
    let dir = tmp.sub("a/b/state");
    let s = FileStore::new(&dir);
    assert!(s.list(&scope(NET)).unwrap().is_empty());
    s.claim(lease("10.0.0.1", "c1"), None).unwrap().unwrap();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&s.state_path(None)), 0o600);
    assert_eq!(mode(&s.lock_path(None)), 0o600);
    assert_eq!(s.state_path(None), dir.join("@cluster.json"));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.state_path(None)).unwrap()).unwrap();
    assert_eq!(v["format"], 2);
    assert_eq!(v["domain"], serde_json::Value::Null);
    assert_eq!(v["leases"][0]["network"], NET);
    assert_eq!(v["leases"][0]["address"], "10.0.0.1");
    assert_eq!(v["leases"][0]["state"]["kind"], "leased");
    // no temp file left behind
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().all(|n| !n.contains("tmp")), "{names:?}");
}

#[test]
fn compare_and_swap_semantics() {
    let tmp = TempDir::new("cas");
    let s = FileStore::new(tmp.path());
    let a = s.claim(lease("10.0.0.1", "c1"), None).unwrap().unwrap();
    assert!(a.version.is_some());
    // create-if-absent loses against an existing record, and names the holder
    let t = s.claim(lease("10.0.0.1", "c2"), None).unwrap().unwrap_err();
    assert_eq!(t.current.as_ref().unwrap().container_id, "c1");
    // release with the current version works
    let r = s.release(&a, 200).unwrap().unwrap();
    assert_eq!(r.state, LeaseState::Released { at: 200 });
    assert_ne!(r.version, a.version);
    // someone takes the released record
    let b = s.claim(lease("10.0.0.1", "c2"), Some(&r)).unwrap().unwrap();
    // a stale release (the version seen before) must not free c2's lease
    let t = s.release(&a, 300).unwrap().unwrap_err();
    assert_eq!(t.current.as_ref().unwrap().container_id, "c2");
    let t = s.release(&r, 300).unwrap().unwrap_err();
    assert_eq!(t.current.unwrap(), b);
    assert!(s.list(&scope(NET)).unwrap()[0].is_leased());
    // stale remove refused; current remove works; replace of a missing record loses
    assert!(s.remove(&a).unwrap().is_err());
    s.remove(&b).unwrap().unwrap();
    assert!(s.list(&scope(NET)).unwrap().is_empty());
    let t = s
        .claim(lease("10.0.0.1", "c3"), Some(&b))
        .unwrap()
        .unwrap_err();
    assert!(t.current.is_none());
    // versions never repeat, even after remove + re-create
    let c = s.claim(lease("10.0.0.1", "c3"), None).unwrap().unwrap();
    assert!(![&a, &r, &b].iter().any(|x| x.version == c.version));
    // contract violations are errors, not silent
    assert!(matches!(
        s.claim(lease("10.0.0.2", "c4"), Some(&c)),
        Err(StoreError::Invalid(_))
    ));
    let mut elsewhere = lease("10.0.0.1", "c4");
    elsewhere.domain = Some("rail-1".into());
    assert!(matches!(
        s.claim(elsewhere, Some(&c)),
        Err(StoreError::Invalid(_))
    ));
}

#[test]
fn transaction_reads_and_writes_under_one_lock() {
    let tmp = TempDir::new("txn");
    let s = FileStore::new(tmp.path());
    let n = s
        .transaction(&scope(NET), |t| {
            for i in 1..=5 {
                t.claim(lease(&format!("10.0.0.{i}"), &format!("c{i}")), None)?
                    .unwrap();
            }
            let cur = t.get(ip("10.0.0.3")).unwrap().clone();
            t.remove(&cur)?.unwrap();
            Ok::<_, StoreError>(t.leases().len())
        })
        .unwrap();
    assert_eq!(n, 4);
    assert_eq!(s.list(&scope(NET)).unwrap().len(), 4);
    // an Err from the closure writes nothing
    let r: Result<(), StoreError> = s.transaction(&scope(NET), |t| {
        t.claim(lease("10.0.0.9", "c9"), None)?.unwrap();
        Err(StoreError::Invalid("abort".into()))
    });
    assert!(r.is_err());
    assert_eq!(s.list(&scope(NET)).unwrap().len(), 4);
}

#[test]
fn corrupt_state_file_is_an_error_and_is_not_reset() {
    let tmp = TempDir::new("corrupt");
    let s = FileStore::new(tmp.path());
    s.claim(lease("10.0.0.1", "c1"), None).unwrap().unwrap();
    let path = s.state_path(None);
    let cases: Vec<(&[u8], &str)> = vec![
        (b"{\"format\": 2, \"domain\": null, \"next_vers", "corrupt"),
        (b"", "corrupt"),
        (b"[1,2]", "corrupt"),
        (b"{\"domain\": null, \"next_version\": 1, \"leases\": []}", "no \"format\""),
        (b"{\"format\": 2, \"domain\": null, \"next_version\": 1, \"leases\": [{\"address\": \"x\"}]}", "leases[0]"),
        (b"{\"format\": 7, \"domain\": null, \"next_version\": 1, \"leases\": []}", "format 7"),
        (b"{\"format\": 1, \"network\": \"net-a\", \"next_version\": 1, \"leases\": []}", "where format 2 belongs"),
        (b"{\"format\": 2, \"domain\": \"rail-1\", \"next_version\": 1, \"leases\": []}", "belongs to isolated fabric rail-1"),
    ];
    let clock = FakeClock::new(1000);
    for (bytes, needle) in cases {
        std::fs::write(&path, bytes).unwrap();
        let e = s.list(&scope(NET)).unwrap_err().to_string();
        assert!(e.contains(path.to_str().unwrap()), "{e}");
        assert!(e.contains(needle), "{needle:?} not in {e}");
        assert!(s.claim(lease("10.0.0.2", "c2"), None).is_err());
        let a = Allocator::new(
            scope(NET),
            vec![range("10.0.0.0/24")],
            Policy::default(),
            &s,
            &NoProbe,
            &clock,
        );
        let e = a
            .add(&add_req("c3", "eth0", PodRef::default()))
            .unwrap_err();
        assert!(
            matches!(&e, AllocError::Store(s) if FileStoreError::from_store_error(s).is_some()),
            "{e}"
        );
        assert!(a.status().is_err());
        assert_eq!(
            std::fs::read(&path).unwrap(),
            bytes,
            "the state file must not be reset"
        );
    }
    // duplicate records are corruption too
    let dup = serde_json::json!({"format": 2, "domain": null, "next_version": 3, "leases": [
        {"network": NET, "address": "10.0.0.1", "prefix_len": 24, "container_id": "a", "ifname": "eth0",
         "state": {"kind": "leased"}, "since": 1, "version": "1"},
        {"network": NET, "address": "10.0.0.1", "prefix_len": 24, "container_id": "b", "ifname": "eth0",
         "state": {"kind": "leased"}, "since": 1, "version": "2"}]});
    std::fs::write(&path, serde_json::to_vec(&dup).unwrap()).unwrap();
    let e = s.list(&scope(NET)).unwrap_err();
    assert!(
        matches!(
            FileStoreError::from_store_error(&e),
            Some(FileStoreError::Corrupt { .. })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("two records for 10.0.0.1"), "{e}");
}

#[test]
fn interrupted_write_leaves_old_state() {
    let tmp = TempDir::new("crash");
    let s = FileStore::new(tmp.path());
    s.claim(lease("10.0.0.1", "c1"), None).unwrap().unwrap();
    // A crash after writing part of the temp file leaves garbage there: ignored...
    let tmpfile = tmp.path().join(".@cluster.json.tmp");
    std::fs::write(&tmpfile, b"{\"format\": 2, \"doma").unwrap();
    assert_eq!(s.list(&scope(NET)).unwrap().len(), 1);
    // ...and overwritten by the next write.
    s.claim(lease("10.0.0.2", "c2"), None).unwrap().unwrap();
    assert_eq!(s.list(&scope(NET)).unwrap().len(), 2);
    assert!(!tmpfile.exists());
}

#[test]
fn network_names_are_sanitised_without_collisions() {
    assert_eq!(file_stem("net-a"), "net-a");
    assert_eq!(file_stem("gpu_net.v2"), "gpu_net.v2");
    let a = file_stem("ns/net");
    let b = file_stem("ns_net");
    assert_ne!(a, b);
    assert!(a.starts_with("ns_net-"));
    for bad in ["../etc", "..", ".", "", "a\0b", "x/../../y", "@cluster"] {
        let stem = file_stem(bad);
        assert!(
            !stem.contains('/')
                && !stem.starts_with('.')
                && !stem.is_empty()
                && !stem.contains('@'),
            "{bad:?} → {stem:?}"
        );
    }
    assert!(file_stem(&"n".repeat(300)).len() < 130);
    // A fabric's name is sanitised the same way, inside the domain's own file name.
    assert_eq!(domain_stem(None), "@cluster");
    assert_eq!(domain_stem(Some("rail-3")), "@fabric.rail-3");
    assert!(domain_stem(Some("../x")).starts_with("@fabric._"));
    let tmp = TempDir::new("names");
    let s = FileStore::new(tmp.path());
    assert!(s.state_path(Some("a/b")).starts_with(tmp.path()));
    assert!(s.network_state_path("ns/net").starts_with(tmp.path()));
}

fn in_fabric(mut l: Lease, network: &str, fabric: Option<&str>) -> Lease {
    l.network = network.into();
    l.domain = fabric.map(str::to_string);
    l
}

/// Two networks of one domain whose ranges overlap share the record of an address: the second
/// never gets what the first holds, and GC of one never judges the other's records.
#[test]
fn networks_of_one_domain_share_each_address() {
    let tmp = TempDir::new("overlap");
    let s = FileStore::new(tmp.path());
    let fixed = in_fabric(lease("10.0.0.6", "c-fixed"), "mgmt-fixed", None);
    s.claim(fixed, None).unwrap().unwrap();
    let pool = in_fabric(lease("10.0.0.6", "c-pool"), "mgmt-pool", None);
    let t = s.claim(pool, None).unwrap().unwrap_err();
    assert_eq!(t.current.unwrap().network, "mgmt-fixed");
    // The pool's engine sees the fixed network's record in its snapshot and goes around it.
    let clock = FakeClock::new(1000);
    let a = Allocator::new(
        scope("mgmt-pool"),
        vec![range("10.0.0.5-10.0.0.7/24")],
        Policy::default(),
        &s,
        &NoProbe,
        &clock,
    );
    let mut got = Vec::new();
    for c in ["p1", "p2"] {
        got.push(a.add(&add_req(c, "net1", PodRef::default())).unwrap()[0].address);
    }
    got.sort();
    assert_eq!(got, vec![ip("10.0.0.5"), ip("10.0.0.7")]);
    let e = a
        .add(&add_req("p3", "net1", PodRef::default()))
        .unwrap_err();
    assert!(matches!(e, AllocError::Exhausted { .. }), "{e}");
    // Each network's own records for GC; the whole domain for an allocation.
    assert_eq!(s.list(&scope("mgmt-pool")).unwrap().len(), 3);
    let mine = s.list_mine(&scope("mgmt-pool")).unwrap();
    assert_eq!(mine.len(), 2);
    assert!(mine.iter().all(|l| l.network == "mgmt-pool"));
    // A released address passes to the other network of the domain.
    let held = s.get(&scope("mgmt-pool"), ip("10.0.0.6")).unwrap().unwrap();
    let released = s.release(&held, 1).unwrap().unwrap();
    let moved = in_fabric(lease("10.0.0.6", "c-pool"), "mgmt-pool", None);
    let now = s.claim(moved, Some(&released)).unwrap().unwrap();
    assert_eq!(now.network, "mgmt-pool");
}

/// An isolated fabric keeps its own records: the same address leases once in each domain.
#[test]
fn an_isolated_fabric_is_a_domain_of_its_own() {
    let tmp = TempDir::new("fabric");
    let s = FileStore::new(tmp.path());
    for (net, fabric) in [
        ("rail-0", Some("rail-0")),
        ("rail-1", Some("rail-1")),
        ("mgmt", None),
    ] {
        let l = in_fabric(lease("10.9.0.1", net), net, fabric);
        s.claim(l, None).unwrap().unwrap();
    }
    assert!(s.state_path(Some("rail-0")).exists());
    assert!(s.state_path(Some("rail-1")).exists());
    assert_eq!(
        s.list(&Scope::new("rail-0", Some("rail-0".into())))
            .unwrap()
            .len(),
        1
    );
    assert_eq!(s.list(&scope("mgmt")).unwrap().len(), 1);
    let mut names = s.networks().unwrap();
    names.sort();
    assert_eq!(names, vec!["mgmt", "rail-0", "rail-1"]);
}

/// A network's own state file from before uniqueness domains moves into its domain's file on
/// first use: its leases are honoured, the old file is gone, and an address both held keeps the
/// leased record.
#[test]
fn a_network_file_from_before_domains_moves_into_its_domain() {
    let tmp = TempDir::new("move");
    let s = FileStore::new(tmp.path());
    // mgmt-fixed already lives in the domain's file.
    let fixed = in_fabric(lease("10.0.0.6", "c-fixed"), "mgmt-fixed", None);
    s.claim(fixed, None).unwrap().unwrap();
    let rec = |addr: &str, cid: &str, state: serde_json::Value, version: &str| {
        serde_json::json!({"network": "mgmt-pool", "address": addr, "prefix_len": 24, "range_index": 0,
            "container_id": cid, "ifname": "net1", "pod": {}, "state": state, "since": 5, "version": version})
    };
    let old = serde_json::json!({"format": 1, "network": "mgmt-pool", "next_version": 9, "leases": [
        rec("10.0.0.5", "old-1", serde_json::json!({"kind": "leased"}), "3"),
        rec("10.0.0.6", "old-2", serde_json::json!({"kind": "leased"}), "4"),
        rec("10.0.0.7", "old-3", serde_json::json!({"kind": "released", "at": 5}), "5"),
    ]});
    let old_path = s.network_state_path("mgmt-pool");
    std::fs::write(&old_path, serde_json::to_vec(&old).unwrap()).unwrap();
    // Another network's call leaves it alone; the network's own first call moves it.
    assert_eq!(s.list(&scope("mgmt-fixed")).unwrap().len(), 1);
    assert!(old_path.exists());
    let all = s.list(&scope("mgmt-pool")).unwrap();
    assert!(!old_path.exists(), "the old file is removed once moved");
    assert_eq!(all.len(), 3);
    let at = |a: &str| all.iter().find(|l| l.address == ip(a)).unwrap().clone();
    assert_eq!(at("10.0.0.5").container_id, "old-1");
    assert!(at("10.0.0.5").is_leased());
    assert_eq!(
        at("10.0.0.6").container_id,
        "c-fixed",
        "two leased: the domain's stays"
    );
    assert!(matches!(
        at("10.0.0.7").state,
        LeaseState::Released { at: 5 }
    ));
    assert!(all.iter().all(|l| l.domain.is_none()));
    // Versions are the domain's own: a write on a moved record works.
    s.release(&at("10.0.0.5"), 9).unwrap().unwrap();
    // Moving is idempotent: the same old file again changes nothing it already holds.
    std::fs::write(&old_path, serde_json::to_vec(&old).unwrap()).unwrap();
    let again = s.list(&scope("mgmt-pool")).unwrap();
    assert_eq!(again.len(), 3);
    let five = again.iter().find(|l| l.address == ip("10.0.0.5")).unwrap();
    assert!(
        five.is_leased(),
        "the old leased record outranks the newer release: moved again"
    );
    // A damaged old file is an error naming it, and is kept.
    std::fs::write(&old_path, b"{\"format\": 1, \"netw").unwrap();
    let e = s.list(&scope("mgmt-pool")).unwrap_err().to_string();
    assert!(e.contains(old_path.to_str().unwrap()), "{e}");
    assert!(old_path.exists());
}
