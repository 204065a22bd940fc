//! The scale-and-faults scenario of issue 22, on a real API server, with simulated nodes as
//! processes. `make test` runs it small (ipam/operator/tests/agents_faults.rs, against the run's shared
//! server, the outage through a [`Proxy`]); `make bench-agents` runs it at 10 to 200 nodes on a
//! server of its own and kills that server for the outage
//! (conformance/src/bin/bench-agents.rs). Both get the same [`Report`]: the test asserts its
//! bounds, the bench prints it.
//!
//! 1. **Setup.** `nodes` nodes ([`super::nodes::register`]: Node, Ready, heartbeat, agent pod,
//!    bound token), their heartbeats renewed every 10 s ([`Kubelet`]); `pods_per_node` pods on
//!    each, each with an address from the real `tether-ipam` ADD run with its node's credential;
//!    one `tether node-agent` per node (the DaemonSet's flags, `grace_s`). Each agent's counters
//!    after its first full pass (and a clean one) are its start cost. Then one `tether controller` (the
//!    Deployment's flags, `grace_s`, `node_lost_grace_s`), once it leads.
//! 2. **Silence.** `silenced_nodes` nodes stop: their agents are killed, their heartbeats stop,
//!    they turn `Ready=Unknown` (at once, where the node lifecycle controller would take 50 s:
//!    the controller's grace counts from the last heartbeat either way); their pods stay.
//!    Reclaim time: from the last heartbeat the server has to the release of the node's last
//!    lease.
//! 3. **Steady window** (`window`). `churn` pods of live nodes are deleted, spread over the
//!    window, each replaced by a new pod with a new ADD, as a cluster's churn; meanwhile
//!    `deleted_nodes` nodes are deleted (Node and heartbeat, their agents killed) and their pods
//!    `podgc_delay` later (the pod GC controller's job; the agent pod last). Per agent: requests
//!    and objects read per minute over the window (from its own metrics); reclaim times: pod
//!    deletion → its lease released (the agent), Node deletion → the node's last lease released
//!    (the controller).
//! 4. **Outage** (`outage`) of the agents' API server: a proxy cut, or the API server killed
//!    (etcd kept) and started again. A pod is deleted while the agents are blind (or, with a
//!    killed server, as soon as it answers). Recovery: from the server answering again
//!    (`/readyz`) until every live agent has a clean pass (`last success` after that moment);
//!    the agents' request burst and objects read in the first 30 s; the server's own count of
//!    objects it read for LISTs (etcd and watch cache) over those 30 s; the missed pod's
//!    reclaim time.
//! 5. **Checks.** From a consistent read of the stored leases: every live pod still holds its
//!    address and no address is held by two live pods (duplicates: 0), and no lease of a deleted
//!    pod, of a deleted node or of a silent node is still Leased (leaks: 0).
//!
//! Every wait is bounded, and a bound broken fails the run with what was seen. Names start with
//! `prefix`, so the scenario shares a server with other tests' objects; with `cleanup` it deletes
//! its nodes, pods and heartbeats at the end.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_kube_store::{LeasePhase, object_name};

use super::api::{Admin, LeaseWatch, ServerReads};
use super::nodes::{
    self, AGENT_NS, Kubelet, NodeCredential, create_pod, ensure_namespace, heartbeat, set_ready,
    unix_now, write_kubeconfig,
};
use super::procs::{
    Agent, AgentSpec, ApiServerProcess, Bins, Metrics, Proc, scrape, scrape_many, start_controller,
};
use super::proxy::Proxy;

/// The burst after an outage is counted over this long (issue 22: every agent resumes within
/// 30 s).
pub const BURST_WINDOW: Duration = Duration::from_secs(30);
/// The coordination Lease the controller replicas elect one with (deploy/base/controller.yaml).
pub const ELECTION_LEASE: &str = "tether-controller";

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub nodes: usize,
    pub pods_per_node: usize,
    /// The agents' and the controller's `--grace-s`.
    pub grace_s: u64,
    /// The controller's `--node-lost-grace-s`.
    pub node_lost_grace_s: u64,
    pub window: Duration,
    /// Pod deletions (each replaced) during the window.
    pub churn: usize,
    pub deleted_nodes: usize,
    pub podgc_delay: Duration,
    pub silenced_nodes: usize,
    pub outage: Duration,
    /// Threads for the setup's requests and ADDs.
    pub threads: usize,
    /// The network's range (room for every pod ever created, with room to spare).
    pub range: String,
    /// Lifetime of the minted tokens.
    pub token_s: u64,
}

/// How the outage is made.
pub enum OutageBy {
    /// The agents reach the server through a proxy, which is cut (the server keeps running: a
    /// test run shares it).
    Proxy,
    /// The API server that `conformance/kube/up.sh` started in this directory is killed and
    /// started again (everyone loses it: agents, controller, kubelets, the harness).
    ApiServer(PathBuf),
}

/// Where and with what to run it.
pub struct Setup<'a> {
    /// The cluster-admin kubeconfig.
    pub kubeconfig: &'a Path,
    pub bins: Bins,
    /// A scratch directory (node directories, logs).
    pub dir: &'a Path,
    /// Every name starts with it (nodes `<prefix>-n0`, namespace `<prefix>-pods`, network
    /// `<prefix>-net`).
    pub prefix: &'a str,
    pub outage: OutageBy,
    /// Delete what it created at the end (a shared server).
    pub cleanup: bool,
    /// Progress lines.
    pub say: &'a (dyn Fn(&str) + Sync),
}

