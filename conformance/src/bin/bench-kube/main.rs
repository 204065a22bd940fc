//! bench-kube: tether-ipam's Kubernetes store next to whereabouts, against a real kube-apiserver, in
//! one run, with what each ADD costs the machine.
//!
//! Starts a throw-away control plane with `k8s-up.sh` from the peers directory (etcd 3.4 and
//! kube-apiserver v1.36, loopback only, a private directory `target/bench-k8s` and ports of its
//! own), installs the IPLease CRD, deploy/base (service account, RBAC, the node-scope admission
//! policy) and whereabouts' CRDs, and stops it at the end (also on an error, a panic, SIGINT or
//! SIGTERM). tether-ipam runs as on a node: with the plugins' kubeconfig holding a token bound to
//! a Node, through the node-agent's lease service (`tether lease-service`, a process of its own)
//! or, in the rows that say so, straight to the API server. Every plugin is run as a runtime runs
//! it: one process per CNI call, the network config on stdin, Multus' CNI_ARGS; all allocate from
//! 10.128.0.0/16 (tether-ipam with `"probe": false`, so only the store is measured).
//!
//! 1. Rows (concurrency 1, 8, 32): N ADDs with distinct container IDs and pods, then a DEL of each,
//!    for tether-ipam through the agent, tether-ipam direct, and whereabouts. Allocations/s over
//!    the ADD phase's wall time, ADD and DEL p50/p99, failures, duplicate addresses among the
//!    row's ADDs, records still leased after the DELs, and the CPU per ADD of the plugin
//!    processes, the lease service, the API server and etcd (`/proc/<pid>/stat` and the reaped
//!    children's rusage around the phase). Every row starts from empty stores (and an empty node
//!    journal) and one unmeasured ADD+DEL; the plugins' order rotates by row.
//! 2. The ceiling (ceiling.rs): at each concurrency, the same server's rate of CREATEs of IPLeases
//!    like the ones tether-ipam writes, from keep-alive clients holding the node credential (the
//!    CRD and the node-scope admission policy in force), and tether-ipam's allocations/s as a
//!    fraction of it.
//! 3. The fallback row: tether-ipam through the agent at the highest concurrency, the agent
//!    stopped (SIGTERM, as a DaemonSet roll does) when half the ADDs have started.
//! 4. API requests per call: the server's `apiserver_request_total` (requests the API server makes
//!    to itself excluded) around the first ADD of the node in the network, then `--api-calls` - 1
//!    more ADDs, then as many DELs, at concurrency 1, for the plugin's resources.
//! 5. Scale: tether-ipam (through the agent) ADDs at concurrency 1 with no IPLease in the cluster,
//!    then with 20,000 created directly through the API (half in the measured network, on
//!    addresses of its range spread pseudo-randomly over it, half in another network).
//!
//! Prints markdown tables with the tether/whereabouts ratios and one PASS/MISS line per target of
//! issue 25 (a miss does not fail the run; a broken harness or server does). Per-call latencies go
//! to `$BENCH_SAMPLES_DIR` when set (`make bench`).
//!
//!   cargo build --release --bin tether-ipam --bin tether
//!   cargo run --release -p tether-conformance --bin bench-kube -- [options]
//!
//! Options: `--n N` ADDs per row (300); `--n-whereabouts N` (default: as `--n`); `--concurrency
//! 1,8,32`; `--cap-s S`: no new call starts in a phase after S seconds (120); `--api-calls N` (50);
//! `--scale-n N` ADDs per scale row (50); `--scale-leases N` (20000; 0 skips the scale rows);
//! `--ceiling-n N` measured CREATEs per concurrency for the ceiling (1000: a second or more at
//! the server's rate, unlike a row's few hundred ADDs; 0 skips);
//! `--keep`: leave the server running at the end (prints how to stop it).
//! Env: TETHER_PEERS (default `../shared/peers` from the repository root), TETHER_BIN_DIR, KUBECTL,
//! PEERS_API_PORT / PEERS_ETCD_PORT / PEERS_ETCD_PEER_PORT (default 36443 / 43790 / 43800).

mod ceiling;
mod phases;
mod prefill;
mod report;
mod server;

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_conformance::bench::record_samples;
use tether_conformance::{capture, repo_root, tether_binary};

use phases::{Kind, Meters, Phase, Plugin, Run, add_del, no_hook, run_phase, warm_up};
use server::{Agent, Counts, Kube, NODE, Server, delta};

