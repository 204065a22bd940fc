//! bench-agents: the lease reconciler at scale and under faults on a real kube-apiserver (issue
//! 22, item 6): for each cluster size, simulated nodes as processes — one `tether node-agent`
//! per node with that node's own bound-token credential, the node's heartbeat, pods whose
//! addresses come from real `tether-ipam` ADDs — and one `tether controller`, then pod churn,
//! node deletion, node silence and a real outage (kube-apiserver killed, etcd kept, started
//! again). The scenario is conformance/src/fleet/scenario.rs, the one `make test` runs with 10
//! nodes (ipam/operator/tests/agents_faults.rs).
//!
//! Each size gets a fresh control plane from `conformance/kube/up.sh` (kube-apiserver v1.36 + etcd,
//! `deploy/base` applied, loopback only) in `target/bench-agents-k8s` on ports of its own,
//! stopped at the end (also on an error, SIGINT or SIGTERM).
//!
//! Prints markdown tables: per agent per minute, requests and objects read (from each agent's
//! own metrics) and what the server read for them, against the cluster's size; the agents' start;
//! reclaim times after pod deletion, node deletion and node silence; recovery after the outage,
//! the request burst and what etcd and the watch cache served; duplicates and leaks. Then one
//! PASS/MISS line per bound of issue 22 (a miss does not fail the run; a duplicate, a freed live
//! address, a leak, a broken harness or server does).
//!
//!   make build && TETHER_BIN_DIR=target/x86_64-unknown-linux-musl/release \
//!     cargo run --release -p tether-conformance --bin bench-agents -- [options]
//!
//! Options: `--nodes 10,50,200`; `--pods-per-node 8`; `--window-s 120` (the steady window);
//! `--churn N` pod deletions in the window (default: one per live node); `--outage-s 60`;
//! `--grace-s 30` (agents' and controller's); `--node-lost-grace-s 60` (the shortest allowed);
//! `--podgc-s 40` (a deleted node's pods are deleted this long after it, as the pod GC
//! controller does); `--lost N` nodes deleted and as many silenced (default N/50, at least 1).
//! Env: TETHER_PEERS, TETHER_BIN_DIR, KUBECTL, BENCH_AGENTS_API_PORT / _ETCD_PORT /
//! _ETCD_PEER_PORT (38443 / 45790 / 45800).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tether_conformance::fleet::procs::Bins;
use tether_conformance::fleet::scenario::{self, OutageBy, Plan, Report, Setup};
use tether_conformance::{TempDir, capture, repo_root, target_dir, tether_binary};

struct Opts {
    nodes: Vec<usize>,
    pods_per_node: usize,
    window: Duration,
    churn: Option<usize>,
    outage: Duration,
    grace_s: u64,
    node_lost_grace_s: u64,
    podgc: Duration,
    lost: Option<usize>,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench-agents [--nodes 10,50,200] [--pods-per-node 8] [--window-s 120] [--churn N] [--outage-s 60] \
         [--grace-s 30] [--node-lost-grace-s 60] [--podgc-s 40] [--lost N]"
    );
    std::process::exit(2)
}

fn opts() -> Opts {
    let mut o = Opts {
        nodes: vec![10, 50, 200],
        pods_per_node: 8,
        window: Duration::from_secs(120),
        churn: None,
        outage: Duration::from_secs(60),
        grace_s: 30,
        node_lost_grace_s: 60,
        podgc: Duration::from_secs(40),
        lost: None,
    };
    let mut it = std::env::args().skip(1);
    let num =
        |v: Option<String>| -> u64 { v.and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()) };
    while let Some(k) = it.next() {
        match k.as_str() {
            "--nodes" => {
                o.nodes = it
                    .next()
                    .unwrap_or_else(|| usage())
                    .split(',')
                    .map(|s| s.trim().parse().unwrap_or_else(|_| usage()))
                    .collect()
            }
            "--pods-per-node" => o.pods_per_node = num(it.next()) as usize,
            "--window-s" => o.window = Duration::from_secs(num(it.next())),
            "--churn" => o.churn = Some(num(it.next()) as usize),
            "--outage-s" => o.outage = Duration::from_secs(num(it.next())),
            "--grace-s" => o.grace_s = num(it.next()),
            "--node-lost-grace-s" => o.node_lost_grace_s = num(it.next()),
            "--podgc-s" => o.podgc = Duration::from_secs(num(it.next())),
            "--lost" => o.lost = Some(num(it.next()) as usize),
            _ => usage(),
        }
    }
    if o.nodes.iter().any(|n| *n < 3) || o.pods_per_node == 0 {
        usage()
    }
    o
}

