//! **A test double of the Kubernetes API — not an API server.**
//!
//! It serves, over plain HTTP on 127.0.0.1, only the subset of the API that tether's Kubernetes
//! lease store (and a later pod reconciler) uses, from memory, with the behaviour those clients
//! rely on:
//!
//! - `IPLease` custom resources, cluster-scoped, at `/apis/ipam.tether.dev/v1alpha1/ipleases[/NAME]`:
//!   create (POST), get, list, watch, replace (PUT) and delete, with
//!   - a monotonically increasing `resourceVersion` shared by every object (like etcd's revision)
//!     and a fresh `uid` per created object;
//!   - `409 AlreadyExists` on a create of an existing name, `409 Conflict` on a replace carrying a
//!     stale `resourceVersion` or another `uid`, and on a delete whose preconditions
//!     (`uid`, `resourceVersion`) fail; `404 NotFound` for a missing object; each with a real
//!     `Status` body (`reason`, `message`, `details`, `code`);
//!   - list with equality label selectors (`k=v`, `k==v`, `k!=v`, `k`, `!k`), the
//!     `metadata.name` field selector, `limit`/`continue` pagination and `resourceVersion` /
//!     `resourceVersionMatch` handling good enough for a client (a too-new version gives 504, an
//!     `Exact` version other than the current one 410);
//!   - a light imitation of the CRD's validation (required fields, `network` and `address`
//!     immutable) answering `422 Invalid`.
//! - `GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions/ipleases.ipam.tether.dev` (an
//!   `Established` CRD) and `GET /version`.
//! - Pods, read-only: `GET /api/v1/namespaces/NS/pods/NAME`, list and watch of `/api/v1/pods` and
//!   `/api/v1/namespaces/NS/pods` (label selectors; field selectors on `spec.nodeName`,
//!   `metadata.name`, `metadata.namespace`, `status.phase`, `status.podIP`), from an in-memory set
//!   the test controls ([`ApiServerDouble::upsert_pod`], [`ApiServerDouble::delete_pod`]). Watches
//!   stream chunked JSON lines (`{"type":"ADDED","object":{...}}`), start with synthetic `ADDED`
//!   events when no `resourceVersion` (or `0`) is given, and replay the recent history otherwise.
//! - Nodes, read-only, the same way ([`ApiServerDouble::upsert_node`],
//!   [`ApiServerDouble::delete_node`]).
//! - `SelfSubjectAccessReview` (create): allowed unless the (verb, resource) pair is forbidden.
//! - Metadata-only answers (`Accept: ...;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`) for
//!   every get, list and watch.
//!
//! Test knobs: injectable latency per request, `403 Forbidden` on demand per (verb, resource) or
//! per (verb, resource, namespace), "CRD not installed" mode (the group answers 404 like a real
//! server without the CRD), and request counters per verb and resource (`"create ipleases"`), so
//! benchmarks can report API requests per allocation.
//!
//! Not modelled: authentication, admission, field managers, patch, finalizers, namespaces as
//! objects, and snapshot-consistent pagination (pages after the first reflect the current state;
//! a real server serves every page from the first page's resourceVersion).
//!
//! Start it in-process with [`ApiServerDouble::start`], or run the `tether-apiserver-double`
//! binary, which prints `listening http://127.0.0.1:PORT` and is controlled over HTTP under
//! `/_double/` (see below).
//!
//! # Control endpoints
//!
//! Not part of the Kubernetes API; neither counted nor delayed:
//!
//! - `GET /_double/stats` → `{"requests": {"list ipleases": 3, ...}, "resourceVersion": "17", "ipleases": 5, "pods": 2}`
//! - `POST /_double/reset` → zero the request counters
//! - `POST /_double/config` with any of `{"latencyMs": 2, "crdInstalled": false, "forbid": [["create", "ipleases"], ["list", "pods", "kube-system"]], "allowAll": true}`
//!   (a third element limits a forbid to that namespace)
//! - `PUT /_double/pods` with a pod object → stored pod; `DELETE /_double/pods/NS/NAME`
//! - `PUT /_double/nodes` with a node object; `DELETE /_double/nodes/NAME`
//! - `POST /_double/expire` → every open watch ends with a `410 Expired` ERROR event

// Handlers return an early HTTP response as their error; its size does not matter here.
#![allow(clippy::result_large_err)]

pub mod util;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::util::{
    Term, field, hex, label, matches, now_rfc3339, parse_query, parse_selector, unhex, uuid4,
};

/// API group of the lease resource.
pub const GROUP: &str = "ipam.tether.dev";
/// API version of the lease resource.
pub const VERSION: &str = "v1alpha1";
/// Plural (resource) name.
pub const PLURAL: &str = "ipleases";
/// Kind.
pub const KIND: &str = "IPLease";
/// Name of the CRD object.
pub const CRD_NAME: &str = "ipleases.ipam.tether.dev";
/// Kubernetes version the double claims to be.
pub const FAKE_VERSION: &str = "v1.33.0-tether-double";

const HISTORY: usize = 10_000;
/// Pseudo event type: every open watch ends with a `410 Expired` ERROR event.
const EXPIRE: &str = "EXPIRE";
const MAX_WATCH_S: u64 = 1800;

type Body = BoxBody<Bytes, Infallible>;
type Resp = Response<Body>;

/// How to start the double.
#[derive(Debug, Clone)]
pub struct Options {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Delay added before answering each API request (not the control endpoints).
    pub latency: Duration,
    /// Whether the IPLease CRD is installed (false: its group answers 404).
    pub crd_installed: bool,
    /// Worker threads of the double's own runtime.
    pub worker_threads: usize,
    /// User name quoted in 403 messages.
    pub user: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: 0,
            latency: Duration::ZERO,
            crd_installed: true,
            worker_threads: 2,
            user: "system:serviceaccount:kube-system:tether".to_string(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Lease,
    Pod,
    Node,
}

impl Kind {
    fn resource(self) -> &'static str {
        match self {
            Kind::Lease => PLURAL,
            Kind::Pod => "pods",
            Kind::Node => "nodes",
        }
    }
    fn group(self) -> &'static str {
        match self {
            Kind::Lease => GROUP,
            Kind::Pod | Kind::Node => "",
        }
    }
    fn qualified(self) -> String {
        match self {
            Kind::Lease => format!("{PLURAL}.{GROUP}"),
            Kind::Pod => "pods".to_string(),
            Kind::Node => "nodes".to_string(),
        }
    }
    fn list_kind(self) -> &'static str {
        match self {
            Kind::Lease => "IPLeaseList",
            Kind::Pod => "PodList",
            Kind::Node => "NodeList",
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Kind::Lease => "ipam.tether.dev/v1alpha1",
            Kind::Pod | Kind::Node => "v1",
        }
    }
}