const RANGE: &str = "10.128.0.0/16";
/// Network (config `name`) of the rows; the scale rows use their own two.
const NETWORK: &str = "bench";
const SCALE_NETWORK: &str = "bench-scale";
const OTHER_NETWORK: &str = "bench-other";
/// whereabouts keeps its objects in the kubeconfig context's namespace (k8s-up.sh: `default`).
const WB_NAMESPACE: &str = "default";
const WB_GROUP: &str = "/apis/whereabouts.cni.cncf.io/v1alpha1";
/// whereabouts' pool object for RANGE without a network_name.
const WB_POOL: &str = "10.128.0.0-16";
/// Plugins do not enter it: IPAM plugins never do, and tether-ipam needs it only to probe (off).
/// CNI requires the variable on ADD, so it is set, to a path that does not exist.
const NETNS: &str = "/var/run/netns/bench-kube-unused";

// ----- options ----------------------------------------------------------------------------------

struct Opts {
    n: usize,
    n_whereabouts: usize,
    concurrency: Vec<usize>,
    cap: Duration,
    api_calls: usize,
    scale_n: usize,
    scale_leases: usize,
    ceiling_n: usize,
    keep: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench-kube [--n 300] [--n-whereabouts N] [--concurrency 1,8,32] [--cap-s 120] \
         [--api-calls 50] [--scale-n 50] [--scale-leases 20000] [--ceiling-n 1000] [--keep]"
    );
    std::process::exit(2)
}

fn opts() -> Opts {
    let mut o = Opts {
        n: 300,
        n_whereabouts: 0,
        concurrency: vec![1, 8, 32],
        cap: Duration::from_secs(120),
        api_calls: 50,
        scale_n: 50,
        scale_leases: 20_000,
        ceiling_n: 1000,
        keep: false,
    };
    let mut it = std::env::args().skip(1);
    let num =
        |v: Option<String>| -> usize { v.and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()) };
    while let Some(k) = it.next() {
        match k.as_str() {
            "--n" => o.n = num(it.next()),
            "--n-whereabouts" => o.n_whereabouts = num(it.next()),
            "--concurrency" => {
                o.concurrency = it
                    .next()
                    .unwrap_or_else(|| usage())
                    .split(',')
                    .map(|s| s.trim().parse().unwrap_or_else(|_| usage()))
                    .collect()
            }
            "--cap-s" => o.cap = Duration::from_secs(num(it.next()) as u64),
            "--api-calls" => o.api_calls = num(it.next()),
            "--scale-n" => o.scale_n = num(it.next()),
            "--scale-leases" => o.scale_leases = num(it.next()),
            "--ceiling-n" => o.ceiling_n = num(it.next()),
            "--keep" => o.keep = true,
            _ => usage(),
        }
    }
    if o.n_whereabouts == 0 {
        o.n_whereabouts = o.n;
    }
    o
}

// ----- main -------------------------------------------------------------------------------------

pub struct Row {
    pub plugin: usize,
    pub concurrency: usize,
    pub add: Phase,
    pub del: Phase,
    pub left: usize,
}

/// Requests counted around one plugin's first ADD, its other ADDs and its DELs.
pub struct ApiRow {
    pub plugin: usize,
    pub first: Counts,
    pub adds: usize,
    pub add: Counts,
    pub dels: usize,
    pub del: Counts,
}

impl ApiRow {
    pub fn per_first(&self) -> f64 {
        self.first.values().sum::<f64>()
    }
    pub fn per_add(&self) -> f64 {
        self.add.values().sum::<f64>() / self.adds.max(1) as f64
    }
    pub fn per_del(&self) -> f64 {
        self.del.values().sum::<f64>() / self.dels.max(1) as f64
    }
}

pub struct ScaleRow {
    pub existing: usize,
    pub add: Phase,
    pub del: Phase,
    pub requests_per_add: f64,
    /// Duplicates among the ADDs plus ADDs handed a pre-existing lease's address.
    pub collisions: usize,
}

/// Where .ci/deps.sh builds the peers (conformance/peers/build.sh).
fn peers_bin_dir() -> String {
    std::env::var("PEERS_BIN_DIR").unwrap_or_else(|_| "/var/cache/tether-peers/bin".into())
}