fn server_dir() -> PathBuf {
    target_dir().join("bench-agents-k8s")
}

/// TETHER_KUBE_* for conformance/kube/up.sh and down.sh: our directory and ports.
fn kube_env() -> Vec<(String, String)> {
    let mut env = vec![(
        "TETHER_KUBE_DIR".to_string(),
        server_dir().display().to_string(),
    )];
    for (ours, theirs, default) in [
        ("BENCH_AGENTS_API_PORT", "TETHER_KUBE_API_PORT", "38443"),
        ("BENCH_AGENTS_ETCD_PORT", "TETHER_KUBE_ETCD_PORT", "45790"),
        (
            "BENCH_AGENTS_ETCD_PEER_PORT",
            "TETHER_KUBE_ETCD_PEER_PORT",
            "45800",
        ),
    ] {
        env.push((
            theirs.into(),
            std::env::var(ours).unwrap_or_else(|_| default.into()),
        ));
    }
    env
}

fn stop_server() {
    let dir = server_dir();
    if !dir.exists() {
        return;
    }
    // down.sh --quiet: the logs of `make test`'s own server in target/conformance stay theirs.
    let logs = target_dir().join("bench-agents");
    let _ = std::fs::create_dir_all(&logs);
    for f in ["apiserver.log", "etcd.log"] {
        let _ = std::fs::copy(dir.join(f), logs.join(f));
    }
    let out = capture(
        Command::new(repo_root().join("conformance/kube/down.sh"))
            .arg("--quiet")
            .envs(kube_env()),
    );
    eprint!("{}", out.stderr);
}

/// The control plane of one size; stopped when dropped.
struct Server {
    kubeconfig: PathBuf,
}

impl Server {
    fn start() -> Result<Server, String> {
        // A machine busy with other work can miss up.sh's fixed readiness bounds: one more
        // attempt, said out loud, before giving up.
        for attempt in 1..=2 {
            stop_server();
            let out =
                capture(Command::new(repo_root().join("conformance/kube/up.sh")).envs(kube_env()));
            if out.success() {
                return Ok(Server {
                    kubeconfig: PathBuf::from(out.stdout.trim()),
                });
            }
            stop_server();
            if attempt == 2 {
                return Err(format!("conformance/kube/up.sh failed twice:\n{out}"));
            }
            eprintln!("bench-agents: conformance/kube/up.sh failed, trying once more:\n{out}");
        }
        unreachable!()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        stop_server();
    }
}

/// A signal stops the server (in a session of its own) first; the agents die with this process
/// (PR_SET_PDEATHSIG).
fn stop_server_on_signal() {
    tether_conformance::signals::on_termination(|sig| {
        eprintln!("bench-agents: signal {sig}: stopping the API server");
        stop_server();
    });
}

fn plan(o: &Opts, nodes: usize) -> Plan {
    let lost = o.lost.unwrap_or((nodes / 50).max(1));
    Plan {
        nodes,
        pods_per_node: o.pods_per_node,
        grace_s: o.grace_s,
        node_lost_grace_s: o.node_lost_grace_s,
        window: o.window,
        churn: o.churn.unwrap_or(nodes.saturating_sub(2 * lost)),
        deleted_nodes: lost,
        podgc_delay: o.podgc,
        silenced_nodes: lost,
        outage: o.outage,
        threads: 4,
        range: "10.160.0.0/16".into(),
        token_s: 4 * 3600,
    }
}

fn run_size(o: &Opts, bins: &Bins, nodes: usize) -> Result<Report, String> {
    eprintln!("bench-agents: {nodes} nodes: starting kube-apiserver + etcd");
    let server = Server::start()?;
    // Under /tmp: tether-ipam keeps its files only below /var/lib, /run or /tmp.
    let mut work = TempDir::new(&format!("bench-agents-n{nodes}"));
    let say = move |m: &str| eprintln!("bench-agents: {nodes} nodes: {m}");
    let p = plan(o, nodes);
    let setup = Setup {
        kubeconfig: &server.kubeconfig,
        bins: bins.clone(),
        dir: work.path(),
        prefix: "sim",
        outage: OutageBy::ApiServer(server_dir()),
        cleanup: false,
        say: &say,
    };
    let r = scenario::run(&p, &setup);
    drop(server);
    // Their logs are what tells why a figure was not seen within its bound.
    let unseen: Vec<String> = match &r {
        Ok(r) => r
            .outage
            .recovery
            .iter()
            .filter(|(_, d)| d.is_none())
            .map(|(n, _)| format!("the agent of {n} did not resume"))
            .chain(
                r.pod_reclaim
                    .iter()
                    .filter(|d| d.is_none())
                    .map(|_| "a pod's lease was not released".to_string()),
            )
            .chain(
                r.outage
                    .missed_pod_reclaim
                    .is_none()
                    .then(|| "the pod deleted on the return kept its lease".to_string()),
            )
            .collect(),
        Err(_) => vec!["the run failed".into()],
    };
    if !unseen.is_empty() {
        eprintln!(
            "bench-agents: {nodes} nodes: {}; the agents' and the controller's logs stay in {}",
            unseen.join("; "),
            work.keep().display()
        );
    }
    r
}

