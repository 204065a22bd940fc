//! Simulated nodes: what a node is to the API server (a Node object that is `Ready`, the
//! kubelet's heartbeat Lease renewed every 10 s) and to tether (the node-agent's pod on it, in
//! the agent namespace with the DaemonSet's label, and that pod's bound token: the node
//! credential the node-scope policy checks).
//!
//! No kubelet and no node lifecycle controller run here; [`Kubelet`] plays the kubelets'
//! heartbeats, and [`set_ready`] the lifecycle controller's verdict.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::api::{Admin, Fail};

/// Namespace of the node-agent's pods and of the shipped service accounts (deploy/base).
pub const AGENT_NS: &str = "kube-system";
/// The DaemonSet's pod label: the controller takes a node that runs such a pod for alive.
pub const AGENT_LABEL: (&str, &str) = ("app.kubernetes.io/name", "tether");
/// Where kubelets keep their heartbeats.
pub const HEARTBEAT_NS: &str = "kube-node-lease";
/// How often a kubelet renews its heartbeat (its default `nodeLeaseRenewInterval`... 10 s).
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);

/// The node-agent's pod on `node` (the name reconcile_support's tests use too).
pub fn agent_pod(node: &str) -> String {
    format!("tether-{node}")
}

pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// As the API server wants a MicroTime (six digits) or a Time.
pub fn micro_time(unix: f64) -> String {
    let micros = (unix * 1e6) as i64;
    jiff::Timestamp::from_microsecond(micros)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string())
        .unwrap_or_default()
}

fn heartbeat_path(node: &str) -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/{HEARTBEAT_NS}/leases/{node}")
}

/// A node's credential: its agent pod's uid and the token bound to that pod.
#[derive(Debug, Clone)]
pub struct NodeCredential {
    pub name: String,
    pub agent_pod_uid: String,
    pub token: String,
}

/// A token of service account `sa` (in [`AGENT_NS`]), bound to `pod` (name, uid) when given.
pub fn token(
    admin: &Admin,
    sa: &str,
    pod: Option<(&str, &str)>,
    expiration_s: u64,
) -> Result<String, String> {
    let mut spec = json!({"audiences": ["https://kubernetes.default.svc.cluster.local"],
                          "expirationSeconds": expiration_s});
    if let Some((name, uid)) = pod {
        spec["boundObjectRef"] =
            json!({"kind": "Pod", "apiVersion": "v1", "name": name, "uid": uid});
    }
    let r = admin
        .post(
            &format!("/api/v1/namespaces/{AGENT_NS}/serviceaccounts/{sa}/token"),
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}),
        )
        .map_err(|e| format!("TokenRequest for {sa}: {e}"))?;
    r["status"]["token"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("TokenRequest for {sa}: no token in {r}"))
}

/// A kubeconfig for `server` with `token` as its user (JSON, which every kubeconfig reader
/// takes).
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca_data: &str,
    token: &str,
) -> Result<(), String> {
    let kc = json!({"apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c"});
    std::fs::write(path, kc.to_string()).map_err(|e| format!("{}: {e}", path.display()))
}

/// The node lifecycle controller's verdict on `node`: its `Ready` condition (`True`,
/// `Unknown`, ...), written to the status subresource.
pub fn set_ready(admin: &Admin, node: &str, status: &str) -> Result<(), Fail> {
    let t = micro_time(unix_now());
    let t = &t[..19];
    let (reason, message) = match status {
        "True" => ("KubeletReady", "kubelet is posting ready status"),
        _ => ("NodeStatusUnknown", "Kubelet stopped posting node status."),
    };
    admin
        .merge_patch(
            &format!("/api/v1/nodes/{node}/status"),
            &json!({"status": {"conditions": [{"type": "Ready", "status": status, "reason": reason,
                    "message": message, "lastHeartbeatTime": format!("{t}Z"),
                    "lastTransitionTime": format!("{t}Z")}]}}),
        )
        .map(|_| ())
}

/// Renew (or create) `node`'s heartbeat Lease with `renewTime` now.
fn renew(admin: &Admin, node: &str) -> Result<(), Fail> {
    let now = micro_time(unix_now());
    match admin.merge_patch(&heartbeat_path(node), &json!({"spec": {"renewTime": now}})) {
        Err(Fail { code: Some(404), .. }) => admin
            .post(
                &format!("/apis/coordination.k8s.io/v1/namespaces/{HEARTBEAT_NS}/leases"),
                &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": node, "namespace": HEARTBEAT_NS},
                        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now}}),
            )
            .map(|_| ()),
        other => other.map(|_| ()),
    }
}

/// Register node `name` as a kubelet does (the Node, Ready, its first heartbeat), put the
/// node-agent's pod on it, and mint that pod's bound token (valid `expiration_s`).
pub fn register(admin: &Admin, name: &str, expiration_s: u64) -> Result<NodeCredential, String> {
    let fail = |what: &str, e: Fail| format!("{what} of node {name}: {e}");
    admin
        .post(
            "/api/v1/nodes",
            &json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}),
        )
        .map_err(|e| fail("create", e))?;
    set_ready(admin, name, "True").map_err(|e| fail("Ready", e))?;
    renew(admin, name).map_err(|e| fail("heartbeat", e))?;
    let pod = admin
        .post(
            &format!("/api/v1/namespaces/{AGENT_NS}/pods"),
            &json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": agent_pod(name), "labels": {AGENT_LABEL.0: AGENT_LABEL.1}},
                    "spec": {"nodeName": name, "serviceAccountName": "tether",
                             "containers": [{"name": "agent", "image": "tether"}]}}),
        )
        .map_err(|e| fail("agent pod", e))?;
    let uid = pod["metadata"]["uid"]
        .as_str()
        .ok_or_else(|| format!("agent pod of {name}: no uid in {pod}"))?
        .to_string();
    let token = token(
        admin,
        "tether",
        Some((&agent_pod(name), &uid)),
        expiration_s,
    )?;
    Ok(NodeCredential {
        name: name.to_string(),
        agent_pod_uid: uid,
        token,
    })
}

