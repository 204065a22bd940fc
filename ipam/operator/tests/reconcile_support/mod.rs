//! Helpers shared by the reconcile, CLI and CNI tests over the Kubernetes store: a real API
//! server (or, for faults it cannot produce on demand, the API double), leases, pods, the binary.
//!
//! [`Env::real`] uses the API server named by `TETHER_TEST_KUBECONFIG` (`make test` and `make
//! unit` start one from `../shared/peers` with `conformance/kube/up.sh`). The tests using it are
//! `#[ignore = "needs a real API server: ..."]`, so a plain `cargo test` lists them as ignored,
//! never as passed; run by hand without the variable they panic with "NOT RUN".
//!
//! One server serves every test of the run, in parallel: each [`Env`] has its own id, and names
//! its namespaces, nodes and networks after it ([`Env::name`]), so tests see only their own pods
//! and leases, and deletes its leases when dropped. The server has no controllers and no kubelet:
//! pods stay Pending and are deleted at once (grace period 0); the server assigns pod uids, so
//! [`Env::pod`] returns the uid to record in leases.
//!
//! [`Env::double`] starts the in-repo API double instead, for the few tests that need a fault
//! (see [`Env::double_api`]). It is a fault injector, not an API server.
#![allow(dead_code)]

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use tether_apiserver_double::ApiServerDouble;
use tether_kube_store::{KubeSettings, KubeStore};
use tether_leases::{Lease, LeaseState, LeaseStore, PodRef, Scope};

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "tether-ipam-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
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