fn main() {
    let o = opts();
    let peers = tether_conformance::paths::require_peers(
        "bench-kube",
        "the real kube-apiserver and whereabouts this benchmark runs",
    );
    server::stop_server_on_signal(
        peers.clone(),
        tether_conformance::target_dir().join("bench-k8s"),
    );
    let code = match run(&o, &peers) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("bench-kube: {e}");
            1
        }
    };
    std::process::exit(code);
}

/// The server, its pids and the lease service every measurement shares.
pub struct Bench {
    kube: Kube,
    meters: Meters,
    agent: Agent,
    plugins: [Plugin; 3],
    /// tether-ipam's dataDir (its node journal).
    data: std::path::PathBuf,
}

impl Bench {
    /// Empty stores for every plugin: the cluster's objects and this node's journal.
    fn reset(&self) -> Result<(), String> {
        self.kube.reset()?;
        match std::fs::remove_dir_all(&self.data) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("emptying {}: {e}", self.data.display()))
            }
            _ => Ok(()),
        }
    }

    /// Start (again) the node's lease service.
    fn start_agent(&mut self) -> Result<(), String> {
        let pid = self.agent.start()?;
        self.meters.agent.store(pid, Ordering::SeqCst);
        Ok(())
    }
}

fn run(o: &Opts, peers: &Path) -> Result<(), String> {
    let t0 = Instant::now();
    let bin_dir = peers_bin_dir();
    eprintln!(
        "bench-kube: starting etcd + kube-apiserver ({})",
        peers.display()
    );
    let server = Server::start(peers, o.keep)?;
    let wb_bin = Path::new(&bin_dir).join("whereabouts");
    if !wb_bin.is_file() {
        return Err(format!(
            "{} missing: .ci/deps.sh builds it (conformance/peers/build.sh)",
            wb_bin.display()
        ));
    }
    let crd = repo_root().join("deploy/crds/ipleases.yaml");
    server.kubectl(&["apply", "-f", &crd.display().to_string()])?;
    let wb_crds = peers.join("whereabouts-crds");
    server.kubectl(&["apply", "-f", &wb_crds.display().to_string()])?;
    server.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=60s",
    ])?;
    let kube = Kube::connect(&server.kubeconfig)?;
    kube.wait_listable(&[
        "/apis/ipam.tether.dev/v1alpha1/ipleases".into(),
        format!("{WB_GROUP}/namespaces/{WB_NAMESPACE}/ippools"),
        format!("{WB_GROUP}/namespaces/{WB_NAMESPACE}/overlappingrangeipreservations"),
        format!("/apis/coordination.k8s.io/v1/namespaces/{WB_NAMESPACE}/leases"),
    ])?;
    let versions = Versions::read(&kube, &wb_bin);

    // tether-ipam's node journal and the lease service's socket live in places the trusted-fs
    // checks accept (below /tmp; the checkout is not one), private to this run and emptied with
    // the cluster's objects.
    let scratch = std::env::temp_dir().join(format!("tether-bench-kube-{}", std::process::id()));
    let tether_data = scratch.join("data");
    std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
    let node_kc = server.node_kubeconfig(&repo_root(), &scratch.join("node.kubeconfig"))?;
    let wb_file = server.dir.join("whereabouts.conf");
    let wb_conf =
        json!({"datastore": "kubernetes", "kubernetes": {"kubeconfig": server.kubeconfig}});
    std::fs::write(&wb_file, wb_conf.to_string()).map_err(|e| e.to_string())?;
    let socket = scratch.join("run/leases.sock");
    let plugins = plugins(&tether_data, &node_kc, &socket, wb_bin, wb_file);
    let (apiserver, etcd) = server.pids()?;
    let mut b = Bench {
        kube,
        meters: Meters {
            apiserver,
            etcd,
            agent: AtomicU32::new(0),
        },
        agent: Agent::new(tether_binary("tether"), node_kc.clone(), socket),
        plugins,
        data: tether_data,
    };
    b.start_agent()?;
    versions.print(o, &b.plugins, &server);

    let rows = measure_rows(o, &b)?;
    let ceiling = measure_ceiling(o, &b, &node_kc)?;
    let fallback = measure_fallback(o, &mut b)?;
    let api = measure_api(o, &b)?;
    let scale = measure_scale(o, &b)?;
    report::report(
        o,
        &b.plugins,
        &rows,
        &ceiling,
        fallback.as_ref(),
        &api,
        &scale,
    );
    println!();
    println!(
        "bench-kube: {:.0} s in all, server start included; load average at the end: {}",
        t0.elapsed().as_secs_f64(),
        report::loadavg()
    );
    drop(b);
    drop(server);
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

