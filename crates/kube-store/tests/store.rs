//! The LeaseStore contract over a real Kubernetes API server (TETHER_TEST_KUBECONFIG; see
//! common/mod.rs). Ignored without one: `make test` starts one.

mod common;

use common::*;
use tether_kube_store::{IPLease, KubeStoreError, object_name};
use tether_leases::{
    AddRequest, Allocator, FakeClock, LeaseState, LeaseStore, NoProbe, Policy, StoreError, Taken,
};

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn item80_create_then_already_exists() {
    let env = Env::new("create");
    let store = env.store();
    let a = lease(&env.network, "10.0.0.5", "ca");
    let got = store.claim(a.clone(), None).unwrap().unwrap();
    assert!(
        got.version.as_deref().unwrap().contains('/'),
        "{:?}",
        got.version
    );
    assert_eq!(
        tether_leases::Lease {
            version: None,
            ..got.clone()
        },
        a
    );

    // A second claimant of the same address loses and learns who holds it.
    let b = lease(&env.network, "10.0.0.5", "cb");
    let Taken { current } = store.claim(b, None).unwrap().unwrap_err();
    assert_eq!(current.as_ref(), Some(&got));

    // Exactly one object, named after network and address.
    assert_eq!(env.leases(&env.network), vec![got.clone()]);
    let obj = env
        .object(&object_name(Some(&fabric_of(&env.network)), a.address))
        .expect("object by name");
    assert_eq!(obj["spec"]["containerID"], "ca");
    assert_eq!(
        obj["metadata"]["labels"]["ipam.tether.dev/network"],
        env.network.as_str()
    );
    let r = store.requests();
    assert_eq!((r.create, r.get, r.list), (2, 1, 0), "{r:?}");
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn replace_with_stale_version_is_taken() {
    let env = Env::new("replace");
    let store = env.store();
    let v1 = store
        .claim(lease(&env.network, "10.0.0.7", "ca"), None)
        .unwrap()
        .unwrap();
    let v2 = store.release(&v1, 1_700_000_100).unwrap().unwrap();
    assert_eq!(v2.state, LeaseState::Released { at: 1_700_000_100 });
    assert_ne!(v1.version, v2.version);

    // A claim against the version seen before the release loses.
    let c = lease(&env.network, "10.0.0.7", "cc");
    let Taken { current } = store.claim(c.clone(), Some(&v1)).unwrap().unwrap_err();
    assert_eq!(current.as_ref(), Some(&v2));
    // Against the current version it wins.
    let v3 = store.claim(c.clone(), Some(&v2)).unwrap().unwrap();
    assert_eq!(v3.container_id, "cc");
    // update() and release() are conditional too.
    assert!(store.update(c.clone(), &v2).unwrap().is_err());
    assert!(store.release(&v2, 1).unwrap().is_err());
    assert_eq!(env.leases(&env.network), vec![v3]);
}

/// Checklist item 81: a release or delete never frees a lease someone else took since.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn item81_delete_precondition_protects_a_recreated_lease() {
    let env = Env::new("precond");
    let store = env.store();
    let mine = store
        .claim(lease(&env.network, "10.0.0.9", "old"), None)
        .unwrap()
        .unwrap();

    // Meanwhile another actor deletes it and re-creates it for another attachment.
    let other = env.store();
    other.remove(&mine).unwrap().unwrap();
    let theirs = other
        .claim(lease(&env.network, "10.0.0.9", "new"), None)
        .unwrap()
        .unwrap();
    assert_ne!(mine.version, theirs.version);

    // My stale delete and release both lose; their lease survives untouched.
    let Taken { current } = store.remove(&mine).unwrap().unwrap_err();
    assert_eq!(current.as_ref(), Some(&theirs));
    assert!(store.release(&mine, 1_700_000_500).unwrap().is_err());
    assert_eq!(env.leases(&env.network), vec![theirs.clone()]);

    // Same after a modification in place (same uid, newer resourceVersion).
    let theirs2 = other.release(&theirs, 1_700_000_600).unwrap().unwrap();
    assert!(store.remove(&theirs).unwrap().is_err());
    assert_eq!(env.leases(&env.network), vec![theirs2.clone()]);

    // A delete of the current version works; deleting again is a lost race, not an error.
    store.remove(&theirs2).unwrap().unwrap();
    assert_eq!(
        store.remove(&theirs2).unwrap().unwrap_err(),
        Taken { current: None }
    );
    assert!(env.leases(&env.network).is_empty());
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn claim_of_a_vanished_record_is_taken() {
    let env = Env::new("vanished");
    let store = env.store();
    let v1 = store
        .claim(lease(&env.network, "10.0.0.11", "a"), None)
        .unwrap()
        .unwrap();
    store.remove(&v1).unwrap().unwrap();
    let Taken { current } = store
        .claim(lease(&env.network, "10.0.0.11", "b"), Some(&v1))
        .unwrap()
        .unwrap_err();
    assert_eq!(current, None);
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn contract_misuse_is_rejected() {
    let env = Env::new("misuse");
    let store = env.store();
    let a = lease(&env.network, "10.0.0.12", "a");
    // Expected record without a version, or of another address.
    assert!(matches!(
        store.claim(a.clone(), Some(&a)),
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(store.remove(&a), Err(StoreError::Invalid(_))));
    let stored = store.claim(a, None).unwrap().unwrap();
    let b = lease(&env.network, "10.0.0.13", "b");
    assert!(matches!(
        store.claim(b, Some(&stored)),
        Err(StoreError::Invalid(_))
    ));
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn pagination_and_cache_lists() {
    let env = Env::new("pages");
    // Consistent lists, paginated (lists from the watch cache are one request).
    let store = env.store_with(|s| {
        s.page_size = 3;
        s.list_from_cache = false;
    });
    for i in 1..=10 {
        store
            .claim(
                lease(&env.network, &format!("10.1.0.{i}"), &format!("c{i}")),
                None,
            )
            .unwrap()
            .unwrap();
    }
    let before = store.requests();
    let all = sorted(&store, &env.network);
    assert_eq!(all.len(), 10);
    assert_eq!(
        (store.requests() - before).list,
        4,
        "10 records in pages of 3"
    );

    let cached = env.store_with(|s| s.list_from_cache = true);
    assert_eq!(sorted(&cached, &env.network), all);
    assert_eq!(cached.requests().list, 1);
}

/// The node-agent keeps whole networks in memory: a list longer than it would hold is given up
/// as it is read (`TooLarge`, counted as such), not read to the end.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn a_network_list_is_read_up_to_a_length() {
    let env = Env::new("long");
    let store = env.store();
    for i in 1..=10 {
        let l = lease(&env.network, &format!("10.4.0.{i}"), &format!("c{i}"));
        store.claim(l, None).unwrap().unwrap();
    }
    let (all, rv) = store.list_network_at(&env.network, 1 << 20).unwrap();
    assert_eq!(all.len(), 10);
    assert!(!rv.is_empty());
    // Ten records are several kilobytes of JSON.
    let e = store.list_network_at(&env.network, 4096).unwrap_err();
    assert!(
        matches!(e, KubeStoreError::TooLarge { limit: 4096, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("longer than 4096 bytes"), "{e}");
    let too_large = store
        .settings()
        .traffic
        .errors()
        .into_iter()
        .filter(|(_, code, _)| code == "too_large")
        .map(|(_, _, n)| n)
        .sum::<u64>();
    assert_eq!(too_large, 1);
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn networks_are_separate_and_any_name_works() {
    let env = Env::new("nets");
    let store = env.store();
    // Not a DNS label nor a label value: names and labels are hashed.
    let weird = format!("{}/GPU_Net.{}", env.network, "x".repeat(80));
    for (net, addr) in [
        (&env.network, "10.2.0.1"),
        (&weird, "10.2.0.1"),
        (&weird, "fd00::1"),
    ] {
        store.claim(lease(net, addr, "c"), None).unwrap().unwrap();
    }
    let mine = env.leases(&env.network);
    assert_eq!(mine.len(), 1);
    let theirs = env.leases(&weird);
    assert_eq!(theirs.len(), 2);
    assert!(theirs.iter().all(|l| l.network == weird));
    assert_eq!(theirs[1].address, ip("fd00::1"));
    for l in theirs {
        store.remove(&l).unwrap().unwrap();
    }
}

/// Objects whose name does not match their (network, address) are ignored, never written.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn foreign_objects_are_ignored() {
    let env = Env::new("foreign");
    let store = env.store();
    let good = store
        .claim(lease(&env.network, "10.3.0.1", "c"), None)
        .unwrap()
        .unwrap();
    // Create, through the raw API, an object claiming 10.3.0.2 under the wrong name.
    let mut obj: IPLease =
        tether_kube_store::convert::to_object(&lease(&env.network, "10.3.0.2", "x"), None).unwrap();
    obj.metadata.name = Some(format!("{}.handmade", env.network));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(&env.kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let api: kube::Api<IPLease> = kube::Api::all(kube::Client::try_from(cfg).unwrap());
        api.create(&Default::default(), &obj).await.unwrap();
    });
    assert_eq!(env.leases(&env.network), vec![good]);
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(&env.kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let api: kube::Api<IPLease> = kube::Api::all(kube::Client::try_from(cfg).unwrap());
        api.delete(&format!("{}.handmade", env.network), &Default::default())
            .await
            .unwrap();
    });
}

/// Issue 11's measure: with the store opened as the plugin opens it (one store per call, as one
/// process per CNI call), an uncontended ADD is one GET and one CREATE and a DEL one UPDATE —
/// no LIST — however many leases the cluster holds, in this network and others.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn add_and_del_cost_the_same_with_many_leases() {
    let env = Env::new("cost");
    let clock = FakeClock::new(1_700_000_000);
    let call = |f: &dyn Fn(&Allocator<'_>)| {
        let store = env.node_store("node-a");
        let a = Allocator::new(
            scope_of(&env.network),
            vec![range("10.4.0.0/16")],
            Policy::default(),
            &store,
            &NoProbe,
            &clock,
        );
        f(&a);
        store.requests()
    };
    let req = |i: usize| AddRequest {
        container_id: format!("cost-{i}"),
        ifname: "net1".into(),
        pod: pod("bench", &format!("cost-{i}"), "u"),
        ..Default::default()
    };
    let measure = |from: usize| {
        for i in from..from + 3 {
            let add = call(&|a| {
                a.add(&req(i)).unwrap();
            });
            // One LIST of the records naming the pod (its sticky address, from the watch cache
            // by the pod label) and a create (the address is free: no read): the same count
            // however many leases exist.
            assert_eq!(
                (add.list, add.get, add.create, add.total()),
                (1, 0, 1, 2),
                "ADD {i}: {add:?}"
            );
            let check = call(&|a| {
                a.check(&format!("cost-{i}"), "net1").unwrap();
            });
            assert_eq!((check.get, check.total()), (1, 1), "CHECK {i}: {check:?}");
            let del = call(&|a| {
                a.del(&format!("cost-{i}"), "net1").unwrap();
            });
            assert_eq!((del.update, del.total()), (1, 1), "DEL {i}: {del:?}");
            let again = call(&|a| {
                a.del(&format!("cost-{i}"), "net1").unwrap();
            });
            assert_eq!(again.total(), 0, "repeated DEL {i}: {again:?}");
        }
    };
    // The node's first call in the network builds its journal (one LIST of this node's leases).
    let first = call(&|a| {
        a.del("never-added", "net1").unwrap();
    });
    assert_eq!((first.list, first.total()), (1, 1), "{first:?}");
    measure(0);
    // 200 more leases of other nodes in this network (high in the range, out of the way of the
    // walks above) and 200 in another network: the same figures.
    let filler = env.store();
    let other = format!("{}-other", env.network);
    for i in 0..200u32 {
        for net in [&env.network, &other] {
            let mut l = lease(
                net,
                &format!("10.4.{}.{}", 200 + i / 250, 1 + i % 250),
                &format!("fill-{i}"),
            );
            l.node = Some("node-z".into());
            filler.claim(l, None).unwrap().unwrap();
        }
    }
    measure(100);
    env.delete_network(&other);
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn version_strings_are_uid_and_resource_version() {
    let env = Env::new("version");
    let store = env.store();
    let l = store
        .claim(lease(&env.network, "10.5.0.1", "c"), None)
        .unwrap()
        .unwrap();
    let (uid, rv) = l.version.as_deref().unwrap().split_once('/').unwrap();
    assert_eq!(uid.len(), 36, "a UUID: {uid}");
    assert!(!rv.is_empty());
    let obj = env
        .object(&object_name(Some(&fabric_of(&env.network)), l.address))
        .unwrap();
    assert_eq!(obj["metadata"]["uid"], uid);
    assert_eq!(obj["metadata"]["resourceVersion"], rv);
    // Errors from the store are ours.
    let e: StoreError = KubeStoreError::CrdMissing { server: "x".into() }.into();
    assert!(KubeStoreError::from_store_error(&e).is_some());
}