/// Delete node `name` and what a cluster's controllers delete with it: its heartbeat Lease
/// (garbage collector). Its pods are the caller's (the pod GC controller deletes them some time
/// after the node).
pub fn delete_node(admin: &Admin, name: &str) -> Result<(), Fail> {
    admin.delete(&format!("/api/v1/nodes/{name}"))?;
    admin.delete(&heartbeat_path(name))?;
    Ok(())
}

/// The unix time of `node`'s last heartbeat as the server has it (`renewTime`): where a
/// node-lost grace counts from.
pub fn heartbeat(admin: &Admin, node: &str) -> Result<Option<f64>, Fail> {
    match admin.get(&heartbeat_path(node)) {
        Ok(v) => Ok(v["spec"]["renewTime"]
            .as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .map(|t| t.as_microsecond() as f64 / 1e6)),
        Err(Fail {
            code: Some(404), ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The kubelets of every simulated node: a thread renewing each node's heartbeat Lease every
/// [`HEARTBEAT_EVERY`], until the node is silenced or forgotten. One thread for all nodes (200
/// nodes are 20 small writes a second).
pub struct Kubelet {
    /// Node → still renewing.
    nodes: Arc<Mutex<BTreeMap<String, bool>>>,
    stop: Arc<AtomicBool>,
    failures: Arc<Mutex<u64>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Kubelet {
    pub fn start(admin: &Admin) -> Result<Kubelet, String> {
        let admin = admin.again()?;
        let nodes: Arc<Mutex<BTreeMap<String, bool>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let failures = Arc::new(Mutex::new(0));
        let (n, s, f) = (nodes.clone(), stop.clone(), failures.clone());
        let thread = std::thread::Builder::new()
            .name("kubelets".into())
            .spawn(move || {
                let mut next = Instant::now() + HEARTBEAT_EVERY;
                while !s.load(Ordering::Relaxed) {
                    if Instant::now() < next {
                        std::thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                    next += HEARTBEAT_EVERY;
                    for node in renewing(&n) {
                        if s.load(Ordering::Relaxed) {
                            break;
                        }
                        // Looked up again: a node silenced during this round is left alone.
                        if n.lock().unwrap_or_else(|p| p.into_inner()).get(&node) != Some(&true) {
                            continue;
                        }
                        if renew(&admin, &node).is_err() {
                            *f.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                        }
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(Kubelet {
            nodes,
            stop,
            failures,
            thread: Some(thread),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, bool>> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep renewing `node`'s heartbeat ([`register`] wrote the first one).
    pub fn add(&self, node: &str) {
        self.lock().insert(node.to_string(), true);
    }

    /// Stop renewing `node`'s heartbeat: the node went silent. (A renewal already on the wire
    /// may still land: read the last one from the server with [`heartbeat`].)
    pub fn silence(&self, node: &str) {
        self.lock().insert(node.to_string(), false);
    }

    /// `node` is gone: nothing to renew.
    pub fn forget(&self, node: &str) {
        self.lock().remove(node);
    }

    /// Renewals the server refused or did not answer (during an outage, say).
    pub fn failures(&self) -> u64 {
        *self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn renewing(nodes: &Mutex<BTreeMap<String, bool>>) -> Vec<String> {
    nodes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(_, r)| **r)
        .map(|(k, _)| k.clone())
        .collect()
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A pod bound to `node` in namespace `ns`; its uid.
pub fn create_pod(admin: &Admin, ns: &str, name: &str, node: &str) -> Result<String, String> {
    let p = admin
        .post(
            &format!("/api/v1/namespaces/{ns}/pods"),
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/none"}]}}),
        )
        .map_err(|e| format!("create pod {ns}/{name}: {e}"))?;
    p["metadata"]["uid"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("pod {ns}/{name}: no uid"))
}

/// Create namespace `ns` unless it exists.
pub fn ensure_namespace(admin: &Admin, ns: &str) -> Result<(), String> {
    match admin.post(
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    ) {
        Ok(_)
        | Err(Fail {
            code: Some(409), ..
        }) => Ok(()),
        Err(e) => Err(format!("create namespace {ns}: {e}")),
    }
}

/// The pod's uid, or `None` when it does not exist.
pub fn pod_uid(admin: &Admin, ns: &str, name: &str) -> Result<Option<String>, Fail> {
    match admin.get(&format!("/api/v1/namespaces/{ns}/pods/{name}")) {
        Ok(v) => Ok(v["metadata"]["uid"].as_str().map(str::to_string)),
        Err(Fail {
            code: Some(404), ..
        }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `v["metadata"]["name"]` of every item of a list.
pub fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_times_have_six_digits() {
        assert_eq!(micro_time(1_700_000_000.25), "2023-11-14T22:13:20.250000Z");
        assert_eq!(micro_time(0.0), "1970-01-01T00:00:00.000000Z");
    }
}
