mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use tether_leases::{
    AllocError, Allocator, FakeClock, FileStore, FileStoreError, Lease, LeaseState, LeaseStore,
    NoProbe, PodRef, Policy, StoreError, file_stem,
};

const NET: &str = "net-a";

fn lease(addr: &str, cid: &str) -> Lease {
    Lease {
        network: NET.into(),
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
    assert!(s.list(NET).unwrap().is_empty());
    s.claim(lease("10.0.0.1", "c1"), None).unwrap().unwrap();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&s.state_path(NET)), 0o600);
    assert_eq!(mode(&s.lock_path(NET)), 0o600);
    assert_eq!(s.state_path(NET), dir.join("net-a.json"));
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.state_path(NET)).unwrap()).unwrap();
    assert_eq!(v["format"], 1);
    assert_eq!(v["network"], NET);
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
    assert!(s.list(NET).unwrap()[0].is_leased());
    // stale remove refused; current remove works; replace of a missing record loses
    assert!(s.remove(&a).unwrap().is_err());
    s.remove(&b).unwrap().unwrap();
    assert!(s.list(NET).unwrap().is_empty());
    let t = s
        .claim(lease("10.0.0.1", "c3"), Some(&b))
        .unwrap()
        .unwrap_err();
    assert!(t.current.is_none());
    // versions never repeat, even after remove + re-create
    let c = s.claim(lease("10.0.0.1", "c3"), None).unwrap().unwrap();
    assert!(![&a, &r, &b].iter().any(|x| x.version == c.version));
    // contract violations are errors, not silent
    let mut other = lease("10.0.0.2", "c4");
    other.network = "net-b".into();
    assert!(matches!(
        s.claim(lease("10.0.0.2", "c4"), Some(&c)),
        Err(StoreError::Invalid(_))
    ));
    let _ = other;
}

#[test]
fn transaction_reads_and_writes_under_one_lock() {
    let tmp = TempDir::new("txn");
    let s = FileStore::new(tmp.path());
    let n = s
        .transaction(NET, |t| {
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
    assert_eq!(s.list(NET).unwrap().len(), 4);
    // an Err from the closure writes nothing
    let r: Result<(), StoreError> = s.transaction(NET, |t| {
        t.claim(lease("10.0.0.9", "c9"), None)?.unwrap();
        Err(StoreError::Invalid("abort".into()))
    });
    assert!(r.is_err());
    assert_eq!(s.list(NET).unwrap().len(), 4);
}

#[test]
fn corrupt_state_file_is_an_error_and_is_not_reset() {
    let tmp = TempDir::new("corrupt");
    let s = FileStore::new(tmp.path());
    s.claim(lease("10.0.0.1", "c1"), None).unwrap().unwrap();
    let path = s.state_path(NET);
    let cases: Vec<(&[u8], &str)> = vec![
        (b"{\"format\": 1, \"network\": \"net-a\", \"next_vers", "corrupt"),
        (b"", "corrupt"),
        (b"[1,2]", "corrupt"),
        (b"{\"network\": \"net-a\", \"next_version\": 1, \"leases\": []}", "no \"format\""),
        (b"{\"format\": 1, \"network\": \"net-a\", \"next_version\": 1, \"leases\": [{\"address\": \"x\"}]}", "leases[0]"),
        (b"{\"format\": 7, \"network\": \"net-a\", \"next_version\": 1, \"leases\": []}", "format 7"),
        (b"{\"format\": 1, \"network\": \"other\", \"next_version\": 1, \"leases\": []}", "belongs to network"),
    ];
    let clock = FakeClock::new(1000);
    for (bytes, needle) in cases {
        std::fs::write(&path, bytes).unwrap();
        let e = s.list(NET).unwrap_err().to_string();
        assert!(e.contains(path.to_str().unwrap()), "{e}");
        assert!(e.contains(needle), "{needle:?} not in {e}");
        assert!(s.claim(lease("10.0.0.2", "c2"), None).is_err());
        let a = Allocator::new(
            NET,
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
    let dup = serde_json::json!({"format": 1, "network": NET, "next_version": 3, "leases": [
        {"network": NET, "address": "10.0.0.1", "prefix_len": 24, "container_id": "a", "ifname": "eth0",
         "state": {"kind": "leased"}, "since": 1, "version": "1"},
        {"network": NET, "address": "10.0.0.1", "prefix_len": 24, "container_id": "b", "ifname": "eth0",
         "state": {"kind": "leased"}, "since": 1, "version": "2"}]});
    std::fs::write(&path, serde_json::to_vec(&dup).unwrap()).unwrap();
    let e = s.list(NET).unwrap_err();
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
    let tmpfile = tmp.path().join(".net-a.json.tmp");
    std::fs::write(&tmpfile, b"{\"format\": 1, \"netw").unwrap();
    assert_eq!(s.list(NET).unwrap().len(), 1);
    // ...and overwritten by the next write.
    s.claim(lease("10.0.0.2", "c2"), None).unwrap().unwrap();
    assert_eq!(s.list(NET).unwrap().len(), 2);
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
    for bad in ["../etc", "..", ".", "", "a\0b", "x/../../y"] {
        let stem = file_stem(bad);
        assert!(
            !stem.contains('/') && !stem.starts_with('.') && !stem.is_empty(),
            "{bad:?} → {stem:?}"
        );
    }
    assert!(file_stem(&"n".repeat(300)).len() < 130);
    // two sanitised-colliding names keep separate state
    let tmp = TempDir::new("names");
    let s = FileStore::new(tmp.path());
    let mut l = lease("10.0.0.1", "c1");
    l.network = "ns/net".into();
    s.claim(l, None).unwrap().unwrap();
    assert!(s.list("ns_net").unwrap().is_empty());
    assert_eq!(s.list("ns/net").unwrap().len(), 1);
    assert!(s.state_path("ns/net").starts_with(tmp.path()));
}