/// tether-ipam through the agent, tether-ipam direct, whereabouts.
fn plugins(
    data: &Path,
    node_kc: &Path,
    socket: &Path,
    wb_bin: std::path::PathBuf,
    wb_file: std::path::PathBuf,
) -> [Plugin; 3] {
    let tether_conf = |data: std::path::PathBuf, kc: std::path::PathBuf| -> phases::Conf {
        Box::new(move |net: &str| {
            json!({"cniVersion": "1.0.0", "name": net, "type": "ipvlan", "ipam": {
                "type": "tether-ipam", "range": RANGE, "probe": false, "dataDir": data,
                "store": "kubernetes", "kubernetes": {"kubeconfig": kc}}})
            .to_string()
            .into_bytes()
        })
    };
    let node = ("NODE_NAME".to_string(), NODE.to_string());
    let lease_socket = |s: &str| ("TETHER_LEASE_SOCKET".to_string(), s.to_string());
    [
        Plugin {
            name: "tether-ipam (agent)",
            short: "agent",
            kind: Kind::Agent,
            bin: tether_binary("tether-ipam"),
            resources: &["ipleases"],
            conf: tether_conf(data.to_path_buf(), node_kc.to_path_buf()),
            env: vec![node.clone(), lease_socket(&socket.display().to_string())],
        },
        Plugin {
            name: "tether-ipam (direct)",
            short: "direct",
            kind: Kind::Direct,
            bin: tether_binary("tether-ipam"),
            resources: &["ipleases"],
            conf: tether_conf(data.to_path_buf(), node_kc.to_path_buf()),
            env: vec![node, lease_socket("")],
        },
        Plugin {
            name: "whereabouts",
            short: "wb",
            kind: Kind::Whereabouts,
            bin: wb_bin,
            resources: &["ippools", "overlappingrangeipreservations", "leases"],
            // log_level error: its default (debug, to stderr) would bill it for logging.
            conf: Box::new(move |net: &str| {
                json!({"cniVersion": "1.0.0", "name": net, "type": "ipvlan", "ipam": {
                    "type": "whereabouts", "range": RANGE, "log_level": "error",
                    "configuration_path": wb_file}})
                .to_string()
                .into_bytes()
            }),
            env: vec![],
        },
    ]
}

/// What ran, for the report's header.
struct Versions {
    server: String,
    etcd: String,
    whereabouts: String,
}

impl Versions {
    fn read(kube: &Kube, wb_bin: &Path) -> Versions {
        let server = kube
            .raw("GET", "/version")
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["gitVersion"].as_str().map(String::from))
            .unwrap_or_else(|| "?".into());
        let whereabouts = capture(Command::new(wb_bin).env_clear())
            .stderr
            .lines()
            .next()
            .unwrap_or("whereabouts ?")
            .to_string();
        let etcd = capture(Command::new("/usr/bin/etcd").arg("--version"))
            .stdout
            .lines()
            .next()
            .unwrap_or("?")
            .replace("etcd Version: ", "");
        Versions {
            server,
            etcd,
            whereabouts,
        }
    }

    fn print(&self, o: &Opts, plugins: &[Plugin; 3], server: &Server) {
        let build = if cfg!(debug_assertions) {
            "DEBUG build (use --release)"
        } else {
            "release build"
        };
        println!(
            "bench-kube: kube-apiserver {} + etcd {} on 127.0.0.1:{} (k8s-up.sh, no controllers; deploy/base applied), {build}",
            self.server, self.etcd, server.port
        );
        println!(
            "  tether-ipam: {} (\"store\": \"kubernetes\", \"probe\": false), the plugins' kubeconfig with a token bound to Node {NODE}; \
             through `tether lease-service` ({}) or direct",
            plugins[0].bin.display(),
            tether_binary("tether").display()
        );
        println!(
            "  whereabouts: {} ({})",
            plugins[2].bin.display(),
            self.whereabouts
        );
        println!(
            "  one process per CNI call, Multus CNI_ARGS, range {RANGE}; {} ADDs per row for tether-ipam, {} for whereabouts; no new call after {} s in a phase",
            o.n,
            o.n_whereabouts,
            o.cap.as_secs()
        );
        // The API server shares the machine's cores with the plugins (and anything else running).
        println!(
            "  {} cpus; load average at the start: {}",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            report::loadavg()
        );
    }
}

