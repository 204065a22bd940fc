//! The lease reconciler against the API double: what it releases, what it never releases, event
//! driven releases, watch expiry, two reconcilers at once, the file store, deleted nodes.

mod reconcile_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use reconcile_support::*;
use tether_ipam::reconcile::{Options, Reconciler, StoreName, sweeper};
use tether_leases::reclaim::StaleReason;
use tether_leases::{FileStore, LeaseStore};

const NET: &str = "fabric";
const OLD: u64 = 3600; // seconds: well past any grace period

fn options(env: &Env, node: &str) -> Options {
    let mut o = Options::new(node);
    o.kube = Some(env.settings());
    o.debounce = Duration::from_millis(50);
    o.agent_namespace = AGENT_NS.to_string();
    o.agent_selector = AGENT_LABEL.to_string();
    o
}

#[test]
fn releases_gone_and_replaced_pods_never_live_young_or_anonymous() {
    let env = Env::new("judge");
    env.agent("n1");
    env.agent("n2");
    let t = now() - OLD;
    let alive = env.pod("ns", "alive", "u-alive", "n1");
    env.pod("ns", "sts-0", "u-new", "n1");
    // Same pod (same uid) seen on another node: a node-name mismatch between plugin and agent.
    env.pod("ns", "elsewhere", "u-else", "n2");
    env.put(lease(NET, "10.0.0.1", Some(("ns", "alive", &alive)), "n1", t));
    env.put(lease(NET, "10.0.0.2", Some(("ns", "gone", "u-gone")), "n1", t));
    env.put(lease(NET, "10.0.0.3", Some(("ns", "sts-0", "u-old")), "n1", t));
    env.put(lease(NET, "10.0.0.4", Some(("ns", "young", "u-young")), "n1", now()));
    env.put(lease(NET, "10.0.0.5", None, "n1", t));
    env.put(lease(NET, "10.0.0.6", Some(("ns", "elsewhere", "u-else")), "n1", t));
    // Another (live) node's lease of a gone pod: that node's agent's business.
    env.put(lease(NET, "10.0.0.7", Some(("ns", "gone-2", "u-g2")), "n2", t));

    let r = Reconciler::new(options(&env, "n1")).unwrap();
    let report = r.pass(true);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let mut got: Vec<(String, StaleReason)> = report.released.iter().map(|x| (x.lease.address.to_string(), x.reason.clone())).collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        got,
        vec![
            ("10.0.0.2".to_string(), StaleReason::PodGone),
            ("10.0.0.3".to_string(), StaleReason::PodReplaced { current_uid: "u-new".into() }),
        ]
    );
    assert!(report.released.iter().all(|x| x.store == StoreName::Kubernetes));
    assert_eq!(report.confirmed_alive, 1, "the cache missed ns/elsewhere; the GET found it alive");
    for a in ["10.0.0.1", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.7"] {
        assert!(is_leased(&env.state(NET, a)), "{a} must stay leased");
    }
    for a in ["10.0.0.2", "10.0.0.3"] {
        assert!(is_released(&env.state(NET, a)), "{a} must be released (kept as Released for cooldown/sticky)");
    }
    // A second pass finds nothing more.
    let again = r.pass(true);
    assert!(again.released.is_empty() && again.errors.is_empty());
}

#[test]
fn pod_created_while_reconcile_runs_is_safe_within_grace() {
    let env = Env::new("race");
    env.agent("n1");
    // The ADD has its lease; the pod shows up in the API a moment later.
    env.put(lease(NET, "10.0.1.1", Some(("ns", "starting", "u-s")), "n1", now()));
    let mut o = options(&env, "n1");
    o.grace_s = 60;
    let r = Arc::new(Reconciler::new(o).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let h = {
        let (r, stop) = (r.clone(), stop.clone());
        std::thread::spawn(move || r.run(&stop, |rep| tx.send(rep.clone()).unwrap()))
    };
    let first = rx.recv_timeout(Duration::from_secs(10)).expect("a pass");
    assert!(first.released.is_empty(), "young lease, pod not yet visible: nothing happens");
    assert!(first.next_due.is_some(), "a pass is scheduled for when the grace period ends");
    env.pod("ns", "starting", "u-s", "n1");
    std::thread::sleep(Duration::from_millis(500));
    // Passes in between (e.g. from the watch) must not touch it either.
    assert!(r.pass(true).released.is_empty());
    assert!(is_leased(&env.state(NET, "10.0.1.1")));
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap().unwrap();
    while let Ok(rep) = rx.try_recv() {
        assert!(rep.released.is_empty(), "{:?}", rep.released);
    }
}

#[test]
fn a_young_lease_of_a_pod_that_never_appears_is_released_when_its_grace_ends() {
    let env = Env::new("grace-end");
    env.agent("n1");
    env.put(lease(NET, "10.0.2.1", Some(("ns", "never", "u-n")), "n1", now()));
    let mut o = options(&env, "n1");
    o.grace_s = 2;
    let r = Reconciler::new(o).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| r.run(&stop, |_| {}).unwrap());
        assert!(is_leased(&env.state(NET, "10.0.2.1")));
        let took = wait_until(Duration::from_secs(10), || is_released(&env.state(NET, "10.0.2.1")));
        stop.store(true, Ordering::Relaxed);
        assert!(took.is_some(), "released after its grace period without waiting for the 10-minute pass");
    });
}

