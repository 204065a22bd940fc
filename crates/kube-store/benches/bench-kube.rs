//! `bench-kube`: allocation throughput and latency of the engine over the Kubernetes
//! store, against the in-repo API double (default) or a real cluster.
//!
//! ```text
//! cargo bench -p tether-kube-store --bench bench-kube -- \
//!     [--n 300] [--concurrency 1,8,32] [--latency-ms 0,2] [--mode fresh,reuse] [--kubeconfig PATH]
//! ```
//!
//! Each row: N ADDs with distinct container IDs on one /16 range, by `concurrency` threads.
//! `fresh` builds a new store (runtime, client, connection) for every ADD, as one tether-ipam
//! process per CNI call does; `reuse` keeps one store per thread. Requests per allocation come
//! from the stores' own counters (and the double's, which must agree). With `--kubeconfig` the
//! double is not started and `--latency-ms` is ignored; the bench's leases are deleted after each
//! row.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tether_apiserver_double::{ApiServerDouble, Options};
use tether_kube_store::{KubeSettings, KubeStore, RequestCounts};
use tether_leases::{
    AddRequest, Allocator, LeaseStore, NoProbe, PodRef, Policy, Scope, SystemClock,
};
use tether_pool::IpRange;

struct Args {
    n: usize,
    concurrency: Vec<usize>,
    latency_ms: Vec<f64>,
    modes: Vec<String>,
    kubeconfig: Option<String>,
}

fn list<T: std::str::FromStr>(s: &str) -> Vec<T> {
    s.split(',')
        .map(|x| x.trim().parse().unwrap_or_else(|_| usage()))
        .collect()
}

fn usage() -> ! {
    eprintln!(
        "usage: bench-kube [--n N] [--concurrency 1,8,32] [--latency-ms 0,2] [--mode fresh,reuse] [--kubeconfig PATH]"
    );
    std::process::exit(2)
}

fn args() -> Args {
    let mut a = Args {
        n: 300,
        concurrency: vec![1, 8, 32],
        latency_ms: vec![0.0, 2.0],
        modes: vec!["fresh".into(), "reuse".into()],
        kubeconfig: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().unwrap_or_else(|| usage());
        match k.as_str() {
            "--n" => a.n = v().parse().unwrap_or_else(|_| usage()),
            "--concurrency" => a.concurrency = list(&v()),
            "--latency-ms" => a.latency_ms = list(&v()),
            "--mode" => a.modes = list(&v()),
            "--kubeconfig" => a.kubeconfig = Some(v()),
            "--bench" => {} // added by `cargo bench`
            _ => usage(),
        }
    }
    if a.modes.iter().any(|m| m != "fresh" && m != "reuse") {
        usage();
    }
    a
}

struct Row {
    rate: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    counts: RequestCounts,
    double_requests: Option<u64>,
}

