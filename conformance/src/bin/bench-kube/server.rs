//! The throw-away control plane (k8s-up.sh / k8s-down.sh from the peers), a client of it for what
//! the harness itself does, and the node credential the plugins use.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::Value;
use tether_conformance::{capture, target_dir};
use tether_kube_store::crd::{NETWORK_LABEL, label_value};
use tether_kube_store::{IPLease, LeasePhase};

use crate::{WB_GROUP, WB_NAMESPACE, WB_POOL, peers_bin_dir};

// ----- the API server ---------------------------------------------------------------------------

/// The control plane k8s-up.sh started; k8s-down.sh stops exactly its processes on drop.
pub struct Server {
    peers: PathBuf,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub port: String,
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
    pub fn start(peers: &Path, keep: bool) -> Result<Server, String> {
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

    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
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
pub fn stop_server_on_signal(peers: PathBuf, dir: PathBuf) {
    tether_conformance::signals::on_termination(move |sig| {
        eprintln!("bench-kube: signal {sig}: stopping the API server");
        if dir.exists() {
            stop_server(&peers, &dir);
        }
    });
}

// ----- the API, for the harness -----------------------------------------------------------------

/// Requests per (resource, verb), from `apiserver_request_total`.
pub type Counts = BTreeMap<(String, String), f64>;

/// A client of the server for what the harness itself does (never inside a measured window,
/// except for GET /metrics, which is not a resource request and so not counted).
pub struct Kube {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
}

impl Kube {
    pub fn connect(kubeconfig: &Path) -> Result<Kube, String> {
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

    pub fn raw(&self, method: &str, path: &str) -> Result<String, kube::Error> {
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
    pub fn wait_listable(&self, paths: &[String]) -> Result<(), String> {
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
    pub fn counts(&self) -> Result<Counts, String> {
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
    pub fn reset(&self) -> Result<(), String> {
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
    pub fn tether_leased(&self, network: &str) -> Result<usize, String> {
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
    pub fn whereabouts_allocated(&self) -> Result<usize, String> {
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

    /// CREATE one IPLease (the ceiling's clients: one `Kube` each).
    pub fn create(&self, o: &IPLease) -> Result<(), String> {
        self.rt
            .block_on(self.leases().create(&PostParams::default(), o))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Create `objs` with `parallel` requests in flight from one client (kubectl would send them
    /// one at a time, for many minutes). AlreadyExists counts as created; other errors are retried
    /// a few times (a server this busy may answer 429 or time out).
    pub fn create_all(&self, objs: Vec<IPLease>, parallel: usize) -> Result<(), String> {
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
pub fn delta(before: &Counts, after: &Counts, resources: &[&str]) -> Counts {
    after
        .iter()
        .filter(|((r, _), _)| resources.contains(&r.as_str()))
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

// ----- the node ---------------------------------------------------------------------------------

/// The node the plugins run on.
pub const NODE: &str = "bench-node";

impl Server {
    /// What a node of a tether cluster has: deploy/base applied (the service account, RBAC, the
    /// node-scope admission policy), a Node object, and the plugins' kubeconfig with a token bound
    /// to that Node, as the node-agent writes it. Returns the kubeconfig's path.
    pub fn node_kubeconfig(&self, repo: &Path, out: &Path) -> Result<PathBuf, String> {
        self.kubectl(&[
            "apply",
            "-k",
            &repo.join("deploy/base").display().to_string(),
        ])?;
        let node_yaml = self.dir.join("node.yaml");
        std::fs::write(
            &node_yaml,
            format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {NODE}\n"),
        )
        .map_err(|e| e.to_string())?;
        self.kubectl(&["apply", "-f", &node_yaml.display().to_string()])?;
        let token = self.kubectl(&[
            "create",
            "token",
            "tether",
            "-n",
            "kube-system",
            "--bound-object-kind",
            "Node",
            "--bound-object-name",
            NODE,
            "--duration",
            "2h",
        ])?;
        let ca = std::fs::read(self.dir.join("pki/ca.crt")).map_err(|e| e.to_string())?;
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority-data: {}\n\
             users:\n- name: tether\n  user:\n    token: {}\ncontexts:\n- name: tether\n  context:\n    cluster: local\n    user: tether\ncurrent-context: tether\n",
            self.port,
            STANDARD.encode(&ca),
            token.trim()
        );
        std::fs::write(out, text).map_err(|e| format!("writing {}: {e}", out.display()))?;
        Ok(out.to_path_buf())
    }

    /// The pids of the API server and etcd (from k8s-up.sh's pid files).
    pub fn pids(&self) -> Result<(u32, u32), String> {
        let pid = |f: &str| {
            tether_conformance::cpu::pid_in(&self.dir.join(f))
                .ok_or_else(|| format!("no pid in {}", self.dir.join(f).display()))
        };
        Ok((pid("kube-apiserver.pid")?, pid("etcd.pid")?))
    }
}

// ----- the node-agent's lease service -----------------------------------------------------------

/// `tether lease-service` for the node, as the node-agent runs it, in a process of its own.
pub struct Agent {
    child: Option<std::process::Child>,
    tether: PathBuf,
    kubeconfig: PathBuf,
    pub socket: PathBuf,
}

impl Agent {
    pub fn new(tether: PathBuf, kubeconfig: PathBuf, socket: PathBuf) -> Agent {
        Agent {
            child: None,
            tether,
            kubeconfig,
            socket,
        }
    }

    /// Start it and wait until its socket answers and it has read this node's leases.
    pub fn start(&mut self) -> Result<u32, String> {
        let child = Command::new(&self.tether)
            .arg("lease-service")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--node")
            .arg(NODE)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.tether.display()))?;
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.socket.exists() {
            if Instant::now() > deadline {
                return Err("the lease service did not listen within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Its first LIST of this node's leases comes right after it listens.
        std::thread::sleep(Duration::from_millis(500));
        Ok(pid)
    }

    /// SIGTERM: it removes its socket at once and refuses what open connections still ask.
    pub fn signal_stop(&self) {
        if let Some(c) = &self.child {
            // SAFETY: a plain kill(2) of our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
    }

    /// Wait for it to end (after [`Agent::signal_stop`]); its CPU then lands on this process's
    /// reaped children, so only between measured phases.
    pub fn reap(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.signal_stop();
        self.reap();
    }
}
