//! The upgrade from leases named by network (tether before uniqueness domains) on the real API
//! server: the controller's switch and the agents following it, and a roll under load with the
//! previous commit's tether-ipam (built by conformance/upgrade/previous.sh) beside this one.
//!
//! The controller's pass judges every lease of the cluster (it moves records named by network and
//! deletes mirrors), so the tests of this file take turns, and use addresses no other test
//! uses (10.205.0.0/16, the cluster-wide domain).

mod reconcile_support;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use reconcile_support::*;
use serde_json::{Value, json};
use tether_kube_store::by_network::{MIRROR_SWITCH_FILE, mirror_switch_text};
use tether_kube_store::convert::naming_of;
use tether_kube_store::{Kinds, KubeSettings, KubeStore, LegacyMirrors, Naming};
use tether_leases::{Lease, LeaseStore};
use tether_operator::kube::Kube;
use tether_operator::lease_names::{
    AGENT_LABEL, AGENT_LABEL_VALUE, Follower, SWITCH_CONFIG_MAP, SWITCH_KEY, controller_pass,
};
use tether_pool::IpRange;

/// One test of this file at a time (see the module docs).
static TURNS: Mutex<()> = Mutex::new(());

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

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

fn clear(env: &Env, subnet: &str) {
    let s = env.store();
    for l in records(env, subnet) {
        s.restart_budget();
        let _ = s.remove(&l);
    }
}

fn configmaps(env: &Env) -> String {
    format!("/api/v1/namespaces/{}/configmaps", env.agent_ns())
}

/// The switch ConfigMap as the manifest ships it: no data.
fn shipped_switch(env: &Env) {
    env.post_json(
        &configmaps(env),
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": SWITCH_CONFIG_MAP, "namespace": env.agent_ns()}}),
    )
    .unwrap();
}

fn published(env: &Env) -> Option<String> {
    env.get_json(&configmaps(env), Some(SWITCH_CONFIG_MAP))
        .unwrap()["data"][SWITCH_KEY]
        .as_str()
        .map(str::to_string)
}

/// A node-agent pod in this test's agent namespace: of this version (`labelled`) or an older one,
/// Ready for `ready_for` seconds.
fn agent(env: &Env, name: &str, labelled: bool, ready_for: u64) {
    let (k, v) = AGENT_LABEL_SELECTOR.split_once('=').unwrap();
    let mut labels = json!({k: v});
    if labelled {
        labels[AGENT_LABEL] = json!(AGENT_LABEL_VALUE);
    }
    let ns = env.agent_ns();
    env.pod_object(
        json!({"metadata": {"namespace": ns, "name": name, "labels": labels},
                          "spec": {"nodeName": format!("{name}-node")}}),
    );
    // No kubelet here: the test says the pod is Ready, since when.
    let path = format!("/api/v1/namespaces/{ns}/pods");
    let mut p = env.get_json(&path, Some(name)).unwrap();
    let since = tether_kube_store::convert::time_text(now() - ready_for).unwrap();
    p["status"] = json!({"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True", "lastTransitionTime": since}]});
    env.put_json(&format!("{path}/{name}"), "status", &p)
        .unwrap();
}

/// The selector of the test's agent pods (the DaemonSet's pod label in the manifest).
const AGENT_LABEL_SELECTOR: &str = "app.kubernetes.io/name=tether";

fn kube(env: &Env) -> Kube {
    Kube::connect(&env.settings()).unwrap()
}

