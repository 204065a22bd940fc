//! 4 "nodes" — separate processes (this test binary re-executed with an environment switch),
//! each with its own node name — run 64 concurrent ADDs each on one shared range against ONE
//! real API server (TETHER_TEST_KUBECONFIG; see common/mod.rs): every address is distinct.
//! Then the same processes release everything concurrently. Each node has its own journal, as
//! the plugin does (point reads; the 64 first calls of a node race to build its journal once).

mod common;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::sync::Barrier;

use common::*;
use tether_kube_store::{KubeSettings, KubeStore};
use tether_leases::{AddRequest, Allocator, LeaseState, NoProbe, Policy, SystemClock};

const NODES: usize = 4;
const PER_NODE: usize = 64;
const RANGE: &str = "10.77.0.0/23";

/// The child's body; a no-op unless started by `four_nodes_share_one_range`.
#[test]
fn node_process() {
    let (Ok(node), Ok(mode), Ok(kubeconfig), Ok(network)) = (
        std::env::var("TETHER_KS_NODE"),
        std::env::var("TETHER_KS_MODE"),
        std::env::var("TETHER_KS_KUBECONFIG"),
        std::env::var("TETHER_KS_NETWORK"),
    ) else {
        return;
    };
    let barrier = Barrier::new(PER_NODE);
    let lines: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..PER_NODE)
            .map(|i| {
                let (node, mode, kubeconfig, network, barrier) =
                    (&node, &mode, &kubeconfig, &network, &barrier);
                sc.spawn(move || {
                    // One store per call, as one tether-ipam process per CNI call would have.
                    let store = KubeStore::connect(KubeSettings {
                        timeout: std::time::Duration::from_secs(60),
                        node: Some(node.clone()),
                        journal_dir: std::env::var_os("TETHER_KS_JOURNAL").map(Into::into),
                        ..KubeSettings::with_kubeconfig(kubeconfig)
                    })
                    .expect("connect");
                    let a = Allocator::new(
                        scope_of(network),
                        vec![range(RANGE)],
                        Policy::default(),
                        &store,
                        &NoProbe,
                        &SystemClock,
                    );
                    let cid = format!("{node}-c{i}");
                    barrier.wait();
                    match mode.as_str() {
                        "add" => {
                            let req = AddRequest {
                                container_id: cid.clone(),
                                ifname: "net1".into(),
                                pod: pod("mp", &format!("{node}-p{i}"), &format!("{node}-u{i}")),
                                node: Some(node.clone()),
                                requested: vec![],
                            };
                            let l = a.add(&req).unwrap_or_else(|e| panic!("ADD {cid}: {e}"));
                            let r = store.requests();
                            format!("LEASE {cid} {} {} {}", l[0].address, r.total(), r.create)
                        }
                        _ => {
                            let released = a
                                .del(&cid, "net1")
                                .unwrap_or_else(|e| panic!("DEL {cid}: {e}"));
                            format!("RELEASED {cid} {}", released.len())
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for l in lines {
        println!("{l}");
    }
}

fn run_nodes(env: &Env, mode: &str) -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..NODES)
        .map(|n| {
            Command::new(&exe)
                .args(["node_process", "--exact", "--nocapture", "--test-threads=1"])
                .env("TETHER_KS_NODE", format!("node-{n}"))
                .env("TETHER_KS_MODE", mode)
                .env("TETHER_KS_KUBECONFIG", &env.kubeconfig)
                .env("TETHER_KS_NETWORK", &env.network)
                .env(
                    "TETHER_KS_JOURNAL",
                    env.dir.path().join(format!("journal-node-{n}")),
                )
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn node process")
        })
        .collect();
    let mut lines = Vec::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "node process failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        // libtest prints "test node_process ... " right before the first of our lines.
        lines.extend(stdout.lines().filter_map(|l| {
            ["LEASE ", "RELEASED "]
                .iter()
                .find_map(|tag| l.find(tag))
                .map(|i| l[i..].to_string())
        }));
    }
    lines
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn four_nodes_share_one_range() {
    let env = Env::new("nodes");
    let adds: Vec<Vec<String>> = run_nodes(&env, "add")
        .into_iter()
        .filter(|l| l.starts_with("LEASE "))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    assert_eq!(adds.len(), NODES * PER_NODE);
    let addrs: HashSet<&str> = adds.iter().map(|f| f[2].as_str()).collect();
    if addrs.len() != NODES * PER_NODE {
        let mut seen = HashMap::new();
        for f in &adds {
            if let Some(prev) = seen.insert(f[2].clone(), f.clone()) {
                eprintln!("DUP {prev:?} {f:?}");
            }
        }
    }
    assert_eq!(addrs.len(), NODES * PER_NODE, "every address distinct");
    let requests: u64 = adds.iter().map(|f| f[3].parse::<u64>().unwrap()).sum();
    let creates: u64 = adds.iter().map(|f| f[4].parse::<u64>().unwrap()).sum();
    eprintln!(
        "{} ADDs from {NODES} processes: {requests} API requests ({:.2} per allocation), {creates} creates ({} lost races)",
        adds.len(),
        requests as f64 / adds.len() as f64,
        creates - adds.len() as u64
    );

    // The cluster agrees: one Leased record per ADD, held by the right container on the right node.
    // A consistent list (not the watch cache, which may lag behind the last writes).
    let store = env.store_with(|s| {
        s.list_from_cache = false;
        s.timeout = std::time::Duration::from_secs(60);
    });
    let by_cid: HashMap<String, String> =
        adds.iter().map(|f| (f[1].clone(), f[2].clone())).collect();
    let all = store_list(&store, &env.network);
    assert_eq!(all.len(), NODES * PER_NODE);
    for l in &all {
        assert!(l.is_leased());
        assert_eq!(by_cid[&l.container_id], l.address.to_string());
        let node = l
            .container_id
            .split('-')
            .take(2)
            .collect::<Vec<_>>()
            .join("-");
        assert_eq!(l.node.as_deref(), Some(node.as_str()));
    }

    // All released, concurrently, by the same four nodes.
    let dels: Vec<String> = run_nodes(&env, "del")
        .into_iter()
        .filter(|l| l.starts_with("RELEASED "))
        .collect();
    assert_eq!(dels.len(), NODES * PER_NODE);
    assert!(
        dels.iter().all(|l| l.ends_with(" 1")),
        "each DEL released its one lease"
    );
    let after = store_list(&store, &env.network);
    assert_eq!(after.len(), NODES * PER_NODE);
    assert!(
        after
            .iter()
            .all(|l| matches!(l.state, LeaseState::Released { .. }))
    );
}

fn store_list(store: &KubeStore, network: &str) -> Vec<tether_leases::Lease> {
    store.restart_budget();
    sorted(store, network)
}
