//! Beyond the lease resource: what the reconciler, the CLI and `doctor` ask the API server about
//! leases across nodes and about pods, on the same client, runtime, credentials and error
//! vocabulary as the store (what this identity may do and the server itself: `access.rs`).
//!
//! Pods are read **metadata-only** (`Accept:
//! application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`), parsed into a few strings
//! per object and visited page by page (`limit` = [`KubeSettings::page_size`]), so nothing holds a
//! pod spec or a whole list in memory. The one exception is [`KubeStore::agent_nodes`], which
//! needs `spec.nodeName` of the node-agent's own pods (one namespace, one label selector, one per
//! node): it reads full objects page by page and keeps only that field. A server that ignores the metadata `Accept` still works
//! (the same fields are read from the full objects).
//!
//! | call | request |
//! |---|---|
//! | [`KubeStore::list_all`] | LIST ipleases (every network), paginated |
//! | [`KubeStore::list_node`] | LIST ipleases `labelSelector=ipam.tether.dev/node=<node>` |
//! | [`KubeStore::lease_node_labels`] | metadata-only LIST ipleases, paginated: node label → count |
//! | [`KubeStore::pod_uid`] | metadata-only GET of one pod |
//! | [`KubeStore::visit_pods`] | metadata-only LIST pods (optional field selector), paginated |
//! | [`KubeStore::watch_pods`] | metadata-only WATCH pods from a resourceVersion |
//! | [`KubeStore::agent_nodes`] | LIST pods of one namespace by label selector, paginated: their nodes |
//!
//! [`KubeSettings::page_size`]: crate::KubeSettings::page_size

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::TryStreamExt;
/// The coordination.k8s.io/v1 Lease that elects the active `tether controller`.
pub use k8s_openapi::api::coordination::v1::Lease as ElectionLease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::core::params::{GetParams, ListParams, WatchParams};
use kube::core::{Request, WatchEvent};
use serde::Deserialize;

use tether_leases::Lease;

use crate::api::failure_code;
use crate::crd::{IPLease, NODE_LABEL, label_value};
use crate::error::KubeStoreError;
use crate::store::{KubeStore, LeaseList, Verb, collect_leases, null_as_empty};

/// The few metadata fields tether reads from pods and leases.
#[derive(Deserialize, Clone, Debug, Default)]
#[serde(rename_all = "camelCase")]
struct LiteMeta {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, Clone, Debug, Default)]
struct LiteObject {
    #[serde(default)]
    metadata: LiteMeta,
}

/// A pod reduced to its node (`spec.nodeName`), for [`KubeStore::agent_nodes`].
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct NodeOfPodSpec {
    #[serde(default)]
    node_name: Option<String>,
}

#[derive(Deserialize)]
struct NodeOfPod {
    #[serde(default)]
    spec: NodeOfPodSpec,
}

#[derive(Deserialize)]
struct NodeOfPodList {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default, deserialize_with = "null_as_empty")]
    items: Vec<NodeOfPod>,
}

#[derive(Deserialize)]
struct LiteList {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default, deserialize_with = "null_as_empty")]
    items: Vec<LiteObject>,
}

/// A pod as the reconciler sees it: namespace, name, uid.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl PodKey {
    fn from_meta(m: LiteMeta) -> Option<PodKey> {
        Some(PodKey {
            namespace: m.namespace?,
            name: m.name?,
            uid: m.uid?,
        })
    }
}

/// One event of a pod watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodEvent {
    /// The pod exists (added, or modified).
    Upsert(PodKey),
    /// The pod was deleted.
    Deleted(PodKey),
}

/// How a pod watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEnd {
    /// The server closed it (its timeout) or the caller stopped it; resume from this
    /// resourceVersion.
    Closed {
        /// Last resourceVersion seen.
        resource_version: String,
    },
    /// `410 Gone`/`Expired`: the resourceVersion is too old; list again.
    Expired,
}

impl KubeStore {
    /// Every lease of every network (paginated LIST without a selector), for `tether-ipam
    /// leases` without `--network`. Malformed objects are skipped with a warning.
    pub fn list_all(&self) -> Result<Vec<Lease>, KubeStoreError> {
        self.list_selected(None, "LIST of ipleases of every network", |_| true)
    }

