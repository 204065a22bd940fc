//! Helpers shared by the reconcile and CLI tests: the API double, leases, pods, the binary.
#![allow(dead_code)]

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_apiserver_double::ApiServerDouble;
use tether_kube_store::{KubeSettings, KubeStore};
use tether_leases::{Lease, LeaseState, LeaseStore, PodRef};

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!("tether-ipam-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The double, its kubeconfig and a scratch directory.
pub struct Env {
    pub double: ApiServerDouble,
    pub dir: TempDir,
    pub kubeconfig: PathBuf,
}

impl Env {
    pub fn new(tag: &str) -> Env {
        let double = ApiServerDouble::start().unwrap();
        let dir = TempDir::new(tag);
        let kubeconfig = dir.join("kubeconfig");
        double.write_kubeconfig(&kubeconfig).unwrap();
        Env { double, dir, kubeconfig }
    }

    pub fn settings(&self) -> KubeSettings {
        KubeSettings::with_kubeconfig(&self.kubeconfig)
    }

    pub fn store(&self) -> KubeStore {
        KubeStore::connect(self.settings()).unwrap()
    }

    /// A pod on `node`; returns its uid.
    pub fn pod(&self, ns: &str, name: &str, uid: &str, node: &str) -> String {
        self.double
            .upsert_pod(json!({"metadata": {"namespace": ns, "name": name, "uid": uid}, "spec": {"nodeName": node}, "status": {"phase": "Running"}}))
            .unwrap();
        uid.to_string()
    }

    /// A node running the node-agent: its DaemonSet pod (namespace [`AGENT_NS`], label
    /// [`AGENT_LABEL`], `spec.nodeName` = `node`), which is how the reconciler knows live nodes.
    pub fn agent(&self, node: &str) {
        let (k, v) = AGENT_LABEL.split_once('=').unwrap();
        self.double
            .upsert_pod(json!({"metadata": {"namespace": AGENT_NS, "name": agent_pod(node), "uid": format!("u-agent-{node}"),
                                            "labels": {k: v}},
                               "spec": {"nodeName": node}, "status": {"phase": "Running"}}))
            .unwrap();
    }

    /// The node's agent pod is gone (the node was deleted, its pods with it).
    pub fn agent_gone(&self, node: &str) {
        assert!(self.double.delete_pod(AGENT_NS, &agent_pod(node)), "no agent pod on {node}");
    }

    /// Put `l` in the Kubernetes store.
    pub fn put(&self, l: Lease) -> Lease {
        let s = self.store();
        s.claim(l, None).unwrap().unwrap()
    }

    /// The stored state of `addr` in `network` (None: no record).
    pub fn state(&self, network: &str, addr: &str) -> Option<LeaseState> {
        let a: IpAddr = addr.parse().unwrap();
        self.store().list(network).unwrap().into_iter().find(|l| l.address == a).map(|l| l.state)
    }

    /// A NAD using the Kubernetes store through the double (master lo, no probing).
    pub fn nad(&self, network: &str) -> PathBuf {
        let p = self.dir.join(&format!("{network}.json"));
        let v = json!({"cniVersion": "1.0.0", "name": network, "type": "tether-ipvlan", "master": "lo",
            "ipam": {"type": "tether-ipam", "range": "10.77.0.0/24", "probe": false, "store": "kubernetes",
                     "kubernetes": {"kubeconfig": self.kubeconfig}}});
        std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
        p
    }
}

/// Where the node-agent's pods are, and their label (the reconciler's defaults).
pub const AGENT_NS: &str = "kube-system";
pub const AGENT_LABEL: &str = "app.kubernetes.io/name=tether";

/// The name of the agent pod on `node`.
pub fn agent_pod(node: &str) -> String {
    format!("tether-{node}")
}

pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// A Leased record.
pub fn lease(network: &str, addr: &str, pod: Option<(&str, &str, &str)>, node: &str, since: u64) -> Lease {
    Lease {
        network: network.into(),
        address: addr.parse().unwrap(),
        prefix_len: 24,
        range_index: Some(0),
        container_id: format!("ctr-{addr}"),
        ifname: "net1".into(),
        pod: pod.map(|(ns, n, u)| PodRef::new(ns, n, u)).unwrap_or_default(),
        node: Some(node.into()),
        state: LeaseState::Leased,
        since,
        version: None,
    }
}

pub fn is_leased(s: &Option<LeaseState>) -> bool {
    matches!(s, Some(LeaseState::Leased))
}

pub fn is_released(s: &Option<LeaseState>) -> bool {
    matches!(s, Some(LeaseState::Released { .. }))
}

/// Poll `f` until true or `limit`; returns how long it took.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Run the `tether-ipam` binary as a person would (no CNI_COMMAND, no in-cluster variables).
pub fn ipam(args: &[&str]) -> Output {
    ipam_env(args, &[])
}

pub fn ipam_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tether-ipam"));
    c.args(args)
        .env_remove("CNI_COMMAND")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBECONFIG")
        .env_remove("NODE_NAME")
        .env_remove("POD_NAMESPACE");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn json_out(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

/// Lines of doctor's table starting with `status` (OK or FAIL) for `check`.
pub fn findings<'a>(out: &'a str, status: &str, check: &str) -> Vec<&'a str> {
    out.lines()
        .filter(|l| {
            let mut w = l.split_whitespace();
            w.next() == Some(status) && w.next() == Some(check)
        })
        .collect()
}
