//! Plugins and phases: one verb of one plugin over a set of calls, each a process, with what the
//! calls cost the machine (CPU of the plugin processes, of the node-agent serving them, of the
//! API server and of etcd).

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tether_conformance::bench::{Batch, Call, ms, quantile, run_calls};
use tether_conformance::cpu;

use crate::NETNS;

/// The network config (stdin) of a plugin for a network name.
pub type Conf = Box<dyn Fn(&str) -> Vec<u8>>;

/// How a plugin reaches its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// tether-ipam through the node-agent's lease service (the shipped default).
    Agent,
    /// tether-ipam straight to the API server (no agent on the node).
    Direct,
    /// The reference.
    Whereabouts,
}

pub struct Plugin {
    pub name: &'static str,
    /// For container IDs and sample labels.
    pub short: &'static str,
    pub kind: Kind,
    pub bin: PathBuf,
    /// The API resources its requests are counted on.
    pub resources: &'static [&'static str],
    pub conf: Conf,
    /// Environment of every call beyond CNI's (the lease socket, the node's name).
    pub env: Vec<(String, String)>,
}

impl Plugin {
    pub fn is_tether(&self) -> bool {
        self.kind != Kind::Whereabouts
    }
}

/// CPU time spent, by whom.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    /// The plugin processes (reaped children).
    pub plugins: Duration,
    /// The node-agent's lease service.
    pub agent: Duration,
    pub apiserver: Duration,
    pub etcd: Duration,
}

impl Cpu {
    pub fn total(&self) -> Duration {
        self.plugins + self.agent + self.apiserver + self.etcd
    }
    fn minus(self, o: Cpu) -> Cpu {
        Cpu {
            plugins: self.plugins.saturating_sub(o.plugins),
            agent: self.agent.saturating_sub(o.agent),
            apiserver: self.apiserver.saturating_sub(o.apiserver),
            etcd: self.etcd.saturating_sub(o.etcd),
        }
    }
}

/// The processes whose CPU a phase is charged with.
pub struct Meters {
    pub apiserver: u32,
    pub etcd: u32,
    /// The running lease service's pid (0: none).
    pub agent: AtomicU32,
}

impl Meters {
    fn sample(&self) -> Cpu {
        let of = |pid: u32| {
            (pid != 0)
                .then(|| cpu::of_process(pid))
                .flatten()
                .unwrap_or_default()
        };
        Cpu {
            plugins: cpu::reaped_children(),
            agent: of(self.agent.load(Ordering::SeqCst)),
            apiserver: of(self.apiserver),
            etcd: of(self.etcd),
        }
    }
}

/// One verb of one plugin over a set of calls.
pub struct Phase {
    pub calls: Vec<Call>,
    pub wall: Duration,
    pub planned: usize,
    pub cpu: Cpu,
}

impl Phase {
    fn ok_latencies(&self) -> Vec<Duration> {
        self.calls
            .iter()
            .filter(|c| c.ok)
            .map(|c| c.latency)
            .collect()
    }
    pub fn ok(&self) -> usize {
        self.calls.iter().filter(|c| c.ok).count()
    }
    pub fn failed(&self) -> usize {
        self.calls.iter().filter(|c| !c.ok).count()
    }
    /// Successful calls per second of wall time.
    pub fn rate(&self) -> f64 {
        self.ok() as f64 / self.wall.as_secs_f64()
    }
    pub fn q_ms(&self, q: f64) -> f64 {
        ms(quantile(&self.ok_latencies(), q))
    }
    pub fn capped(&self) -> bool {
        self.calls.len() < self.planned
    }
    /// CPU milliseconds per successful call, by whom.
    pub fn cpu_ms(&self) -> [f64; 5] {
        let per = |d: Duration| d.as_secs_f64() * 1000.0 / self.ok().max(1) as f64;
        [
            per(self.cpu.plugins),
            per(self.cpu.agent),
            per(self.cpu.apiserver),
            per(self.cpu.etcd),
            per(self.cpu.total()),
        ]
    }
    /// The first address of each successful ADD's result.
    pub fn addresses(&self) -> Vec<IpAddr> {
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
    pub fn duplicates(&self) -> usize {
        let a = self.addresses();
        let distinct: HashSet<_> = a.iter().collect();
        self.ok() - distinct.len()
    }
    pub fn batch(&self) -> Batch {
        Batch {
            latencies: self.ok_latencies(),
            wall: self.wall,
            failures: vec![],
        }
    }
    pub fn first_failure(&self) -> Option<&str> {
        self.calls.iter().find(|c| !c.ok).map(|c| c.stdout.trim())
    }
}

/// What one phase runs.
pub struct Run<'a> {
    pub verb: &'a str,
    pub tag: &'a str,
    pub network: &'a str,
    pub concurrency: usize,
    /// No call starts after it.
    pub cap: Duration,
    /// Called as call `k` starts (the fallback row stops the agent halfway).
    pub on_start: &'a (dyn Fn(usize) + Sync),
}

