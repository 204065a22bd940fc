//! bench-ipam: tether-ipam (file store, probing off) next to the reference host-local, in one run.
//!
//! For each plugin and concurrency (1 and 32): 256 ADDs with distinct container IDs on a fresh store
//! (a /16, so nobody runs out), each call a fresh process as a runtime makes it. Prints allocations
//! per second (over the batch's wall time) and per-call p50/p99, then 256 DELs the same way, and the
//! tether/host-local ratios.
//!
//!   cargo build --release --bin tether-ipam
//!   cargo run --release -p tether-conformance --bin bench-ipam
//!
//! Env: BENCH_N (default 256), BENCH_CONCURRENCY (default "1,32"), BENCH_ROUNDS (default 3; the best
//! round by rate is reported), TETHER_BIN_DIR (default target/release for a release build),
//! TETHER_REFERENCE_CNI_PATH (default /usr/lib/cni).

use std::path::PathBuf;

use serde_json::json;
use tether_conformance::bench::{Batch, ms, record_samples, run_batch};
use tether_conformance::{TempDir, reference_plugin, tether_binary};

struct Plugin {
    name: &'static str,
    bin: PathBuf,
    conf: Box<dyn Fn(&std::path::Path) -> serde_json::Value>,
}

fn env_usize(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn main() {
    let n = env_usize("BENCH_N", 256);
    let rounds = env_usize("BENCH_ROUNDS", 3).max(1);
    let concurrency: Vec<usize> = std::env::var("BENCH_CONCURRENCY")
        .unwrap_or_else(|_| "1,32".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let plugins = [
        Plugin {
            name: "tether-ipam",
            bin: tether_binary("tether-ipam"),
            conf: Box::new(|dir| {
                json!({"cniVersion": "1.0.0", "name": "bench", "type": "tether-ipam",
                       "ipam": {"type": "tether-ipam", "range": "10.1.0.0/16", "dataDir": dir, "probe": false}})
            }),
        },
        Plugin {
            name: "host-local",
            bin: reference_plugin("host-local"),
            conf: Box::new(|dir| {
                json!({"cniVersion": "1.0.0", "name": "bench", "type": "host-local",
                       "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.1.0.0/16"}]], "dataDir": dir}})
            }),
        },
    ];
    let build = if cfg!(debug_assertions) {
        "DEBUG build (use --release)"
    } else {
        "release build"
    };
    println!(
        "bench-ipam: {n} ADDs then {n} DELs per row, fresh store per round, best of {rounds} rounds; {build}"
    );
    println!("  tether-ipam: {}", plugins[0].bin.display());
    println!("  host-local:  {}", plugins[1].bin.display());
    println!();
    println!(
        "{:<12} {:>5} {:>4} {:>10} {:>9} {:>9}",
        "plugin", "verb", "conc", "calls/s", "p50 ms", "p99 ms"
    );

    // results[(plugin, verb, conc)] = batch
    let mut results: Vec<(&str, &str, usize, Batch)> = Vec::new();
    for &c in &concurrency {
        for p in &plugins {
            let mut best: Option<(Batch, Batch)> = None;
            for _ in 0..rounds {
                let store = TempDir::new("bench-ipam");
                let stdin = (p.conf)(&store.join("data")).to_string().into_bytes();
                let env = |verb: &'static str| {
                    move |i: usize| {
                        vec![
                            ("CNI_COMMAND".to_string(), verb.to_string()),
                            ("CNI_CONTAINERID".to_string(), format!("bench-{i:05}")),
                            ("CNI_IFNAME".to_string(), "net1".to_string()),
                            (
                                "CNI_NETNS".to_string(),
                                "/var/run/netns/bench-unused".to_string(),
                            ),
                            ("CNI_PATH".to_string(), "/nonexistent".to_string()),
                        ]
                    }
                };
                let argv = vec![p.bin.to_string_lossy().into_owned()];
                let add = run_batch(&argv, n, c, &env("ADD"), &stdin);
                let del = run_batch(&argv, n, c, &env("DEL"), &stdin);
                for (what, b) in [("ADD", &add), ("DEL", &del)] {
                    if !b.failures.is_empty() {
                        eprintln!(
                            "{} {what}: {} calls failed, e.g. {}",
                            p.name,
                            b.failures.len(),
                            b.failures[0]
                        );
                        std::process::exit(1);
                    }
                }
                if best.as_ref().is_none_or(|(a, _)| add.rate() > a.rate()) {
                    best = Some((add, del));
                }
            }
            let (add, del) = best.unwrap();
            for (verb, b) in [("ADD", add), ("DEL", del)] {
                println!(
                    "{:<12} {:>5} {:>4} {:>10.0} {:>9.2} {:>9.2}",
                    p.name,
                    verb,
                    c,
                    b.rate(),
                    ms(b.quantile(0.5)),
                    ms(b.quantile(0.99))
                );
                record_samples("ipam", &format!("{} {verb} c{c}", p.name), &b);
                results.push((p.name, verb, c, b));
            }
        }
    }

    println!();
    println!(
        "tether-ipam / host-local (rate: higher is better for tether; latency: lower is better)"
    );
    println!(
        "{:>5} {:>4} {:>11} {:>11} {:>11}",
        "verb", "conc", "rate ratio", "p50 ratio", "p99 ratio"
    );
    for &c in &concurrency {
        for verb in ["ADD", "DEL"] {
            let get = |name: &str| {
                results
                    .iter()
                    .find(|r| r.0 == name && r.1 == verb && r.2 == c)
                    .map(|r| &r.3)
                    .unwrap()
            };
            let (t, h) = (get("tether-ipam"), get("host-local"));
            println!(
                "{:>5} {:>4} {:>10.2}x {:>10.2}x {:>10.2}x",
                verb,
                c,
                t.rate() / h.rate(),
                ms(t.quantile(0.5)) / ms(h.quantile(0.5)),
                ms(t.quantile(0.99)) / ms(h.quantile(0.99))
            );
        }
    }
}