    /// The leases recorded for `node` (label selector on the node label, then `spec.node ==
    /// node`).
    pub fn list_node(&self, node: &str) -> Result<Vec<Lease>, KubeStoreError> {
        let sel = format!("{NODE_LABEL}={}", label_value(node));
        self.list_selected(
            Some(&sel),
            &format!("LIST of ipleases of node {node:?}"),
            |o| o.spec.node.as_deref() == Some(node),
        )
    }

    /// The leases whose node label is `label` (a value from [`KubeStore::lease_node_labels`]),
    /// whatever their `spec.node`.
    pub fn list_node_label(&self, label: &str) -> Result<Vec<Lease>, KubeStoreError> {
        let sel = format!("{NODE_LABEL}={label}");
        self.list_selected(
            Some(&sel),
            &format!("LIST of ipleases with node label {label:?}"),
            |_| true,
        )
    }

    /// One LIST of leases (label `selector`, then `keep`): a single `resourceVersion=0`
    /// request served from the API server's watch cache with `list_from_cache` (the default;
    /// etcd 3.4 cannot serve consistent lists from the cache, so a consistent one reads every
    /// IPLease of the cluster), else consistent pages of `page_size`.
    pub(crate) fn list_selected(
        &self,
        selector: Option<&str>,
        what: &str,
        keep: impl Fn(&IPLease) -> bool,
    ) -> Result<Vec<Lease>, KubeStoreError> {
        let mut out = Vec::new();
        let mut cont: Option<String> = None;
        let mut restarts = 0;
        let mut waits = 0;
        let cache = self.settings.list_from_cache;
        loop {
            let mut lp = if cache {
                self.cache_list_params()
            } else {
                ListParams::default().limit(self.settings.page_size)
            };
            if let Some(s) = selector {
                lp = lp.labels(s);
            }
            if let Some(c) = &cont {
                lp = lp.continue_token(c);
            }
            let req = Request::new(&self.path)
                .list(&lp)
                .map_err(|e| self.api.protocol(what, e.to_string()))?;
            match self.api.send::<LeaseList>(Verb::List, what, req) {
                Ok(page) => {
                    collect_leases(page.items, &keep, &mut out);
                    match page.metadata.continue_ {
                        Some(c) if !c.is_empty() && !cache => cont = Some(c),
                        _ => return Ok(out),
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 410 && cont.is_some() && restarts < 3 => {
                    restarts += 1;
                    out.clear();
                    cont = None;
                }
                // The watch cache is still filling: never a consistent LIST instead.
                Err(kube::Error::Api(s)) if s.code == 429 && cache => self
                    .wait_for_cache(&mut waits, what, s)
                    .map_err(|e| self.api.map_error(Verb::List, what, e))?,
                Err(e) => return Err(self.api.map_error(Verb::List, what, e)),
            }
        }
    }

    /// Node label values of every lease (metadata-only, paginated) with their lease counts.
    /// Leases without a node label are counted under `""`.
    pub fn lease_node_labels(&self) -> Result<BTreeMap<String, usize>, KubeStoreError> {
        let what = "metadata-only LIST of ipleases";
        let mut out = BTreeMap::new();
        let mut cont: Option<String> = None;
        let mut waits = 0;
        let cache = self.settings.list_from_cache;
        loop {
            let mut lp = if cache {
                ListParams::default().match_any()
            } else {
                ListParams::default().limit(self.settings.page_size)
            };
            if let Some(c) = &cont {
                lp = lp.continue_token(c);
            }
            let req = Request::new(&self.path)
                .list_metadata(&lp)
                .map_err(|e| self.api.protocol(what, e.to_string()))?;
            match self.api.send::<LiteList>(Verb::List, what, req) {
                Ok(page) => {
                    for item in page.items {
                        let label = item
                            .metadata
                            .labels
                            .and_then(|mut l| l.remove(NODE_LABEL))
                            .unwrap_or_default();
                        *out.entry(label).or_insert(0) += 1;
                    }
                    match page.metadata.continue_ {
                        Some(c) if !c.is_empty() && !cache => cont = Some(c),
                        _ => return Ok(out),
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 410 && cont.is_some() => {
                    out.clear();
                    cont = None;
                }
                Err(kube::Error::Api(s)) if s.code == 429 && cache => self
                    .wait_for_cache(&mut waits, what, s)
                    .map_err(|e| self.api.map_error(Verb::List, what, e))?,
                Err(e) => return Err(self.api.map_error(Verb::List, what, e)),
            }
        }
    }

    /// The uid of pod `namespace/name`, `None` when it does not exist (metadata-only GET).
    pub fn pod_uid(&self, namespace: &str, name: &str) -> Result<Option<String>, KubeStoreError> {
        let what = format!("GET of pod {namespace}/{name}");
        let req = Request::new(format!("/api/v1/namespaces/{namespace}/pods"))
            .get_metadata(name, &GetParams::default())
            .map_err(|e| self.api.protocol(&what, e.to_string()))?;
        match self.api.send::<LiteObject>(Verb::Get, &what, req) {
            Ok(o) => Ok(Some(o.metadata.uid.unwrap_or_default())),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(self.api.map_other("get", "pods", &what, e)),
        }
    }

    /// The coordination.k8s.io Lease `namespace/name` that elects the active controller.
    pub fn election_lease(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ElectionLease>, KubeStoreError> {
        let what = format!("GET of lease {namespace}/{name}");
        let req = Request::new(format!(
            "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        ))
        .get(name, &GetParams::default())
        .map_err(|e| self.api.protocol(&what, e.to_string()))?;
        match self.api.send::<ElectionLease>(Verb::Get, &what, req) {
            Ok(l) => Ok(Some(l)),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(self.api.map_other("get", "leases", &what, e)),
        }
    }

    /// Create the election Lease (`create`), or replace it if it still has the
    /// resourceVersion it carries. `Ok(None)`: another replica wrote it first (409).
    pub fn write_election_lease(
        &self,
        lease: &ElectionLease,
        create: bool,
    ) -> Result<Option<ElectionLease>, KubeStoreError> {
        let ns = lease.metadata.namespace.as_deref().unwrap_or_default();
        let name = lease.metadata.name.as_deref().unwrap_or_default();
        let what = format!("write of lease {ns}/{name}");
        let body =
            serde_json::to_vec(lease).map_err(|e| self.api.protocol(&what, e.to_string()))?;
        let coll = Request::new(format!(
            "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        ));
        let pp = self.post_params();
        let (verb, req) = if create {
            (Verb::Create, coll.create(&pp, body))
        } else {
            (Verb::Update, coll.replace(name, &pp, body))
        };
        let req = req.map_err(|e| self.api.protocol(&what, e.to_string()))?;
        match self.api.send::<ElectionLease>(verb, &what, req) {
            Ok(l) => Ok(Some(l)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
            Err(e) => Err(self.api.map_other(
                if create { "create" } else { "update" },
                "leases",
                &what,
                e,
            )),
        }
    }

    /// Visit every pod (metadata-only; `field_selector` e.g. `spec.nodeName=n1`). Returns the
    /// list's resourceVersion, to watch from.
    ///
    /// With a field selector and `list_from_cache`: one `resourceVersion=0` LIST, which the API
    /// server answers from its watch cache (pods are indexed there by `spec.nodeName`), so an
    /// agent's start or relist after an outage reads its own node's pods, not every pod of the
    /// cluster from etcd. A stale answer is harmless: the reconciler confirms each release with a
    /// GET of the pod. Without a selector: consistent pages (the whole cluster, bounded memory).
    pub fn visit_pods(
        &self,
        field_selector: Option<&str>,
        mut f: impl FnMut(PodKey),
    ) -> Result<String, KubeStoreError> {
        let what = "metadata-only LIST of pods";
        let mut cont: Option<String> = None;
        let mut waits = 0;
        let cache = self.settings.list_from_cache && field_selector.is_some();
        loop {
            let mut lp = if cache {
                ListParams::default().match_any()
            } else {
                ListParams::default().limit(self.settings.page_size)
            };
            if let Some(s) = field_selector {
                lp = lp.fields(s);
            }
            if let Some(c) = &cont {
                lp = lp.continue_token(c);
            }
            let req = Request::new("/api/v1/pods")
                .list_metadata(&lp)
                .map_err(|e| self.api.protocol(what, e.to_string()))?;
            let page = match self.api.send::<LiteList>(Verb::List, what, req) {
                Ok(p) => p,
                Err(kube::Error::Api(s)) if s.code == 429 && cache => {
                    self.wait_for_cache(&mut waits, what, s)
                        .map_err(|e| self.api.map_other("list", "pods", what, e))?;
                    continue;
                }
                Err(e) => return Err(self.api.map_other("list", "pods", what, e)),
            };
            for item in page.items {
                if let Some(k) = PodKey::from_meta(item.metadata) {
                    f(k);
                }
            }
            match page.metadata.continue_ {
                Some(c) if !c.is_empty() && !cache => cont = Some(c),
                _ => return Ok(page.metadata.resource_version.unwrap_or_default()),
            }
        }
    }

    /// Watch pods (metadata-only) from `resource_version`, calling `f` per event, for at most
    /// `timeout` (asked of the server as `timeoutSeconds`, enforced here too) or until
    /// `keep_going()` turns false (checked every 200 ms). Not bounded by the store's budget.
    pub fn watch_pods(
        &self,
        field_selector: Option<&str>,
        resource_version: &str,
        timeout: Duration,
        keep_going: &dyn Fn() -> bool,
        mut f: impl FnMut(PodEvent),
    ) -> Result<WatchEnd, KubeStoreError> {
        let what = "metadata-only WATCH of pods";
        let mut wp = WatchParams::default().timeout(timeout.as_secs().clamp(1, 3600) as u32);
        if let Some(s) = field_selector {
            wp = wp.fields(s);
        }
        let req = Request::new("/api/v1/pods")
            .watch_metadata(&wp, resource_version)
            .map_err(|e| self.api.protocol(what, e.to_string()))?;
        self.api
            .counter(Verb::List)
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (client, rt, traffic) = self.api.unbudgeted();
        traffic.record("watch", None);
        let mut rv = resource_version.to_string();
        let outcome: Result<WatchEnd, kube::Error> = rt.block_on(async {
            let deadline = tokio::time::sleep(timeout + Duration::from_secs(15));
            tokio::pin!(deadline);
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            let stream = tokio::select! {
                s = client.request_events::<LiteObject>(req) => s?,
                _ = &mut deadline => return Ok(WatchEnd::Closed { resource_version: rv.clone() }),
            };
            tokio::pin!(stream);
            loop {
                tokio::select! {
                    ev = stream.try_next() => match ev? {
                        None => return Ok(WatchEnd::Closed { resource_version: rv.clone() }),
                        Some(WatchEvent::Added(o)) | Some(WatchEvent::Modified(o)) => {
                            if let Some(v) = o.metadata_rv() { rv = v; }
                            if let Some(k) = PodKey::from_meta(o.metadata) { f(PodEvent::Upsert(k)); }
                        }
                        Some(WatchEvent::Deleted(o)) => {
                            if let Some(v) = o.metadata_rv() { rv = v; }
                            if let Some(k) = PodKey::from_meta(o.metadata) { f(PodEvent::Deleted(k)); }
                        }
                        Some(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                        Some(WatchEvent::Error(s)) if s.code == 410 => return Ok(WatchEnd::Expired),
                        Some(WatchEvent::Error(s)) => return Err(kube::Error::Api(s)),
                    },
                    _ = tick.tick() => if !keep_going() {
                        return Ok(WatchEnd::Closed { resource_version: rv.clone() });
                    },
                    _ = &mut deadline => return Ok(WatchEnd::Closed { resource_version: rv.clone() }),
                }
            }
        });
        traffic.record_failure("watch", outcome.as_ref().err().and_then(failure_code));
        match outcome {
            Ok(end) => Ok(end),
            Err(kube::Error::Api(s)) if s.code == 410 => Ok(WatchEnd::Expired),
            Err(e) => Err(self.api.map_other("watch", "pods", what, e)),
        }
    }

    /// The distinct names of the nodes that run a pod of `namespace` matching `label_selector`
    /// (the node-agent DaemonSet's pods): LIST of
    /// `/api/v1/namespaces/{namespace}/pods?labelSelector=...` (full objects, as `spec.nodeName`
    /// is not metadata; only that field is parsed), from the watch cache (`resourceVersion=0`,
    /// with `list_from_cache`): every agent and the controller ask, and a consistent LIST would be
    /// read from etcd each time. A cache a moment behind is harmless here (every release is
    /// confirmed by a GET of the lease's pod). Pods not yet scheduled are skipped. Needs only
    /// `list` on pods, not on nodes.
    pub fn agent_nodes(
        &self,
        namespace: &str,
        label_selector: &str,
    ) -> Result<Vec<String>, KubeStoreError> {
        let what = format!("LIST of pods in namespace {namespace} matching {label_selector:?}");
        let mut out = std::collections::BTreeSet::new();
        let mut cont: Option<String> = None;
        let mut restarts = 0;
        let mut waits = 0;
        loop {
            let mut lp = if self.settings.list_from_cache {
                ListParams::default().match_any()
            } else {
                ListParams::default().limit(self.settings.page_size)
            };
            if !label_selector.is_empty() {
                lp = lp.labels(label_selector);
            }
            if let Some(c) = &cont {
                lp = lp.continue_token(c);
            }
            let req = Request::new(format!("/api/v1/namespaces/{namespace}/pods"))
                .list(&lp)
                .map_err(|e| self.api.protocol(&what, e.to_string()))?;
            match self.api.send::<NodeOfPodList>(Verb::List, &what, req) {
                Ok(page) => {
                    out.extend(
                        page.items
                            .into_iter()
                            .filter_map(|p| p.spec.node_name)
                            .filter(|n| !n.is_empty()),
                    );
                    match page.metadata.continue_ {
                        Some(c) if !c.is_empty() => cont = Some(c),
                        _ => return Ok(out.into_iter().collect()),
                    }
                }
                // The continue token expired: start over.
                Err(kube::Error::Api(s)) if s.code == 410 && cont.is_some() && restarts < 3 => {
                    restarts += 1;
                    out.clear();
                    cont = None;
                }
                Err(kube::Error::Api(s)) if s.code == 429 && self.settings.list_from_cache => self
                    .wait_for_cache(&mut waits, &what, s)
                    .map_err(|e| self.api.map_other("list", "pods", &what, e))?,
                Err(e) => return Err(self.api.map_other("list", "pods", &what, e)),
            }
        }
    }
}

impl LiteObject {
    fn metadata_rv(&self) -> Option<String> {
        self.metadata.resource_version.clone()
    }
}

impl KubeStore {
    /// A watch cache answered 429 (still filling: a new resource, a restarted API server).
    /// Asking etcd instead (a consistent LIST) is what kept a recovering server from serving
    /// when every agent did it at once: wait, with back-off and jitter and never less than the
    /// server's `retryAfterSeconds`, and let the caller ask the cache again while the budget
    /// lasts; `Err` (the 429) when it would run out.
    pub(crate) fn wait_for_cache(
        &self,
        waits: &mut u32,
        what: &str,
        s: Box<kube::core::Status>,
    ) -> Result<(), kube::Error> {
        let asked = Duration::from_secs(
            s.details
                .as_ref()
                .map_or(0, |d| u64::from(d.retry_after_seconds)),
        );
        // At least what the server asked, plus up to half of it again: not all at once.
        let wait = cache_retry_wait(*waits).max(asked + jittered(asked / 2));
        if self.api.remaining() <= wait {
            return Err(kube::Error::Api(s));
        }
        log::debug!(
            "{what}: the watch cache is not ready ({}); asking it again in {wait:?}",
            s.message
        );
        *waits += 1;
        std::thread::sleep(wait);
        Ok(())
    }
}

/// How long to wait before asking a watch cache that answered 429 again: 250 ms doubling per
/// attempt up to 2 s, times a random factor in [0.5, 1.5) so that agents that all met the same
/// restarted server do not come back in step.
fn cache_retry_wait(attempt: u32) -> Duration {
    jittered(Duration::from_millis(250u64 << attempt.min(3)))
}

/// `d` times a random factor in [0.5, 1.5): waits of many clients that failed together (every
/// agent against one restarted API server) spread out instead of coming back in step.
pub fn jittered(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded randomly per process (and per instance): enough to spread them.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    d.mul_f64(0.5 + (r % 1000) as f64 / 1000.0)
}
