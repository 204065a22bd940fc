//! bench-kube: tether-ipam's Kubernetes store next to whereabouts, against a real kube-apiserver, in
//! one run.
//!
//! Starts a throw-away control plane with `k8s-up.sh` from the peers directory (etcd 3.4 and
//! kube-apiserver v1.36, loopback only, a private directory `target/bench-k8s` and ports of its
//! own), installs the IPLease CRD and whereabouts' CRDs with kubectl, and stops it at the end (also
//! on an error, a panic, SIGINT or SIGTERM). Both plugins are run as a runtime runs them: one
//! process per CNI call, the network config on stdin, Multus' CNI_ARGS; both allocate from
//! 10.128.0.0/16 (tether-ipam with `"probe": false`, so only the store is measured).
//!
//! 1. Rows (concurrency 1, 8, 32): N ADDs with distinct container IDs and pods, then a DEL of each.
//!    Allocations/s over the ADD phase's wall time, ADD and DEL p50/p99, failures, duplicate
//!    addresses among the row's ADDs, records still leased after the DELs. Every row starts from
//!    empty stores and one unmeasured ADD+DEL per plugin; the plugins' order alternates by row.
//! 2. API requests per call: the server's `apiserver_request_total` (requests the API server makes
//!    to itself excluded) read before and after `--api-calls` ADDs, then as many DELs, at
//!    concurrency 1, for the plugin's resources.
//! 3. Scale: tether-ipam ADDs at concurrency 1 with no IPLease in the cluster, then with 20,000
//!    created directly through the API (half in the measured network, on addresses of its range
//!    spread pseudo-randomly over it, half in another network).
//!
//! Prints markdown tables with the tether/whereabouts ratios and one PASS/MISS line per target of
//! issue 11 (a miss does not fail the run; a broken harness or server does). Per-call latencies go
//! to `$BENCH_SAMPLES_DIR` when set (`make bench`).
//!
//!   cargo build --release --bin tether-ipam
//!   cargo run --release -p tether-conformance --bin bench-kube -- [options]
//!
//! Options: `--n N` ADDs per row (300); `--n-whereabouts N` (default: as `--n`); `--concurrency
//! 1,8,32`; `--cap-s S`: no new call starts in a phase after S seconds (120); `--api-calls N` (50);
//! `--scale-n N` ADDs per scale row (50); `--scale-leases N` (20000; 0 skips the scale rows);
//! `--keep`: leave the server running at the end (prints how to stop it).
//! Env: TETHER_PEERS (default `../shared/peers` from the repository root), TETHER_BIN_DIR, KUBECTL,
//! PEERS_API_PORT / PEERS_ETCD_PORT / PEERS_ETCD_PEER_PORT (default 36443 / 43790 / 43800).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use tether_conformance::bench::{Batch, Call, ms, quantile, record_samples, run_calls};
use tether_conformance::{capture, repo_root, target_dir, tether_binary};
use tether_kube_store::convert::time_text;
use tether_kube_store::crd::{NETWORK_LABEL, NODE_LABEL, label_value};
use tether_kube_store::{IPLease, IPLeaseSpec, LeasePhase, PodInfo, object_name};

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
    keep: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench-kube [--n 300] [--n-whereabouts N] [--concurrency 1,8,32] [--cap-s 120] \
         [--api-calls 50] [--scale-n 50] [--scale-leases 20000] [--keep]"
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
            "--keep" => o.keep = true,
            _ => usage(),
        }
    }
    if o.n_whereabouts == 0 {
        o.n_whereabouts = o.n;
    }
    o
}

// ----- the API server ---------------------------------------------------------------------------

/// The control plane k8s-up.sh started; k8s-down.sh stops exactly its processes on drop.
struct Server {
    peers: PathBuf,
    dir: PathBuf,
    kubeconfig: PathBuf,
    port: String,
    keep: bool,
}

/// PEERS_* for k8s-up.sh / k8s-down.sh: the private directory, and our ports unless overridden.
fn peers_env(dir: &Path) -> Vec<(String, String)> {
    let mut env = vec![("PEERS_DIR".to_string(), dir.display().to_string())];
    for (k, default) in [
        ("PEERS_API_PORT", "36443"),
        ("PEERS_ETCD_PORT", "43790"),
        ("PEERS_ETCD_PEER_PORT", "43800"),
    ] {
        env.push((
            k.into(),
            std::env::var(k).unwrap_or_else(|_| default.into()),
        ));
    }
    env
}

fn stop_server(peers: &Path, dir: &Path) {
    let out = capture(Command::new(peers.join("k8s-down.sh")).envs(peers_env(dir)));
    eprint!("{}", out.stderr);
}