/// A stored object with its serialised form (lists concatenate these).
#[derive(Debug)]
struct Stored {
    value: Value,
    json: Bytes,
}

impl Stored {
    fn new(value: Value) -> Arc<Stored> {
        let json = Bytes::from(serde_json::to_vec(&value).expect("JSON value serialises"));
        Arc::new(Stored { value, json })
    }
    fn rv(&self) -> u64 {
        self.value
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
}

#[derive(Debug)]
struct Event {
    kind: Kind,
    type_: &'static str,
    rv: u64,
    obj: Arc<Stored>,
}

#[derive(Default)]
struct State {
    rv: u64,
    leases: BTreeMap<String, Arc<Stored>>,
    /// Key `namespace/name`.
    pods: BTreeMap<String, Arc<Stored>>,
    nodes: BTreeMap<String, Arc<Stored>>,
    history: VecDeque<Arc<Event>>,
    /// Events with a resourceVersion above this are all in `history`.
    history_floor: u64,
}

impl State {
    fn map(&mut self, kind: Kind) -> &mut BTreeMap<String, Arc<Stored>> {
        match kind {
            Kind::Lease => &mut self.leases,
            Kind::Pod => &mut self.pods,
            Kind::Node => &mut self.nodes,
        }
    }
    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }
    fn record(&mut self, ev: Arc<Event>, tx: &broadcast::Sender<Arc<Event>>) {
        if self.history.len() >= HISTORY
            && let Some(old) = self.history.pop_front()
        {
            self.history_floor = old.rv;
        }
        self.history.push_back(ev.clone());
        let _ = tx.send(ev);
    }
}

struct Shared {
    state: Mutex<State>,
    latency_us: AtomicU64,
    crd_installed: AtomicBool,
    forbidden: Mutex<HashSet<(String, String)>>,
    /// (verb, resource, namespace): 403 on requests in that namespace only.
    forbidden_in: Mutex<HashSet<(String, String, String)>>,
    counts: Mutex<BTreeMap<String, u64>>,
    events: broadcast::Sender<Arc<Event>>,
    user: String,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    fn latency(&self) -> Duration {
        Duration::from_micros(self.latency_us.load(Ordering::Relaxed))
    }
    fn count(&self, key: String) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default() += 1;
    }
    fn is_forbidden(&self, verb: &str, resource: &str) -> bool {
        self.forbidden
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(verb.to_string(), resource.to_string()))
    }
    fn is_forbidden_in(&self, verb: &str, resource: &str, ns: Option<&str>) -> bool {
        let Some(ns) = ns else { return false };
        self.forbidden_in
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(verb.to_string(), resource.to_string(), ns.to_string()))
    }
}

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

    /// Zero the counters.
    pub fn reset_counts(&self) {
        self.shared.counts.lock().unwrap().clear();
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

    /// Expire every open watch (each ends with an `ERROR` event carrying `410 Expired`) and forget
    /// the event history, so a watch from any earlier `resourceVersion` gets `410` too: what a
    /// real API server does after its watch cache or etcd compacted past a client.
    pub fn expire_watches(&self) {
        expire_watches(&self.shared)
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

/// A self-signed certificate (its key was thrown away) that only fills the kubeconfig's
/// `certificate-authority-data`, as every real cluster's kubeconfig has one: a client then
/// trusts just that certificate instead of loading the operating system's trust store, which
/// would make every client construction (one per CNI call) needlessly slow. The double itself
/// speaks plain HTTP, so the certificate is never used.
pub const PLACEHOLDER_CA_PEM_BASE64: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJuRENDQVVHZ0F3SUJBZ0lVVlQxUHJmSm9kUDdweWpaeGxpYThxN29EVVdJd0NnWUlLb1pJemowRUF3SXcKSWpFZ01CNEdBMVVFQXd3WGRHVjBhR1Z5TFdGd2FYTmxjblpsY2kxa2IzVmliR1V3SUJjTk1qWXhNVE13TURjMQpNek14V2hnUE1qRXlOakV4TURZd056VXpNekZhTUNJeElEQWVCZ05WQkFNTUYzUmxkR2hsY2kxaGNHbHpaWEoyClpYSXRaRzkxWW14bE1Ga3dFd1lIS29aSXpqMENBUVlJS29aSXpqMERBUWNEUWdBRTVJOG03RHA3WGFnRHRkaGcKaTc2N2RVWVdOSXdsOUxMTUhtSm0ycnh4ZmFPa3hUaVdhbVh6VGFYVFM3ZFI1VzFZcHlEQktkNmVGUjU0MEE5RgordDFnNWFOVE1GRXdIUVlEVlIwT0JCWUVGSUw4VW12UlhSVER6K0ptWmNpVll2dUVBTVR4TUI4R0ExVWRJd1FZCk1CYUFGSUw4VW12UlhSVER6K0ptWmNpVll2dUVBTVR4TUE4R0ExVWRFd0VCL3dRRk1BTUJBZjh3Q2dZSUtvWkkKemowRUF3SURTUUF3UmdJaEFJM0dWMzAzT0IrbGt3TzRxZ1FOSVBIT2VDV3NCbmhmOGxvbmFKQS9rWDRLQWlFQQoveUVuc2JINWRuS2RjejRWeS9PekJSM2QrRjlTWWxIS0U4Qk10RjVDUHVJPQotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==";

/// A kubeconfig (YAML) for a server at `url` without credentials.
pub fn kubeconfig_for(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    server: {url}\n    \
         certificate-authority-data: {PLACEHOLDER_CA_PEM_BASE64}\n\
         contexts:\n- name: double\n  context:\n    cluster: double\n    user: double\n\
         current-context: double\nusers:\n- name: double\n  user: {{}}\n"
    )
}

async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stop => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let sh = shared.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            let sh = sh.clone();
                            async move { Ok::<_, Infallible>(handle(sh, req).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    });
                }
                Err(e) => {
                    log::warn!("apiserver double: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

// ----- responses ------------------------------------------------------------------------------

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

fn json_bytes(code: u16, bytes: Bytes) -> Resp {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(full(bytes))
        .expect("valid response")
}

fn json_resp(code: u16, v: &Value) -> Resp {
    json_bytes(
        code,
        Bytes::from(serde_json::to_vec(v).expect("serialises")),
    )
}

fn status_value(code: u16, reason: &str, message: &str, details: Value) -> Value {
    let mut v = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if !details.is_null() {
        v["details"] = details;
    }
    v
}

fn status(code: u16, reason: &str, message: &str, details: Value) -> Resp {
    json_resp(code, &status_value(code, reason, message, details))
}

fn details(kind: Kind, name: &str) -> Value {
    json!({"name": name, "group": kind.group(), "kind": kind.resource()})
}

fn not_found(kind: Kind, name: &str) -> Resp {
    status(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", kind.qualified()),
        details(kind, name),
    )
}

fn no_such_resource() -> Resp {
    status(
        404,
        "NotFound",
        "the server could not find the requested resource",
        json!({}),
    )
}

fn bad_request(msg: &str) -> Resp {
    status(400, "BadRequest", msg, Value::Null)
}

fn conflict(kind: Kind, name: &str, why: &str) -> Resp {
    status(
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            kind.qualified()
        ),
        details(kind, name),
    )
}

fn invalid(name: &str, field_path: &str, msg: &str) -> Resp {
    status(
        422,
        "Invalid",
        &format!("{KIND}.{GROUP} \"{name}\" is invalid: {field_path}: {msg}"),
        json!({"name": name, "group": GROUP, "kind": KIND,
               "causes": [{"reason": "FieldValueInvalid", "message": msg, "field": field_path}]}),
    )
}

// ----- routing --------------------------------------------------------------------------------

enum Target {
    Version,
    Crd(String),
    Collection(Kind, Option<String>),
    Item(Kind, Option<String>, String),
    Control(Vec<String>),
    AccessReview,
    Unknown,
}

fn route(path: &str) -> Target {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["_double", rest @ ..] => Target::Control(rest.iter().map(|s| s.to_string()).collect()),
        ["version"] => Target::Version,
        [
            "apis",
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            name,
        ] => Target::Crd(name.to_string()),
        ["apis", g, v, p] if *g == GROUP && *v == VERSION && *p == PLURAL => {
            Target::Collection(Kind::Lease, None)
        }
        ["apis", g, v, p, name] if *g == GROUP && *v == VERSION && *p == PLURAL => {
            Target::Item(Kind::Lease, None, name.to_string())
        }
        ["api", "v1", "pods"] => Target::Collection(Kind::Pod, None),
        ["api", "v1", "nodes"] => Target::Collection(Kind::Node, None),
        ["api", "v1", "nodes", name] => Target::Item(Kind::Node, None, name.to_string()),
        [
            "apis",
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
        ] => Target::AccessReview,
        ["api", "v1", "namespaces", ns, "pods"] => {
            Target::Collection(Kind::Pod, Some(ns.to_string()))
        }
        ["api", "v1", "namespaces", ns, "pods", name] => {
            Target::Item(Kind::Pod, Some(ns.to_string()), name.to_string())
        }
        _ => Target::Unknown,
    }
}