/// One agent over the steady window.
#[derive(Debug, Clone)]
pub struct AgentRates {
    pub node: String,
    pub requests_per_min: f64,
    pub objects_per_min: f64,
    pub objects_per_min_by: BTreeMap<String, f64>,
    /// Pods of its node deleted during the window.
    pub deletions: usize,
    /// Its node's pods (its own agent pod included) and lease records at the window's end.
    pub own_pods: usize,
    pub own_records: usize,
}

/// The outage, measured.
#[derive(Debug, Clone, Default)]
pub struct OutageReport {
    pub duration: Duration,
    /// From starting the killed server again until it answered `/readyz` (proxy: zero).
    pub server_back_after: Duration,
    /// Per live agent: from the server answering until its first clean pass after the server
    /// started again (0 when that was before `/readyz` said so; `None`: none within the bound).
    pub recovery: Vec<(String, Option<Duration>)>,
    /// Requests and objects read by all live agents in the first [`BURST_WINDOW`].
    pub burst: Metrics,
    /// The server's count of objects read for LISTs (etcd / watch cache) and of requests, by
    /// resource: from the cut (a killed server: from its start) until it answered again, which
    /// holds a restarted server's own filling of its watch cache ...
    pub server_until_back: Option<ServerReads>,
    /// ... and over the [`BURST_WINDOW`] after it answered: what the clients made it read.
    pub server: Option<ServerReads>,
    /// The pod deleted while the agents were blind: its lease released this long after the
    /// server answered again.
    pub missed_pod_reclaim: Option<Duration>,
}

/// What a run measured. Durations that are `None` were not seen within their bound.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub nodes: usize,
    pub pods_per_node: usize,
    pub setup: Duration,
    /// Per agent, its counters once it has made its first full pass and a clean one.
    pub start: Vec<(String, Metrics)>,
    /// What the server read for LISTs (and the requests it served) while the agents started:
    /// from their start until every one had made its first full pass (the controller starts
    /// after).
    pub start_server: ServerReads,
    pub steady: Vec<AgentRates>,
    pub window: Duration,
    /// What the server read for LISTs over the window, for every client (agents, controller,
    /// kubelets, the ADDs of the churn, this harness's watch).
    pub window_server: ServerReads,
    /// The controller's own counters over the window, per minute.
    pub controller_per_min: Metrics,
    pub pod_reclaim: Vec<Option<Duration>>,
    /// Per deleted node: from the Node's deletion, and from its pods' deletion.
    pub node_reclaim: Vec<(Option<Duration>, Duration)>,
    /// Per silent node: from its last heartbeat.
    pub silence_reclaim: Vec<Option<Duration>>,
    pub outage: OutageReport,
    /// Live pods whose lease is not theirs any more (a live address freed).
    pub live_lost: Vec<String>,
    /// Addresses held by two live pods.
    pub duplicates: Vec<String>,
    /// Leases still Leased to a pod that is gone (deleted, on a deleted or a silent node).
    pub leaks: Vec<String>,
    pub total: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Live,
    Deleted(Instant),
    OnDeletedNode,
    OnSilentNode,
}

#[derive(Debug, Clone)]
struct PodRec {
    name: String,
    uid: String,
    node: usize,
    address: IpAddr,
    /// The IPLease object of its address.
    object: String,
    fate: Fate,
    /// Made at setup (so its lease is past the grace by the time it is deleted).
    setup: bool,
}

/// A node to delete in the window: its index, name, agent and pods.
struct Doomed {
    node: usize,
    name: String,
    agent: Option<Agent>,
    pods: Vec<String>,
}

/// A simulated cluster (see the module docs).
struct Fleet<'a> {
    plan: &'a Plan,
    s: &'a Setup<'a>,
    admin: Admin,
    network: String,
    namespace: String,
    nodes: Vec<NodeCredential>,
    /// Per node: its plugin's kubeconfig (straight to the server) and directory.
    node_dirs: Vec<PathBuf>,
    agents: Vec<Option<Agent>>,
    controller: Option<Proc>,
    kubelet: Kubelet,
    watch: LeaseWatch,
    proxy: Option<Proxy>,
    pods: Vec<PodRec>,
    next_pod: usize,
    last_add: Instant,
    /// The server's list reads before the agents started.
    before_agents: ServerReads,
}

fn node_name(prefix: &str, i: usize) -> String {
    format!("{prefix}-n{i}")
}