/// The real API server of this run, if any.
pub fn real_cluster() -> Option<PathBuf> {
    std::env::var_os("TETHER_TEST_KUBECONFIG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Tests that look at every lease of the cluster (the dead-node sweep) take this for writing;
/// every other test on the real server takes it for reading, so no sweep judges the leases of a
/// test running at the same time.
static CLUSTER_WIDE: RwLock<()> = RwLock::new(());

enum Guard {
    Shared(RwLockReadGuard<'static, ()>),
    Exclusive(RwLockWriteGuard<'static, ()>),
}

/// A real server's client and what this test created there.
struct Cluster {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    namespaces: Mutex<HashSet<String>>,
    rbac: Mutex<Vec<String>>,
    _guard: Guard,
}

enum Backend {
    Real(Box<Cluster>),
    Double(ApiServerDouble),
}

/// An API server, its kubeconfig, a scratch directory, and this test's id.
pub struct Env {
    backend: Backend,
    pub dir: TempDir,
    pub kubeconfig: PathBuf,
    /// Unique to this test (and process); see [`Env::name`].
    pub id: String,
}

fn unique_id(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

impl Env {
    /// The real API server of this run; panics ("NOT RUN") without one.
    pub fn real(tag: &str) -> Env {
        Env::real_with(tag, false)
    }

    /// The real API server, with no other test of this binary running on it meanwhile: for
    /// tests whose reconciler sweeps the leases of the whole cluster.
    pub fn real_exclusive(tag: &str) -> Env {
        Env::real_with(tag, true)
    }

    fn real_with(tag: &str, exclusive: bool) -> Env {
        let kubeconfig = real_cluster().unwrap_or_else(|| {
            panic!(
                "NOT RUN: this test needs a real API server. Set TETHER_TEST_KUBECONFIG to the kubeconfig that \
                 `conformance/kube/up.sh` prints (or run `make unit`, which starts one from ../shared/peers)."
            )
        });
        let guard = if exclusive {
            Guard::Exclusive(CLUSTER_WIDE.write().unwrap_or_else(|e| e.into_inner()))
        } else {
            Guard::Shared(CLUSTER_WIDE.read().unwrap_or_else(|e| e.into_inner()))
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = client_for(&rt, &kubeconfig);
        Env {
            backend: Backend::Real(Box::new(Cluster {
                rt,
                client,
                namespaces: Mutex::new(HashSet::new()),
                rbac: Mutex::new(Vec::new()),
                _guard: guard,
            })),
            dir: TempDir::new(tag),
            kubeconfig,
            id: unique_id(tag),
        }
    }

    /// The in-repo API double: only for a fault a real server cannot produce on demand (say which
    /// in the test).
    pub fn double(tag: &str) -> Env {
        let double = ApiServerDouble::start().unwrap();
        let dir = TempDir::new(tag);
        let kubeconfig = dir.join("kubeconfig");
        double.write_kubeconfig(&kubeconfig).unwrap();
        Env {
            backend: Backend::Double(double),
            dir,
            kubeconfig,
            id: unique_id(tag),
        }
    }

    /// The API double of a test that uses one for a fault; panics on the real server.
    pub fn double_api(&self) -> &ApiServerDouble {
        match &self.backend {
            Backend::Double(d) => d,
            Backend::Real(_) => panic!(
                "this step needs the API double (a fault injector); the test runs on a real server"
            ),
        }
    }

    pub fn is_real(&self) -> bool {
        matches!(self.backend, Backend::Real(_))
    }

    /// `what`, made unique to this test: a namespace, node, network or user name. (Leaked, so
    /// that tests can pass it around as `&str` like a literal: a few bytes per test.)
    pub fn name(&self, what: &str) -> &'static str {
        Box::leak(format!("{}-{what}", self.id).into_boxed_str())
    }

    /// This test's namespace of node-agent pods (see [`Env::agent`]).
    pub fn agent_ns(&self) -> &'static str {
        self.name("agents")
    }

    /// Options of the reconciler of `node` on this server, reacting to pod events within 50 ms.
    /// No dead-node sweep: a sweep judges the leases of the whole cluster, which tests running at
    /// the same time share (the sweep tests turn it on).
    pub fn reconciler_options(&self, node: &str) -> tether_operator::reconcile::Options {
        let mut o = tether_operator::reconcile::Options::new(node);
        o.kube = Some(self.settings());
        o.debounce = Duration::from_millis(50);
        o.agent_namespace = self.agent_ns().to_string();
        o.agent_selector = AGENT_LABEL.to_string();
        o.sweep_dead_nodes = false;
        o
    }

    pub fn settings(&self) -> KubeSettings {
        KubeSettings::with_kubeconfig(&self.kubeconfig)
    }

    pub fn store(&self) -> KubeStore {
        KubeStore::connect(self.settings()).unwrap()
    }

    /// A pod on `node`; returns its uid (a real server assigns its own; the double takes `uid`).
    pub fn pod(&self, ns: &str, name: &str, uid: &str, node: &str) -> String {
        self.pod_object(json!({"metadata": {"namespace": ns, "name": name, "uid": uid}, "spec": {"nodeName": node}}))
    }

    /// Create (real) or put (double) a pod from a partial object: `metadata.namespace`,
    /// `metadata.name`, optional `uid` (double only), `labels`, and `spec.nodeName`. Returns its uid.
    pub fn pod_object(&self, mut obj: Value) -> String {
        match &self.backend {
            Backend::Double(d) => {
                obj["status"] = json!({"phase": "Running"});
                let uid = obj["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                d.upsert_pod(obj).unwrap();
                uid
            }
            Backend::Real(c) => {
                let ns = obj["metadata"]["namespace"].as_str().unwrap().to_string();
                c.ensure_namespace(&ns);
                obj["metadata"].as_object_mut().unwrap().remove("uid");
                obj["apiVersion"] = json!("v1");
                obj["kind"] = json!("Pod");
                obj["spec"]["containers"] =
                    json!([{"name": "c", "image": "registry.invalid/none"}]);
                let pod: Pod = serde_json::from_value(obj).unwrap();
                let api: Api<Pod> = Api::namespaced(c.client.clone(), &ns);
                let name = pod.metadata.name.clone().unwrap();
                let created =
                    c.rt.block_on(api.create(&PostParams::default(), &pod))
                        .unwrap_or_else(|e| panic!("create pod {ns}/{name}: {e}"));
                created.metadata.uid.unwrap()
            }
        }
    }

    /// Delete a pod at once (grace period 0: no kubelet confirms a graceful deletion). False when
    /// there was none.
    pub fn delete_pod(&self, ns: &str, name: &str) -> bool {
        match &self.backend {
            Backend::Double(d) => d.delete_pod(ns, name),
            Backend::Real(c) => {
                let api: Api<Pod> = Api::namespaced(c.client.clone(), ns);
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                match c.rt.block_on(api.delete(name, &dp)) {
                    Ok(_) => true,
                    Err(kube::Error::Api(s)) if s.code == 404 => false,
                    Err(e) => panic!("delete pod {ns}/{name}: {e}"),
                }
            }
        }
    }

    /// A node running the node-agent: its DaemonSet pod (namespace [`Env::agent_ns`], label
    /// [`AGENT_LABEL`], `spec.nodeName` = `node`), which is how the reconciler knows live nodes.
    pub fn agent(&self, node: &str) {
        self.agent_pod(node, &agent_pod(node));
    }

    /// An agent pod named `name` on `node` (two of them on one node during a rolling update).
    pub fn agent_pod(&self, node: &str, name: &str) {
        let (k, v) = AGENT_LABEL.split_once('=').unwrap();
        self.pod_object(json!({"metadata": {"namespace": self.agent_ns(), "name": name, "uid": format!("u-{name}"), "labels": {k: v}},
                               "spec": {"nodeName": node}}));
    }

    /// The node's agent pod is gone (the node was deleted, its pods with it).
    pub fn agent_gone(&self, node: &str) {
        assert!(
            self.delete_pod(self.agent_ns(), &agent_pod(node)),
            "no agent pod on {node}"
        );
    }

    /// A kubeconfig for an identity that may do what tether needs (ipleases: get, list, watch,
    /// create, update, delete; pods: get, list, watch; customresourcedefinitions: get) except the
    /// `(verb, resource)` pairs given. Real server: a ClusterRole bound to an impersonated user.
    /// Double: its 403 knob (for every client of this double).
    pub fn forbidding(&self, forbidden: &[(&str, &str)]) -> PathBuf {
        match &self.backend {
            Backend::Double(d) => {
                for (verb, resource) in forbidden {
                    d.forbid(verb, resource);
                }
                self.kubeconfig.clone()
            }
            Backend::Real(c) => c.restricted(self, forbidden),
        }
    }

    /// Put `l` in the Kubernetes store.
    pub fn put(&self, l: Lease) -> Lease {
        let s = self.store();
        s.claim(l, None).unwrap().unwrap()
    }

    /// The stored state of `addr` in `network` (None: no record), from a consistent list: the
    /// watch cache may lag behind what another store just wrote.
    pub fn state(&self, network: &str, addr: &str) -> Option<LeaseState> {
        let a: IpAddr = addr.parse().unwrap();
        self.leases(network)
            .into_iter()
            .find(|l| l.address == a)
            .map(|l| l.state)
    }

    /// Every record of `network`, from a consistent list.
    pub fn leases(&self, network: &str) -> Vec<Lease> {
        let store = KubeStore::connect(KubeSettings {
            list_from_cache: false,
            ..self.settings()
        })
        .unwrap();
        store.list(&scope_of(network)).unwrap()
    }

    /// The IPLease objects of `network` as the API server returns them (real server only).
    pub fn lease_objects(&self, network: &str) -> Vec<Value> {
        let Backend::Real(c) = &self.backend else {
            panic!("lease_objects: real server only")
        };
        let api: Api<tether_kube_store::IPLease> = Api::all(c.client.clone());
        let lp = kube::api::ListParams::default()
            .labels(&tether_kube_store::crd::network_selector(network));
        let list = c.rt.block_on(api.list(&lp)).expect("LIST ipleases");
        list.items
            .into_iter()
            .map(|o| serde_json::to_value(o).unwrap())
            .filter(|o| o["spec"]["network"] == network)
            .collect()
    }

    /// POST `body` to the collection at `path` on the real server (objects the helpers here do
    /// not model: CRDs, NADs).
    pub fn post_json(&self, path: &str, body: &Value) -> Result<Value, kube::Error> {
        let Backend::Real(c) = &self.backend else {
            panic!("post_json: real server only")
        };
        let req = kube::core::Request::new(path)
            .create(&PostParams::default(), serde_json::to_vec(body).unwrap())
            .unwrap();
        c.rt.block_on(c.client.request::<Value>(req))
    }

    /// PUT `body` as the object `name` of the collection at `path` (or its `/status` with
    /// `status`), on the real server.
    pub fn put_json(&self, path: &str, name: &str, body: &Value) -> Result<Value, kube::Error> {
        let Backend::Real(c) = &self.backend else {
            panic!("put_json: real server only")
        };
        let req = kube::core::Request::new(path)
            .replace(
                name,
                &PostParams::default(),
                serde_json::to_vec(body).unwrap(),
            )
            .unwrap();
        c.rt.block_on(c.client.request::<Value>(req))
    }

    /// GET the object `name` of the collection at `path`, or the whole list (`None`), on the real
    /// server.
    pub fn get_json(&self, path: &str, name: Option<&str>) -> Result<Value, kube::Error> {
        let Backend::Real(c) = &self.backend else {
            panic!("get_json: real server only")
        };
        let r = kube::core::Request::new(path);
        let req = match name {
            Some(n) => r.get(n, &Default::default()),
            None => r.list(&Default::default()),
        }
        .unwrap();
        c.rt.block_on(c.client.request::<Value>(req))
    }

    /// DELETE the object `name` of the collection at `path` on the real server.
    pub fn delete_json(&self, path: &str, name: &str) -> Result<Value, kube::Error> {
        let Backend::Real(c) = &self.backend else {
            panic!("delete_json: real server only")
        };
        let req = kube::core::Request::new(path)
            .delete(name, &DeleteParams::default())
            .unwrap();
        c.rt.block_on(c.client.request::<Value>(req))
    }

    /// Whether the real server runs with feature gate `gate` on, from its
    /// `kubernetes_feature_enabled` metric: the oldest Kubernetes tether claims lacks some
    /// features (docs/compatibility.md), and a test of one asserts how tether degrades there.
    /// A gate the server does not list is one removed after GA: its feature is always on.
    pub fn server_feature(&self, gate: &str) -> bool {
        let out = std::process::Command::new(kubectl())
            .args(["--kubeconfig", self.kubeconfig.to_str().unwrap()])
            .args(["get", "--raw", "/metrics"])
            .output()
            .unwrap();
        assert!(out.status.success(), "GET /metrics: {}", stderr(&out));
        let key = format!("kubernetes_feature_enabled{{name=\"{gate}\",");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with(&key))
            .is_none_or(|l| l.trim_end().ends_with(" 1"))
    }

    /// A NAD using the Kubernetes store (master lo, no probing).
    pub fn nad(&self, network: &str) -> PathBuf {
        self.nad_with(network, &self.kubeconfig)
    }

    /// The same with another kubeconfig (e.g. one from [`Env::forbidding`]).
    pub fn nad_with(&self, network: &str, kubeconfig: &Path) -> PathBuf {
        nad_file(self.dir.path(), network, kubeconfig)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let Backend::Real(c) = &self.backend else {
            return;
        };
        // This test's leases (every network named after it): a later sweep must not judge them.
        if let Ok(store) = KubeStore::connect(self.settings()) {
            let prefix = format!("{}-", self.id);
            for l in store
                .list_all()
                .unwrap_or_default()
                .into_iter()
                .filter(|l| l.network.starts_with(&prefix))
            {
                store.restart_budget();
                let _ = store.remove(&l);
            }
        }
        // Its RBAC objects. Pods and namespaces stay: no test looks at another's namespace or
        // nodes, and the server lives for one run.
        let roles: Api<ClusterRole> = Api::all(c.client.clone());
        let bindings: Api<ClusterRoleBinding> = Api::all(c.client.clone());
        for name in c.rbac.lock().unwrap().iter() {
            let _ =
                c.rt.block_on(bindings.delete(name, &DeleteParams::default()));
            let _ = c.rt.block_on(roles.delete(name, &DeleteParams::default()));
        }
    }
}

fn client_for(rt: &tokio::runtime::Runtime, kubeconfig: &Path) -> kube::Client {
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        Ok::<_, Box<dyn std::error::Error>>(kube::Client::try_from(cfg)?)
    })
    .unwrap_or_else(|e| panic!("a client for {}: {e}", kubeconfig.display()))
}

impl Cluster {
    fn ensure_namespace(&self, ns: &str) {
        if self.namespaces.lock().unwrap().contains(ns) {
            return;
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        match self.rt.block_on(api.create(&PostParams::default(), &obj)) {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create namespace {ns}: {e}"),
        }
        self.namespaces.lock().unwrap().insert(ns.to_string());
    }

    fn restricted(&self, env: &Env, forbidden: &[(&str, &str)]) -> PathBuf {
        let n = self.rbac.lock().unwrap().len();
        let user = env.name(&format!("user{n}")).to_string();
        let granted: [(&str, &str, &[&str]); 3] = [
            (
                "ipam.tether.dev",
                "ipleases",
                &["get", "list", "watch", "create", "update", "delete"],
            ),
            ("", "pods", &["get", "list", "watch"]),
            (
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                &["get"],
            ),
        ];
        for (verb, resource) in forbidden {
            assert!(
                granted
                    .iter()
                    .any(|(_, r, vs)| r == resource && vs.contains(verb)),
                "a real server can only forbid what tether is granted here, not {verb} {resource}: use the double"
            );
        }
        let mut rules = Vec::new();
        for (group, resource, verbs) in granted {
            let verbs: Vec<&str> = verbs
                .iter()
                .copied()
                .filter(|v| !forbidden.contains(&(*v, resource)))
                .collect();
            if !verbs.is_empty() {
                rules.push(json!({"apiGroups": [group], "resources": [resource], "verbs": verbs}));
            }
        }
        let role: ClusterRole =
            serde_json::from_value(json!({"metadata": {"name": user}, "rules": rules})).unwrap();
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": user},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]
        }))
        .unwrap();
        let pp = PostParams::default();
        self.rt
            .block_on(Api::<ClusterRole>::all(self.client.clone()).create(&pp, &role))
            .expect("create ClusterRole");
        self.rbac.lock().unwrap().push(user.clone());
        self.rt
            .block_on(Api::<ClusterRoleBinding>::all(self.client.clone()).create(&pp, &binding))
            .expect("create ClusterRoleBinding");

        // The admin's kubeconfig, impersonating the user.
        let mut kc = kube::config::Kubeconfig::read_from(&env.kubeconfig).unwrap();
        let ctx = kc.current_context.clone().expect("current-context");
        let auth = kc
            .contexts
            .iter()
            .find(|c| c.name == ctx)
            .and_then(|c| c.context.as_ref())
            .and_then(|c| c.user.clone())
            .expect("context user");
        for a in kc.auth_infos.iter_mut().filter(|a| a.name == auth) {
            if let Some(ai) = a.auth_info.as_mut() {
                ai.impersonate = Some(user.clone());
            }
        }
        let path = env.dir.join(&format!("kubeconfig-{user}"));
        std::fs::write(&path, serde_saphyr::to_string(&kc).unwrap()).unwrap();

        // The authorizer's caches take a moment: wait until the role's first rule is in force.
        let cluster =
            tether_cluster::Cluster::connect(&KubeSettings::with_kubeconfig(&path)).unwrap();
        let probe = granted.iter().find_map(|(g, r, vs)| {
            vs.iter()
                .find(|v| !forbidden.contains(&(**v, *r)))
                .map(|v| (*v, *g, *r))
        });
        if let Some((verb, group, resource)) = probe {
            let ok = wait_until(Duration::from_secs(10), || {
                cluster.restart_budget();
                cluster
                    .can_i(verb, group, resource)
                    .is_ok_and(|a| a.allowed)
            });
            assert!(ok.is_some(), "RBAC for {user} not in force after 10 s");
        }
        path
    }
}
/// Multus' NAD CRD, created unless the server has it, and served.
pub fn nad_crd(env: &Env) {
    peer_crd(env, "nad-crd.yaml");
}