// ----- figures ----------------------------------------------------------------------------------

fn avg(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// `p50 / max` of durations in seconds; `-` for none; `NOT SEEN` if one was never seen.
fn spread(v: &[Option<Duration>]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    if v.iter().any(Option::is_none) {
        return format!(
            "NOT SEEN ({} of {})",
            v.iter().filter(|d| d.is_none()).count(),
            v.len()
        );
    }
    let mut s: Vec<f64> = v.iter().flatten().map(Duration::as_secs_f64).collect();
    s.sort_by(f64::total_cmp);
    format!("{:.1} / {:.1}", s[(s.len() - 1) / 2], s[s.len() - 1])
}

/// `0.6 s`, or `not seen` within its bound.
fn secs(d: Option<Duration>) -> String {
    d.map_or("not seen".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

fn worst(v: &[Option<Duration>]) -> Option<Duration> {
    if v.iter().any(Option::is_none) {
        return None;
    }
    v.iter().flatten().max().copied()
}

fn get(m: &std::collections::BTreeMap<String, f64>, k: &str) -> f64 {
    m.get(k).copied().unwrap_or(0.0)
}

fn print_tables(o: &Opts, rows: &[Report]) {
    let k = o.pods_per_node;
    println!(
        "### API cost per agent per minute, steady window ({} s, pods deleted and replaced meanwhile)",
        o.window.as_secs()
    );
    println!();
    println!(
        "Each agent's own `tether_api_requests_total` and `tether_api_objects_read_total` (LIST items and watch events \
         it received), over the window. The server columns are the API server's own counters over the same window \
         for every client (agents, controller, kubelets, the churn's ADDs), divided by the agents."
    );
    println!();
    println!(
        "| nodes | pods | agents | requests/min: avg (max) | objects read/min: avg (max) | of which pods / ipleases (avg) | pod deletions per agent | server, per agent/min: IPLeases scanned in the watch cache | server: objects read from etcd/min (all) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let req: Vec<f64> = r.steady.iter().map(|a| a.requests_per_min).collect();
        let obj: Vec<f64> = r.steady.iter().map(|a| a.objects_per_min).collect();
        let by = |res: &str| {
            avg(&r
                .steady
                .iter()
                .map(|a| get(&a.objects_per_min_by, res))
                .collect::<Vec<_>>())
        };
        let dels = avg(&r
            .steady
            .iter()
            .map(|a| a.deletions as f64)
            .collect::<Vec<_>>());
        let mins = r.window.as_secs_f64() / 60.0;
        let agents = r.steady.len().max(1) as f64;
        // (A sum of nothing is -0.0.)
        let etcd: f64 = r.window_server.storage.values().sum::<f64>() + 0.0;
        println!(
            "| {} | {} | {} | {:.1} ({:.1}) | {:.1} ({:.1}) | {:.1} / {:.1} | {dels:.1} | {:.0} | {:.0} |",
            r.nodes,
            r.nodes * k,
            r.steady.len(),
            avg(&req),
            max(&req),
            avg(&obj),
            max(&obj),
            by("pods"),
            by("ipleases"),
            get(&r.window_server.cache, "ipleases") / mins / agents,
            etcd / mins,
        );
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last())
        && rows.len() > 1
    {
        let ratio = |f: &dyn Fn(&Report) -> f64| {
            let a = f(first);
            if a > 0.0 {
                format!("x{:.2}", f(last) / a)
            } else {
                "-".into()
            }
        };
        let reqs = |r: &Report| {
            avg(&r
                .steady
                .iter()
                .map(|a| a.requests_per_min)
                .collect::<Vec<_>>())
        };
        let objs = |r: &Report| {
            avg(&r
                .steady
                .iter()
                .map(|a| a.objects_per_min)
                .collect::<Vec<_>>())
        };
        let scans = |r: &Report| {
            get(&r.window_server.cache, "ipleases")
                / (r.window.as_secs_f64() / 60.0)
                / r.steady.len().max(1) as f64
        };
        println!();
        println!(
            "From {} to {} nodes, per agent per minute: requests {}, objects read {}; IPLeases the server scans for it {}.",
            first.nodes,
            last.nodes,
            ratio(&reqs),
            ratio(&objs),
            ratio(&scans)
        );
    }

    println!();
    println!(
        "The controller (one, leading; `--metrics-addr` as the Deployment runs it), over the same window:"
    );
    println!();
    println!(
        "| nodes | requests/min | objects read/min | of which pods / ipleases / leases (heartbeats) |"
    );
    println!("|---:|---:|---:|---:|");
    for r in rows {
        let c = &r.controller_per_min;
        println!(
            "| {} | {:.1} | {:.0} | {:.0} / {:.0} / {:.0} |",
            r.nodes,
            c.requests,
            c.objects,
            get(&c.objects_by, "pods"),
            get(&c.objects_by, "ipleases"),
            get(&c.objects_by, "leases"),
        );
    }

    println!();
    println!("### The agents' start: until each one's first full pass");
    println!();
    println!(
        "| nodes | requests: avg (max) | objects read: avg (max) | of which pods (avg) | server, while they started: pods read from etcd | pods read from the watch cache | IPLeases scanned in the watch cache |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let req: Vec<f64> = r.start.iter().map(|(_, m)| m.requests).collect();
        let obj: Vec<f64> = r.start.iter().map(|(_, m)| m.objects).collect();
        let pods: Vec<f64> = r
            .start
            .iter()
            .map(|(_, m)| get(&m.objects_by, "pods"))
            .collect();
        println!(
            "| {} | {:.1} ({:.0}) | {:.1} ({:.0}) | {:.1} | {:.0} | {:.0} | {:.0} |",
            r.nodes,
            avg(&req),
            max(&req),
            avg(&obj),
            max(&obj),
            avg(&pods),
            get(&r.start_server.storage, "pods"),
            get(&r.start_server.cache, "pods"),
            get(&r.start_server.cache, "ipleases"),
        );
    }

    println!();
    println!(
        "### Reclaim: seconds until the lease is Released (p50 / max), seen on a watch of the IPLeases"
    );
    println!();
    println!(
        "| nodes | pod deleted (agent) | n | Node deleted, its pods {} s later (controller) | n | node silent: from its last heartbeat, grace {} s (controller) | n |",
        o.podgc.as_secs(),
        o.node_lost_grace_s
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let nodes: Vec<Option<Duration>> = r.node_reclaim.iter().map(|(d, _)| *d).collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.nodes,
            spread(&r.pod_reclaim),
            r.pod_reclaim.len(),
            spread(&nodes),
            nodes.len(),
            spread(&r.silence_reclaim),
            r.silence_reclaim.len()
        );
    }

    println!();
    println!(
        "### Outage: kube-apiserver killed for {} s (etcd kept), then started again",
        o.outage.as_secs()
    );
    println!();
    println!(
        "Times from the server answering `/readyz` again. An agent has resumed at its first clean pass after the \
         server started again (0 s when that was before `/readyz` said so). A pod is deleted as soon as the server \
         answers, while the agents still back off. Burst: what all agents sent and received in the first {} s. The \
         server's counters start at 0 with it: etcd columns are the objects it read from etcd to serve LISTs (its \
         watch caches' own fill is not in that counter), before it was ready and in the first 30 s; the watch cache \
         column what its clients made it scan there.",
        scenario::BURST_WINDOW.as_secs()
    );
    println!();
    println!(
        "| nodes | ready after start, s | every agent resumed, s: p50 / max | pod deleted on return, released after, s | burst: requests (per agent) | burst: objects read (per agent) | etcd, restart → ready: pods / IPLeases | etcd, first 30 s: pods / IPLeases | watch cache, first 30 s: pods / IPLeases |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let o = &r.outage;
        let rec: Vec<Option<Duration>> = o.recovery.iter().map(|(_, d)| *d).collect();
        let agents = o.recovery.len().max(1) as f64;
        let pair = |s: Option<&tether_conformance::fleet::api::ServerReads>, etcd: bool| match s {
            Some(s) => {
                let m = if etcd { &s.storage } else { &s.cache };
                format!("{:.0} / {:.0}", get(m, "pods"), get(m, "ipleases"))
            }
            None => "-".into(),
        };
        println!(
            "| {} | {:.1} | {} | {} | {:.0} ({:.1}) | {:.0} ({:.1}) | {} | {} | {} |",
            r.nodes,
            o.server_back_after.as_secs_f64(),
            spread(&rec),
            o.missed_pod_reclaim
                .map_or("NOT SEEN".into(), |d| format!("{:.1}", d.as_secs_f64())),
            o.burst.requests,
            o.burst.requests / agents,
            o.burst.objects,
            o.burst.objects / agents,
            pair(o.server_until_back.as_ref(), true),
            pair(o.server.as_ref(), true),
            pair(o.server.as_ref(), false),
        );
    }

    println!();
    println!("### Checks, from a consistent read of every IPLease at the end");
    println!();
    println!(
        "| nodes | pods made | addresses held by two live pods | live pods whose address was freed | leases still Leased to a pod that is gone | run, s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let made = r.nodes * r.pods_per_node + r.pod_reclaim.len();
        println!(
            "| {} | {made} | {} | {} | {} | {:.0} |",
            r.nodes,
            r.duplicates.len(),
            r.live_lost.len(),
            r.leaks.len(),
            r.total.as_secs_f64()
        );
    }

    println!();
    println!("### Targets (issue 22)");
    println!();
    let line = |ok: bool, what: String| println!("- {}: {what}", if ok { "PASS" } else { "MISS" });
    for r in rows {
        let pod = worst(&r.pod_reclaim);
        line(
            pod.is_some_and(|d| d <= Duration::from_secs(5)),
            format!(
                "{} nodes: a deleted pod's lease released within 5 s (max {})",
                r.nodes,
                secs(pod)
            ),
        );
        let node = worst(&r.node_reclaim.iter().map(|(d, _)| *d).collect::<Vec<_>>());
        line(
            node.is_some_and(|d| d <= Duration::from_secs(60)),
            format!(
                "{} nodes: a deleted node's leases within 60 s of the Node's deletion (max {})",
                r.nodes,
                secs(node)
            ),
        );
        let silent = worst(&r.silence_reclaim);
        let bound = Duration::from_secs(o.node_lost_grace_s + 30);
        line(
            silent.is_some_and(|d| d <= bound),
            format!(
                "{} nodes: a silent node's leases within its grace + 30 s ({} s; max {})",
                r.nodes,
                bound.as_secs(),
                secs(silent)
            ),
        );
        let rec = worst(
            &r.outage
                .recovery
                .iter()
                .map(|(_, d)| *d)
                .collect::<Vec<_>>(),
        );
        line(
            rec.is_some_and(|d| d <= Duration::from_secs(30)),
            format!(
                "{} nodes: every agent resumed within 30 s of the server's return (max {})",
                r.nodes,
                secs(rec)
            ),
        );
        line(
            r.duplicates.is_empty() && r.live_lost.is_empty() && r.leaks.is_empty(),
            format!(
                "{} nodes: 0 duplicates, 0 live addresses freed, 0 leaks",
                r.nodes
            ),
        );
    }
}

fn main() {
    let o = opts();
    // The server comes from conformance/kube/up.sh, which starts the peers' kube-apiserver.
    tether_conformance::paths::require_peers(
        "bench-agents",
        "the real kube-apiserver this benchmark runs",
    );
    stop_server_on_signal();
    let bins = Bins {
        tether: tether_binary("tether"),
        tether_ipam: tether_binary("tether-ipam"),
    };
    println!(
        "bench-agents: {} pods per node; steady window {} s; agents and controller --grace-s {}; controller \
         --node-lost-grace-s {}; outage {} s; binaries {}",
        o.pods_per_node,
        o.window.as_secs(),
        o.grace_s,
        o.node_lost_grace_s,
        o.outage.as_secs(),
        bins.tether
            .parent()
            .map(Path::display)
            .map(|d| d.to_string())
            .unwrap_or_default()
    );
    let mut rows = Vec::new();
    for &n in &o.nodes {
        match run_size(&o, &bins, n) {
            Ok(r) => rows.push(r),
            Err(e) => {
                eprintln!("bench-agents: {n} nodes: {e}");
                if !rows.is_empty() {
                    print_tables(&o, &rows);
                }
                std::process::exit(1);
            }
        }
    }
    print_tables(&o, &rows);
    let broken: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            r.duplicates
                .iter()
                .chain(&r.live_lost)
                .chain(&r.leaks)
                .map(move |x| format!("{} nodes: {x}", r.nodes))
        })
        .collect();
    if !broken.is_empty() {
        eprintln!("bench-agents: FAILED: {}", broken.join("; "));
        std::process::exit(1);
    }
}