async fn handle(sh: Arc<Shared>, req: Request<Incoming>) -> Resp {
    let method = req.method().clone();
    let path = util::percent_decode(req.uri().path());
    let q = parse_query(req.uri().query());
    let target = route(&path);
    // `Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`: metadata only.
    let meta_only = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
    if let Target::Control(rest) = target {
        let body = read_body(req).await;
        return control(&sh, &method, &rest, body);
    }
    let watch = matches!(q.get("watch").map(String::as_str), Some("true") | Some("1"));
    let (verb, resource) = match (&target, &method) {
        (Target::Version, _) => ("get", "version".to_string()),
        (Target::Crd(_), &Method::GET) => ("get", "customresourcedefinitions".to_string()),
        (Target::AccessReview, &Method::POST) => ("create", "selfsubjectaccessreviews".to_string()),
        (Target::Collection(k, _), &Method::GET) if watch => ("watch", k.resource().to_string()),
        (Target::Collection(k, _), &Method::GET) => ("list", k.resource().to_string()),
        (Target::Collection(k, _), &Method::POST) => ("create", k.resource().to_string()),
        (Target::Collection(k, _), &Method::DELETE) => {
            ("deletecollection", k.resource().to_string())
        }
        (Target::Item(k, _, _), &Method::GET) => ("get", k.resource().to_string()),
        (Target::Item(k, _, _), &Method::PUT) => ("update", k.resource().to_string()),
        (Target::Item(k, _, _), &Method::PATCH) => ("patch", k.resource().to_string()),
        (Target::Item(k, _, _), &Method::DELETE) => ("delete", k.resource().to_string()),
        _ => (method_verb(&method), "unknown".to_string()),
    };
    sh.count(format!("{verb} {resource}"));
    let lat = sh.latency();
    if !lat.is_zero() {
        tokio::time::sleep(lat).await;
    }
    let target_ns = match &target {
        Target::Collection(_, ns) | Target::Item(_, ns, _) => ns.as_deref(),
        _ => None,
    };
    if sh.is_forbidden(verb, &resource) || sh.is_forbidden_in(verb, &resource, target_ns) {
        return forbidden(&sh, verb, &resource, &target);
    }
    let lease_target = matches!(
        target,
        Target::Collection(Kind::Lease, _) | Target::Item(Kind::Lease, _, _)
    );
    if lease_target && !sh.crd_installed.load(Ordering::Relaxed) {
        return no_such_resource();
    }
    match (target, method) {
        (Target::Version, Method::GET) => json_resp(
            200,
            &json!({"major": "1", "minor": "33", "gitVersion": FAKE_VERSION,
                    "platform": "linux/amd64", "goVersion": "none (tether apiserver double)"}),
        ),
        (Target::Crd(name), Method::GET) => crd(&sh, &name),
        (Target::Collection(kind, ns), Method::GET) => {
            if watch {
                watch_objects(&sh, kind, ns, &q, meta_only)
            } else {
                list(&sh, kind, ns.as_deref(), &q, meta_only)
            }
        }
        (Target::Collection(Kind::Lease, _), Method::POST) => {
            let body = read_body(req).await;
            create_lease(&sh, body)
        }
        (Target::Item(kind, ns, name), Method::GET) => {
            get(&sh, kind, ns.as_deref(), &name, meta_only)
        }
        (Target::AccessReview, Method::POST) => {
            let body = read_body(req).await;
            access_review(&sh, body)
        }
        (Target::Item(Kind::Lease, _, name), Method::PUT) => {
            let body = read_body(req).await;
            update_lease(&sh, &name, body)
        }
        (Target::Item(Kind::Lease, _, name), Method::DELETE) => {
            let body = read_body(req).await;
            delete_lease(&sh, &name, body)
        }
        (Target::Unknown, _) => no_such_resource(),
        (_, m) => status(
            405,
            "MethodNotAllowed",
            &format!("the double does not support {m} on {path}"),
            Value::Null,
        ),
    }
}

