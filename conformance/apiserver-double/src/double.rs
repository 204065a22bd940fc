//! `ApiServerDouble`, the handle a test holds: starting the server on its own thread and
//! runtime, its address and kubeconfig, and every test-control method (the objects it stores,
//! the pods and nodes it serves, the knobs). Nothing else in the crate imports this module.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{broadcast, oneshot};

use crate::kubeconfig::kubeconfig_for;
use crate::objects::State;
use crate::pods_nodes::{delete_node, delete_pod, upsert_node, upsert_pod};
use crate::server::{Options, serve};
use crate::shared::Shared;
use crate::watch::expire_watches;

/// A running double. Dropping it stops the server (and ends open watches).
pub struct ApiServerDouble {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ApiServerDouble {
    /// Start with default options on a free port of 127.0.0.1.
    pub fn start() -> io::Result<ApiServerDouble> {
        ApiServerDouble::start_with(Options::default())
    }

    /// Start with `opts`. The server runs on its own thread and tokio runtime.
    pub fn start_with(opts: Options) -> io::Result<ApiServerDouble> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", opts.port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (events, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            latency_us: AtomicU64::new(opts.latency.as_micros() as u64),
            crd_installed: AtomicBool::new(opts.crd_installed),
            cache_unready: AtomicU64::new(0),
            forbidden: Mutex::new(HashSet::new()),
            forbidden_in: Mutex::new(HashSet::new()),
            counts: Mutex::new(BTreeMap::new()),
            events,
            user: opts.user.clone(),
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.worker_threads.max(1))
            .thread_name("apiserver-double")
            .enable_all()
            .build()?;
        let (stop, stop_rx) = oneshot::channel();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("apiserver-double".into())
            .spawn(move || {
                rt.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => serve(l, sh, stop_rx).await,
                        Err(e) => log::error!("apiserver double: {e}"),
                    }
                });
                rt.shutdown_background();
            })?;
        Ok(ApiServerDouble {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig pointing at the double (no credentials: the double does not authenticate).
    pub fn kubeconfig(&self) -> String {
        kubeconfig_for(&self.url())
    }

    /// Write [`ApiServerDouble::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.kubeconfig())
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.state().rv
    }

    /// Every stored IPLease, by name.
    pub fn leases(&self) -> Vec<Value> {
        self.shared
            .state()
            .leases
            .values()
            .map(|s| s.value.clone())
            .collect()
    }

    /// One stored IPLease.
    pub fn lease(&self, name: &str) -> Option<Value> {
        self.shared
            .state()
            .leases
            .get(name)
            .map(|s| s.value.clone())
    }

    /// Create or replace a pod (needs `metadata.namespace` and `metadata.name`). The double sets
    /// `uid` (if absent), `resourceVersion` and `creationTimestamp` (if absent) and notifies
    /// watchers. Returns the stored pod.
    pub fn upsert_pod(&self, pod: Value) -> Result<Value, String> {
        upsert_pod(&self.shared, pod)
    }

    /// Delete a pod; false if it did not exist.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> bool {
        delete_pod(&self.shared, namespace, name)
    }

    /// Create or replace a node (needs `metadata.name`), like [`ApiServerDouble::upsert_pod`].
    pub fn upsert_node(&self, node: Value) -> Result<Value, String> {
        upsert_node(&self.shared, node)
    }

    /// Delete a node; false if it did not exist.
    pub fn delete_node(&self, name: &str) -> bool {
        delete_node(&self.shared, name)
    }

    /// Every stored node.
    pub fn nodes(&self) -> Vec<Value> {
        self.shared
            .state()
            .nodes
            .values()
            .map(|s| s.value.clone())
            .collect()
    }

    /// Every stored pod.
    pub fn pods(&self) -> Vec<Value> {
        self.shared
            .state()
            .pods
            .values()
            .map(|s| s.value.clone())
            .collect()
    }

    /// Delay every API request by `latency` from now on.
    pub fn set_latency(&self, latency: Duration) {
        self.shared
            .latency_us
            .store(latency.as_micros() as u64, Ordering::Relaxed);
    }

    /// Install or "uninstall" the IPLease CRD (objects are kept, as with a real uninstall they
    /// would not be, but they are unreachable while it is off).
    pub fn set_crd_installed(&self, installed: bool) {
        self.shared
            .crd_installed
            .store(installed, Ordering::Relaxed);
    }

    /// Answer 403 to `verb` (`get`, `list`, `watch`, `create`, `update`, `delete`) on `resource`
    /// (`ipleases`, `pods`, `customresourcedefinitions`).
    pub fn forbid(&self, verb: &str, resource: &str) {
        self.shared
            .forbidden
            .lock()
            .unwrap()
            .insert((verb.to_string(), resource.to_string()));
    }

    /// Answer 403 to `verb` on the namespaced `resource` (`pods`) in `namespace` only, as a
    /// Role missing in that namespace would: requests of other namespaces and cluster-wide ones
    /// (`/api/v1/pods`) are still served, and access reviews (cluster-wide) are unaffected.
    pub fn forbid_in(&self, verb: &str, resource: &str, namespace: &str) {
        self.shared.forbidden_in.lock().unwrap().insert((
            verb.to_string(),
            resource.to_string(),
            namespace.to_string(),
        ));
    }

    /// Undo one [`ApiServerDouble::forbid`].
    pub fn allow(&self, verb: &str, resource: &str) {
        self.shared
            .forbidden
            .lock()
            .unwrap()
            .remove(&(verb.to_string(), resource.to_string()));
    }

    /// Undo every [`ApiServerDouble::forbid`].
    pub fn allow_all(&self) {
        self.shared.forbidden.lock().unwrap().clear();
        self.shared.forbidden_in.lock().unwrap().clear();
    }

    /// Requests served so far, by `"verb resource"` (e.g. `"create ipleases"`, `"get version"`).
    pub fn request_counts(&self) -> BTreeMap<String, u64> {
        self.shared.counts.lock().unwrap().clone()
    }

    /// Requests of `verb` on `resource` so far.
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.request_counts()
            .get(&format!("{verb} {resource}"))
            .copied()
            .unwrap_or(0)
    }

    /// Every request to `resource` so far.
    pub fn total(&self, resource: &str) -> u64 {
        self.request_counts()
            .iter()
            .filter(|(k, _)| k.rsplit(' ').next() == Some(resource))
            .map(|(_, v)| *v)
            .sum()
    }

    /// Answer the next `n` IPLease lists from the watch cache (`resourceVersion` given) with 429
    /// TooManyRequests, as a restarted API server does while its watch cache fills. Consistent
    /// lists (no `resourceVersion`, what etcd must serve) are answered, and counted as
    /// `consistent-list ipleases`.
    pub fn set_cache_unready(&self, n: u64) {
        self.shared.cache_unready.store(n, Ordering::Relaxed);
    }

    /// Zero the counters.
    pub fn reset_counts(&self) {
        self.shared.counts.lock().unwrap().clear();
    }

    /// Expire every open watch (each ends with an `ERROR` event carrying `410 Expired`) and forget
    /// the event history, so a watch from any earlier `resourceVersion` gets `410` too: what a
    /// real API server does after its watch cache or etcd compacted past a client.
    pub fn expire_watches(&self) {
        expire_watches(&self.shared)
    }
}

impl Drop for ApiServerDouble {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
