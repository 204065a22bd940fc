//! The processes of a simulated cluster: one `tether node-agent` per node (with that node's
//! credential, its own directories, metrics on a port of its own), the `tether controller`, and,
//! for a real outage, the API server itself (killed and started again with the same command).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::nodes::AGENT_NS;

/// The tether binaries to run.
#[derive(Debug, Clone)]
pub struct Bins {
    /// `tether` (node-agent, controller).
    pub tether: PathBuf,
    /// `tether-ipam` (the CNI plugin the harness runs ADDs with).
    pub tether_ipam: PathBuf,
}

/// A child process killed (SIGKILL, as a node dies) and reaped when dropped.
pub struct Proc {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    /// Spawn `cmd`, its stderr into `log`. It dies with the thread that spawned it
    /// (PR_SET_PDEATHSIG), so an interrupted run leaves no agent behind.
    fn spawn(cmd: &mut Command, log: PathBuf) -> Result<Proc, String> {
        let f = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        // SAFETY: prctl(2) only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
        Ok(Proc {
            child: Some(child),
            log,
        })
    }

    /// Kill it now.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Still running?
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Where it serves its metrics, from its log ("serving metrics on http://ADDR/metrics").
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().find_map(|l| {
            let rest = l.split("serving metrics on http://").nth(1)?;
            rest.split('/').next()?.parse().ok()
        })
    }

    /// The last lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What one node-agent is given.
pub struct AgentSpec<'a> {
    pub node: &'a str,
    /// Its private directory (CNI bin dir, plugin kubeconfig, file store, service account).
    pub dir: &'a Path,
    /// The kubeconfig its reconciler uses (the node credential; maybe through a proxy).
    pub kubeconfig: &'a Path,
    /// The node's bound token and the server's CA (PEM): its "service account mount".
    pub token: &'a str,
    pub ca_pem: &'a [u8],
    /// `host:port` of the API server as the pod sees it (`KUBERNETES_SERVICE_HOST`/`_PORT`).
    pub service: (&'a str, u16),
    /// Placeholder `tether-ipvlan` and `tether-ipam` it installs into its CNI bin dir (what is
    /// measured is the reconciler, not the copy of two real binaries per node).
    pub source_dir: &'a Path,
    pub grace_s: u64,
}

/// A running `tether node-agent`, its metrics address once it serves them.
pub struct Agent {
    pub node: String,
    pub proc: Proc,
    pub metrics: Option<SocketAddr>,
}

impl Agent {
    /// Start it with the DaemonSet's flags (deploy/base/daemonset.yaml: `--no-sweep`,
    /// metrics on), the reconciler's other defaults, and `grace_s`.
    pub fn start(bins: &Bins, s: &AgentSpec<'_>) -> Result<Agent, String> {
        let sa = s.dir.join("serviceaccount");
        std::fs::create_dir_all(&sa).map_err(|e| e.to_string())?;
        std::fs::write(sa.join("token"), s.token).map_err(|e| e.to_string())?;
        std::fs::write(sa.join("ca.crt"), s.ca_pem).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&bins.tether);
        cmd.arg("node-agent")
            .arg("--cni-bin-dir")
            .arg(s.dir.join("cni-bin"))
            .arg("--kubeconfig-out")
            .arg(s.dir.join("net.d/tether.d/tether.kubeconfig"))
            .arg("--data-dir")
            .arg(s.dir.join("data"))
            .arg("--source-dir")
            .arg(s.source_dir)
            .arg("--service-account-dir")
            .arg(&sa)
            .arg("--kubeconfig")
            .arg(s.kubeconfig)
            .args([
                "--node",
                s.node,
                "--no-sweep",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            // Its lease service on a socket of its own, not the host's /run/tether (the
            // harness's ADDs go straight to the API: what is measured here is the reconciler).
            .arg("--lease-socket")
            .arg(s.dir.join("run/leases.sock"))
            .arg("--call-spool")
            .arg(s.dir.join("run/calls"))
            .args([
                "--grace-s",
                &s.grace_s.to_string(),
                "--agent-namespace",
                AGENT_NS,
            ])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("NODE_NAME", s.node)
            .env("POD_NAMESPACE", AGENT_NS)
            .env("KUBERNETES_SERVICE_HOST", s.service.0)
            .env("KUBERNETES_SERVICE_PORT", s.service.1.to_string());
        Ok(Agent {
            node: s.node.to_string(),
            proc: Proc::spawn(&mut cmd, s.dir.join("agent.log"))?,
            metrics: None,
        })
    }

    /// Its metrics address, once it serves them.
    pub fn find_metrics(&mut self) -> Option<SocketAddr> {
        if self.metrics.is_none() {
            self.metrics = self.proc.metrics_addr();
        }
        self.metrics
    }

    pub fn scrape(&mut self) -> Result<Metrics, String> {
        let addr = self
            .find_metrics()
            .ok_or_else(|| format!("agent of {} serves no metrics yet", self.node))?;
        scrape(addr).map_err(|e| format!("agent of {}: {e}", self.node))
    }
}

/// What the harness reads of an agent's metrics (docs/monitoring.md).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// `tether_api_requests_total`, every verb.
    pub requests: f64,
    /// `tether_api_objects_read_total`, every resource.
    pub objects: f64,
    pub objects_by: BTreeMap<String, f64>,
    /// `tether_reconcile_last_success_timestamp_seconds`.
    pub last_success: Option<f64>,
    /// `tether_api_errors_total`, every verb and code.
    pub errors: f64,
    /// `tether_reconcile_passes_total{kind="full"}`.
    pub full_passes: f64,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let mut m = Metrics::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((key, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match key.split_once('{') {
                Some((n, l)) => (n, super::api::parse_labels(l.trim_end_matches('}'))),
                None => (key, BTreeMap::new()),
            };
            match name {
                "tether_api_requests_total" => m.requests += v,
                "tether_api_errors_total" => m.errors += v,
                "tether_api_objects_read_total" => {
                    m.objects += v;
                    *m.objects_by
                        .entry(labels.get("resource").cloned().unwrap_or_default())
                        .or_default() += v;
                }
                "tether_reconcile_last_success_timestamp_seconds" => m.last_success = Some(v),
                "tether_reconcile_passes_total"
                    if labels.get("kind").map(String::as_str) == Some("full") =>
                {
                    m.full_passes += v
                }
                _ => {}
            }
        }
        m
    }