/// The controller keeps mirrors while a node-agent of an older version runs, or one of this
/// version has not been Ready long, and publishes when none does; an agent follows it into the
/// file its plugins read and its lease service's switch.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn the_controller_keeps_mirrors_until_every_agent_runs_this_version() {
    let _turn = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    let env = Env::real("names");
    let k = kube(&env);
    let ns = env.agent_ns();
    agent(&env, "agent-new", true, 600);
    shipped_switch(&env);
    // An agent follower before the controller has said anything: mirrors (the safe side).
    let dir = env.dir.join("node");
    let switch = LegacyMirrors::new(false);
    let follower = Follower::new("n-a", ns, &dir.join("tether.kubeconfig"), switch.clone());
    follower.round(Some(&k));
    assert!(switch.on());
    let file = std::fs::read_to_string(dir.join(MIRROR_SWITCH_FILE)).unwrap();
    assert!(file.contains("\"mirrorLegacyNames\": true"), "{file}");

    agent(&env, "agent-old", false, 600);
    let r = controller_pass(&k, ns, AGENT_LABEL_SELECTOR, now());
    assert!(r.mirrors && r.reason.contains("agent-old"), "{r:?}");
    assert_eq!(published(&env).as_deref(), Some("true"));

    // The old agent is replaced by one of this version, Ready only just now: still kept.
    assert!(env.delete_pod(ns, "agent-old"));
    agent(&env, "agent-new-2", true, 5);
    let mut r = controller_pass(&k, ns, AGENT_LABEL_SELECTOR, now());
    let only_new = wait_until(Duration::from_secs(10), || {
        r = controller_pass(&k, ns, AGENT_LABEL_SELECTOR, now());
        r.reason.contains("agent-new-2")
    });
    assert!(only_new.is_some() && r.mirrors, "{r:?}");
    // Settled: off (once the API server's cache, which the pass lists from, has the deletion).
    assert!(env.delete_pod(ns, "agent-new-2"));
    let mut r = controller_pass(&k, ns, AGENT_LABEL_SELECTOR, now());
    let off = wait_until(Duration::from_secs(10), || {
        r = controller_pass(&k, ns, AGENT_LABEL_SELECTOR, now());
        !r.mirrors
    });
    assert!(off.is_some(), "{r:?}");
    assert!(r.adoption.errors.is_empty(), "{:?}", r.adoption.errors);
    assert_eq!(published(&env).as_deref(), Some("false"));
    follower.round(Some(&k));
    assert!(!switch.on());
    assert!(
        !tether_kube_store::by_network::mirrors_wanted(&dir.join("tether.kubeconfig")),
        "the plugins read the same"
    );
    // An agent of the older version comes back (a rolled-back DaemonSet): on again.
    agent(&env, "agent-back", false, 600);
    let back = wait_until(Duration::from_secs(10), || {
        controller_pass(&k, ns, AGENT_LABEL_SELECTOR, now()).mirrors
    });
    assert!(back.is_some());
    follower.round(Some(&k));
    assert!(switch.on());
}

/// The previous commit's tether-ipam (`conformance/upgrade/previous.sh`).
fn previous_ipam() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/previous/6c980264c91ee7e2346783ccf5a1128cf782cabc/tether-ipam");
    assert!(
        p.is_file(),
        "NOT RUN: {} is missing; build it with conformance/upgrade/previous.sh (make test does)",
        p.display()
    );
    p
}

const SUBNET: &str = "10.205.0.0/24";

fn conf(network: &str) -> Value {
    json!({"cniVersion": "1.0.0", "name": network, "type": "tether-ipvlan", "master": "lo",
           "ipam": {"type": "tether-ipam", "range": "10.205.0.10-10.205.0.69/24", "probe": false,
                    "cooldown_s": 0}})
}

/// Who holds each address (container IDs), from the records of every kind: a domain's record and
/// its mirror count once; two different holders of one address are a duplicate.
fn holders(env: &Env) -> BTreeMap<String, HashSet<String>> {
    let mut out: BTreeMap<String, HashSet<String>> = BTreeMap::new();
    for l in records(env, SUBNET).into_iter().filter(Lease::is_leased) {
        out.entry(l.address.to_string())
            .or_default()
            .insert(l.container_id.clone());
    }
    out
}

fn assert_one_holder_each(env: &Env, when: &str) {
    for (a, h) in holders(env) {
        assert_eq!(h.len(), 1, "{when}: {a} is held by {h:?}");
    }
}