/// whereabouts' CRDs (IPPool, OverlappingRangeIPReservation, NodeSlicePool), created unless the
/// server has them, and served: the whereabouts binary fails every call without them.
pub fn whereabouts_crds(env: &Env) {
    for f in [
        "whereabouts.cni.cncf.io_ippools.yaml",
        "whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml",
        "whereabouts.cni.cncf.io_nodeslicepools.yaml",
    ] {
        peer_crd(env, &format!("whereabouts-crds/{f}"));
    }
}

/// The CRD in `file` of ../shared/peers, created unless the server has it; returns once its
/// resource lists (Established comes a moment before the resource is served).
fn peer_crd(env: &Env, file: &str) {
    let crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
    let path = tether_conformance::paths::peers_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let crd: Value = serde_saphyr::from_str(&text).unwrap();
    let name = crd["metadata"]["name"].as_str().expect("a CRD has a name");
    if env.get_json(crds, Some(name)).is_err() {
        match env.post_json(crds, &crd) {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("creating the CRD {name}: {e}"),
        }
    }
    let spec = &crd["spec"];
    let version = spec["versions"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["served"] == true))
        .and_then(|v| v["name"].as_str())
        .expect("a CRD serves a version");
    let list = format!(
        "/apis/{}/{version}/{}",
        spec["group"].as_str().unwrap(),
        spec["names"]["plural"].as_str().unwrap()
    );
    let served = wait_until(Duration::from_secs(30), || {
        env.get_json(&list, None).is_ok()
    });
    assert!(served.is_some(), "the CRD {name} is not served after 30 s");
}