fn method_verb(m: &Method) -> &'static str {
    match *m {
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

async fn read_body(req: Request<Incoming>) -> Bytes {
    match req.into_body().collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => Bytes::new(),
    }
}

fn forbidden(sh: &Shared, verb: &str, resource: &str, target: &Target) -> Resp {
    let (group, name, ns) = match target {
        Target::Collection(k, ns) => (k.group(), None, ns.clone()),
        Target::Item(k, ns, n) => (k.group(), Some(n.clone()), ns.clone()),
        Target::Crd(n) => ("apiextensions.k8s.io", Some(n.clone()), None),
        Target::AccessReview => ("authorization.k8s.io", None, None),
        _ => ("", None, None),
    };
    let qualified = if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    };
    let subject = match &name {
        Some(n) => format!("{qualified} \"{n}\""),
        None => qualified,
    };
    let scope = match &ns {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    let msg = format!(
        "{subject} is forbidden: User \"{}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}",
        sh.user
    );
    let mut d = json!({"group": group, "kind": resource});
    if let Some(n) = name {
        d["name"] = json!(n);
    }
    status(403, "Forbidden", &msg, d)
}

// ----- CRD ------------------------------------------------------------------------------------

fn crd(sh: &Shared, name: &str) -> Resp {
    if name != CRD_NAME || !sh.crd_installed.load(Ordering::Relaxed) {
        return status(
            404,
            "NotFound",
            &format!("customresourcedefinitions.apiextensions.k8s.io \"{name}\" not found"),
            json!({"name": name, "group": "apiextensions.k8s.io", "kind": "customresourcedefinitions"}),
        );
    }
    json_resp(
        200,
        &json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": CRD_NAME, "uid": "00000000-0000-4000-8000-000000000001",
                         "resourceVersion": "1", "generation": 1},
            "spec": {
                "group": GROUP,
                "names": {"kind": KIND, "listKind": "IPLeaseList", "plural": PLURAL, "singular": "iplease"},
                "scope": "Cluster",
                "versions": [{"name": VERSION, "served": true, "storage": true}]
            },
            "status": {
                "acceptedNames": {"kind": KIND, "listKind": "IPLeaseList", "plural": PLURAL, "singular": "iplease"},
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                     "message": "no conflicts found", "lastTransitionTime": "2024-01-01T00:00:00Z"},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                     "message": "the initial names have been accepted", "lastTransitionTime": "2024-01-01T00:00:00Z"}
                ],
                "storedVersions": [VERSION]
            }
        }),
    )
}

// ----- read -----------------------------------------------------------------------------------

