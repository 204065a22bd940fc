//! bench-probe: what conflict probing adds to a tether-ipam ADD, on this kernel (root; no ipvlan
//! needed). A veth segment: a "node" netns whose `m0` is the master, a peer netns on the other end
//! holding 10.1.2.1 and fd00:1:2::1 (nothing answers for the pool). tether-ipam runs inside the node
//! netns with `"master": "m0"`, sequentially, one fresh attachment per ADD.
//!
//! Rows: probing off, then the default budget (100 ms, 1 attempt), for IPv4 and dual-stack pools.
//! The "added" column is p50(on) - p50(off).
//!
//!   cargo build --release --bin tether-ipam
//!   cargo run --release -p tether-conformance --bin bench-probe
//!
//! Env: BENCH_N (ADDs per row, default 40), BENCH_BUDGETS (timeout_ms list, default "100"),
//! TETHER_BIN_DIR.

use serde_json::{Value, json};
use tether_conformance::bench::{Batch, ms, quantile, record_samples, run_batch};
use tether_conformance::{NetNs, TempDir, tether_binary, veth_pair};

fn main() {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let budgets: Vec<u64> = std::env::var("BENCH_BUDGETS")
        .unwrap_or_else(|_| "100".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let bin = tether_binary("tether-ipam");
    let node = NetNs::new("bench-node");
    let peer = NetNs::new("bench-peer");
    veth_pair(&node, "m0", &peer, "p0");
    peer.addr_add("p0", "10.1.2.1/24");
    peer.ip_ok(&["addr", "add", "fd00:1:2::1/64", "dev", "p0", "nodad"]);

    let build = if cfg!(debug_assertions) {
        "DEBUG build (use --release)"
    } else {
        "release build"
    };
    println!(
        "bench-probe: {n} sequential ADDs per row on a veth segment, {build}; {}",
        bin.display()
    );
    println!();
    println!(
        "{:<10} {:<22} {:>9} {:>9} {:>11}",
        "pool", "probe", "p50 ms", "p99 ms", "added p50"
    );

    let pools: [(&str, Value); 2] = [
        ("IPv4", json!({"range": "10.1.2.0/16"})),
        (
            "dual",
            json!({"range": "10.1.2.0/16", "ipRanges": [{"range": "fd00:1:2::/64"}]}),
        ),
    ];
    let mut probes: Vec<(String, Value)> = vec![("off".into(), json!(false))];
    for b in &budgets {
        probes.push((
            format!("{b} ms x 1 attempt"),
            json!({"timeout_ms": b, "attempts": 1}),
        ));
    }
    let mut row = 0;
    for (pool, ranges) in &pools {
        let mut off_p50 = None;
        for (label, probe) in &probes {
            row += 1;
            let store = TempDir::new("bench-probe");
            let mut ipam = ranges.clone();
            ipam["type"] = json!("tether-ipam");
            ipam["dataDir"] = json!(store.join("data"));
            ipam["probe"] = probe.clone();
            ipam["exclude"] = json!(["10.1.2.1", "fd00:1:2::1"]);
            let conf = json!({"cniVersion": "1.1.0", "name": "benchprobe", "type": "tether-ipvlan", "master": "m0", "mode": "l2", "ipam": ipam});
            let stdin = conf.to_string().into_bytes();
            let netns = node.path().to_string_lossy().into_owned();
            let env = move |i: usize| {
                vec![
                    ("CNI_COMMAND".to_string(), "ADD".to_string()),
                    ("CNI_CONTAINERID".to_string(), format!("probe-{row}-{i:04}")),
                    ("CNI_IFNAME".to_string(), "net1".to_string()),
                    ("CNI_NETNS".to_string(), netns.clone()),
                    ("CNI_PATH".to_string(), "/nonexistent".to_string()),
                ]
            };
            let argv = vec![
                "ip".to_string(),
                "netns".into(),
                "exec".into(),
                node.name().to_string(),
                bin.to_string_lossy().into_owned(),
            ];
            let b: Batch = run_batch(&argv, n, 1, &env, &stdin);
            if !b.failures.is_empty() {
                eprintln!(
                    "{pool} {label}: {} ADDs failed, e.g. {}",
                    b.failures.len(),
                    b.failures[0]
                );
                std::process::exit(1);
            }
            record_samples("probe", &format!("{pool} {label}"), &b);
            let p50 = quantile(&b.latencies, 0.5);
            let added = match off_p50 {
                None => {
                    off_p50 = Some(p50);
                    "-".to_string()
                }
                Some(o) => format!("{:.1} ms", ms(p50) - ms(o)),
            };
            println!(
                "{:<10} {:<22} {:>9.2} {:>9.2} {:>11}",
                pool,
                label,
                ms(p50),
                ms(b.quantile(0.99)),
                added
            );
        }
    }
}