/// A NAD in the cluster, deleted on drop (the monitor of every later test on this server would
/// count it).
pub struct Nad<'e>(&'e Env, String, String);

impl Drop for Nad<'_> {
    fn drop(&mut self) {
        let _ = self.0.delete_json(&self.1, &self.2);
    }
}

/// A NAD `name` in `ns` (created if missing) with `config`; retried while the new CRD's resource
/// is not yet served. Real server only.
pub fn cluster_nad<'e>(env: &'e Env, ns: &str, name: &str, config: &Value) -> Nad<'e> {
    if let Backend::Real(c) = &env.backend {
        c.ensure_namespace(ns);
    }
    let path = format!("/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions");
    let body = json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                      "metadata": {"name": name, "namespace": ns}, "spec": {"config": config.to_string()}});
    let ok = wait_until(Duration::from_secs(20), || {
        env.post_json(&path, &body).is_ok()
    });
    assert!(ok.is_some(), "creating NAD {ns}/{name}");
    Nad(env, path, name.to_string())
}

/// The isolated fabric of a test's network: tests share one API server and many use the same
/// ranges, so each test's network is a uniqueness domain of its own (tests of the cluster-wide
/// domain use ranges no other test uses).
pub fn fabric_of(network: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    network.hash(&mut h);
    format!("t{:016x}", h.finish())
}