/// Rows: N ADDs then a DEL of each, per concurrency, every plugin, each from empty stores.
fn measure_rows(o: &Opts, b: &Bench) -> Result<Vec<Row>, String> {
    let mut rows: Vec<Row> = Vec::new();
    for (r, &c) in o.concurrency.iter().enumerate() {
        for k in 0..b.plugins.len() {
            let pi = (r + k) % b.plugins.len();
            let p = &b.plugins[pi];
            b.reset()?;
            warm_up(p, &format!("warm-c{c}-{}", p.short), NETWORK, &b.meters)?;
            let n = if p.is_tether() { o.n } else { o.n_whereabouts };
            let tag = format!("c{c}-{}", p.short);
            let run = Run {
                verb: "ADD",
                tag: &tag,
                network: NETWORK,
                concurrency: c,
                cap: o.cap,
                on_start: &no_hook,
            };
            let (add, del) = add_del(p, &run, n, &b.meters);
            let left = if p.is_tether() {
                b.kube.tether_leased(NETWORK)?
            } else {
                b.kube.whereabouts_allocated()?
            };
            record_samples("kube", &format!("{} ADD c{c}", p.name), &add.batch());
            record_samples("kube", &format!("{} DEL c{c}", p.name), &del.batch());
            rows.push(Row {
                plugin: pi,
                concurrency: c,
                add,
                del,
                left,
            });
        }
    }
    Ok(rows)
}

/// The ceiling at every concurrency of the rows, right after them: `--ceiling-n` CREATEs each, from
/// empty stores, deleted again.
fn measure_ceiling(
    o: &Opts,
    b: &Bench,
    node_kc: &Path,
) -> Result<Vec<ceiling::CeilingRow>, String> {
    let n = o.ceiling_n;
    let mut out = Vec::new();
    if n == 0 {
        return Ok(out);
    }
    for &c in &o.concurrency {
        b.reset()?;
        let row = ceiling::measure(node_kc, NETWORK, n, c, [b.meters.apiserver, b.meters.etcd])?;
        record_samples(
            "kube",
            &format!("IPLease CREATE (ceiling) c{c}"),
            &tether_conformance::bench::Batch {
                latencies: row.latencies.clone(),
                wall: row.wall,
                failures: vec![],
            },
        );
        out.push(row);
    }
    b.reset()?;
    Ok(out)
}

/// tether-ipam through the agent at the highest concurrency, the agent stopped when half the
/// ADDs have started (its DELs find it gone); started again after.
fn measure_fallback(o: &Opts, b: &mut Bench) -> Result<Option<Row>, String> {
    let Some(&c) = o.concurrency.iter().max() else {
        return Ok(None);
    };
    b.reset()?;
    let p = &b.plugins[0];
    warm_up(p, "warm-fallback", NETWORK, &b.meters)?;
    let half = o.n / 2;
    let agent = &b.agent;
    let stop_halfway = |k: usize| {
        if k == half {
            eprintln!(
                "  stopping the lease service (SIGTERM) as ADD {k} of {} starts",
                o.n
            );
            agent.signal_stop();
        }
    };
    let run = Run {
        verb: "ADD",
        tag: "fallback",
        network: NETWORK,
        concurrency: c,
        cap: o.cap,
        on_start: &stop_halfway,
    };
    let (add, del) = add_del(p, &run, o.n, &b.meters);
    let left = b.kube.tether_leased(NETWORK)?;
    record_samples(
        "kube",
        &format!("{} ADD c{c}, agent stopped halfway", p.name),
        &add.batch(),
    );
    b.agent.reap();
    b.start_agent()?;
    Ok(Some(Row {
        plugin: 0,
        concurrency: c,
        add,
        del,
        left,
    }))
}