fn run(
    n: usize,
    conc: usize,
    fresh: bool,
    settings: &KubeSettings,
    network: &str,
) -> (Row, Vec<tether_leases::Lease>) {
    let range = IpRange::parse("10.128.0.0/16").unwrap();
    let next = AtomicUsize::new(0);
    let lat = Mutex::new(Vec::with_capacity(n));
    let counts = Mutex::new(RequestCounts::default());
    let add_all = |acc: &mut RequestCounts, c: RequestCounts| {
        acc.list += c.list;
        acc.get += c.get;
        acc.create += c.create;
        acc.update += c.update;
        acc.delete += c.delete;
    };
    let start = Instant::now();
    std::thread::scope(|sc| {
        for _ in 0..conc {
            sc.spawn(|| {
                let mut mine = Vec::new();
                let mut reused: Option<KubeStore> = None;
                let mut sum = RequestCounts::default();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let t0 = Instant::now();
                    let store_fresh;
                    let store: &KubeStore = if fresh {
                        store_fresh = KubeStore::connect(settings.clone()).expect("connect");
                        &store_fresh
                    } else {
                        let s = reused.get_or_insert_with(|| {
                            KubeStore::connect(settings.clone()).expect("connect")
                        });
                        s.restart_budget();
                        s
                    };
                    let before = store.requests();
                    let a = Allocator::new(
                        Scope::cluster(network),
                        vec![range.clone()],
                        Policy::default(),
                        store,
                        &NoProbe,
                        &SystemClock,
                    );
                    let req = AddRequest {
                        container_id: format!("bench-{network}-{i}"),
                        ifname: "net1".into(),
                        pod: PodRef::new("bench", format!("pod-{i}"), format!("uid-{i}")),
                        node: Some(format!("node-{}", i % 4)),
                        requested: vec![],
                    };
                    a.add(&req).unwrap_or_else(|e| panic!("ADD {i}: {e}"));
                    mine.push(t0.elapsed());
                    add_all(&mut sum, store.requests() - before);
                }
                lat.lock().unwrap().extend(mine);
                add_all(&mut counts.lock().unwrap(), sum);
            });
        }
    });
    let wall = start.elapsed();
    let mut l = lat.into_inner().unwrap();
    l.sort();
    let pct = |p: f64| l[((l.len() as f64 * p).ceil() as usize).clamp(1, l.len()) - 1];
    let row = Row {
        rate: n as f64 / wall.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        max: *l.last().unwrap(),
        counts: counts.into_inner().unwrap(),
        double_requests: None,
    };
    let check = KubeStore::connect(settings.clone()).expect("connect");
    let leases = check.list(&Scope::cluster(network)).expect("list");
    (row, leases)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let a = args();
    let dir = std::env::temp_dir().join(format!("tether-bench-kube-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    println!(
        "bench-kube: N={} ADDs per row, range 10.128.0.0/16, engine over tether-kube-store, {}",
        a.n,
        if a.kubeconfig.is_some() {
            "real cluster"
        } else {
            "API double (in-process, 2 worker threads)"
        }
    );
    println!(
        "{:>10} {:>5} {:>6} {:>10} {:>8} {:>8} {:>8} {:>10} {:>22} {:>8}",
        "latency",
        "conc",
        "mode",
        "allocs/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "req/alloc",
        "list/create/get/upd/del",
        "double"
    );
    let latencies = if a.kubeconfig.is_some() {
        vec![f64::NAN]
    } else {
        a.latency_ms.clone()
    };
    let mut row_no = 0;
    for lat in &latencies {
        for &conc in &a.concurrency {
            for mode in &a.modes {
                row_no += 1;
                let network = format!("bench-{}-{row_no}", std::process::id());
                let (double, kubeconfig) = match &a.kubeconfig {
                    Some(k) => (None, std::path::PathBuf::from(k)),
                    None => {
                        let d = ApiServerDouble::start_with(Options {
                            latency: Duration::from_secs_f64(lat / 1000.0),
                            ..Options::default()
                        })
                        .expect("start double");
                        let p = dir.join(format!("kubeconfig-{row_no}"));
                        d.write_kubeconfig(&p).unwrap();
                        (Some(d), p)
                    }
                };
                let settings = KubeSettings {
                    timeout: Duration::from_secs(30),
                    ..KubeSettings::with_kubeconfig(&kubeconfig)
                };
                let before = double.as_ref().map(|d| d.total("ipleases"));
                let (mut row, leases) = run(a.n, conc, mode == "fresh", &settings, &network);
                if let (Some(d), Some(b)) = (&double, before) {
                    row.double_requests = Some(d.total("ipleases") - b - 1); // minus the check list
                }
                let distinct: std::collections::HashSet<_> =
                    leases.iter().map(|l| l.address).collect();
                assert_eq!(distinct.len(), a.n, "every allocation got its own address");
                let c = row.counts;
                println!(
                    "{:>10} {:>5} {:>6} {:>10.0} {:>8.2} {:>8.2} {:>8.2} {:>10.2} {:>22} {:>8}",
                    if lat.is_nan() {
                        "cluster".to_string()
                    } else {
                        format!("{lat} ms")
                    },
                    conc,
                    mode,
                    row.rate,
                    ms(row.p50),
                    ms(row.p99),
                    ms(row.max),
                    c.total() as f64 / a.n as f64,
                    format!(
                        "{}/{}/{}/{}/{}",
                        c.list, c.create, c.get, c.update, c.delete
                    ),
                    row.double_requests
                        .map(|r| r.to_string())
                        .unwrap_or_else(|| "-".into()),
                );
                if a.kubeconfig.is_some() {
                    let s = KubeStore::connect(settings.clone()).expect("connect");
                    for l in leases {
                        s.restart_budget();
                        let _ = s.remove(&l);
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