/// A test's network in its own fabric (see [`fabric_of`]).
pub fn scope_of(network: &str) -> Scope {
    Scope::new(network, Some(fabric_of(network)))
}

/// A NAD in `dir` using the Kubernetes store through `kubeconfig` (master lo, no probing), in the
/// network's own fabric.
pub fn nad_file(dir: &Path, network: &str, kubeconfig: &Path) -> PathBuf {
    let p = dir.join(format!("{network}.json"));
    let v = json!({"cniVersion": "1.0.0", "name": network, "type": "tether-ipvlan", "master": "lo",
        "ipam": {"type": "tether-ipam", "range": "10.77.0.0/24", "probe": false, "store": "kubernetes",
                 "isolated_fabric": fabric_of(network), "kubernetes": {"kubeconfig": kubeconfig}}});
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
    p
}

/// A URL where nothing listens (connections are refused).
pub fn closed_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

/// The node-agent's pod label (the reconciler's default).
pub const AGENT_LABEL: &str = "app.kubernetes.io/name=tether";

/// The name of the agent pod on `node`.
pub fn agent_pod(node: &str) -> String {
    format!("tether-{node}")
}

pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A Leased record.
pub fn lease(
    network: &str,
    addr: &str,
    pod: Option<(&str, &str, &str)>,
    node: &str,
    since: u64,
) -> Lease {
    Lease {
        network: network.into(),
        domain: Some(fabric_of(network)),
        address: addr.parse().unwrap(),
        prefix_len: 24,
        range_index: Some(0),
        container_id: format!("ctr-{addr}"),
        ifname: "net1".into(),
        pod: pod
            .map(|(ns, n, u)| PodRef::new(ns, n, u))
            .unwrap_or_default(),
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

/// The plugin binary `tether-ipam`, built beside `tether` (a package of its own, so cargo names
/// only `tether` to these tests; `cargo test --workspace`, `make unit` and `make test` build every
/// binary of the workspace).
pub fn ipam_bin() -> PathBuf {
    let p = Path::new(env!("CARGO_BIN_EXE_tether")).with_file_name("tether-ipam");
    assert!(
        p.is_file(),
        "{} is not built: build the workspace's binaries first (cargo build --workspace --bins)",
        p.display()
    );
    p
}

/// Runs tether-ipam ([`ipam_bin`]) as a runtime would: `env`
/// only (the caller's environment is cleared), `conf` on stdin. Returns the exit code and the
/// JSON on stdout (Null when empty).
pub fn run_ipam(ipam: &Path, env: &[(&str, String)], conf: &Value) -> (i32, Value) {
    let (code, v, _) = run_plugin(ipam, env, conf);
    (code, v)
}

/// Runs a CNI plugin binary as [`run_ipam`] does; also returns its stderr.
pub fn run_plugin(bin: &Path, env: &[(&str, String)], conf: &Value) -> (i32, Value, String) {
    use std::io::Write;
    let mut child = Command::new(bin)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v = if out.stdout.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&out.stdout).unwrap()
    };
    (
        out.status.code().unwrap_or(-1),
        v,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The first address (without its prefix) of a CNI Result.
pub fn first_address(r: &Value) -> String {
    r["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in {r}"))
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

/// tether-ipam on `node` (its credential and data directory) for the sandbox `ctr-<sandbox>` of
/// pod `train/<pod>` (uid `uid-<sandbox>`), with a NODE_NAME that lies: the leases must name the
/// node the credential is bound to. Straight to the API server (no lease service).
pub fn call_on_node(
    node: &Node,
    verb: &str,
    pod: &str,
    sandbox: &str,
    conf: &Value,
) -> (i32, Value) {
    call_through(node, None, verb, pod, sandbox, conf)
}

/// [`call_on_node`], through the lease service on `socket` when given.
pub fn call_through(
    node: &Node,
    socket: Option<&Path>,
    verb: &str,
    pod: &str,
    sandbox: &str,
    conf: &Value,
) -> (i32, Value) {
    call_bin(&ipam_bin(), node, socket, verb, pod, sandbox, conf)
}

/// [`call_through`] with the tether-ipam binary `bin` (another version's).
pub fn call_bin(
    bin: &Path,
    node: &Node,
    socket: Option<&Path>,
    verb: &str,
    pod: &str,
    sandbox: &str,
    conf: &Value,
) -> (i32, Value) {
    let sandbox_of = SandboxOf {
        pod,
        uid: &format!("uid-{sandbox}"),
        sandbox,
    };
    call_sandbox(bin, node, socket, verb, &sandbox_of, conf)
}

/// One sandbox of a pod: the pod's name and uid, and the sandbox (`ctr-<sandbox>` is its
/// container ID). A pod whose sandbox is re-created keeps its name and uid.
pub struct SandboxOf<'a> {
    pub pod: &'a str,
    pub uid: &'a str,
    pub sandbox: &'a str,
}

/// `verb` for sandbox `s` of pod `s.pod` in namespace `train`, with the tether-ipam binary `bin`.
pub fn call_sandbox(
    bin: &Path,
    node: &Node,
    socket: Option<&Path>,
    verb: &str,
    s: &SandboxOf<'_>,
    conf: &Value,
) -> (i32, Value) {
    let (pod, uid, sandbox) = (s.pod, s.uid, s.sandbox);
    let mut conf = conf.clone();
    conf["ipam"]["kubernetes"] = json!({"kubeconfig": node.kubeconfig, "timeout_s": 10});
    conf["ipam"]["dataDir"] = json!(node.dir);
    run_ipam(
        bin,
        &[
            ("CNI_COMMAND", verb.to_string()),
            ("CNI_CONTAINERID", format!("ctr-{sandbox}")),
            ("CNI_NETNS", "/run/netns/unused".to_string()),
            ("CNI_IFNAME", "net1".to_string()),
            (
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=true;K8S_POD_NAMESPACE=train;K8S_POD_NAME={pod};K8S_POD_UID={uid}"
                ),
            ),
            ("NODE_NAME", "not-the-node".to_string()),
            (
                "TETHER_LEASE_SOCKET",
                socket.map(|p| p.display().to_string()).unwrap_or_default(),
            ),
        ],
        &conf,
    )
}