fn key(ns: Option<&str>, name: &str) -> String {
    match ns {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

fn get(sh: &Shared, kind: Kind, ns: Option<&str>, name: &str, meta_only: bool) -> Resp {
    let k = key(ns, name);
    let obj = sh.state().map(kind).get(&k).cloned();
    match obj {
        Some(o) if meta_only => json_bytes(200, metadata_json(&o, false)),
        Some(o) => json_bytes(200, o.json.clone()),
        None => not_found(kind, name),
    }
}

struct Filter {
    ns: Option<String>,
    labels: Vec<Term>,
    fields: Vec<Term>,
}

impl Filter {
    fn parse(kind: Kind, ns: Option<String>, q: &BTreeMap<String, String>) -> Result<Filter, Resp> {
        let labels = parse_selector(
            q.get("labelSelector").map(String::as_str).unwrap_or(""),
            true,
        )
        .map_err(|e| bad_request(&format!("unable to parse requirement: {e}")))?;
        let fields = parse_selector(
            q.get("fieldSelector").map(String::as_str).unwrap_or(""),
            false,
        )
        .map_err(|e| bad_request(&e))?;
        let allowed: &[&str] = match kind {
            Kind::Lease => &["metadata.name"],
            Kind::Node => &["metadata.name"],
            Kind::Pod => &[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "status.phase",
                "status.podIP",
            ],
        };
        for t in &fields {
            let (Term::Eq(k, _) | Term::Ne(k, _) | Term::Exists(k) | Term::NotExists(k)) = t;
            if !allowed.contains(&k.as_str()) {
                return Err(bad_request(&format!(
                    "\"{k}\" is not a known field selector: only \"{}\"",
                    allowed.join("\", \"")
                )));
            }
        }
        Ok(Filter { ns, labels, fields })
    }

    fn accepts(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.ns
            && field(obj, "metadata.namespace").as_deref() != Some(ns.as_str())
        {
            return false;
        }
        matches(&self.labels, |k| label(obj, k)) && matches(&self.fields, |k| field(obj, k))
    }
}

fn list(
    sh: &Shared,
    kind: Kind,
    ns: Option<&str>,
    q: &BTreeMap<String, String>,
    meta_only: bool,
) -> Resp {
    let filter = match Filter::parse(kind, ns.map(str::to_string), q) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let limit: Option<usize> = match q.get("limit").filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => match s.parse::<usize>() {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(_) => return bad_request(&format!("invalid limit {s:?}")),
        },
    };
    // continue token: "<list rv>:<hex of the last name returned>"
    let cont = match q.get("continue").filter(|s| !s.is_empty()) {
        None => None,
        Some(tok) => {
            let parsed = tok
                .split_once(':')
                .and_then(|(rv, h)| Some((rv.parse::<u64>().ok()?, unhex(h)?)));
            match parsed {
                Some(p) => Some(p),
                None => return bad_request("continue key is not valid: malformed token"),
            }
        }
    };
    let (items, list_rv) = {
        let st = sh.state();
        let current = st.rv;
        if cont.is_none()
            && let Some(rv) = q.get("resourceVersion").filter(|s| !s.is_empty())
        {
            let Ok(want) = rv.parse::<u64>() else {
                return bad_request(&format!("invalid resource version {rv:?}"));
            };
            let exact = q.get("resourceVersionMatch").map(String::as_str) == Some("Exact");
            if exact && want != current {
                return status(
                    410,
                    "Expired",
                    &format!("too old resource version: {want} ({current})"),
                    Value::Null,
                );
            }
            if want > current {
                return status(
                    504,
                    "Timeout",
                    &format!("Too large resource version: {want}, current: {current}"),
                    json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
                );
            }
        }
        let map = match kind {
            Kind::Lease => &st.leases,
            Kind::Pod => &st.pods,
            Kind::Node => &st.nodes,
        };
        let start = cont.as_ref().map(|(_, after)| after.clone());
        let iter: Box<dyn Iterator<Item = (&String, &Arc<Stored>)>> = match &start {
            Some(after) => Box::new(map.range::<String, _>((
                std::ops::Bound::Excluded(after.clone()),
                std::ops::Bound::Unbounded,
            ))),
            None => Box::new(map.iter()),
        };
        let items: Vec<(String, Arc<Stored>)> = iter
            .filter(|(_, o)| filter.accepts(&o.value))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        let list_rv = cont.as_ref().map(|(rv, _)| *rv).unwrap_or(current);
        (items, list_rv)
    };
    let (page, rest) = match limit {
        Some(n) if items.len() > n => (&items[..n], items.len() - n),
        _ => (&items[..], 0),
    };
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if rest > 0 {
        let last = &page[page.len() - 1].0;
        meta["continue"] = json!(format!("{list_rv}:{}", hex(last)));
        meta["remainingItemCount"] = json!(rest);
    }
    let mut body =
        Vec::with_capacity(64 + page.iter().map(|(_, o)| o.json.len() + 1).sum::<usize>());
    let (list_kind, api_version) = if meta_only {
        ("PartialObjectMetadataList", "meta.k8s.io/v1")
    } else {
        (kind.list_kind(), kind.api_version())
    };
    body.extend_from_slice(
        format!(
            "{{\"kind\":\"{list_kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{meta},\"items\":["
        )
        .as_bytes(),
    );
    for (i, (_, o)) in page.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        if meta_only {
            body.extend_from_slice(&metadata_json(o, true));
        } else {
            body.extend_from_slice(&o.json);
        }
    }
    body.extend_from_slice(b"]}");
    json_bytes(200, Bytes::from(body))
}

// ----- watch ----------------------------------------------------------------------------------