impl Server {
    fn start(peers: &Path, keep: bool) -> Result<Server, String> {
        let dir = target_dir().join("bench-k8s");
        // A previous run killed with SIGKILL leaves the directory (and maybe processes) behind;
        // k8s-down.sh stops only the pids recorded there, so this never touches other clusters.
        if dir.exists() {
            stop_server(peers, &dir);
        }
        let env = peers_env(&dir);
        let port = env
            .iter()
            .find(|(k, _)| k == "PEERS_API_PORT")
            .unwrap()
            .1
            .clone();
        let server = Server {
            peers: peers.to_path_buf(),
            kubeconfig: dir.join("kubeconfig"),
            dir,
            port,
            keep,
        };
        // k8s-up.sh gives etcd a fixed 30 s to become healthy, which a machine busy with builds
        // can miss: one more attempt, said out loud, before giving up.
        for attempt in 1..=2 {
            let out = capture(Command::new(peers.join("k8s-up.sh")).envs(env.clone()));
            if out.success() {
                server.check_loopback_only()?;
                return Ok(server);
            }
            let logs = server.log_tails();
            stop_server(&server.peers, &server.dir);
            if attempt == 2 {
                return Err(format!("k8s-up.sh failed twice:\n{out}\n{logs}"));
            }
            eprintln!("bench-kube: k8s-up.sh failed, trying once more:\n{out}\n{logs}");
        }
        unreachable!()
    }

    /// The last lines of the servers' logs (k8s-down.sh removes them with the directory).
    fn log_tails(&self) -> String {
        ["etcd.log", "apiserver.log"]
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                format!(
                    "--- {f} (last lines) ---\n{}",
                    lines[lines.len().saturating_sub(15)..].join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Nothing of this server may listen beyond loopback: checked, not taken on trust.
    fn check_loopback_only(&self) -> Result<(), String> {
        for (_, port) in peers_env(&self.dir).into_iter().skip(1) {
            let out = capture(Command::new("ss").args(["-Hltn", &format!("sport = :{port}")]));
            for line in out.stdout.lines() {
                let local = line.split_whitespace().nth(3).unwrap_or("");
                if !local.starts_with("127.0.0.1:") {
                    return Err(format!(
                        "port {port} listens on {local}, not only on 127.0.0.1"
                    ));
                }
            }
        }
        Ok(())
    }

    fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let kubectl =
            std::env::var("KUBECTL").unwrap_or_else(|_| format!("{}/kubectl", peers_bin_dir()));
        let out = capture(
            Command::new(&kubectl)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args),
        );
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(format!("kubectl failed:\n{out}"))
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.keep {
            eprintln!(
                "--keep: the server is still running: export KUBECONFIG={}\n  stop it with: PEERS_DIR={} {}",
                self.kubeconfig.display(),
                self.dir.display(),
                self.peers.join("k8s-down.sh").display()
            );
        } else {
            stop_server(&self.peers, &self.dir);
        }
    }
}

/// A signal stops the server (in a session of its own) first.
fn stop_server_on_signal(peers: PathBuf, dir: PathBuf) {
    tether_conformance::signals::on_termination(move |sig| {
        eprintln!("bench-kube: signal {sig}: stopping the API server");
        if dir.exists() {
            stop_server(&peers, &dir);
        }
    });
}

// ----- the API, for the harness -----------------------------------------------------------------

/// Requests per (resource, verb), from `apiserver_request_total`.
type Counts = BTreeMap<(String, String), f64>;

/// A client of the server for what the harness itself does (never inside a measured window,
/// except for GET /metrics, which is not a resource request and so not counted).
struct Kube {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
}