/// Run the operator binary `tether` as a person would (no CNI_COMMAND, no in-cluster variables).
pub fn tether(args: &[&str]) -> Output {
    tether_env(args, &[])
}

pub fn tether_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = tether_command(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// [`tether`] with `input` on a pipe as its stdin (`--config /dev/stdin`).
pub fn tether_piped(args: &[&str], input: &[u8]) -> Output {
    let mut child = tether_command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), input).unwrap();
    child.wait_with_output().unwrap()
}

/// The operator binary with `args` and nothing of this machine's environment that would change
/// what it does.
fn tether_command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tether"));
    c.args(args)
        .env_remove("CNI_COMMAND")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBECONFIG")
        .env_remove("NODE_NAME")
        .env_remove("POD_NAMESPACE")
        // Nothing of this machine's: no ~/.kube/config, no node-agent kubeconfig, unless a test
        // names one.
        .env("HOME", "/nonexistent/tether-test-home")
        .env("TETHER_NODE_KUBECONFIG", "");
    c
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

// ---- Node credentials as the node-agent has them (issue 21) ---------------------------------

/// The namespace of the shipped service accounts (deploy/base, applied by conformance/kube/up.sh).
pub const AGENT_NS: &str = "kube-system";

/// One node of the test: its Node object, its agent pod, its credential.
pub struct Node {
    pub name: &'static str,
    pub kubeconfig: PathBuf,
    pub dir: PathBuf,
}