#[test]
fn deleting_a_pod_releases_its_lease_without_waiting_for_the_periodic_pass() {
    let env = Env::new("event");
    env.agent("n1");
    let t = now() - OLD;
    env.pod("ns", "worker", "u-w", "n1");
    env.pod("ns", "other", "u-o", "n1");
    env.put(lease(NET, "10.0.3.1", Some(("ns", "worker", "u-w")), "n1", t));
    env.put(lease(NET, "10.0.3.2", Some(("ns", "other", "u-o")), "n1", t));
    let r = Reconciler::new(options(&env, "n1")).unwrap(); // interval: 10 minutes
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| r.run(&stop, move |rep| { let _ = tx.send(rep.released.len()); }).unwrap());
        // The first full pass and the pass after the initial list.
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(is_leased(&env.state(NET, "10.0.3.1")));
        assert!(env.double.delete_pod("ns", "worker"));
        let took = wait_until(Duration::from_secs(5), || is_released(&env.state(NET, "10.0.3.1")));
        // After a watch expiry (410) the cache is rebuilt and events flow again.
        env.double.expire_watches();
        std::thread::sleep(Duration::from_millis(300));
        assert!(env.double.delete_pod("ns", "other"));
        let took2 = wait_until(Duration::from_secs(5), || is_released(&env.state(NET, "10.0.3.2")));
        stop.store(true, Ordering::Relaxed);
        let took = took.expect("released within 5 s of the pod's deletion");
        eprintln!("event-driven release took {took:?}; after a watch expiry {took2:?}");
        assert!(took2.is_some(), "released within 5 s after the watch expired and was re-established");
        assert!(env.double.count("list", "pods") >= 2, "the expired watch led to a fresh list");
        assert!(env.double.count("watch", "pods") >= 2, "and to a new watch");
    });
}