    /// Counts since `before` (the same process).
    pub fn since(&self, before: &Metrics) -> Metrics {
        Metrics {
            requests: self.requests - before.requests,
            objects: self.objects - before.objects,
            objects_by: self
                .objects_by
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v - before.objects_by.get(k).copied().unwrap_or(0.0),
                    )
                })
                .collect(),
            last_success: self.last_success,
            errors: self.errors - before.errors,
            full_passes: self.full_passes - before.full_passes,
        }
    }
}

/// GET http://addr/metrics (bounded: 5 s).
pub fn scrape(addr: SocketAddr) -> Result<Metrics, String> {
    let t = Duration::from_secs(5);
    let mut c = TcpStream::connect_timeout(&addr, t).map_err(|e| format!("{addr}: {e}"))?;
    c.set_read_timeout(Some(t)).map_err(|e| e.to_string())?;
    c.set_write_timeout(Some(t)).map_err(|e| e.to_string())?;
    write!(
        c,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("{addr}: {e}"))?;
    let mut text = String::new();
    c.read_to_string(&mut text)
        .map_err(|e| format!("{addr}: {e}"))?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}: no HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{addr}: {}", head.lines().next().unwrap_or("")));
    }
    Ok(Metrics::parse(body))
}

/// [`scrape`] each of `addrs`, many at once (an agent's metrics server answers one connection at
/// a time, within 100 ms: 200 agents one after the other would take seconds).
pub fn scrape_many(addrs: &[SocketAddr]) -> Vec<Result<Metrics, String>> {
    let out: Vec<std::sync::Mutex<Option<Result<Metrics, String>>>> =
        addrs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|sc| {
        for _ in 0..addrs.len().clamp(1, 32) {
            sc.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(a) = addrs.get(i) else { return };
                    *out[i].lock().unwrap() = Some(scrape(*a));
                }
            });
        }
    });
    out.into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap()
                .unwrap_or_else(|| Err("not scraped".into()))
        })
        .collect()
}

/// Start `tether controller` as the Deployment runs it (deploy/base/controller.yaml: passes every
/// 60 s, metrics served), as replica `identity`, with `grace_s` and `node_lost_grace_s`.
pub fn start_controller(
    bins: &Bins,
    kubeconfig: &Path,
    identity: &str,
    grace_s: u64,
    node_lost_grace_s: u64,
    log: PathBuf,
) -> Result<Proc, String> {
    let mut cmd = Command::new(&bins.tether);
    cmd.args([
        "controller",
        "--interval-s",
        "60",
        "--grace-s",
        &grace_s.to_string(),
    ])
    .args(["--node-lost-grace-s", &node_lost_grace_s.to_string()])
    .args(["--metrics-addr", "127.0.0.1:0"])
    .args(["--agent-namespace", AGENT_NS, "--kubeconfig"])
    .arg(kubeconfig)
    .env_clear()
    .env("PATH", "/usr/bin:/bin")
    .env("POD_NAME", identity)
    .env("POD_NAMESPACE", AGENT_NS);
    Proc::spawn(&mut cmd, log)
}