/// A kubeconfig for the admin's server with `token` as the user.
pub fn token_kubeconfig(env: &Env, file: &str, token: &str) -> PathBuf {
    let admin: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&env.kubeconfig).unwrap()).unwrap();
    let cluster = admin["clusters"][0]["cluster"].clone();
    let kc = json!({"apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c"});
    let path = env.dir.join(file);
    std::fs::write(&path, serde_json::to_string(&kc).unwrap()).unwrap();
    path
}

/// The controller's credential: a token of `tether-controller`, which no node holds.
pub fn controller_kubeconfig(env: &Env) -> PathBuf {
    token_kubeconfig(
        env,
        "kubeconfig-controller",
        &token(env, "tether-controller", None),
    )
}

/// A token of service account `sa` (kube-system), bound to `pod` when given.
pub fn token(env: &Env, sa: &str, pod: Option<(&str, &str)>) -> String {
    let mut spec = json!({"audiences": ["https://kubernetes.default.svc.cluster.local"], "expirationSeconds": 3600});
    if let Some((name, uid)) = pod {
        spec["boundObjectRef"] =
            json!({"kind": "Pod", "apiVersion": "v1", "name": name, "uid": uid});
    }
    let r = env
        .post_json(
            &format!("/api/v1/namespaces/{AGENT_NS}/serviceaccounts/{sa}/token"),
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}),
        )
        .unwrap_or_else(|e| panic!("TokenRequest for {sa}: {e}"));
    r["status"]["token"].as_str().unwrap().to_string()
}