impl Kube {
    fn connect(kubeconfig: &Path) -> Result<Kube, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let client = rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| e.to_string())?;
            kube::Client::try_from(cfg).map_err(|e| e.to_string())
        })?;
        Ok(Kube { rt, client })
    }

    fn raw(&self, method: &str, path: &str) -> Result<String, kube::Error> {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .body(Vec::new())
            .expect("a valid request");
        self.rt.block_on(self.client.request_text(req))
    }

    fn leases(&self) -> Api<IPLease> {
        Api::all(self.client.clone())
    }

    /// A CRD is Established a moment before the server can list it (a new resource's cache
    /// answers 429 "storage is (re)initializing" at first): wait until every path lists.
    fn wait_listable(&self, paths: &[String]) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for p in paths {
            loop {
                match self.raw("GET", &format!("{p}?limit=1")) {
                    Ok(_) => break,
                    Err(e) if Instant::now() > deadline => {
                        return Err(format!("cannot list {p}: {e}"));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(200)),
                }
            }
        }
        Ok(())
    }

    /// Counts of the requests clients made, per resource and verb.
    fn counts(&self) -> Result<Counts, String> {
        let text = self
            .raw("GET", "/metrics")
            .map_err(|e| format!("GET /metrics: {e}"))?;
        let mut c = Counts::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let l = tether_conformance::prometheus_text::parse_labels(labels);
            // The server's own loopback requests (its identity lease, bootstrap) are not a
            // plugin's; they carry system_client="kube-apiserver".
            if l.get("system_client").map(String::as_str) == Some("kube-apiserver") {
                continue;
            }
            let (Some(res), Some(verb)) = (l.get("resource"), l.get("verb")) else {
                continue;
            };
            if res.is_empty() {
                continue;
            }
            *c.entry((res.clone(), verb.clone())).or_default() +=
                value.trim().parse().unwrap_or(0.0);
        }
        Ok(c)
    }

    /// Empty stores in the cluster for both plugins: every IPLease, whereabouts' pools and
    /// reservations.
    fn reset(&self) -> Result<(), String> {
        let dp = DeleteParams::default();
        self.rt
            .block_on(self.leases().delete_collection(&dp, &ListParams::default()))
            .map_err(|e| format!("deleting IPLeases: {e}"))?;
        for r in ["ippools", "overlappingrangeipreservations"] {
            self.raw(
                "DELETE",
                &format!("{WB_GROUP}/namespaces/{WB_NAMESPACE}/{r}"),
            )
            .map_err(|e| format!("deleting {r}: {e}"))?;
        }
        Ok(())
    }

    /// IPLeases of `network` still in state Leased.
    fn tether_leased(&self, network: &str) -> Result<usize, String> {
        let lp = ListParams::default().labels(&format!("{NETWORK_LABEL}={}", label_value(network)));
        let list = self
            .rt
            .block_on(self.leases().list(&lp))
            .map_err(|e| e.to_string())?;
        Ok(list
            .items
            .iter()
            .filter(|l| l.spec.state == LeasePhase::Leased)
            .count())
    }

    /// Allocations still recorded in whereabouts' pool.
    fn whereabouts_allocated(&self) -> Result<usize, String> {
        match self.raw(
            "GET",
            &format!("{WB_GROUP}/namespaces/{WB_NAMESPACE}/ippools/{WB_POOL}"),
        ) {
            Ok(t) => {
                let v: Value = serde_json::from_str(&t).map_err(|e| e.to_string())?;
                Ok(v["spec"]["allocations"].as_object().map_or(0, |a| a.len()))
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(0),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Create `objs` with `parallel` requests in flight from one client (kubectl would send them
    /// one at a time, for many minutes). AlreadyExists counts as created; other errors are retried
    /// a few times (a server this busy may answer 429 or time out).
    fn create_all(&self, objs: Vec<IPLease>, parallel: usize) -> Result<(), String> {
        let objs = Arc::new(objs);
        let next = Arc::new(AtomicUsize::new(0));
        self.rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..parallel {
                let (api, objs, next) = (self.leases(), objs.clone(), next.clone());
                set.spawn(async move {
                    let pp = PostParams::default();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(o) = objs.get(i) else { return Ok(()) };
                        let mut tries = 0;
                        loop {
                            match api.create(&pp, o).await {
                                Ok(_) => break,
                                Err(kube::Error::Api(s)) if s.code == 409 => break,
                                Err(e) if tries >= 5 => {
                                    return Err(format!("creating IPLease: {e}"));
                                }
                                Err(_) => {
                                    tries += 1;
                                    tokio::time::sleep(Duration::from_millis(200 * tries)).await;
                                }
                            }
                        }
                    }
                });
            }
            while let Some(r) = set.join_next().await {
                r.map_err(|e| e.to_string())??;
            }
            Ok(())
        })
    }
}

/// `after - before` for `resources` only, zero entries dropped.
fn delta(before: &Counts, after: &Counts, resources: &[&str]) -> Counts {
    after
        .iter()
        .filter(|((r, _), _)| resources.contains(&r.as_str()))
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

// ----- plugins and phases -----------------------------------------------------------------------

/// The network config (stdin) of a plugin for a network name.
type Conf = Box<dyn Fn(&str) -> Vec<u8>>;

struct Plugin {
    name: &'static str,
    /// For container IDs and sample labels.
    short: &'static str,
    bin: PathBuf,
    /// The API resources its requests are counted on.
    resources: &'static [&'static str],
    conf: Conf,
}

impl Plugin {
    fn is_tether(&self) -> bool {
        self.short == "tether"
    }
}

/// One verb of one plugin over a set of calls.
struct Phase {
    calls: Vec<Call>,
    wall: Duration,
    planned: usize,
}