/// A roll under load: pods start on a node of the previous version and on one of this version at
/// the same time, while the controller moves records named by network into the domain; then the
/// roll ends, mirrors go, and the pods of the previous version keep their addresses (a DEL through
/// this version, from the previous version's node journal, releases them).
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn item96_an_upgrade_under_load_hands_out_nothing_twice() {
    let _turn = TURNS.lock().unwrap_or_else(|p| p.into_inner());
    let old_bin = previous_ipam();
    let env = Env::real("roll");
    clear(&env, SUBNET);
    let k = kube(&env);
    let net = env.name("roll-net");
    let c = conf(net);
    let (old, new) = (node(&env, "roll-old"), node(&env, "roll-new"));
    let switch_file = new.kubeconfig.with_file_name(MIRROR_SWITCH_FILE);
    // Before the roll: every node runs the previous version.
    for i in 0..10 {
        let node = if i % 2 == 0 { &old } else { &new };
        let (code, r) = call_bin(
            &old_bin,
            node,
            None,
            "ADD",
            &format!("pre-{i}"),
            &format!("pre-{i}"),
            &c,
        );
        assert_eq!(code, 0, "{r}");
    }
    assert!(
        records(&env, SUBNET)
            .iter()
            .all(|l| naming_of(l) == Naming::ByNetwork),
        "the previous version names leases by network"
    );
    // The roll reaches node roll-new: its agent tells the plugins to keep mirrors and moves the
    // node's records into the domain before this version's plugins run there.
    std::fs::write(
        &switch_file,
        mirror_switch_text(true, "the roll is under way"),
    )
    .unwrap();
    let moved = k.leases.adopt(
        &k.leases.list_node_of(new.name, Kinds::All).unwrap(),
        &|_| None,
        true,
    );
    assert_eq!((moved.moved, moved.left), (5, 0), "{moved:?}");
    // Both versions at once, 20 ADDs each, while the controller moves what the old one writes.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let results: Vec<(String, i32, Value)> = std::thread::scope(|s| {
        let k = &k;
        let mover = s.spawn(move || {
            let mut passes = 0;
            loop {
                k.restart_budget();
                if let Ok(all) = k.leases.list_every(Kinds::All) {
                    k.leases.adopt(&all, &|_| None, true);
                }
                passes += 1;
                if rx.recv_timeout(Duration::from_millis(20)).is_ok() {
                    return passes;
                }
            }
        });
        let calls: Vec<_> = (0..40)
            .map(|i| {
                let (old_bin, old, new, c) = (&old_bin, &old, &new, &c);
                s.spawn(move || {
                    let pod = format!("live-{i}");
                    let (code, r) = if i % 2 == 0 {
                        call_bin(old_bin, old, None, "ADD", &pod, &pod, c)
                    } else {
                        call_on_node(new, "ADD", &pod, &pod, c)
                    };
                    (pod, code, r)
                })
            })
            .collect();
        let out = calls.into_iter().map(|h| h.join().unwrap()).collect();
        tx.send(()).unwrap();
        assert!(mover.join().unwrap() > 0);
        out
    });
    let mut given = BTreeMap::new();
    for (pod, code, r) in &results {
        assert_eq!(*code, 0, "{pod}: {r}");
        if let Some(other) = given.insert(first_address(r), pod.clone()) {
            panic!("{} given to {other} and {pod}", first_address(r));
        }
    }
    assert_one_holder_each(&env, "during the roll");

    // The roll ends: node roll-old's agent moves its records, and the controller finds no node
    // of the previous version: mirrors go.
    let moved = k.leases.adopt(
        &k.leases.list_node_of(old.name, Kinds::All).unwrap(),
        &|_| None,
        true,
    );
    assert_eq!(moved.left, 0, "{moved:?}");
    let last = k.leases.adopt(&records(&env, SUBNET), &|_| None, false);
    assert!(last.errors.is_empty() && last.left == 0, "{last:?}");
    std::fs::write(&switch_file, mirror_switch_text(false, "the roll is done")).unwrap();
    assert!(
        records(&env, SUBNET)
            .iter()
            .all(|l| naming_of(l) == Naming::Domain),
        "every lease is named by address"
    );
    assert_one_holder_each(&env, "after the roll");
    let held: HashSet<String> = holders(&env).into_keys().collect();
    assert_eq!(
        held.len(),
        50,
        "the 10 pods from before and the 40 of the roll"
    );

    // This version now runs on both nodes: the pods of the previous version keep their
    // addresses, and a DEL of one (the old node's journal, written by the previous version)
    // releases it.
    for i in 0..10 {
        let pod = format!("after-{i}");
        let node = if i % 2 == 0 { &old } else { &new };
        let (code, r) = call_on_node(node, "ADD", &pod, &pod, &c);
        assert_eq!(code, 0, "{r}");
        assert!(
            !held.contains(&first_address(&r)),
            "{} was still held",
            first_address(&r)
        );
    }
    assert_one_holder_each(&env, "after the roll, new pods");
    let pre0 = records(&env, SUBNET)
        .into_iter()
        .find(|l| l.container_id == "ctr-pre-0" && l.is_leased())
        .unwrap();
    let (code, r) = call_on_node(&old, "DEL", "pre-0", "pre-0", &c);
    assert_eq!(code, 0, "{r}");
    let after = records(&env, SUBNET);
    let now_pre0 = after.iter().find(|l| l.address == pre0.address).unwrap();
    assert!(!now_pre0.is_leased(), "{now_pre0:?}");
    clear(&env, SUBNET);
}