/// API requests per call, uncontended: counted by the server around the node's first ADD in the
/// network (its journal empty), the other ADDs and the DELs, at concurrency 1.
fn measure_api(o: &Opts, b: &Bench) -> Result<Vec<ApiRow>, String> {
    let mut api: Vec<ApiRow> = Vec::new();
    if o.api_calls < 2 {
        return Ok(api);
    }
    for (pi, p) in b.plugins.iter().enumerate() {
        b.reset()?;
        // whereabouts' first call creates its pool; tether's first call is what is measured.
        if !p.is_tether() {
            warm_up(p, &format!("warm-api-{}", p.short), NETWORK, &b.meters)?;
        }
        let tag = format!("api-{}", p.short);
        // A request is counted as its handler returns, a moment after the client has the
        // answer: let the last one land before reading.
        let settle = || std::thread::sleep(Duration::from_millis(300));
        let run = Run {
            verb: "ADD",
            tag: &tag,
            network: NETWORK,
            concurrency: 1,
            cap: o.cap,
            on_start: &no_hook,
        };
        let m0 = b.kube.counts()?;
        let first = run_phase(p, &run, &[0], &b.meters);
        settle();
        let m1 = b.kube.counts()?;
        let ids: Vec<usize> = (1..o.api_calls).collect();
        let add = run_phase(p, &run, &ids, &b.meters);
        settle();
        let m2 = b.kube.counts()?;
        let started: Vec<usize> = std::iter::once(0)
            .chain(add.calls.iter().map(|c| ids[c.index]))
            .collect();
        let del_run = Run { verb: "DEL", ..run };
        let del = run_phase(p, &del_run, &started, &b.meters);
        settle();
        let m3 = b.kube.counts()?;
        if let Some(f) = first.first_failure() {
            return Err(format!("{}: the first ADD failed: {f}", p.name));
        }
        api.push(ApiRow {
            plugin: pi,
            first: delta(&m0, &m1, p.resources),
            adds: add.calls.len(),
            add: delta(&m1, &m2, p.resources),
            dels: del.calls.len(),
            del: delta(&m2, &m3, p.resources),
        });
    }
    Ok(api)
}

/// Scale: tether-ipam (through the agent) ADD latency with no IPLease in the cluster, then with
/// `--scale-leases`.
fn measure_scale(o: &Opts, b: &Bench) -> Result<Vec<ScaleRow>, String> {
    let mut scale: Vec<ScaleRow> = Vec::new();
    if o.scale_leases == 0 || o.scale_n == 0 {
        return Ok(scale);
    }
    let t = &b.plugins[0];
    let occupied = prefill::occupied_hosts(o.scale_leases / 2);
    for (k, existing) in [0, o.scale_leases].into_iter().enumerate() {
        b.reset()?;
        warm_up(t, &format!("warm-scale{k}"), SCALE_NETWORK, &b.meters)?;
        // The warm-up's released record goes; the journal it built stays, as on a node in
        // service (its first ADD in a network rebuilds the journal).
        b.kube.reset()?;
        if existing > 0 {
            let t1 = Instant::now();
            b.kube
                .create_all(prefill::prefill(&occupied, existing - occupied.len()), 64)?;
            let s = t1.elapsed().as_secs_f64();
            eprintln!(
                "  created {existing} IPLeases in {s:.1} s ({:.0}/s)",
                existing as f64 / s
            );
            // Measure the cluster holding them, not the server still digesting the burst.
            std::thread::sleep(Duration::from_secs(5));
        }
        let m0 = b.kube.counts()?;
        let ids: Vec<usize> = (0..o.scale_n).collect();
        let tag = format!("scale{existing}");
        let run = Run {
            verb: "ADD",
            tag: &tag,
            network: SCALE_NETWORK,
            concurrency: 1,
            cap: o.cap,
            on_start: &no_hook,
        };
        let add = run_phase(t, &run, &ids, &b.meters);
        std::thread::sleep(Duration::from_millis(300));
        let m1 = b.kube.counts()?;
        let started: Vec<usize> = add.calls.iter().map(|c| c.index).collect();
        let del = run_phase(t, &Run { verb: "DEL", ..run }, &started, &b.meters);
        let req: f64 =
            delta(&m0, &m1, t.resources).values().sum::<f64>() / add.calls.len().max(1) as f64;
        // A pre-existing lease handed out again counts as a duplicate, like two ADDs sharing one.
        let taken: HashSet<IpAddr> = if existing > 0 {
            occupied
                .iter()
                .map(|h| IpAddr::V4(prefill::host(*h)))
                .collect()
        } else {
            HashSet::new()
        };
        let collisions =
            add.duplicates() + add.addresses().iter().filter(|a| taken.contains(a)).count();
        record_samples(
            "kube",
            &format!("tether-ipam ADD c1 with {existing} IPLeases"),
            &add.batch(),
        );
        scale.push(ScaleRow {
            existing,
            add,
            del,
            requests_per_add: req,
            collisions,
        });
    }
    Ok(scale)
}