impl Phase {
    fn ok_latencies(&self) -> Vec<Duration> {
        self.calls
            .iter()
            .filter(|c| c.ok)
            .map(|c| c.latency)
            .collect()
    }
    fn failed(&self) -> usize {
        self.calls.iter().filter(|c| !c.ok).count()
    }
    /// Successful calls per second of wall time.
    fn rate(&self) -> f64 {
        self.ok_latencies().len() as f64 / self.wall.as_secs_f64()
    }
    fn q_ms(&self, q: f64) -> f64 {
        ms(quantile(&self.ok_latencies(), q))
    }
    fn capped(&self) -> bool {
        self.calls.len() < self.planned
    }
    /// The first address of each successful ADD's result.
    fn addresses(&self) -> Vec<IpAddr> {
        self.calls
            .iter()
            .filter(|c| c.ok)
            .filter_map(|c| {
                let v: Value = serde_json::from_str(&c.stdout).ok()?;
                let a = v["ips"][0]["address"].as_str()?;
                a.split('/').next()?.parse().ok()
            })
            .collect()
    }
    /// Successful ADDs whose address another successful ADD of the phase also got, plus those
    /// without an address in their result.
    fn duplicates(&self) -> usize {
        let a = self.addresses();
        let distinct: HashSet<_> = a.iter().collect();
        self.calls.iter().filter(|c| c.ok).count() - distinct.len()
    }
    fn batch(&self) -> Batch {
        Batch {
            latencies: self.ok_latencies(),
            wall: self.wall,
            failures: vec![],
        }
    }
    fn first_failure(&self) -> Option<&str> {
        self.calls.iter().find(|c| !c.ok).map(|c| c.stdout.trim())
    }
}

/// `ids` calls of `verb`: call `k` is attachment `ids[k]` of `tag` (container `<tag>-<id>`, pod
/// `pod-<tag>-<id>`), with Multus' CNI_ARGS. No call starts after `cap`.
fn run_phase(
    p: &Plugin,
    verb: &str,
    tag: &str,
    ids: &[usize],
    concurrency: usize,
    network: &str,
    cap: Duration,
) -> Phase {
    let stdin = (p.conf)(network);
    let cni_path = p.bin.parent().unwrap().display().to_string();
    let env = |k: usize| {
        let id = ids[k];
        let cid = format!("{tag}-{id:05}");
        let args = format!(
            "IgnoreUnknown=true;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{tag}-{id};\
             K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID=uid-{tag}-{id}"
        );
        vec![
            ("CNI_COMMAND".to_string(), verb.to_string()),
            ("CNI_CONTAINERID".to_string(), cid),
            ("CNI_NETNS".to_string(), NETNS.to_string()),
            ("CNI_IFNAME".to_string(), "net1".to_string()),
            ("CNI_PATH".to_string(), cni_path.clone()),
            ("CNI_ARGS".to_string(), args),
        ]
    };
    let argv = vec![p.bin.display().to_string()];
    let deadline = Instant::now() + cap;
    let (calls, wall) = run_calls(&argv, ids.len(), concurrency, &env, &stdin, Some(deadline));
    let phase = Phase {
        calls,
        wall,
        planned: ids.len(),
    };
    eprintln!(
        "  {:<11} {verb} c={concurrency:<3} {:>4} calls in {:>6.1} s, {} failed{}",
        p.name,
        phase.calls.len(),
        wall.as_secs_f64(),
        phase.failed(),
        if phase.capped() {
            " (time cap reached)"
        } else if tag.starts_with("warm") {
            " (warm-up, not measured)"
        } else {
            ""
        }
    );
    if let Some(f) = phase.first_failure() {
        eprintln!("    first failure: {f}");
    }
    phase
}

/// ADD then DEL of every attachment the ADD phase started.
fn add_del(
    p: &Plugin,
    tag: &str,
    n: usize,
    concurrency: usize,
    network: &str,
    cap: Duration,
) -> (Phase, Phase) {
    let ids: Vec<usize> = (0..n).collect();
    let add = run_phase(p, "ADD", tag, &ids, concurrency, network, cap);
    let started: Vec<usize> = add.calls.iter().map(|c| ids[c.index]).collect();
    let del = run_phase(p, "DEL", tag, &started, concurrency, network, cap);
    (add, del)
}

/// One unmeasured ADD and DEL: creates whereabouts' pool, loads the binary.
fn warm_up(p: &Plugin, tag: &str, network: &str) -> Result<(), String> {
    let (add, del) = add_del(p, tag, 1, 1, network, Duration::from_secs(150));
    match add.first_failure().or(del.first_failure()) {
        Some(f) => Err(format!("{}: warm-up call failed: {f}", p.name)),
        None => Ok(()),
    }
}

// ----- formatting -------------------------------------------------------------------------------

fn f_ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn f_ratio(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v >= 10.0 {
        format!("{v:.0}×")
    } else {
        format!("{v:.2}×")
    }
}

/// Per call, by resource: `ippools GET 1, PATCH 1; leases GET 2, PUT 3`.
fn breakdown(d: &Counts, calls: usize) -> String {
    let mut by_resource: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for ((r, verb), n) in d {
        let x = n / calls as f64;
        let x = if (x - x.round()).abs() < 0.005 {
            format!("{x:.0}")
        } else {
            format!("{x:.2}")
        };
        by_resource
            .entry(r)
            .or_default()
            .push(format!("{verb} {x}"));
    }
    let parts: Vec<String> = by_resource
        .into_iter()
        .map(|(r, verbs)| format!("{r} {}", verbs.join(", ")))
        .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join("; ")
    }
}