/// The API server that `conformance/kube/up.sh` (the peers' k8s-up.sh) started in `dir`, for a
/// real outage: killed, etcd left running, and started again with the very same command line,
/// its pid written back where down.sh looks for it.
pub struct ApiServerProcess {
    dir: PathBuf,
    argv: Vec<String>,
}

impl ApiServerProcess {
    pub fn new(dir: &Path) -> ApiServerProcess {
        ApiServerProcess {
            dir: dir.to_path_buf(),
            argv: Vec::new(),
        }
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join("kube-apiserver.pid")
    }

    /// The server's pid and command line, checked to be a kube-apiserver.
    fn running(&self) -> Result<(i32, Vec<String>), String> {
        let pid: i32 = std::fs::read_to_string(self.pid_file())
            .map_err(|e| format!("{}: {e}", self.pid_file().display()))?
            .trim()
            .parse()
            .map_err(|e| format!("{}: {e}", self.pid_file().display()))?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map_err(|e| format!("kube-apiserver pid {pid}: {e}"))?;
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if !argv.first().is_some_and(|a| a.ends_with("kube-apiserver")) {
            return Err(format!("pid {pid} is not a kube-apiserver: {argv:?}"));
        }
        Ok((pid, argv))
    }

    /// SIGSTOP the API server: how an overloaded server or a stalled etcd looks from a node
    /// (connections accepted, nothing answered; what was sent runs when it resumes). It resumes
    /// when the guard is resumed or dropped, so a failing test never leaves it stopped.
    pub fn pause(&self) -> Result<Paused, String> {
        let (pid, _) = self.running()?;
        // SAFETY: a plain kill(2) of a pid this run's server directory names (checked above).
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        Ok(Paused { pid })
    }

    /// SIGKILL the API server (a crash: no graceful drain) and wait until it is gone.
    pub fn kill(&mut self) -> Result<(), String> {
        let (pid, argv) = self.running()?;
        self.argv = argv;
        // SAFETY: a plain kill(2) of a pid this run's server directory names (checked above).
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(30);
        // Gone, or a zombie of ours (a server restarted earlier by this run is our child).
        while std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty()) {
            if Instant::now() > deadline {
                return Err(format!(
                    "kube-apiserver pid {pid} still runs 30 s after SIGKILL"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Start it again, in a session of its own like k8s-up.sh does (so it outlives this
    /// process until down.sh stops it), appending to its log.
    pub fn start(&mut self) -> Result<(), String> {
        let (prog, args) = self
            .argv
            .split_first()
            .ok_or("the API server was not killed by this run: no command line to start")?;
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.dir.join("apiserver.log"))
            .map_err(|e| e.to_string())?;
        let mut cmd = Command::new(prog);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        // SAFETY: setsid(2) only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| format!("{prog}: {e}"))?;
        std::fs::write(self.pid_file(), format!("{}\n", child.id())).map_err(|e| e.to_string())?;
        // Reap it whenever it ends (down.sh stops it), so it never lingers as a zombie.
        std::thread::spawn(move || {
            let _ = child.wait();
        });
        Ok(())
    }
}

/// A stopped API server (see [`ApiServerProcess::pause`]).
pub struct Paused {
    pid: i32,
}

impl Paused {
    /// SIGCONT: the server runs what it had received meanwhile.
    pub fn resume(self) {}
}

impl Drop for Paused {
    fn drop(&mut self) {
        // SAFETY: a plain kill(2) of the pid stopped by `pause`.
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_metrics_are_summed() {
        let text = "# HELP x\n\
            tether_api_requests_total{verb=\"list\"} 7\n\
            tether_api_requests_total{verb=\"get\"} 3\n\
            tether_api_objects_read_total{resource=\"pods\"} 12\n\
            tether_api_objects_read_total{resource=\"ipleases\"} 4\n\
            tether_api_errors_total{verb=\"list\",code=\"429\"} 2\n\
            tether_reconcile_passes_total{kind=\"full\"} 1\n\
            tether_reconcile_passes_total{kind=\"event\"} 4\n\
            tether_reconcile_last_success_timestamp_seconds 1700000000\n";
        let m = Metrics::parse(text);
        assert_eq!((m.requests, m.objects, m.errors), (10.0, 16.0, 2.0));
        assert_eq!(m.objects_by.get("pods"), Some(&12.0));
        assert_eq!(m.last_success, Some(1_700_000_000.0));
        assert_eq!(m.full_passes, 1.0);
        let later = Metrics::parse(&text.replace("} 12", "} 20"));
        assert_eq!(later.since(&m).objects, 8.0);
    }
}