struct ChanBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChanBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.0.poll_recv(cx) {
            Poll::Ready(Some(b)) => Poll::Ready(Some(Ok(Frame::data(b)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The object as a `PartialObjectMetadata` (kind and apiVersion omitted inside a list, as the API
/// server does).
fn metadata_json(obj: &Stored, in_list: bool) -> Bytes {
    let meta = obj
        .value
        .get("metadata")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let v = if in_list {
        json!({"metadata": meta})
    } else {
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
    };
    Bytes::from(serde_json::to_vec(&v).expect("serialises"))
}

fn event_line_as(type_: &str, obj: &Stored, meta_only: bool) -> Bytes {
    if meta_only {
        let m = Stored {
            value: Value::Null,
            json: metadata_json(obj, false),
        };
        event_line(type_, &m)
    } else {
        event_line(type_, obj)
    }
}

fn event_line(type_: &str, obj: &Stored) -> Bytes {
    let mut v = Vec::with_capacity(obj.json.len() + 32);
    v.extend_from_slice(format!("{{\"type\":\"{type_}\",\"object\":").as_bytes());
    v.extend_from_slice(&obj.json);
    v.extend_from_slice(b"}\n");
    Bytes::from(v)
}

fn watch_objects(
    sh: &Arc<Shared>,
    kind: Kind,
    ns: Option<String>,
    q: &BTreeMap<String, String>,
    meta_only: bool,
) -> Resp {
    let filter = match Filter::parse(kind, ns, q) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(MAX_WATCH_S)
        .min(MAX_WATCH_S);
    let rv_param = q.get("resourceVersion").cloned().unwrap_or_default();
    let mut rx = sh.events.subscribe();
    let (initial, from_rv): (Vec<Bytes>, u64) = {
        let st = sh.state();
        if rv_param.is_empty() || rv_param == "0" {
            let map = match kind {
                Kind::Lease => &st.leases,
                Kind::Pod => &st.pods,
                Kind::Node => &st.nodes,
            };
            let lines = map
                .values()
                .filter(|o| filter.accepts(&o.value))
                .map(|o| event_line_as("ADDED", o, meta_only))
                .collect();
            (lines, st.rv)
        } else {
            let Ok(want) = rv_param.parse::<u64>() else {
                return bad_request(&format!("invalid resource version {rv_param:?}"));
            };
            if want < st.history_floor {
                return status(
                    410,
                    "Expired",
                    &format!("too old resource version: {want} ({})", st.rv),
                    Value::Null,
                );
            }
            let lines = st
                .history
                .iter()
                .filter(|e| e.kind == kind && e.rv > want && filter.accepts(&e.obj.value))
                .map(|e| event_line_as(e.type_, &e.obj, meta_only))
                .collect();
            (lines, st.rv.max(want))
        }
    };
    let (tx, body_rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        for line in initial {
            if tx.send(line).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = tx.closed() => return,
                ev = rx.recv() => match ev {
                    Ok(ev) => {
                        if ev.type_ == EXPIRE {
                            let st = Stored::new(status_value(410, "Expired", "too old resource version (the double expired every watch)", Value::Null));
                            let _ = tx.send(event_line("ERROR", &st)).await;
                            return;
                        }
                        if ev.kind != kind || ev.rv <= from_rv || !filter.accepts(&ev.obj.value) {
                            continue;
                        }
                        if tx.send(event_line_as(ev.type_, &ev.obj, meta_only)).await.is_err() {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let st = Stored::new(status_value(410, "Expired", "watch fell behind; re-list", Value::Null));
                        let _ = tx.send(event_line("ERROR", &st)).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(ChanBody(body_rx).boxed())
        .expect("valid response")
}

// ----- lease writes ---------------------------------------------------------------------------

fn parse_object(body: &Bytes) -> Result<Value, Resp> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad_request(&format!("the request body is not a JSON object: {e}")))?;
    if !v.is_object() {
        return Err(bad_request("the request body is not a JSON object"));
    }
    Ok(v)
}

fn meta_str<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get("metadata")
        .and_then(|m| m.get(k))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Imitates the CRD schema and its CEL rules (see deploy/crds/ipleases.yaml).
fn validate_lease(name: &str, v: &Value, old: Option<&Value>) -> Result<(), Resp> {
    if v.get("apiVersion").and_then(Value::as_str) != Some("ipam.tether.dev/v1alpha1")
        || v.get("kind").and_then(Value::as_str) != Some(KIND)
    {
        return Err(bad_request(&format!(
            "expected apiVersion ipam.tether.dev/v1alpha1 and kind {KIND}, got {} {}",
            v.get("apiVersion").unwrap_or(&Value::Null),
            v.get("kind").unwrap_or(&Value::Null)
        )));
    }
    let Some(spec) = v.get("spec").and_then(Value::as_object) else {
        return Err(invalid(name, "spec", "Required value"));
    };
    for f in [
        "network",
        "address",
        "containerID",
        "ifname",
        "state",
        "since",
    ] {
        match spec.get(f) {
            Some(Value::String(s)) if !(s.is_empty() && (f == "network" || f == "address")) => {}
            Some(Value::String(_)) => {
                return Err(invalid(name, &format!("spec.{f}"), "must not be empty"));
            }
            Some(_) => {
                return Err(invalid(
                    name,
                    &format!("spec.{f}"),
                    "must be of type string",
                ));
            }
            None => return Err(invalid(name, &format!("spec.{f}"), "Required value")),
        }
    }
    match spec.get("prefixLength").and_then(Value::as_u64) {
        Some(n) if n <= 128 => {}
        _ => {
            return Err(invalid(
                name,
                "spec.prefixLength",
                "must be an integer between 0 and 128",
            ));
        }
    }
    let state = spec["state"].as_str().unwrap_or("");
    if !["Leased", "Released", "Quarantined"].contains(&state) {
        return Err(invalid(
            name,
            "spec.state",
            &format!(
                "Unsupported value: \"{state}\": supported values: \"Leased\", \"Released\", \"Quarantined\""
            ),
        ));
    }
    if state == "Quarantined" && !spec.contains_key("quarantine") {
        return Err(invalid(
            name,
            "spec",
            "a Quarantined lease needs quarantine.mac and quarantine.at",
        ));
    }
    if state == "Released" && !spec.contains_key("releasedAt") {
        return Err(invalid(name, "spec", "a Released lease needs releasedAt"));
    }
    if let Some(old) = old {
        for f in ["network", "address"] {
            if old.pointer(&format!("/spec/{f}")) != spec.get(f) {
                return Err(invalid(
                    name,
                    &format!("spec.{f}"),
                    &format!("{f} is immutable"),
                ));
            }
        }
    }
    Ok(())
}

fn create_lease(sh: &Shared, body: Bytes) -> Resp {
    let mut v = match parse_object(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    if meta_str(&v, "resourceVersion").is_some() {
        return status(
            500,
            "InternalError",
            "Internal error occurred: resourceVersion should not be set on objects to be created",
            Value::Null,
        );
    }
    let name = match (meta_str(&v, "name"), meta_str(&v, "generateName")) {
        (Some(n), _) => n.to_string(),
        (None, Some(g)) => format!("{g}{}", &uuid4()[..5]),
        (None, None) => {
            return invalid(
                "",
                "metadata.name",
                "Required value: name or generateName is required",
            );
        }
    };
    if !util::is_dns_subdomain(&name) {
        return invalid(
            &name,
            "metadata.name",
            &format!(
                "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
                 characters, '-' or '.', and must start and end with an alphanumeric character"
            ),
        );
    }
    if let Err(r) = validate_lease(&name, &v, None) {
        return r;
    }
    let mut st = sh.state();
    if st.leases.contains_key(&name) {
        return status(
            409,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", Kind::Lease.qualified()),
            details(Kind::Lease, &name),
        );
    }
    let rv = st.next_rv();
    let meta = v["metadata"]
        .as_object_mut()
        .expect("checked: metadata has a name");
    meta.insert("name".into(), json!(name));
    meta.remove("generateName");
    meta.insert("uid".into(), json!(uuid4()));
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    meta.insert("generation".into(), json!(1));
    meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    let stored = Stored::new(v);
    st.leases.insert(name, stored.clone());
    let ev = Arc::new(Event {
        kind: Kind::Lease,
        type_: "ADDED",
        rv,
        obj: stored.clone(),
    });
    st.record(ev, &sh.events);
    json_bytes(201, stored.json.clone())
}

fn update_lease(sh: &Shared, name: &str, body: Bytes) -> Resp {
    let mut v = match parse_object(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    if meta_str(&v, "name") != Some(name) {
        return bad_request(&format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta_str(&v, "name").unwrap_or("")
        ));
    }
    let mut st = sh.state();
    let Some(old) = st.leases.get(name).cloned() else {
        return not_found(Kind::Lease, name);
    };
    let old_uid = meta_str(&old.value, "uid").unwrap_or("").to_string();
    if let Some(uid) = meta_str(&v, "uid")
        && uid != old_uid
    {
        return conflict(
            Kind::Lease,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
            ),
        );
    }
    if let Some(rv) = meta_str(&v, "resourceVersion")
        && rv != old.rv().to_string()
    {
        return conflict(
            Kind::Lease,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        );
    }
    if let Err(r) = validate_lease(name, &v, Some(&old.value)) {
        return r;
    }
    let rv = st.next_rv();
    let spec_changed = old.value.get("spec") != v.get("spec");
    let generation = old
        .value
        .pointer("/metadata/generation")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        + u64::from(spec_changed);
    let meta = v["metadata"]
        .as_object_mut()
        .expect("checked: metadata has a name");
    meta.insert("uid".into(), json!(old_uid));
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    meta.insert("generation".into(), json!(generation));
    meta.insert(
        "creationTimestamp".into(),
        old.value
            .pointer("/metadata/creationTimestamp")
            .cloned()
            .unwrap_or(Value::Null),
    );
    let stored = Stored::new(v);
    st.leases.insert(name.to_string(), stored.clone());
    let ev = Arc::new(Event {
        kind: Kind::Lease,
        type_: "MODIFIED",
        rv,
        obj: stored.clone(),
    });
    st.record(ev, &sh.events);
    json_bytes(200, stored.json.clone())
}

fn delete_lease(sh: &Shared, name: &str, body: Bytes) -> Resp {
    let opts: Value = if body.iter().all(|b| b.is_ascii_whitespace()) {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return bad_request(&format!("DeleteOptions are not valid JSON: {e}")),
        }
    };
    let mut st = sh.state();
    let Some(old) = st.leases.get(name).cloned() else {
        return not_found(Kind::Lease, name);
    };
    let old_uid = meta_str(&old.value, "uid").unwrap_or("").to_string();
    let old_rv = old.rv().to_string();
    if let Some(uid) = opts.pointer("/preconditions/uid").and_then(Value::as_str)
        && uid != old_uid
    {
        return conflict(
            Kind::Lease,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
            ),
        );
    }
    if let Some(rv) = opts
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        && rv != old_rv
    {
        return conflict(
            Kind::Lease,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {old_rv}"
            ),
        );
    }
    st.leases.remove(name);
    let rv = st.next_rv();
    let mut gone = old.value.clone();
    gone["metadata"]["resourceVersion"] = json!(rv.to_string());
    let stored = Stored::new(gone);
    let ev = Arc::new(Event {
        kind: Kind::Lease,
        type_: "DELETED",
        rv,
        obj: stored.clone(),
    });
    st.record(ev, &sh.events);
    // Custom resources answer a delete with the object as it was.
    json_bytes(200, old.json.clone())
}

// ----- pods -----------------------------------------------------------------------------------

fn upsert_pod(sh: &Shared, mut pod: Value) -> Result<Value, String> {
    let ns = meta_str(&pod, "namespace")
        .ok_or("pod needs metadata.namespace")?
        .to_string();
    let name = meta_str(&pod, "name")
        .ok_or("pod needs metadata.name")?
        .to_string();
    let mut st = sh.state();
    let k = key(Some(&ns), &name);
    let old = st.pods.get(&k).cloned();
    let rv = st.next_rv();
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    let meta = pod["metadata"]
        .as_object_mut()
        .ok_or("pod metadata is not an object")?;
    if !meta.contains_key("uid") {
        let uid = old
            .as_ref()
            .and_then(|o| meta_str(&o.value, "uid").map(str::to_string))
            .unwrap_or_else(uuid4);
        meta.insert("uid".into(), json!(uid));
    }
    if !meta.contains_key("creationTimestamp") {
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    }
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    let stored = Stored::new(pod);
    st.pods.insert(k, stored.clone());
    let type_ = if old.is_some() { "MODIFIED" } else { "ADDED" };
    let ev = Arc::new(Event {
        kind: Kind::Pod,
        type_,
        rv,
        obj: stored.clone(),
    });
    st.record(ev, &sh.events);
    Ok(stored.value.clone())
}

fn delete_pod(sh: &Shared, ns: &str, name: &str) -> bool {
    let mut st = sh.state();
    let Some(old) = st.pods.remove(&key(Some(ns), name)) else {
        return false;
    };
    let rv = st.next_rv();
    let mut gone = old.value.clone();
    gone["metadata"]["resourceVersion"] = json!(rv.to_string());
    let ev = Arc::new(Event {
        kind: Kind::Pod,
        type_: "DELETED",
        rv,
        obj: Stored::new(gone),
    });
    st.record(ev, &sh.events);
    true
}

fn upsert_node(sh: &Shared, mut node: Value) -> Result<Value, String> {
    let name = meta_str(&node, "name")
        .ok_or("node needs metadata.name")?
        .to_string();
    let mut st = sh.state();
    let old = st.nodes.get(&name).cloned();
    let rv = st.next_rv();
    node["apiVersion"] = json!("v1");
    node["kind"] = json!("Node");
    let meta = node["metadata"]
        .as_object_mut()
        .ok_or("node metadata is not an object")?;
    meta.remove("namespace");
    if !meta.contains_key("uid") {
        let uid = old
            .as_ref()
            .and_then(|o| meta_str(&o.value, "uid").map(str::to_string))
            .unwrap_or_else(uuid4);
        meta.insert("uid".into(), json!(uid));
    }
    if !meta.contains_key("creationTimestamp") {
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    }
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    let stored = Stored::new(node);
    st.nodes.insert(name, stored.clone());
    let type_ = if old.is_some() { "MODIFIED" } else { "ADDED" };
    let ev = Arc::new(Event {
        kind: Kind::Node,
        type_,
        rv,
        obj: stored.clone(),
    });
    st.record(ev, &sh.events);
    Ok(stored.value.clone())
}

fn delete_node(sh: &Shared, name: &str) -> bool {
    let mut st = sh.state();
    let Some(old) = st.nodes.remove(name) else {
        return false;
    };
    let rv = st.next_rv();
    let mut gone = old.value.clone();
    gone["metadata"]["resourceVersion"] = json!(rv.to_string());
    let ev = Arc::new(Event {
        kind: Kind::Node,
        type_: "DELETED",
        rv,
        obj: Stored::new(gone),
    });
    st.record(ev, &sh.events);
    true
}

fn expire_watches(sh: &Shared) {
    let mut st = sh.state();
    st.history.clear();
    st.history_floor = st.rv;
    let ev = Arc::new(Event {
        kind: Kind::Pod,
        type_: EXPIRE,
        rv: st.rv,
        obj: Stored::new(Value::Null),
    });
    // Not recorded in the history: it only ends the watches open now.
    let _ = sh.events.send(ev);
}

// ----- access reviews -------------------------------------------------------------------------

/// `SelfSubjectAccessReview`: allowed unless the (verb, resource) pair is forbidden with
/// [`ApiServerDouble::forbid`] (the group is not considered; subresources and names are ignored).
fn access_review(sh: &Shared, body: Bytes) -> Resp {
    let mut v = match parse_object(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let attrs = v.pointer("/spec/resourceAttributes").cloned();
    let Some(attrs) = attrs.filter(Value::is_object) else {
        return invalid_review(
            "spec.resourceAttributes",
            "Required value: the double answers resource attributes only",
        );
    };
    let verb = attrs.get("verb").and_then(Value::as_str).unwrap_or("");
    let resource = attrs.get("resource").and_then(Value::as_str).unwrap_or("");
    if verb.is_empty() || resource.is_empty() {
        return invalid_review("spec.resourceAttributes", "verb and resource are required");
    }
    let allowed = !sh.is_forbidden(verb, resource);
    v["apiVersion"] = json!("authorization.k8s.io/v1");
    v["kind"] = json!("SelfSubjectAccessReview");
    v["metadata"] = json!({"creationTimestamp": null});
    v["status"] = if allowed {
        json!({"allowed": true, "reason": "allowed by the tether apiserver double"})
    } else {
        json!({"allowed": false, "reason": format!("the double forbids {verb} on {resource} for User \"{}\"", sh.user)})
    };
    json_resp(201, &v)
}

fn invalid_review(field_path: &str, msg: &str) -> Resp {
    status(
        422,
        "Invalid",
        &format!(
            "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: {field_path}: {msg}"
        ),
        json!({"group": "authorization.k8s.io", "kind": "SelfSubjectAccessReview",
               "causes": [{"reason": "FieldValueRequired", "message": msg, "field": field_path}]}),
    )
}

// ----- control --------------------------------------------------------------------------------

fn control(sh: &Shared, method: &Method, rest: &[String], body: Bytes) -> Resp {
    let parts: Vec<&str> = rest.iter().map(String::as_str).collect();
    match (method, parts.as_slice()) {
        (&Method::GET, ["stats"]) => {
            let st = sh.state();
            let counts = sh.counts.lock().unwrap().clone();
            json_resp(
                200,
                &json!({"requests": counts, "resourceVersion": st.rv.to_string(),
                        "ipleases": st.leases.len(), "pods": st.pods.len(), "nodes": st.nodes.len()}),
            )
        }
        (&Method::POST, ["reset"]) => {
            sh.counts.lock().unwrap().clear();
            json_resp(200, &json!({}))
        }
        (&Method::POST, ["config"]) => {
            let v: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return bad_request(&format!("config is not JSON: {e}")),
            };
            if let Some(ms) = v.get("latencyMs").and_then(Value::as_f64) {
                sh.latency_us.store((ms * 1000.0) as u64, Ordering::Relaxed);
            }
            if let Some(b) = v.get("crdInstalled").and_then(Value::as_bool) {
                sh.crd_installed.store(b, Ordering::Relaxed);
            }
            if v.get("allowAll").and_then(Value::as_bool) == Some(true) {
                sh.forbidden.lock().unwrap().clear();
                sh.forbidden_in.lock().unwrap().clear();
            }
            if let Some(list) = v.get("forbid").and_then(Value::as_array) {
                let mut f = sh.forbidden.lock().unwrap();
                let mut f_in = sh.forbidden_in.lock().unwrap();
                for pair in list {
                    if let (Some(verb), Some(res)) = (
                        pair.get(0).and_then(Value::as_str),
                        pair.get(1).and_then(Value::as_str),
                    ) {
                        match pair.get(2).and_then(Value::as_str) {
                            Some(ns) => {
                                f_in.insert((verb.to_string(), res.to_string(), ns.to_string()))
                            }
                            None => f.insert((verb.to_string(), res.to_string())),
                        };
                    }
                }
            }
            json_resp(200, &json!({}))
        }
        (&Method::PUT, ["pods"]) => match parse_object(&body)
            .map_err(|_| "not JSON".to_string())
            .and_then(|p| upsert_pod(sh, p))
        {
            Ok(p) => json_resp(200, &p),
            Err(e) => bad_request(&e),
        },
        (&Method::PUT, ["nodes"]) => match parse_object(&body)
            .map_err(|_| "not JSON".to_string())
            .and_then(|n| upsert_node(sh, n))
        {
            Ok(n) => json_resp(200, &n),
            Err(e) => bad_request(&e),
        },
        (&Method::DELETE, ["nodes", name]) => {
            if delete_node(sh, name) {
                json_resp(200, &json!({}))
            } else {
                status(404, "NotFound", "no such node", Value::Null)
            }
        }
        (&Method::POST, ["expire"]) => {
            expire_watches(sh);
            json_resp(200, &json!({}))
        }
        (&Method::DELETE, ["pods", ns, name]) => {
            if delete_pod(sh, ns, name) {
                json_resp(200, &json!({}))
            } else {
                status(404, "NotFound", "no such pod", Value::Null)
            }
        }
        _ => status(404, "NotFound", "unknown control endpoint", Value::Null),
    }
}