/// `ids` calls of `run.verb`: call `k` is attachment `ids[k]` of `tag` (container `<tag>-<id>`,
/// pod `pod-<tag>-<id>`), with Multus' CNI_ARGS.
pub fn run_phase(p: &Plugin, run: &Run<'_>, ids: &[usize], meters: &Meters) -> Phase {
    let stdin = (p.conf)(run.network);
    let cni_path = p.bin.parent().unwrap().display().to_string();
    let (verb, tag, extra) = (run.verb, run.tag, &p.env);
    let env = |k: usize| {
        (run.on_start)(k);
        let id = ids[k];
        let cid = format!("{tag}-{id:05}");
        let args = format!(
            "IgnoreUnknown=true;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{tag}-{id};\
             K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID=uid-{tag}-{id}"
        );
        let mut e = vec![
            ("CNI_COMMAND".to_string(), verb.to_string()),
            ("CNI_CONTAINERID".to_string(), cid),
            ("CNI_NETNS".to_string(), NETNS.to_string()),
            ("CNI_IFNAME".to_string(), "net1".to_string()),
            ("CNI_PATH".to_string(), cni_path.clone()),
            ("CNI_ARGS".to_string(), args),
        ];
        e.extend(extra.iter().cloned());
        e
    };
    let argv = vec![p.bin.display().to_string()];
    let deadline = Instant::now() + run.cap;
    let before = meters.sample();
    let (calls, wall) = run_calls(
        &argv,
        ids.len(),
        run.concurrency,
        &env,
        &stdin,
        Some(deadline),
    );
    let cpu = meters.sample().minus(before);
    let phase = Phase {
        calls,
        wall,
        planned: ids.len(),
        cpu,
    };
    eprintln!(
        "  {:<21} {verb} c={:<3} {:>4} calls in {:>6.1} s, {} failed{}",
        p.name,
        run.concurrency,
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

/// Nothing to do as calls start.
pub fn no_hook(_: usize) {}

/// ADD then DEL of every attachment the ADD phase started.
pub fn add_del(p: &Plugin, add: &Run<'_>, n: usize, meters: &Meters) -> (Phase, Phase) {
    let ids: Vec<usize> = (0..n).collect();
    let added = run_phase(p, add, &ids, meters);
    let started: Vec<usize> = added.calls.iter().map(|c| ids[c.index]).collect();
    let del = Run {
        verb: "DEL",
        on_start: &no_hook,
        ..*add
    };
    let deleted = run_phase(p, &del, &started, meters);
    (added, deleted)
}

/// One unmeasured ADD and DEL: creates whereabouts' pool, loads the binary, builds tether's
/// journal.
pub fn warm_up(p: &Plugin, tag: &str, network: &str, meters: &Meters) -> Result<(), String> {
    let run = Run {
        verb: "ADD",
        tag,
        network,
        concurrency: 1,
        cap: Duration::from_secs(150),
        on_start: &no_hook,
    };
    let (add, del) = add_del(p, &run, 1, meters);
    match add.first_failure().or(del.first_failure()) {
        Some(f) => Err(format!("{}: warm-up call failed: {f}", p.name)),
        None => Ok(()),
    }
}
