//! Test environment: a **real Kubernetes API server** with the IPLease CRD installed, named by
//! `TETHER_TEST_KUBECONFIG` (`make test` and `make unit` start one with `conformance/kube/up.sh`,
//! from `../shared/peers`). Every test that uses [`Env`] is `#[ignore]`d, so a plain `cargo test`
//! shows it as ignored, never as passed; without the variable [`Env::new`] panics with "NOT RUN".
//!
//! The identity must be cluster-admin (create ClusterRoles and ClusterRoleBindings, impersonate
//! users). Each test uses its own network name and deletes its leases at the end, so tests run
//! in parallel against one server; "CRD missing" points the store at an API group that does not
//! exist, "forbidden" impersonates a user bound to a ClusterRole without that verb.
//!
//! The API double (`conformance/apiserver-double`) is used only by tests that need a fault a real
//! server cannot produce on demand (see `errors.rs`).
#![allow(dead_code)]

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tether_kube_store::{KubeSettings, KubeStore};
use tether_leases::{
    AddRequest, Allocator, Lease, LeaseState, LeaseStore, NoProbe, PodRef, Policy, Scope,
    SystemClock,
};
use tether_pool::{IpRange, RequestedIp};

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "tether-kube-store-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The isolated fabric of a test's network: tests share one API server and many use the same
/// ranges, so each test's network is a uniqueness domain of its own (the cluster-wide domain is
/// tested with ranges no other test uses).
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

/// Why the tests that need [`Env`] are ignored by default (keep in sync with their attribute).
pub const NEEDS_API: &str = "needs a real API server: make test starts one (../shared/peers)";

pub struct Env {
    pub dir: TempDir,
    pub kubeconfig: PathBuf,
    /// A network name unique to this test (and process).
    pub network: String,
}

