//! Small helpers for the benchmark binaries (`bench-ipam`, `bench-probe`, `bench-kube`): run many
//! plugin calls at a given concurrency, time each one, and summarise.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Latencies of one batch and its wall time.
#[derive(Debug, Clone)]
pub struct Batch {
    pub latencies: Vec<Duration>,
    pub wall: Duration,
    pub failures: Vec<String>,
}

impl Batch {
    /// Calls per second over the wall time.
    pub fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64()
    }

    /// The `q`-quantile (0..=1) of the latencies, nearest rank.
    pub fn quantile(&self, q: f64) -> Duration {
        quantile(&self.latencies, q)
    }
}

/// Nearest-rank quantile of `v` (`q` in 0..=1); zero for an empty slice.
pub fn quantile(v: &[Duration], q: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    let mut s = v.to_vec();
    s.sort();
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// Keep a batch's latencies for the distribution chart in BENCHMARKS.md: when `BENCH_SAMPLES_DIR`
/// is set (by `make bench`), write them there as `<bench>__<label>.txt`, one millisecond value a line.
pub fn record_samples(bench: &str, label: &str, b: &Batch) {
    let Some(dir) = std::env::var_os("BENCH_SAMPLES_DIR") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let _ = std::fs::create_dir_all(&dir);
    let text: String = b
        .latencies
        .iter()
        .map(|d| format!("{:.3}\n", ms(*d)))
        .collect();
    let name = format!("{bench}__{}.txt", label.replace(['/', ' '], "_"));
    if let Err(e) = std::fs::write(dir.join(&name), text) {
        eprintln!("cannot keep samples {name}: {e}");
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One plugin call of [`run_calls`]: its index, how long the process took, and what it printed.
#[derive(Debug, Clone)]
pub struct Call {
    pub index: usize,
    pub latency: Duration,
    pub ok: bool,
    pub stdout: String,
}

/// Run `n` calls of `argv` (program and arguments, e.g. `ip netns exec <ns> <plugin>`) with
/// `concurrency` workers, one process per call. Call `i` gets the environment from `env(i)`
/// (nothing else but PATH) and `stdin` on standard input; it succeeds when it exits 0. No call
/// starts after `deadline` (calls under way finish), so fewer than `n` may run. Returns the calls
/// in completion order and the wall time.
pub fn run_calls(
    argv: &[String],
    n: usize,
    concurrency: usize,
    env: &(dyn Fn(usize) -> Vec<(String, String)> + Sync),
    stdin: &[u8],
    deadline: Option<Instant>,
) -> (Vec<Call>, Duration) {
    let next = AtomicUsize::new(0);
    let calls = Mutex::new(Vec::with_capacity(n));
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..concurrency.max(1) {
            s.spawn(|| {
                loop {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let mut c = Command::new(&argv[0]);
                    c.args(&argv[1..]);
                    c.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
                    for (k, v) in env(i) {
                        c.env(k, v);
                    }
                    c.stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped());
                    let t = Instant::now();
                    let mut child = c.spawn().expect("spawn plugin");
                    child.stdin.take().unwrap().write_all(stdin).unwrap();
                    let out = child.wait_with_output().unwrap();
                    let latency = t.elapsed();
                    calls.lock().unwrap().push(Call {
                        index: i,
                        latency,
                        ok: out.status.success(),
                        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                    });
                }
            });
        }
    });
    (calls.into_inner().unwrap(), start.elapsed())
}

/// [`run_calls`] without a deadline, summarised: latencies of the successful calls, stdout of
/// the failed ones.
pub fn run_batch(
    argv: &[String],
    n: usize,
    concurrency: usize,
    env: &(dyn Fn(usize) -> Vec<(String, String)> + Sync),
    stdin: &[u8],
) -> Batch {
    let (calls, wall) = run_calls(argv, n, concurrency, env, stdin, None);
    let (ok, failed): (Vec<Call>, Vec<Call>) = calls.into_iter().partition(|c| c.ok);
    Batch {
        latencies: ok.into_iter().map(|c| c.latency).collect(),
        wall,
        failures: failed.into_iter().map(|c| c.stdout).collect(),
    }
}