/// The 1, 5 and 15 minute load averages.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn pass(ok: bool) -> &'static str {
    if ok { "PASS" } else { "MISS" }
}

// ----- main -------------------------------------------------------------------------------------

struct Row {
    plugin: usize,
    concurrency: usize,
    add: Phase,
    del: Phase,
    left: usize,
}

/// Requests counted around one plugin's ADD phase and its DEL phase.
struct ApiRow {
    plugin: usize,
    adds: usize,
    add: Counts,
    dels: usize,
    del: Counts,
}

impl ApiRow {
    fn per_add(&self) -> f64 {
        self.add.values().sum::<f64>() / self.adds.max(1) as f64
    }
    fn per_del(&self) -> f64 {
        self.del.values().sum::<f64>() / self.dels.max(1) as f64
    }
}

struct ScaleRow {
    existing: usize,
    add: Phase,
    del: Phase,
    requests_per_add: f64,
    /// Duplicates among the ADDs plus ADDs handed a pre-existing lease's address.
    collisions: usize,
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
    stop_server_on_signal(peers.clone(), target_dir().join("bench-k8s"));
    let code = match run(&o, &peers) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("bench-kube: {e}");
            1
        }
    };
    std::process::exit(code);
}

fn run(o: &Opts, peers: &Path) -> Result<(), String> {
    let t0 = Instant::now();
    let tether_bin = tether_binary("tether-ipam");
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
    server.kubectl(&[
        "apply",
        "-f",
        &repo_root()
            .join("deploy/crds/ipleases.yaml")
            .display()
            .to_string(),
    ])?;
    server.kubectl(&[
        "apply",
        "-f",
        &peers.join("whereabouts-crds").display().to_string(),
    ])?;
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
    let server_version = kube
        .raw("GET", "/version")
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["gitVersion"].as_str().map(String::from))
        .unwrap_or_else(|| "?".into());
    let wb_version = capture(Command::new(&wb_bin).env_clear())
        .stderr
        .lines()
        .next()
        .unwrap_or("whereabouts ?")
        .to_string();
    let etcd_version = capture(Command::new("/usr/bin/etcd").arg("--version"))
        .stdout
        .lines()
        .next()
        .unwrap_or("?")
        .replace("etcd Version: ", "");

    let kc = server.kubeconfig.clone();
    // tether-ipam's node journal (which leases this node's attachments hold) lives under
    // dataDir: a private one, emptied with the cluster's objects, never the host's. Under /tmp:
    // tether-ipam keeps its files only below the places it trusts (/var/lib, /run, /tmp, ...),
    // and the server's own dir is in the checkout.
    let tether_data =
        std::env::temp_dir().join(format!("tether-bench-kube-{}", std::process::id()));
    let reset = || -> Result<(), String> {
        kube.reset()?;
        match std::fs::remove_dir_all(&tether_data) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("emptying {}: {e}", tether_data.display()))
            }
            _ => Ok(()),
        }
    };
    let data_dir = tether_data.clone();
    let wb_file = server.dir.join("whereabouts.conf");
    std::fs::write(
        &wb_file,
        json!({"datastore": "kubernetes", "kubernetes": {"kubeconfig": kc}}).to_string(),
    )
    .map_err(|e| e.to_string())?;
    let plugins = [
        Plugin {
            name: "tether-ipam",
            short: "tether",
            bin: tether_bin,
            resources: &["ipleases"],
            conf: Box::new(move |net: &str| {
                json!({"cniVersion": "1.0.0", "name": net, "type": "ipvlan", "ipam": {
                    "type": "tether-ipam", "range": RANGE, "probe": false, "dataDir": data_dir,
                    "store": "kubernetes", "kubernetes": {"kubeconfig": kc}}})
                .to_string()
                .into_bytes()
            }),
        },
        Plugin {
            name: "whereabouts",
            short: "wb",
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
        },
    ];

    let build = if cfg!(debug_assertions) {
        "DEBUG build (use --release)"
    } else {
        "release build"
    };
    println!(
        "bench-kube: kube-apiserver {server_version} + etcd {etcd_version} on 127.0.0.1:{} (k8s-up.sh, no controllers), {build}",
        server.port
    );
    println!(
        "  tether-ipam: {} (\"store\": \"kubernetes\", \"probe\": false)",
        plugins[0].bin.display()
    );
    println!("  whereabouts: {} ({wb_version})", plugins[1].bin.display());
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
        loadavg()
    );

    let rows = measure_rows(o, &kube, &plugins, &reset)?;
    let api = measure_api(o, &kube, &plugins, &reset)?;
    let scale = measure_scale(o, &kube, &plugins[0], &reset)?;
    report(o, &plugins, &rows, &api, &scale);
    println!();
    println!(
        "bench-kube: {:.0} s in all, server start included; load average at the end: {}",
        t0.elapsed().as_secs_f64(),
        loadavg()
    );
    drop(server);
    Ok(())
}