/// A Node, the node-agent's pod on it (the DaemonSet's label: the controller sees the node as
/// alive), and that pod's bound token in a kubeconfig.
pub fn node(env: &Env, what: &str) -> Node {
    let name = env.name(what);
    env.post_json(
        "/api/v1/nodes",
        &json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
    )
    .unwrap_or_else(|e| panic!("create node {name}: {e}"));
    let pod = env
        .post_json(
            &format!("/api/v1/namespaces/{AGENT_NS}/pods"),
            &json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": agent_pod(name), "labels": {"app.kubernetes.io/name": "tether"}},
                    "spec": {"nodeName": name, "serviceAccountName": "tether",
                             "containers": [{"name": "agent", "image": "tether"}]}}),
        )
        .unwrap_or_else(|e| panic!("create agent pod on {name}: {e}"));
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    let t = token(env, "tether", Some((&agent_pod(name), uid)));
    let dir = env.dir.join(what);
    std::fs::create_dir_all(&dir).unwrap();
    Node {
        name,
        kubeconfig: token_kubeconfig(env, &format!("kubeconfig-{what}"), &t),
        dir,
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Best effort: the server is shared by the whole run. No kubelet ends a pod's grace
        // period here, so the agent pod is deleted at once (else it would stay, Terminating, and
        // keep its node alive for the controller).
        let _ = std::process::Command::new(kubectl())
            .args(["--kubeconfig", real_cluster().unwrap().to_str().unwrap()])
            .args([
                "delete",
                "--ignore-not-found",
                "--wait=false",
                "node",
                self.name,
            ])
            .output();
        let _ = std::process::Command::new(kubectl())
            .args(["--kubeconfig", real_cluster().unwrap().to_str().unwrap()])
            .args([
                "-n",
                AGENT_NS,
                "delete",
                "--ignore-not-found",
                "--grace-period=0",
                "--force",
                "pod",
            ])
            .arg(agent_pod(self.name))
            .output();
    }
}

pub fn kubectl() -> PathBuf {
    std::env::var_os("KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(
                &std::env::var("PEERS_BIN_DIR")
                    .unwrap_or_else(|_| "/var/cache/tether-peers/bin".into()),
            )
            .join("kubectl")
        })
}

/// A long-running `tether controller` (interval 600 s, grace 0 unless `extra` sets one, then
/// `extra` flags) as the pod `pod`; killed when dropped.
pub fn controller(kubeconfig: &Path, pod: &str, extra: &[&str]) -> Kill {
    let grace: &[&str] = if extra.contains(&"--grace-s") {
        &[]
    } else {
        &["--grace-s", "0"]
    };
    Kill(
        std::process::Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["controller", "--interval-s", "600"])
            .args(grace)
            .args(extra)
            .args(["--agent-namespace", AGENT_NS, "--kubeconfig"])
            .arg(kubeconfig)
            .env("POD_NAME", pod)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBECONFIG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

pub struct Kill(pub std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill(); // SIGKILL: no handing over, as when a node dies
        let _ = self.0.wait();
    }
}

/// No election Lease left by an earlier test (its holder would hold it for 15 s more).
pub fn clear_election() {
    kubectl_ok(&[
        "-n",
        AGENT_NS,
        "delete",
        "lease",
        "tether-controller",
        "--ignore-not-found",
    ]);
}

/// `kubectl` as the admin of the real server; panics with its stderr when it fails.
pub fn kubectl_ok(args: &[&str]) {
    let out = std::process::Command::new(kubectl())
        .args(["--kubeconfig", real_cluster().unwrap().to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A command block of the docs (`conformance/docs/blocks.py`), run as written: by `bash -e` from
/// the repository's root, with this build's `tether` and the peers' `kubectl` first on PATH, and
/// nothing of this machine's cluster settings unless `env` names them.
pub fn doc_block(file: &str, name: &str, env: &[(&str, &str)]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let block = Command::new("python3")
        .arg(root.join("conformance/docs/blocks.py"))
        .args(["extract", file, name])
        .output()
        .unwrap();
    assert!(
        block.status.success(),
        "{file} {name}: {}",
        String::from_utf8_lossy(&block.stderr)
    );
    let tether = Path::new(env!("CARGO_BIN_EXE_tether")).parent().unwrap();
    let peers = kubectl();
    let path = format!(
        "{}:{}:{}",
        tether.display(),
        peers.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = Command::new("bash");
    c.args(["-euo", "pipefail", "-c"])
        .arg(String::from_utf8(block.stdout).unwrap())
        .current_dir(&root)
        .env("PATH", path)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent/tether-test-home")
        .env("TETHER_NODE_KUBECONFIG", "");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// The sample of `name` with every label of `labels` in the registry's text.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name
            && labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
        .then(|| value.parse().unwrap())
    })
}

/// The Events of namespace `ns` that `keep` keeps.
pub fn events_where(env: &Env, ns: &str, keep: impl Fn(&Value) -> bool) -> Vec<Value> {
    let list = env
        .get_json(&format!("/api/v1/namespaces/{ns}/events"), None)
        .unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| keep(e))
        .cloned()
        .collect()
}

/// The AddressConflict Events of pod `ns/pod`.
pub fn conflict_events(env: &Env, ns: &str, pod: &str) -> Vec<Value> {
    events_where(env, ns, |e| {
        e["reason"] == "AddressConflict" && e["involvedObject"]["name"] == pod
    })
}