/// Run `f` on every item with `threads` threads, each with a client of its own; the results in
/// the items' order.
fn parallel<I: Send + Sync, T: Send>(
    admin: &Admin,
    items: &[I],
    threads: usize,
    f: impl Fn(&Admin, &I) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    let next = Mutex::new(0usize);
    let out: Mutex<Vec<Option<T>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    let first_error: Mutex<Option<String>> = Mutex::new(None);
    std::thread::scope(|sc| {
        for _ in 0..threads.clamp(1, items.len().max(1)) {
            sc.spawn(|| {
                let a = match admin.again() {
                    Ok(a) => a,
                    Err(e) => {
                        first_error.lock().unwrap().get_or_insert(e);
                        return;
                    }
                };
                loop {
                    if first_error.lock().unwrap().is_some() {
                        return;
                    }
                    let i = {
                        let mut n = next.lock().unwrap();
                        *n += 1;
                        *n - 1
                    };
                    let Some(item) = items.get(i) else { return };
                    match f(&a, item) {
                        Ok(v) => out.lock().unwrap()[i] = Some(v),
                        Err(e) => {
                            first_error.lock().unwrap().get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().unwrap() {
        return Err(e);
    }
    Ok(out.into_inner().unwrap().into_iter().flatten().collect())
}

/// Poll `f` every `every` until it gives a value or `limit` passes.
fn poll<T>(limit: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

impl<'a> Fleet<'a> {
    fn say(&self, m: &str) {
        (self.s.say)(m)
    }

    fn start(plan: &'a Plan, s: &'a Setup<'a>, upstream: SocketAddr) -> Result<Fleet<'a>, String> {
        let admin = Admin::connect(s.kubeconfig)?;
        let network = format!("{}-net", s.prefix);
        let namespace = format!("{}-pods", s.prefix);
        ensure_namespace(&admin, &namespace)?;
        let proxy = match s.outage {
            OutageBy::Proxy => Some(Proxy::start(upstream)?),
            OutageBy::ApiServer(_) => None,
        };
        let kubelet = Kubelet::start(&admin)?;
        let watch = LeaseWatch::start(&admin, &network)?;
        let mut f = Fleet {
            plan,
            s,
            admin,
            network,
            namespace,
            nodes: Vec::new(),
            node_dirs: Vec::new(),
            agents: Vec::new(),
            controller: None,
            kubelet,
            watch,
            proxy,
            pods: Vec::new(),
            next_pod: 0,
            last_add: Instant::now(),
            before_agents: ServerReads::default(),
        };
        f.say(&format!("registering {} nodes", plan.nodes));
        let names: Vec<String> = (0..plan.nodes).map(|i| node_name(s.prefix, i)).collect();
        f.nodes = parallel(&f.admin, &names, plan.threads, |a, n| {
            nodes::register(a, n, plan.token_s)
        })?;
        for (i, n) in f.nodes.iter().enumerate() {
            f.kubelet.add(&n.name);
            let d = s.dir.join(format!("n{i}"));
            std::fs::create_dir_all(d.join("ipam")).map_err(|e| e.to_string())?;
            write_kubeconfig(
                &d.join("plugin.kubeconfig"),
                f.admin.server(),
                f.admin.ca_data(),
                &n.token,
            )?;
            let agent_server = match &f.proxy {
                Some(p) => format!("https://{}", p.addr()),
                None => f.admin.server().to_string(),
            };
            write_kubeconfig(
                &d.join("agent.kubeconfig"),
                &agent_server,
                f.admin.ca_data(),
                &n.token,
            )?;
            f.node_dirs.push(d);
        }
        f.say(&format!(
            "{} pods, one ADD each",
            plan.nodes * plan.pods_per_node
        ));
        let work: Vec<(usize, String)> = (0..plan.nodes)
            .flat_map(|i| (0..plan.pods_per_node).map(move |k| (i, format!("p{i}-{k}"))))
            .collect();
        let pods = parallel(&f.admin, &work, plan.threads, |a, (i, name)| {
            f.new_pod(a, *i, name)
        })?;
        f.pods = pods;
        f.last_add = Instant::now();
        f.before_agents = f
            .admin
            .server_reads()
            .map_err(|e| format!("the server's metrics: {e}"))?;
        f.start_agents()?;
        Ok(f)
    }

    /// A pod on node `i` and its ADD (the node's credential, straight to the server).
    fn new_pod(&self, admin: &Admin, i: usize, name: &str) -> Result<PodRec, String> {
        let uid = create_pod(admin, &self.namespace, name, &self.nodes[i].name)?;
        let address = self.add(i, name, &uid)?;
        Ok(PodRec {
            name: name.to_string(),
            uid,
            node: i,
            object: object_name(None, address),
            address,
            fate: Fate::Live,
            setup: true,
        })
    }

    /// tether-ipam ADD for pod `name` (uid `uid`) on node `i`, as Multus runs it; its address.
    fn add(&self, i: usize, name: &str, uid: &str) -> Result<IpAddr, String> {
        let dir = &self.node_dirs[i];
        let conf = json!({"cniVersion": "1.0.0", "name": self.network, "type": "tether-ipvlan",
            "ipam": {"type": "tether-ipam", "range": self.plan.range, "probe": false,
                     "dataDir": dir.join("ipam"),
                     "kubernetes": {"kubeconfig": dir.join("plugin.kubeconfig"), "timeout_s": 10}}});
        let cid = format!("ctr-{uid}");
        let out = crate::cmd::capture_with_stdin(
            Command::new(&self.s.bins.tether_ipam)
                .env_clear()
                .env("CNI_COMMAND", "ADD")
                .env("CNI_CONTAINERID", &cid)
                .env("CNI_NETNS", "/var/run/netns/tether-fleet-unused")
                .env("CNI_IFNAME", "net1")
                .env("CNI_PATH", "/nonexistent")
                .env("NODE_NAME", &self.nodes[i].name)
                .env("TETHER_LEASE_SOCKET", "")
                .env(
                    "CNI_ARGS",
                    format!(
                        "IgnoreUnknown=true;K8S_POD_NAMESPACE={};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={uid}",
                        self.namespace
                    ),
                )
                .stderr(Stdio::piped()),
            Some(conf.to_string().as_bytes()),
        );
        if !out.success() {
            return Err(format!("ADD of {name} on {}:\n{out}", self.nodes[i].name));
        }
        let v: Value =
            serde_json::from_str(&out.stdout).map_err(|e| format!("ADD of {name}: {e}: {out}"))?;
        v["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("ADD of {name}: no address in {v}"))
    }

    fn start_agents(&mut self) -> Result<(), String> {
        let source = self.s.dir.join("agent-binaries");
        std::fs::create_dir_all(&source).map_err(|e| e.to_string())?;
        for b in ["tether-ipvlan", "tether-ipam"] {
            std::fs::write(source.join(b), format!("placeholder {b}\n"))
                .map_err(|e| e.to_string())?;
        }
        let ca_pem = STANDARD
            .decode(self.admin.ca_data().trim())
            .map_err(|e| format!("the admin kubeconfig's CA: {e}"))?;
        let service = match &self.proxy {
            Some(p) => p.addr(),
            None => server_addr(self.admin.server())?,
        };
        let host = service.ip().to_string();
        self.say(&format!("starting {} node-agents", self.nodes.len()));
        for (i, n) in self.nodes.iter().enumerate() {
            let d = &self.node_dirs[i];
            let agent = Agent::start(
                &self.s.bins,
                &AgentSpec {
                    node: &n.name,
                    dir: d,
                    kubeconfig: &d.join("agent.kubeconfig"),
                    token: &n.token,
                    ca_pem: &ca_pem,
                    service: (&host, service.port()),
                    source_dir: &source,
                    grace_s: self.plan.grace_s,
                },
            )?;
            self.agents.push(Some(agent));
        }
        Ok(())
    }

    /// Wait until every agent has made its first full pass (the one that also lists the agent
    /// pods) and a clean pass; their counters then.
    fn first_passes(&mut self) -> Result<Vec<(String, Metrics)>, String> {
        let limit = Duration::from_secs(60) + Duration::from_millis(300) * self.nodes.len() as u32;
        let deadline = Instant::now() + limit;
        let mut start: Vec<Option<Metrics>> = vec![None; self.agents.len()];
        loop {
            let mut waiting = Vec::new();
            for (i, a) in self.agents.iter_mut().enumerate() {
                let Some(a) = a else { continue };
                if start[i].is_some() {
                    continue;
                }
                if !a.proc.running() {
                    return Err(format!(
                        "the agent of {} exited:\n{}",
                        a.node,
                        a.proc.log_tail(20)
                    ));
                }
                if let Some(addr) = a.find_metrics() {
                    waiting.push((i, addr));
                }
            }
            let addrs: Vec<SocketAddr> = waiting.iter().map(|(_, a)| *a).collect();
            for ((i, _), m) in waiting.iter().zip(scrape_many(&addrs)) {
                if let Ok(m) = m
                    && m.last_success.is_some()
                    && m.full_passes >= 1.0
                {
                    start[*i] = Some(m);
                }
            }
            let left: Vec<&Agent> = start
                .iter()
                .zip(&self.agents)
                .filter_map(|(s, a)| if s.is_none() { a.as_ref() } else { None })
                .collect();
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} agent(s) made no clean pass within {limit:?} ({}); the log of one:\n{}",
                    left.len(),
                    left.iter()
                        .map(|a| a.node.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    left[0].proc.log_tail(20)
                ));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(start
            .into_iter()
            .zip(&self.nodes)
            .filter_map(|(m, n)| m.map(|m| (n.name.clone(), m)))
            .collect())
    }

    fn election_path() -> String {
        format!("/apis/coordination.k8s.io/v1/namespaces/{AGENT_NS}/leases/{ELECTION_LEASE}")
    }

    /// The controller, with the controller's credential (straight to the server), once it
    /// leads (an election Lease left by an earlier run is deleted first).
    fn start_controller(&mut self) -> Result<(), String> {
        let kc = self.s.dir.join("controller.kubeconfig");
        let t = nodes::token(&self.admin, "tether-controller", None, self.plan.token_s)?;
        write_kubeconfig(&kc, self.admin.server(), self.admin.ca_data(), &t)?;
        self.admin
            .delete(&Self::election_path())
            .map_err(|e| format!("deleting the election Lease: {e}"))?;
        let identity = format!("{}-controller", self.s.prefix);
        let mut p = start_controller(
            &self.s.bins,
            &kc,
            &identity,
            self.plan.grace_s,
            self.plan.node_lost_grace_s,
            self.s.dir.join("controller.log"),
        )?;
        let leads = poll(Duration::from_secs(30), Duration::from_millis(250), || {
            let l = self.admin.get(&Self::election_path()).ok()?;
            (l["spec"]["holderIdentity"] == identity.as_str()).then_some(())
        });
        if leads.is_none() {
            return Err(format!(
                "the controller does not lead 30 s after its start (running: {}):\n{}",
                p.running(),
                p.log_tail(20)
            ));
        }
        self.controller = Some(p);
        Ok(())
    }

    /// The metrics of the agents of nodes `which`, scraped at once.
    fn scrape_controller(&self) -> Result<Metrics, String> {
        let c = self.controller.as_ref().ok_or("no controller")?;
        let addr = c
            .metrics_addr()
            .ok_or_else(|| format!("the controller serves no metrics:\n{}", c.log_tail(10)))?;
        scrape(addr).map_err(|e| format!("the controller: {e}"))
    }

    fn scrape_all(&self, which: &[usize]) -> Result<Vec<Metrics>, String> {
        let addrs = which
            .iter()
            .map(|i| {
                self.agents[*i]
                    .as_ref()
                    .and_then(|a| a.metrics)
                    .ok_or_else(|| {
                        format!("node {} runs no agent serving metrics", self.nodes[*i].name)
                    })
            })
            .collect::<Result<Vec<SocketAddr>, String>>()?;
        scrape_many(&addrs)
            .into_iter()
            .zip(which)
            .map(|(m, i)| m.map_err(|e| format!("the agent of {}: {e}", self.nodes[*i].name)))
            .collect()
    }

    /// The pods of node `i` that are alive and were made at setup (old enough to be judged).
    fn live_setup_pod(&self, i: usize) -> Option<usize> {
        self.pods
            .iter()
            .position(|p| p.node == i && p.fate == Fate::Live && p.setup)
    }

    fn delete_pod(&self, admin: &Admin, name: &str) -> Result<(), String> {
        admin
            .delete(&format!(
                "/api/v1/namespaces/{}/pods/{name}",
                self.namespace
            ))
            .map(|_| ())
            .map_err(|e| format!("delete pod {name}: {e}"))
    }

    /// Delete pod `p` (by index) and put a new pod with a new ADD on its node.
    fn churn_one(&mut self, p: usize) -> Result<(), String> {
        let name = self.pods[p].name.clone();
        self.delete_pod(&self.admin, &name)?;
        self.pods[p].fate = Fate::Deleted(Instant::now());
        let i = self.pods[p].node;
        let replacement = format!("p{i}-r{}", self.next_pod);
        self.next_pod += 1;
        let rec = self.new_pod(&self.admin, i, &replacement)?;
        self.pods.push(PodRec {
            setup: false,
            ..rec
        });
        Ok(())
    }

    /// The moment every lease in `objects` (object, pod uid) was seen released (the latest), once
    /// all were, within `limit`.
    fn all_released(&self, objects: &[(String, String)], limit: Duration) -> Option<Instant> {
        poll(limit, Duration::from_millis(100), || {
            let mut last: Option<Instant> = None;
            for (o, uid) in objects {
                let t = self.watch.released(o, uid)?;
                last = Some(last.map_or(t, |l| l.max(t)));
            }
            Some(last.unwrap_or_else(Instant::now))
        })
    }

    fn leases_of_node(&self, i: usize) -> Vec<(String, String)> {
        self.pods
            .iter()
            .filter(|p| p.node == i)
            .map(|p| (p.object.clone(), p.uid.clone()))
            .collect()
    }
}

impl Drop for Fleet<'_> {
    fn drop(&mut self) {
        for a in self.agents.iter_mut().flatten() {
            a.proc.kill();
        }
        if let Some(c) = &mut self.controller {
            c.kill();
        }
        if !self.s.cleanup {
            return;
        }
        // Best effort, on a server the rest of the run shares: what this run created.
        let _ = self.admin.delete(&Self::election_path());
        for p in &self.pods {
            let _ = self.admin.delete(&format!(
                "/api/v1/namespaces/{}/pods/{}",
                self.namespace, p.name
            ));
        }
        for n in &self.nodes {
            let _ = self.admin.delete(&format!(
                "/api/v1/namespaces/{AGENT_NS}/pods/{}",
                nodes::agent_pod(&n.name)
            ));
            let _ = nodes::delete_node(&self.admin, &n.name);
        }
    }
}

/// `https://127.0.0.1:6443` → 127.0.0.1:6443.
fn server_addr(url: &str) -> Result<SocketAddr, String> {
    url.trim_start_matches("https://")
        .trim_end_matches('/')
        .parse()
        .map_err(|e| format!("{url}: not https://IP:PORT ({e})"))
}

/// Run the scenario (see the module docs).
pub fn run(plan: &Plan, s: &Setup<'_>) -> Result<Report, String> {
    let t_run = Instant::now();
    let admin = Admin::connect(s.kubeconfig)?;
    let upstream = server_addr(admin.server())?;
    drop(admin);
    if plan.silenced_nodes + plan.deleted_nodes + 1 > plan.nodes {
        return Err("the plan silences and deletes every node: none is left to measure".into());
    }
    let mut f = Fleet::start(plan, s, upstream)?;
    let mut r = Report {
        nodes: plan.nodes,
        pods_per_node: plan.pods_per_node,
        window: plan.window,
        ..Report::default()
    };
    r.start = f.first_passes()?;
    r.start_server = f
        .admin
        .server_reads()
        .map_err(|e| format!("the server's metrics: {e}"))?
        .since(&f.before_agents, false);
    // The controller after the agents' start, so that what the server read for them is theirs.
    f.start_controller()?;
    r.setup = t_run.elapsed();
    f.say(&format!("setup done in {:.0} s", r.setup.as_secs_f64()));

    // Nodes are picked from the end: silenced, then deleted; the first ones stay live.
    let n = plan.nodes;
    let silenced: Vec<usize> = (n - plan.silenced_nodes..n).collect();
    let deleted: Vec<usize> =
        (n - plan.silenced_nodes - plan.deleted_nodes..n - plan.silenced_nodes).collect();
    let live: Vec<usize> = (0..n - plan.silenced_nodes - plan.deleted_nodes).collect();

    // Every setup lease past the grace: a deletion is then judged at once.
    sleep_until(f.last_add + Duration::from_secs(plan.grace_s + 1));

    // 2. Silence.
    let mut last_beats = Vec::new();
    for &i in &silenced {
        let name = f.nodes[i].name.clone();
        f.kubelet.silence(&name);
        // Its agent goes down with it (dropped: killed); its agent pod and pods stay.
        f.agents[i] = None;
        set_ready(&f.admin, &name, "Unknown").map_err(|e| format!("node {name} Unknown: {e}"))?;
    }
    // A renewal already on the wire lands within a moment: then the server's last heartbeat is
    // the one the grace counts from.
    std::thread::sleep(Duration::from_secs(1));
    for &i in &silenced {
        let b = heartbeat(&f.admin, &f.nodes[i].name)
            .map_err(|e| e.to_string())?
            .ok_or("a silenced node has no heartbeat")?;
        last_beats.push((i, b));
        for p in f.pods.iter_mut().filter(|p| p.node == i) {
            p.fate = Fate::OnSilentNode;
        }
    }
    if !silenced.is_empty() {
        f.say(&format!("silenced {} node(s)", silenced.len()));
    }

    // 3. The steady window, with churn, and the node deletions beside it.
    let m0 = f.scrape_all(&live)?;
    let c0 = f.scrape_controller()?;
    let server0 = f
        .admin
        .server_reads()
        .map_err(|e| format!("the server's metrics: {e}"))?;
    let t0 = Instant::now();
    let doomed: Vec<Doomed> = deleted
        .iter()
        .map(|&i| Doomed {
            node: i,
            name: f.nodes[i].name.clone(),
            agent: f.agents[i].take(),
            pods: f
                .pods
                .iter()
                .filter(|p| p.node == i)
                .map(|p| p.name.clone())
                .collect(),
        })
        .collect();
    let deletion_admin = f.admin.again()?;
    for d in &doomed {
        // The node stops with its deletion: no heartbeat after it.
        f.kubelet.forget(&d.name);
    }
    let mut churned_on: HashMap<usize, usize> = HashMap::new();
    let (namespace, podgc) = (f.namespace.clone(), plan.podgc_delay);
    let deletions = std::thread::scope(|sc| -> Result<Vec<(usize, Instant, Instant)>, String> {
        let worker = sc.spawn(move || -> Result<Vec<(usize, Instant, Instant)>, String> {
            let (a, mut doomed) = (deletion_admin, doomed);
            std::thread::sleep(Duration::from_secs(1));
            let mut at = Vec::new();
            for d in &mut doomed {
                nodes::delete_node(&a, &d.name)
                    .map_err(|e| format!("delete node {}: {e}", d.name))?;
                // The node is gone, and its agent with it (dropped: killed).
                d.agent = None;
                at.push(Instant::now());
            }
            std::thread::sleep(podgc);
            let mut done = Vec::new();
            for (d, t_node) in doomed.iter().zip(at) {
                for p in &d.pods {
                    a.delete(&format!("/api/v1/namespaces/{namespace}/pods/{p}"))
                        .map_err(|e| format!("delete pod {p}: {e}"))?;
                }
                // The agent pod last: the controller judges the node once it goes.
                a.delete(&format!(
                    "/api/v1/namespaces/{AGENT_NS}/pods/{}",
                    nodes::agent_pod(&d.name)
                ))
                .map_err(|e| format!("delete the agent pod of {}: {e}", d.name))?;
                done.push((d.node, t_node, Instant::now()));
            }
            Ok(done)
        });
        for j in 0..plan.churn {
            sleep_until(t0 + plan.window.mul_f64(j as f64 / plan.churn as f64));
            let i = live[j % live.len()];
            let Some(p) = f.live_setup_pod(i) else {
                continue;
            };
            f.churn_one(p)?;
            *churned_on.entry(i).or_default() += 1;
        }
        sleep_until(t0 + plan.window);
        worker
            .join()
            .map_err(|_| "the node deletions panicked".to_string())?
    })?;
    let window = t0.elapsed();
    let m1 = f.scrape_all(&live)?;
    let c = f.scrape_controller()?.since(&c0);
    let per_min = |x: f64| x / window.as_secs_f64() * 60.0;
    r.controller_per_min = Metrics {
        requests: per_min(c.requests),
        objects: per_min(c.objects),
        objects_by: c
            .objects_by
            .iter()
            .map(|(k, v)| (k.clone(), per_min(*v)))
            .collect(),
        errors: per_min(c.errors),
        ..Metrics::default()
    };
    r.window_server = f
        .admin
        .server_reads()
        .map_err(|e| format!("the server's metrics: {e}"))?
        .since(&server0, false);
    r.window = window;
    for (k, &i) in live.iter().enumerate() {
        let d = m1[k].since(&m0[k]);
        r.steady.push(AgentRates {
            node: f.nodes[i].name.clone(),
            requests_per_min: per_min(d.requests),
            objects_per_min: per_min(d.objects),
            objects_per_min_by: d
                .objects_by
                .iter()
                .map(|(res, v)| (res.clone(), per_min(*v)))
                .collect(),
            deletions: churned_on.get(&i).copied().unwrap_or(0),
            own_pods: 1 + f
                .pods
                .iter()
                .filter(|p| p.node == i && p.fate == Fate::Live)
                .count(),
            own_records: f.pods.iter().filter(|p| p.node == i).count(),
        });
    }
    for (i, _, _) in &deletions {
        for p in f.pods.iter_mut().filter(|p| p.node == *i) {
            p.fate = Fate::OnDeletedNode;
        }
    }
    f.say(&format!(
        "window of {:.0} s: {} pod(s) deleted and replaced, {} node(s) deleted",
        window.as_secs_f64(),
        plan.churn,
        deletions.len()
    ));

    // Reclaim times of the window's deletions (each bounded: a minute past the window).
    let churned: Vec<(String, String, Instant)> = f
        .pods
        .iter()
        .filter_map(|p| match p.fate {
            Fate::Deleted(t) => Some((p.object.clone(), p.uid.clone(), t)),
            _ => None,
        })
        .collect();
    let settle = Instant::now() + Duration::from_secs(60);
    for (o, uid, t) in &churned {
        let left = settle.saturating_duration_since(Instant::now());
        let seen = f.all_released(&[(o.clone(), uid.clone())], left);
        r.pod_reclaim
            .push(seen.map(|s| s.saturating_duration_since(*t)));
    }
    for (i, t_node, t_pods) in &deletions {
        let limit = (*t_node + Duration::from_secs(120)).saturating_duration_since(Instant::now());
        let seen = f.all_released(&f.leases_of_node(*i), limit);
        r.node_reclaim.push((
            seen.map(|s| s.saturating_duration_since(*t_node)),
            t_pods.saturating_duration_since(*t_node),
        ));
    }

    // A killed server takes the controller down too: let the silent nodes be judged first, so
    // the outage does not stand in the way of their grace.
    let mut silence_measured = false;
    let silence_reclaim = |f: &Fleet<'_>| -> Vec<Option<Duration>> {
        last_beats
            .iter()
            .map(|&(i, beat)| {
                let beat_at =
                    Instant::now() - Duration::from_secs_f64((unix_now() - beat).max(0.0));
                let limit = (beat_at + Duration::from_secs(plan.node_lost_grace_s + 60))
                    .saturating_duration_since(Instant::now());
                f.all_released(&f.leases_of_node(i), limit)
                    .map(|t| t.saturating_duration_since(beat_at))
            })
            .collect()
    };
    if matches!(s.outage, OutageBy::ApiServer(_)) {
        r.silence_reclaim = silence_reclaim(&f);
        silence_measured = true;
    }

    // 4. The outage.
    let missed = live
        .iter()
        .find_map(|&i| f.live_setup_pod(i))
        .ok_or("no live pod left to delete during the outage")?;
    r.outage = outage(&mut f, s, plan, &live, missed)?;

    if !silence_measured {
        r.silence_reclaim = silence_reclaim(&f);
    }

    // 5. The checks, on what is stored.
    let stored: HashMap<String, tether_kube_store::IPLease> = f
        .admin
        .leases(&f.network)
        .map_err(|e| format!("reading the leases: {e}"))?
        .into_iter()
        .filter_map(|l| l.metadata.name.clone().map(|n| (n, l)))
        .collect();
    let held_by = |p: &PodRec| {
        stored.get(&p.object).is_some_and(|l| {
            l.spec.state == LeasePhase::Leased
                && l.spec.pod.as_ref().and_then(|x| x.uid.as_deref()) == Some(p.uid.as_str())
        })
    };
    let mut by_address: BTreeMap<IpAddr, Vec<&str>> = BTreeMap::new();
    for p in &f.pods {
        match p.fate {
            Fate::Live => {
                by_address.entry(p.address).or_default().push(&p.name);
                if !held_by(p) {
                    r.live_lost.push(format!(
                        "{} ({}): {:?}",
                        p.name,
                        p.address,
                        stored.get(&p.object).map(|l| &l.spec)
                    ));
                }
            }
            _ if held_by(p) => r
                .leaks
                .push(format!("{} ({}, {:?})", p.name, p.address, p.fate)),
            _ => {}
        }
    }
    for (a, holders) in by_address.into_iter().filter(|(_, h)| h.len() > 1) {
        r.duplicates.push(format!("{a}: {}", holders.join(", ")));
    }
    // A Leased record naming none of the pods made here would be a lease of nobody's.
    let known: std::collections::HashSet<&str> = f.pods.iter().map(|p| p.uid.as_str()).collect();
    for (name, l) in &stored {
        let uid = l
            .spec
            .pod
            .as_ref()
            .and_then(|x| x.uid.as_deref())
            .unwrap_or("");
        if l.spec.state == LeasePhase::Leased && !known.contains(uid) {
            r.leaks.push(format!(
                "{name}: Leased to a pod this run never made ({uid})"
            ));
        }
    }
    r.total = t_run.elapsed();
    Ok(r)
}

/// Phase 4 (see the module docs).
fn outage(
    f: &mut Fleet<'_>,
    s: &Setup<'_>,
    plan: &Plan,
    live: &[usize],
    missed: usize,
) -> Result<OutageReport, String> {
    let mut o = OutageReport {
        duration: plan.outage,
        ..OutageReport::default()
    };
    let server_before = f
        .admin
        .server_reads()
        .map_err(|e| format!("the server's metrics: {e}"))?;
    let mut apiserver = match &s.outage {
        OutageBy::ApiServer(dir) => Some(ApiServerProcess::new(dir)),
        OutageBy::Proxy => None,
    };
    f.say(&format!("outage of {:.0} s", plan.outage.as_secs_f64()));
    let t_cut = Instant::now();
    match (&mut f.proxy, &mut apiserver) {
        (Some(p), _) => p.cut(),
        (None, Some(a)) => a.kill()?,
        (None, None) => unreachable!("an outage needs a proxy or a server"),
    }
    let missed_name = f.pods[missed].name.clone();
    if f.proxy.is_some() {
        // The agents are blind, the server is not: a deletion they must catch up on.
        std::thread::sleep((plan.outage / 4).min(Duration::from_secs(2)));
        f.delete_pod(&f.admin, &missed_name)?;
        f.pods[missed].fate = Fate::Deleted(Instant::now());
    }
    sleep_until(t_cut + plan.outage);
    let t_restart = Instant::now();
    match (&mut f.proxy, &mut apiserver) {
        (Some(p), _) => p.restore()?,
        (None, Some(a)) => a.start()?,
        (None, None) => unreachable!(),
    }
    let ready = poll(Duration::from_secs(120), Duration::from_millis(200), || {
        (f.admin.text("/readyz").ok()?.trim() == "ok").then(Instant::now)
    })
    .ok_or("the API server is not ready 120 s after the outage ended")?;
    let t_back = if f.proxy.is_some() { t_restart } else { ready };
    let back_unix = unix_now() - t_back.elapsed().as_secs_f64();
    let restart_unix = unix_now() - t_restart.elapsed().as_secs_f64();
    o.server_back_after = t_back.saturating_duration_since(t_restart);
    let server_back = f.admin.server_reads().ok();
    o.server_until_back = server_back
        .as_ref()
        .map(|b| b.since(&server_before, apiserver.is_some()));
    if f.proxy.is_none() {
        // Deleted as soon as the server answers: before the agents, backing off, are back.
        f.delete_pod(&f.admin, &missed_name)?;
        f.pods[missed].fate = Fate::Deleted(Instant::now());
    }
    let at_back = f.scrape_all(live)?;
    let mut recovered: Vec<Option<Duration>> = vec![None; live.len()];
    let mut burst: Option<Metrics> = None;
    let limit = t_back + Duration::from_secs(120);
    loop {
        let waiting: Vec<usize> = (0..live.len())
            .filter(|k| recovered[*k].is_none())
            .collect();
        let which: Vec<usize> = waiting.iter().map(|k| live[*k]).collect();
        let seen = Instant::now();
        if let Ok(now) = f.scrape_all(&which) {
            for (k, m) in waiting.iter().zip(now) {
                // A clean pass cannot happen while the server is away: one stamped after it
                // started again is the agent back in sync, maybe even before `/readyz` said so
                // (then 0 s). The pass ended within the second it stamps, so before (stamp + 1),
                // and before this scrape.
                if let Some(t) = m.last_success.filter(|t| *t >= restart_unix.floor()) {
                    let by_stamp = Duration::from_secs_f64((t + 1.0 - back_unix).max(0.0));
                    recovered[*k] = Some(by_stamp.min(seen.saturating_duration_since(t_back)));
                }
            }
        }
        if burst.is_none() && t_back.elapsed() >= BURST_WINDOW {
            let now = f.scrape_all(live)?;
            let mut sum = Metrics::default();
            for (m, b) in now.iter().zip(&at_back) {
                let d = m.since(b);
                sum.requests += d.requests;
                sum.objects += d.objects;
                sum.errors += d.errors;
                for (k, v) in d.objects_by {
                    *sum.objects_by.entry(k).or_default() += v;
                }
            }
            burst = Some(sum);
            o.server = match (&server_back, f.admin.server_reads()) {
                (Some(b), Ok(after)) => Some(after.since(b, false)),
                _ => None,
            };
        }
        if (burst.is_some() && recovered.iter().all(Option::is_some)) || Instant::now() > limit {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    o.burst = burst.unwrap_or_default();
    o.recovery = live
        .iter()
        .zip(recovered)
        .map(|(&i, d)| (f.nodes[i].name.clone(), d))
        .collect();
    let pod = &f.pods[missed];
    o.missed_pod_reclaim = f
        .all_released(
            &[(pod.object.clone(), pod.uid.clone())],
            Duration::from_secs(60),
        )
        .map(|t| t.saturating_duration_since(t_back));
    Ok(o)
}