/// Rows: N ADDs then a DEL of each, per concurrency, both plugins, from empty stores.
fn measure_rows(
    o: &Opts,
    kube: &Kube,
    plugins: &[Plugin; 2],
    reset: &dyn Fn() -> Result<(), String>,
) -> Result<Vec<Row>, String> {
    let mut rows: Vec<Row> = Vec::new();
    for (r, &c) in o.concurrency.iter().enumerate() {
        reset()?;
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for pi in order {
            let p = &plugins[pi];
            warm_up(p, &format!("warm-c{c}-{}", p.short), NETWORK)?;
            let n = if p.is_tether() { o.n } else { o.n_whereabouts };
            let (add, del) = add_del(p, &format!("c{c}-{}", p.short), n, c, NETWORK, o.cap);
            let left = if p.is_tether() {
                kube.tether_leased(NETWORK)?
            } else {
                kube.whereabouts_allocated()?
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

/// API requests per call, uncontended: counted by the server around ADDs and DELs at concurrency 1.
fn measure_api(
    o: &Opts,
    kube: &Kube,
    plugins: &[Plugin; 2],
    reset: &dyn Fn() -> Result<(), String>,
) -> Result<Vec<ApiRow>, String> {
    let mut api: Vec<ApiRow> = Vec::new();
    if o.api_calls > 0 {
        for (pi, p) in plugins.iter().enumerate() {
            reset()?;
            warm_up(p, &format!("warm-api-{}", p.short), NETWORK)?;
            let ids: Vec<usize> = (0..o.api_calls).collect();
            let tag = format!("api-{}", p.short);
            // A request is counted as its handler returns, a moment after the client has the
            // answer: let the last one land before reading.
            let settle = || std::thread::sleep(Duration::from_millis(300));
            let m0 = kube.counts()?;
            let add = run_phase(p, "ADD", &tag, &ids, 1, NETWORK, o.cap);
            settle();
            let m1 = kube.counts()?;
            let started: Vec<usize> = add.calls.iter().map(|c| c.index).collect();
            let del = run_phase(p, "DEL", &tag, &started, 1, NETWORK, o.cap);
            settle();
            let m2 = kube.counts()?;
            api.push(ApiRow {
                plugin: pi,
                adds: add.calls.len(),
                add: delta(&m0, &m1, p.resources),
                dels: del.calls.len(),
                del: delta(&m1, &m2, p.resources),
            });
        }
    }

    Ok(api)
}

/// Scale: tether-ipam ADD latency with no IPLease in the cluster, then with `--scale-leases`.
fn measure_scale(
    o: &Opts,
    kube: &Kube,
    t: &Plugin,
    reset: &dyn Fn() -> Result<(), String>,
) -> Result<Vec<ScaleRow>, String> {
    let mut scale: Vec<ScaleRow> = Vec::new();
    if o.scale_leases > 0 && o.scale_n > 0 {
        let occupied = occupied_hosts(o.scale_leases / 2);
        for (k, existing) in [0, o.scale_leases].into_iter().enumerate() {
            reset()?;
            warm_up(t, &format!("warm-scale{k}"), SCALE_NETWORK)?;
            // The warm-up's released record goes; the journal it built stays, as on a node in
            // service (its first ADD in a network rebuilds the journal with a LIST).
            kube.reset()?;
            if existing > 0 {
                let t1 = Instant::now();
                kube.create_all(prefill(&occupied, existing - occupied.len()), 64)?;
                let s = t1.elapsed().as_secs_f64();
                eprintln!(
                    "  created {existing} IPLeases in {s:.1} s ({:.0}/s)",
                    existing as f64 / s
                );
                // Measure the cluster holding them, not the server still digesting the burst.
                std::thread::sleep(Duration::from_secs(5));
            }
            let m0 = kube.counts()?;
            let ids: Vec<usize> = (0..o.scale_n).collect();
            let tag = format!("scale{existing}");
            let add = run_phase(t, "ADD", &tag, &ids, 1, SCALE_NETWORK, o.cap);
            std::thread::sleep(Duration::from_millis(300));
            let m1 = kube.counts()?;
            let started: Vec<usize> = add.calls.iter().map(|c| c.index).collect();
            let del = run_phase(t, "DEL", &tag, &started, 1, SCALE_NETWORK, o.cap);
            let req: f64 =
                delta(&m0, &m1, t.resources).values().sum::<f64>() / add.calls.len().max(1) as f64;
            // A pre-existing lease handed out again counts as a duplicate, like two ADDs sharing one.
            let taken: HashSet<IpAddr> = if existing > 0 {
                occupied.iter().map(|h| IpAddr::V4(host(*h))).collect()
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
    }

    Ok(scale)
}

/// The markdown tables and the targets' PASS/MISS lines.
fn report(o: &Opts, plugins: &[Plugin; 2], rows: &[Row], api: &[ApiRow], scale: &[ScaleRow]) {
    println!();
    println!("### Allocations: N ADDs, one process each, then a DEL of each");
    println!();
    println!(
        "allocs/s: successful ADDs over the ADD phase's wall time. dup: successful ADDs whose address another ADD \
         of the row also got. leased after DEL: what the store still holds (tether: IPLeases in state Leased; \
         whereabouts: allocations in its IPPool)."
    );
    println!();
    println!(
        "| plugin | conc | ADDs | failed | dup | allocs/s | ADD p50 ms | ADD p99 ms | DEL p50 ms | DEL p99 ms | DEL failed | leased after DEL |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for r in rows {
        println!(
            "| {} | {} | {}{} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} |",
            plugins[r.plugin].name,
            r.concurrency,
            r.add.calls.len(),
            if r.add.capped() {
                format!(" of {} (cap)", r.add.planned)
            } else {
                String::new()
            },
            r.add.failed(),
            r.add.duplicates(),
            r.add.rate(),
            f_ms(r.add.q_ms(0.5)),
            f_ms(r.add.q_ms(0.99)),
            f_ms(r.del.q_ms(0.5)),
            f_ms(r.del.q_ms(0.99)),
            r.del.failed(),
            r.left
        );
    }
    let row = |pi: usize, c: usize| rows.iter().find(|r| r.plugin == pi && r.concurrency == c);
    println!();
    println!("### tether-ipam / whereabouts, same server, same run");
    println!();
    println!("| conc | allocs/s (higher is better) | ADD p50 | ADD p99 | DEL p50 | DEL p99 |");
    println!("|--:|--:|--:|--:|--:|--:|");
    for &c in &o.concurrency {
        let (Some(t), Some(w)) = (row(0, c), row(1, c)) else {
            continue;
        };
        let q = |f: &dyn Fn(&Row) -> f64| f_ratio(f(t) / f(w));
        println!(
            "| {c} | {} | {} | {} | {} | {} |",
            q(&|r| r.add.rate()),
            q(&|r| r.add.q_ms(0.5)),
            q(&|r| r.add.q_ms(0.99)),
            q(&|r| r.del.q_ms(0.5)),
            q(&|r| r.del.q_ms(0.99)),
        );
    }
    if !api.is_empty() {
        println!();
        println!(
            "### API requests per call: {} ADDs then {} DELs at concurrency 1 (server's apiserver_request_total)",
            o.api_calls, o.api_calls
        );
        println!();
        println!(
            "| plugin | per ADD | per DEL | ADD: resource verb per call | DEL: resource verb per call |"
        );
        println!("|---|--:|--:|---|---|");
        for a in api {
            println!(
                "| {} | {:.2} | {:.2} | {} | {} |",
                plugins[a.plugin].name,
                a.per_add(),
                a.per_del(),
                breakdown(&a.add, a.adds.max(1)),
                breakdown(&a.del, a.dels.max(1))
            );
        }
    }
    if !scale.is_empty() {
        println!();
        println!(
            "### Scale: tether-ipam, {} ADDs at concurrency 1 with IPLeases already in the cluster",
            o.scale_n
        );
        println!();
        println!(
            "Created through the API before the row, state Leased: {} in the measured network on addresses of its \
             range spread over it (the ADDs must skip those they meet), {} in another network. dup or taken: ADDs \
             handed an address another ADD or a pre-existing lease holds. requests per ADD: the server's count on \
             ipleases.",
            o.scale_leases / 2,
            o.scale_leases - o.scale_leases / 2
        );
        println!();
        println!(
            "| IPLeases | ADDs | failed | dup or taken | ADD p50 ms | ADD p99 ms | requests per ADD | DEL p50 ms | DEL p99 ms | DEL failed |"
        );
        println!("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        for s in scale {
            println!(
                "| {} | {}{} | {} | {} | {} | {} | {:.2} | {} | {} | {} |",
                s.existing,
                s.add.calls.len(),
                if s.add.capped() {
                    format!(" of {} (cap)", s.add.planned)
                } else {
                    String::new()
                },
                s.add.failed(),
                s.collisions,
                f_ms(s.add.q_ms(0.5)),
                f_ms(s.add.q_ms(0.99)),
                s.requests_per_add,
                f_ms(s.del.q_ms(0.5)),
                f_ms(s.del.q_ms(0.99)),
                s.del.failed(),
            );
        }
    }

    // Targets of issue 11.
    println!();
    println!("### Targets (issue 11)");
    println!();
    let cmax = o.concurrency.iter().copied().max().unwrap_or(1);
    match (row(0, cmax), row(1, cmax)) {
        (Some(t), Some(w)) => {
            let x = t.add.rate() / w.add.rate();
            println!(
                "- {}: allocations/s at {cmax}-way ≥ 20× whereabouts: {}",
                pass(x >= 20.0),
                f_ratio(x)
            );
        }
        _ => println!("- MISS: allocations/s ≥ 20× whereabouts: not measured"),
    }
    let t_rows: Vec<&Row> = rows.iter().filter(|r| r.plugin == 0).collect();
    let p99 = t_rows.iter().map(|r| r.add.q_ms(0.99)).fold(0.0, f64::max);
    println!(
        "- {}: tether-ipam ADD p99 ≤ 500 ms at every concurrency: worst {} ms",
        pass(p99 <= 500.0),
        f_ms(p99)
    );
    let dups: usize = t_rows.iter().map(|r| r.add.duplicates()).sum::<usize>()
        + scale.iter().map(|s| s.collisions).sum::<usize>();
    let fails: usize = t_rows.iter().map(|r| r.add.failed() + r.del.failed()).sum();
    println!(
        "- {}: tether-ipam duplicate addresses: {dups} (failed calls: {fails})",
        pass(dups == 0 && !t_rows.is_empty())
    );
    match api.iter().find(|a| a.plugin == 0) {
        Some(a) => {
            let (add, del) = (a.per_add(), a.per_del());
            println!(
                "- {}: ≤ 2 API requests per uncontended ADD: {add:.2}",
                pass(add <= 2.0)
            );
            println!(
                "- {}: ≤ 2 API requests per uncontended DEL: {del:.2}",
                pass(del <= 2.0)
            );
        }
        None => println!("- MISS: API requests per ADD/DEL: not measured (--api-calls 0)"),
    }
    match (scale.first(), scale.get(1)) {
        (Some(z), Some(big)) => {
            let x = big.add.q_ms(0.5) / z.add.q_ms(0.5);
            println!(
                "- {}: ADD p50 with {} IPLeases ≤ 1.2× ADD p50 with none: {} ({} ms vs {} ms)",
                pass(x <= 1.2),
                big.existing,
                f_ratio(x),
                f_ms(big.add.q_ms(0.5)),
                f_ms(z.add.q_ms(0.5))
            );
        }
        _ => println!("- MISS: ADD p50 with pre-existing leases: not measured (--scale-leases 0)"),
    }
}

// ----- pre-existing leases ----------------------------------------------------------------------

/// Host number `h` (1..=65534) of RANGE.
fn host(h: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + h)
}

/// `n` distinct host numbers of RANGE, spread over it pseudo-randomly and the same in every run,
/// as allocations from many pods' hashed starting points would be: the measured ADDs meet some
/// of them and must move on, as in a busy network.
fn occupied_hosts(n: usize) -> BTreeSet<u32> {
    let n = n.min(65_534);
    let mut set = BTreeSet::new();
    let mut x: u64 = 0x5eed;
    while set.len() < n {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        set.insert((z % 65_534) as u32 + 1);
    }
    set
}

/// IPLeases as tether-ipam writes them (crd.rs naming and labels), state Leased with a fake
/// holder: `occupied` in SCALE_NETWORK, and `others` more in OTHER_NETWORK.
fn prefill(occupied: &BTreeSet<u32>, others: usize) -> Vec<IPLease> {
    let since = time_text(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    let other_hosts = (1..=others.min(65_534) as u32).map(|h| (OTHER_NETWORK, h));
    occupied
        .iter()
        .map(|h| (SCALE_NETWORK, *h))
        .chain(other_hosts)
        .enumerate()
        .map(|(i, (network, h))| {
            let addr = host(h);
            let node = format!("prefill-node-{:02}", i % 50);
            let spec = IPLeaseSpec {
                network: network.to_string(),
                address: addr.to_string(),
                prefix_length: 16,
                range_index: Some(0),
                container_id: format!("prefill-{i:05}"),
                ifname: "net1".into(),
                pod: Some(PodInfo {
                    namespace: Some("prefill".into()),
                    name: Some(format!("pod-{i}")),
                    uid: Some(format!("uid-prefill-{i}")),
                }),
                node: Some(node.clone()),
                state: LeasePhase::Leased,
                since: since.clone(),
                released_at: None,
                quarantine: None,
            };
            let mut o = IPLease::new(&object_name(network, IpAddr::V4(addr)), spec);
            o.metadata.labels = Some(BTreeMap::from([
                (NETWORK_LABEL.to_string(), label_value(network)),
                (NODE_LABEL.to_string(), label_value(&node)),
            ]));
            o
        })
        .collect()
}