/// The real API server of this run, if any.
pub fn real_cluster() -> Option<PathBuf> {
    std::env::var_os("TETHER_TEST_KUBECONFIG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl Env {
    /// A fresh network name on the real API server; panics ("NOT RUN") without one.
    pub fn new(tag: &str) -> Env {
        static N: AtomicUsize = AtomicUsize::new(0);
        let kubeconfig = real_cluster().unwrap_or_else(|| {
            panic!(
                "NOT RUN: this test {NEEDS_API}. Set TETHER_TEST_KUBECONFIG to the kubeconfig that \
                 `conformance/kube/up.sh` prints (or run `make unit`)."
            )
        });
        let dir = TempDir::new(tag);
        let network = format!(
            "t-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        Env {
            dir,
            kubeconfig,
            network,
        }
    }

    pub fn settings(&self) -> KubeSettings {
        KubeSettings {
            timeout: Duration::from_secs(20),
            ..KubeSettings::with_kubeconfig(&self.kubeconfig)
        }
    }

    pub fn store(&self) -> KubeStore {
        KubeStore::connect(self.settings()).expect("connect")
    }

    /// The store as the plugin on `node` opens it: with the node's name and its journal, so the
    /// engine reads single objects instead of listing (the production path).
    pub fn node_store(&self, node: &str) -> KubeStore {
        self.store_with(|s| {
            s.node = Some(node.to_string());
            s.journal_dir = Some(self.dir.path().join(format!("journal-{node}")));
        })
    }

    pub fn store_with(&self, f: impl FnOnce(&mut KubeSettings)) -> KubeStore {
        let mut s = self.settings();
        f(&mut s);
        KubeStore::connect(s).expect("connect")
    }

    /// The leases of `network`, sorted by address, from a consistent (etcd) list: what the
    /// server holds now. (A store lists from the watch cache by default, which may lag behind a
    /// write just made; tests check their outcome with this, never with the store under test.)
    pub fn leases(&self, network: &str) -> Vec<Lease> {
        sorted(&self.store_with(|s| s.list_from_cache = false), network)
    }

    /// Settings under which the IPLease resource is not served: an API group that does not
    /// exist (the CRD of a server shared by parallel tests cannot be removed).
    pub fn without_crd(&self) -> CrdGone {
        CrdGone {
            settings: KubeSettings {
                group: "not-installed.tether.dev".into(),
                ..self.settings()
            },
        }
    }

    /// Settings under which `verb` on ipleases is forbidden (everything else allowed).
    pub fn forbidding(&self, verb: &str) -> Forbidden {
        cluster::forbidding(self, verb)
    }

    /// The IPLease object `name` as the API server returns it (None: not found).
    pub fn object(&self, name: &str) -> Option<serde_json::Value> {
        cluster::object(&self.kubeconfig, name)
    }

    /// Create `obj` as it is (what another writer, e.g. an older tether, would have written).
    pub fn create_object(&self, obj: &tether_kube_store::IPLease) {
        cluster::create(&self.kubeconfig, obj)
    }
}

impl Env {
    /// Delete every lease of `network` (a consistent list: the cache may lag behind).
    pub fn delete_network(&self, network: &str) {
        if let Ok(store) = KubeStore::connect(KubeSettings {
            list_from_cache: false,
            ..self.settings()
        }) {
            for l in store.list(&scope_of(network)).unwrap_or_default() {
                let _ = store.remove(&l);
            }
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Leave nothing behind on the server.
        self.delete_network(&self.network);
    }
}

pub struct CrdGone {
    pub settings: KubeSettings,
}

pub struct Forbidden {
    pub settings: KubeSettings,
    cleanup: Option<Box<dyn FnOnce()>>,
}

impl Drop for Forbidden {
    fn drop(&mut self) {
        if let Some(f) = self.cleanup.take() {
            f();
        }
    }
}

/// Real-cluster fixtures (RBAC for the "forbidden" cases).
mod cluster {
    use super::*;
    use k8s_openapi::api::rbac::v1::{
        ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject,
    };
    use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
    use kube::config::Kubeconfig;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn client(runtime: &tokio::runtime::Runtime, kubeconfig: &Path) -> kube::Client {
        runtime
            .block_on(async {
                let kc = Kubeconfig::read_from(kubeconfig)?;
                let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
                Ok::<_, Box<dyn std::error::Error>>(kube::Client::try_from(cfg)?)
            })
            .expect("cluster client")
    }

    pub fn object(kubeconfig: &Path, name: &str) -> Option<serde_json::Value> {
        let runtime = rt();
        let api: Api<tether_kube_store::IPLease> = Api::all(client(&runtime, kubeconfig));
        runtime
            .block_on(api.get_opt(name))
            .expect("GET IPLease")
            .map(|o| serde_json::to_value(o).unwrap())
    }

    pub fn create(kubeconfig: &Path, obj: &tether_kube_store::IPLease) {
        let runtime = rt();
        let api: Api<tether_kube_store::IPLease> = Api::all(client(&runtime, kubeconfig));
        runtime
            .block_on(api.create(&PostParams::default(), obj))
            .expect("CREATE IPLease");
    }

    pub fn forbidding(env: &Env, verb: &str) -> Forbidden {
        static N: AtomicUsize = AtomicUsize::new(0);
        let user = format!(
            "tether-test-no-{verb}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let name = user.clone();
        let verbs: Vec<String> = ["get", "list", "watch", "create", "update", "delete"]
            .iter()
            .filter(|v| **v != verb)
            .map(|v| v.to_string())
            .collect();
        let runtime = rt();
        let client = client(&runtime, &env.kubeconfig);
        let roles: Api<ClusterRole> = Api::all(client.clone());
        let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
        let role = ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            rules: Some(vec![
                PolicyRule {
                    api_groups: Some(vec!["ipam.tether.dev".into()]),
                    resources: Some(vec!["ipleases".into()]),
                    verbs: verbs.clone(),
                    ..Default::default()
                },
                PolicyRule {
                    api_groups: Some(vec!["apiextensions.k8s.io".into()]),
                    resources: Some(vec!["customresourcedefinitions".into()]),
                    verbs: vec!["get".into()],
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: name.clone(),
            },
            subjects: Some(vec![Subject {
                kind: "User".into(),
                name: user.clone(),
                api_group: Some("rbac.authorization.k8s.io".into()),
                ..Default::default()
            }]),
        };
        runtime.block_on(async {
            let pp = PostParams::default();
            let _ = roles.delete(&name, &DeleteParams::default()).await;
            let _ = bindings.delete(&name, &DeleteParams::default()).await;
            roles.create(&pp, &role).await.expect("create ClusterRole");
            bindings
                .create(&pp, &binding)
                .await
                .expect("create ClusterRoleBinding");
        });
        // A kubeconfig impersonating the user.
        let mut kc = Kubeconfig::read_from(&env.kubeconfig).unwrap();
        let ctx_name = kc.current_context.clone().expect("current-context");
        let user_name = kc
            .contexts
            .iter()
            .find(|c| c.name == ctx_name)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.user.clone())
            .expect("context user")
            .expect("context user");
        for a in kc.auth_infos.iter_mut().filter(|a| a.name == user_name) {
            if let Some(ai) = a.auth_info.as_mut() {
                ai.impersonate = Some(user.clone());
            }
        }
        let path = env.dir.path().join(format!("kubeconfig-no-{verb}"));
        std::fs::write(&path, serde_saphyr::to_string(&kc).unwrap()).unwrap();
        let settings = KubeSettings {
            kubeconfig: Some(path),
            ..env.settings()
        };
        // RBAC caches take a moment: wait until a permitted verb works.
        let probe_ok = || {
            let s = KubeStore::connect(settings.clone()).unwrap();
            if verb == "list" {
                s.ready().is_err()
            } else {
                s.ready().is_ok()
            }
        };
        for _ in 0..50 {
            if probe_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Forbidden {
            settings,
            cleanup: Some(Box::new(move || {
                rt().block_on(async {
                    let _ = roles.delete(&name, &DeleteParams::default()).await;
                    let _ = bindings.delete(&name, &DeleteParams::default()).await;
                });
            })),
        }
    }
}

// ----- helpers ----------------------------------------------------------------------------------

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn range(s: &str) -> IpRange {
    IpRange::parse(s).unwrap()
}

pub fn pod(ns: &str, name: &str, uid: &str) -> PodRef {
    PodRef::new(ns, name, uid)
}

pub fn add_req(cid: &str, ifname: &str, pod: PodRef) -> AddRequest {
    AddRequest {
        container_id: cid.into(),
        ifname: ifname.into(),
        pod,
        node: Some("node-a".into()),
        requested: vec![],
    }
}

pub fn with_requested(mut r: AddRequest, reqs: &[&str]) -> AddRequest {
    r.requested = reqs
        .iter()
        .map(|s| RequestedIp::parse(s).unwrap())
        .collect();
    r
}

pub fn lease(network: &str, addr: &str, cid: &str) -> Lease {
    Lease {
        network: network.into(),
        domain: Some(fabric_of(network)),
        address: ip(addr),
        prefix_len: 24,
        range_index: Some(0),
        container_id: cid.into(),
        ifname: "net1".into(),
        pod: pod("ns", &format!("pod-{cid}"), &format!("uid-{cid}")),
        node: Some("node-a".into()),
        state: LeaseState::Leased,
        since: 1_700_000_000,
        version: None,
    }
}

/// The leases of `network`, sorted by address.
pub fn sorted(store: &dyn LeaseStore, network: &str) -> Vec<Lease> {
    let mut v = store.list(&scope_of(network)).unwrap();
    v.sort_by_key(|l| l.address);
    v
}

/// An allocator of `scope` over `range` on `store`: no cooldown (a test re-leases at once), no
/// probe, the system clock.
pub fn allocator<'a>(scope: Scope, range: &str, store: &'a KubeStore) -> Allocator<'a> {
    Allocator::new(
        scope,
        vec![IpRange::parse(range).unwrap()],
        Policy {
            cooldown_s: 0,
            ..Policy::default()
        },
        store,
        &NoProbe,
        &SystemClock,
    )
}
