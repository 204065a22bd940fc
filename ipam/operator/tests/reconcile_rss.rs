//! Memory of `tether reconcile` (a child process) against a real API server holding 5,000
//! pods and 2,000+ leases. A measurement, not part of `make test` (it takes a while to fill the
//! server); with a server from `conformance/kube/up.sh`, run
//!
//! ```text
//! TETHER_TEST_KUBECONFIG=$(conformance/kube/up.sh) \
//!   cargo test --release -p tether-operator --test reconcile_rss -- --ignored --nocapture
//! ```
//!
//! and read the `RSS` lines. It fails above `TETHER_RSS_LIMIT_MIB` (default 64).

mod reconcile_support;

use std::process::{Command, Stdio};
use std::time::Duration;

use reconcile_support::*;

fn status_kib(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn measure(tag: &str, pods_on_me: usize, nodes: usize) {
    // The reconciler sweeps the whole cluster's leases: no other test meanwhile.
    let env = Env::real_exclusive(tag);
    let (ml, net) = (env.name("ml"), env.name("big"));
    let node_names: Vec<String> = (0..nodes)
        .map(|i| env.name(&format!("node-{i:03}")).to_string())
        .collect();
    let me = node_names[0].as_str();
    for n in &node_names {
        env.agent(n);
    }
    // 5,000 pods: `pods_on_me` on this node, the rest spread over the others.
    let mut uids = Vec::new();
    for i in 0..5000 {
        let node = if i < pods_on_me {
            me.to_string()
        } else {
            node_names[1 + i % (nodes - 1)].clone()
        };
        uids.push(env.pod(ml, &format!("pod-{i:05}"), &format!("uid-{i:05}"), &node));
    }
    // 2,000 leases: pods 0..1999 (their own nodes), a quarter of them stale (pod replaced), plus
    // 200 leases of a deleted node.
    let t = now() - 3600;
    let store = env.store();
    let dead = env.name("node-gone");
    for i in 0..2000usize {
        let node = if i < pods_on_me {
            me.to_string()
        } else {
            node_names[1 + i % (nodes - 1)].clone()
        };
        let uid = if i % 4 == 0 {
            format!("old-{i}")
        } else {
            uids[i].clone()
        };
        let addr = format!("10.{}.{}.{}", 100 + i / 65536, (i / 256) % 256, i % 256);
        store.restart_budget();
        use tether_leases::LeaseStore;
        store
            .claim(
                lease(
                    net,
                    &addr,
                    Some((ml, &format!("pod-{i:05}"), &uid)),
                    &node,
                    t,
                ),
                None,
            )
            .unwrap()
            .unwrap();
    }
    for i in 0..200usize {
        store.restart_budget();
        use tether_leases::LeaseStore;
        store
            .claim(
                lease(
                    net,
                    &format!("10.200.0.{i}"),
                    Some((ml, &format!("dead-{i}"), "u")),
                    dead,
                    t,
                ),
                None,
            )
            .unwrap()
            .unwrap();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args([
            "reconcile",
            "--kubeconfig",
            env.kubeconfig.to_str().unwrap(),
            "--node",
            me,
            "--agent-namespace",
            env.agent_ns(),
        ])
        .env_remove("CNI_COMMAND")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    // The first full pass: releases (stale of this node) + the sweep (this node is the sweeper?).
    let sweeper = tether_operator::reconcile::sweeper(&node_names)
        .unwrap()
        .to_string();
    let stale_mine = (0..pods_on_me.min(2000)).filter(|i| i % 4 == 0).count();
    let expect_dead = if sweeper == me { 200 } else { 0 };
    let released = || {
        use tether_leases::LeaseStore;
        store.restart_budget();
        store
            .list(&scope_of(net))
            .unwrap()
            .iter()
            .filter(|l| !l.is_leased())
            .count()
    };
    let t0 = std::time::Instant::now();
    let mut done = None;
    while t0.elapsed() < Duration::from_secs(120) {
        if released() >= stale_mine + expect_dead {
            done = Some(t0.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(1));
    // Events: delete 100 of this node's pods.
    for i in (1..pods_on_me.min(400)).step_by(4) {
        env.delete_pod(ml, &format!("pod-{i:05}"));
    }
    std::thread::sleep(Duration::from_secs(3));
    let (hwm, rss) = (status_kib(pid, "VmHWM:"), status_kib(pid, "VmRSS:"));
    let _ = child.kill();
    let _ = child.wait();
    eprintln!(
        "RSS {tag}: 5000 pods ({pods_on_me} on this node, {nodes} nodes), 2200 leases; first pass done: {}; \
         sweeper: {}; peak {:.1} MiB, now {:.1} MiB",
        done.map_or("no".into(), |d| format!("{d:?}")),
        sweeper == me,
        hwm as f64 / 1024.0,
        rss as f64 / 1024.0,
    );
    assert!(done.is_some(), "the first pass released the stale leases");
    let limit: u64 = std::env::var("TETHER_RSS_LIMIT_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    assert!(
        hwm / 1024 < limit,
        "peak RSS {} MiB over {limit} MiB",
        hwm / 1024
    );
}

#[test]
#[ignore = "measurement: needs a real API server and minutes; run by hand (see the top of this file)"]
fn rss_with_5000_pods_and_2000_leases() {
    // Worst case for the pod cache: every pod on this node. Then the usual spread: 100 per node.
    measure("all-on-me", 5000, 50);
    measure("spread", 100, 50);
}