#[test]
fn two_reconcilers_at_once_release_each_lease_once_and_do_not_fail() {
    let env = Env::new("two");
    env.agent("n1");
    let t = now() - OLD;
    for i in 1..=40 {
        env.put(lease(NET, &format!("10.0.4.{i}"), Some(("ns", &format!("gone-{i}"), &format!("u{i}"))), "n1", t));
    }
    env.pod("ns", "live", "u-live", "n1");
    env.put(lease(NET, "10.0.4.200", Some(("ns", "live", "u-live")), "n1", t));
    let a = Reconciler::new(options(&env, "n1")).unwrap();
    let b = Reconciler::new(options(&env, "n1")).unwrap();
    let (ra, rb) = std::thread::scope(|s| {
        let ha = s.spawn(|| a.pass(true));
        let hb = s.spawn(|| b.pass(true));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert!(ra.errors.is_empty() && rb.errors.is_empty(), "{:?} {:?}", ra.errors, rb.errors);
    assert_eq!(ra.released.len() + rb.released.len(), 40, "each stale lease released exactly once");
    let mut addrs: Vec<String> = ra.released.iter().chain(&rb.released).map(|x| x.lease.address.to_string()).collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 40, "no lease released twice");
    eprintln!("a released {}, b released {}, lost races {}", ra.released.len(), rb.released.len(), ra.lost_races + rb.lost_races);
    assert!(is_leased(&env.state(NET, "10.0.4.200")));
}

#[test]
fn file_store_is_reconciled_for_this_node() {
    let env = Env::new("file");
    env.agent("n1");
    let data = env.dir.join("data");
    let fs = FileStore::new(&data);
    let t = now() - OLD;
    env.pod("ns", "alive", "u-a", "n1");
    env.pod("ns", "sts-0", "u-new", "n1");
    for (net, addr, pod, since) in [
        ("f1", "10.1.0.1", ("ns", "alive", "u-a"), t),
        ("f1", "10.1.0.2", ("ns", "gone", "u-g"), t),
        ("f1", "10.1.0.3", ("ns", "young", "u-y"), now()),
        ("f2", "10.2.0.1", ("ns", "sts-0", "u-old"), t),
    ] {
        fs.claim(lease(net, addr, Some(pod), "n1", since), None).unwrap().unwrap();
    }
    let mut o = options(&env, "n1");
    o.data_dir = Some(data.clone());
    let report = Reconciler::new(o).unwrap().pass(true);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let mut got: Vec<String> = report.released.iter().map(|x| format!("{}:{:?}", x.lease.address, x.store)).collect();
    got.sort();
    assert_eq!(got, vec!["10.1.0.2:File".to_string(), "10.2.0.1:File".to_string()]);
    let state = |net: &str, a: &str| fs.list(net).unwrap().into_iter().find(|l| l.address.to_string() == a).map(|l| l.state);
    assert!(is_leased(&state("f1", "10.1.0.1")));
    assert!(is_released(&state("f1", "10.1.0.2")));
    assert!(is_leased(&state("f1", "10.1.0.3")));
    assert!(is_released(&state("f2", "10.2.0.1")));
}

#[test]
fn leases_of_deleted_nodes_are_swept_by_one_agent_only() {
    let env = Env::new("sweep");
    // Live nodes are the nodes running an agent pod; no Node object is ever read.
    let survivors: Vec<String> = ["gpu-a", "gpu-b", "gpu-c"].iter().map(|s| s.to_string()).collect();
    let doomed = "gpu-d";
    for n in survivors.iter().map(String::as_str).chain([doomed]) {
        env.agent(n);
    }
    let me = sweeper(&survivors).unwrap().to_string();
    let other = survivors.iter().find(|n| **n != me).unwrap().clone();
    let t = now() - OLD;
    // gpu-d's leases: one pod is gone, one (same uid) runs elsewhere, one is young, and one pod
    // still runs on gpu-d itself (its agent pod is only briefly away, e.g. a rolling update).
    env.pod("ns", "moved", "u-m", &other);
    env.pod("ns", "d-live", "u-dl", doomed);
    env.put(lease(NET, "10.0.5.1", Some(("ns", "dead-pod", "u-d")), doomed, t));
    env.put(lease(NET, "10.0.5.2", Some(("ns", "moved", "u-m")), doomed, t));
    env.put(lease(NET, "10.0.5.3", Some(("ns", "fresh", "u-f")), doomed, now()));
    env.put(lease(NET, "10.0.5.4", Some(("ns", "d-live", "u-dl")), doomed, t));
    let gpu_d = ["10.0.5.1", "10.0.5.2", "10.0.5.3", "10.0.5.4"];

    // While gpu-d runs its agent it is alive: nobody else judges its leases.
    for n in &survivors {
        let r = Reconciler::new(options(&env, n)).unwrap().pass(true);
        assert!(r.errors.is_empty() && r.released.is_empty(), "{n}: {:?} {:?}", r.errors, r.released);
    }
    assert!(gpu_d.iter().all(|a| is_leased(&env.state(NET, a))));

    // gpu-d's agent pod disappears (the node was deleted, or its agent is being replaced).
    env.agent_gone(doomed);
    env.double.reset_counts();

    let event_pass = Reconciler::new(options(&env, &me)).unwrap().pass(false);
    assert!(!event_pass.swept, "the sweep runs in periodic passes only");
    assert!(is_leased(&env.state(NET, "10.0.5.1")));

    // A rolling update on gpu-a: its old and new agent pods both listed (one node, counted once).
    env.double
        .upsert_pod(serde_json::json!({"metadata": {"namespace": AGENT_NS, "name": "tether-gpu-a-new", "uid": "u-agent-new",
                                                    "labels": {"app.kubernetes.io/name": "tether"}},
                                       "spec": {"nodeName": "gpu-a"}}))
        .unwrap();

    // Every surviving agent runs a full pass: exactly one sweeps, and frees only the lease whose
    // pod the API server says is gone. (Pages of one pod: the agent pods are read page by page.)
    let mut sweepers = Vec::new();
    let mut released = Vec::new();
    for n in &survivors {
        let mut o = options(&env, n);
        o.kube.as_mut().unwrap().page_size = 1;
        let r = Reconciler::new(o).unwrap().pass(true);
        assert!(r.errors.is_empty(), "{n}: {:?}", r.errors);
        if r.swept {
            sweepers.push(n.clone());
            assert_eq!(r.confirmed_alive, 2, "ns/moved and ns/d-live were confirmed alive with a GET");
        }
        released.extend(r.released.iter().map(|x| x.lease.address.to_string()));
    }
    assert_eq!(sweepers, vec![me.clone()], "one sweeper, the same for every agent");
    assert_eq!(released, vec!["10.0.5.1".to_string()]);
    assert!(is_released(&env.state(NET, "10.0.5.1")));
    for a in ["10.0.5.2", "10.0.5.3", "10.0.5.4"] {
        assert!(is_leased(&env.state(NET, a)), "{a} must stay leased");
    }
    assert!(env.double.count("get", "pods") >= 3, "each old candidate was checked with a GET");
    assert_eq!(env.double.total("nodes"), 0, "nodes are never read");

    // Without `list` on pods in the agent namespace the agent keeps reconciling its own node and
    // does not fail; the dead node's new stale lease waits.
    env.put(lease(NET, "10.0.5.5", Some(("ns", "dead-pod-2", "u-d2")), doomed, t));
    env.put(lease(NET, "10.0.5.6", Some(("ns", "mine-gone", "u-mg")), &me, t));
    env.double.forbid_in("list", "pods", AGENT_NS);
    let r = Reconciler::new(options(&env, &me)).unwrap().pass(true);
    assert!(!r.swept && r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.released.iter().map(|x| x.lease.address.to_string()).collect::<Vec<_>>(), vec!["10.0.5.6".to_string()]);
    assert!(is_leased(&env.state(NET, "10.0.5.5")));
    env.double.allow_all();

    // A wrong agent namespace (or selector) finds no agent pod on this node: no sweep, no failure.
    let mut o = options(&env, &me);
    o.agent_namespace = "elsewhere".into();
    let r = Reconciler::new(o).unwrap().pass(true);
    assert!(!r.swept && r.errors.is_empty() && r.released.is_empty(), "{:?} {:?}", r.errors, r.released);
    let mut o = options(&env, &me);
    o.agent_selector = "app.kubernetes.io/name=other".into();
    assert!(!Reconciler::new(o).unwrap().pass(true).swept);
    assert!(is_leased(&env.state(NET, "10.0.5.5")));

    // With the right settings the next periodic pass picks it up.
    let r = Reconciler::new(options(&env, &me)).unwrap().pass(true);
    assert!(r.swept && r.errors.is_empty(), "{:?}", r.errors);
    assert_eq!(r.released.iter().map(|x| x.lease.address.to_string()).collect::<Vec<_>>(), vec!["10.0.5.5".to_string()]);
    assert!(is_leased(&env.state(NET, "10.0.5.4")), "the live pod's lease is still never freed");
}

#[test]
fn reconcile_once_from_the_command_line() {
    let env = Env::new("cli-once");
    env.agent("n1");
    env.put(lease(NET, "10.0.6.1", Some(("ns", "gone", "u-g")), "n1", now() - OLD));
    let kc = env.kubeconfig.to_str().unwrap();
    let o = ipam(&["reconcile", "--kubeconfig", kc, "--node", "n1", "--once"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("released 10.0.6.1 network fabric (kubernetes) pod ns/gone uid u-g: its pod no longer exists"), "{}", stdout(&o));
    assert!(is_released(&env.state(NET, "10.0.6.1")));
    let o = ipam_env(&["reconcile", "--kubeconfig", kc, "--once", "-o", "json"], &[("NODE_NAME", "n1")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(json_out(&o)["released"].as_array().unwrap().len(), 0);
    // Usage: no node, no API.
    assert_eq!(ipam(&["reconcile", "--kubeconfig", kc, "--once"]).status.code(), Some(2));
    assert_eq!(ipam(&["reconcile", "--node", "n1", "--once"]).status.code(), Some(2));
}
