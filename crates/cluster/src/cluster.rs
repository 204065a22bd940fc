//! [`Cluster`]: what the reconciler, the CLI and `doctor` ask the API server beyond the leases —
//! pods and the controller's election Lease here; nodes in `nodes.rs`, NADs and Events in
//! `monitoring.rs`, what this identity may do and the server itself in `access.rs`, node-bound
//! tokens in `node_token.rs`, whereabouts' records in `whereabouts.rs` — on an [`ApiClient`] that a lease store may share.
//!
//! Pods are read **metadata-only** (`Accept:
//! application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`), parsed into a few strings
//! per object and visited page by page (`limit` = [`KubeSettings::page_size`]), so nothing holds a
//! pod spec or a whole list in memory. The one exception is [`Cluster::agent_nodes`], which
//! needs `spec.nodeName` of the node-agent's own pods (one namespace, one label selector, one per
//! node): it reads full objects page by page and keeps only that field. A server that ignores
//! the metadata `Accept` still works (the same fields are read from the full objects).
//!
//! | call | request |
//! |---|---|
//! | [`Cluster::pod_uid`] | metadata-only GET of one pod |
//! | [`Cluster::visit_pods`] | metadata-only LIST pods (optional field selector), paginated |
//! | [`Cluster::watch_pods`] | metadata-only WATCH pods from a resourceVersion |
//! | [`Cluster::agent_nodes`] | LIST pods of one namespace by label selector, paginated: their nodes |
//! | [`Cluster::election_lease`], [`Cluster::write_election_lease`] | GET, CREATE or UPDATE of the controller's Lease |
//! | [`Cluster::agent_pods`] | LIST pods of one namespace by label selector: their node, labels and readiness |
//! | [`Cluster::config_map`], [`Cluster::write_config_map`] | GET or UPDATE of one ConfigMap (the controller's word on lease names) |
//!
//! [`KubeSettings::page_size`]: tether_kube_store::KubeSettings::page_size

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The coordination.k8s.io/v1 Lease that elects the active `tether controller`.
pub use k8s_openapi::api::coordination::v1::Lease as ElectionLease;
use kube::core::Request;
use kube::core::params::{GetParams, WatchParams};
use serde::Deserialize;

use tether_kube_store::KubeSettings;
use tether_kube_store::KubeStoreError;
use tether_kube_store::api::{ApiClient, Verb};
use tether_kube_store::listing::ListRequest;
use tether_kube_store::watching::{Change, Versioned, WatchEnd, WatchRequest};

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
}

#[derive(Deserialize, Clone, Debug, Default)]
struct LiteObject {
    #[serde(default)]
    metadata: LiteMeta,
}

/// A pod reduced to its node (`spec.nodeName`), for [`Cluster::agent_nodes`].
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

/// What the operator asks the API server beyond the leases: pods, nodes, NADs, Events, the
/// election Lease, tokens, access reviews. On an [`ApiClient`] of its own or shared with a
/// [`KubeStore`](tether_kube_store::KubeStore) (one connection, one budget, one set of counters).
pub struct Cluster {
    api: Arc<ApiClient>,
}

impl Cluster {
    /// A reader over `api`.
    pub fn new(api: Arc<ApiClient>) -> Cluster {
        Cluster { api }
    }

    /// Connect a client of its own (see [`ApiClient::connect`]).
    pub fn connect(settings: &KubeSettings) -> Result<Cluster, KubeStoreError> {
        Ok(Cluster::new(ApiClient::connect(settings)?))
    }

    /// The client under this reader.
    pub fn api(&self) -> &Arc<ApiClient> {
        &self.api
    }

    /// Start a new time budget from now (see [`ApiClient::restart_budget`]).
    pub fn restart_budget(&self) {
        self.api.restart_budget()
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
        let pp = self.api.post_params();
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
        let req = ListRequest {
            path: "/api/v1/pods",
            what: "metadata-only LIST of pods",
            resource: Some("pods"),
            labels: None,
            fields: field_selector,
            metadata_only: true,
            cache: field_selector.and(self.api.any_cached()),
            max_bytes: None,
        };
        // A restarted list visits pods again: `f` only ever learns that a pod exists.
        self.api.list_each(&req, |items: Vec<LiteObject>, _| {
            items
                .into_iter()
                .filter_map(|o| PodKey::from_meta(o.metadata))
                .for_each(&mut f)
        })
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
        let w = WatchRequest {
            req,
            what,
            resource: Some("pods"),
        };
        self.api.watch_each(
            w,
            resource_version,
            timeout,
            keep_going,
            |c: Change<LiteObject>| match c {
                Change::Upsert(o) => {
                    if let Some(k) = PodKey::from_meta(o.metadata) {
                        f(PodEvent::Upsert(k))
                    }
                }
                Change::Deleted(o) => {
                    if let Some(k) = PodKey::from_meta(o.metadata) {
                        f(PodEvent::Deleted(k))
                    }
                }
            },
        )
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
        let mut out = std::collections::BTreeSet::new();
        let req = ListRequest {
            path: &format!("/api/v1/namespaces/{namespace}/pods"),
            what: &format!("LIST of pods in namespace {namespace} matching {label_selector:?}"),
            resource: Some("pods"),
            labels: Some(label_selector).filter(|s| !s.is_empty()),
            fields: None,
            metadata_only: false,
            max_bytes: None,
            cache: self.api.any_cached(),
        };
        self.api.list_each(&req, |items: Vec<NodeOfPod>, fresh| {
            if fresh {
                out.clear();
            }
            out.extend(
                items
                    .into_iter()
                    .filter_map(|p| p.spec.node_name)
                    .filter(|n| !n.is_empty()),
            );
        })?;
        Ok(out.into_iter().collect())
    }
}

/// A node-agent pod as the controller judges an upgrade by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPod {
    /// The pod's name.
    pub name: String,
    /// Its node, once scheduled.
    pub node: Option<String>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Since when (unix seconds) it has been Ready; `None` while it is not.
    pub ready_since: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PodCondition {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    last_transition_time: Option<String>,
}

#[derive(Deserialize, Default)]
struct PodStatus {
    #[serde(default)]
    conditions: Vec<PodCondition>,
}

#[derive(Deserialize, Default)]
struct PodMetaLabels {
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
struct AgentPodObject {
    #[serde(default)]
    metadata: PodMetaLabels,
    #[serde(default)]
    spec: NodeOfPodSpec,
    #[serde(default)]
    status: PodStatus,
}

/// A ConfigMap's data and resourceVersion.
#[derive(Deserialize, serde::Serialize, Default, Debug)]
#[serde(rename_all = "camelCase")]
struct ConfigMapObject {
    #[serde(default)]
    metadata: ConfigMapMeta,
    #[serde(default)]
    data: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize, serde::Serialize, Default, Debug)]
#[serde(rename_all = "camelCase")]
struct ConfigMapMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    annotations: Option<BTreeMap<String, String>>,
}

/// A ConfigMap as read: its data and the resourceVersion a write must carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigMapData {
    /// `data`.
    pub data: BTreeMap<String, String>,
    /// `metadata.resourceVersion`.
    pub resource_version: String,
}

impl Cluster {
    /// The pods of `namespace` matching `label_selector` (the node-agent DaemonSet's): name,
    /// node, labels and since when each is Ready. One LIST from the watch cache
    /// (`resourceVersion=0` with `list_from_cache`), read page by page.
    pub fn agent_pods(
        &self,
        namespace: &str,
        label_selector: &str,
    ) -> Result<Vec<AgentPod>, KubeStoreError> {
        let mut out = Vec::new();
        let req = ListRequest {
            path: &format!("/api/v1/namespaces/{namespace}/pods"),
            what: &format!("LIST of pods in namespace {namespace} matching {label_selector:?}"),
            resource: Some("pods"),
            labels: Some(label_selector).filter(|s| !s.is_empty()),
            fields: None,
            metadata_only: false,
            max_bytes: None,
            cache: self.api.any_cached(),
        };
        self.api
            .list_each(&req, |items: Vec<AgentPodObject>, fresh| {
                if fresh {
                    out.clear();
                }
                out.extend(items.into_iter().map(|p| {
                    let ready = p
                        .status
                        .conditions
                        .iter()
                        .find(|c| c.kind == "Ready" && c.status == "True");
                    AgentPod {
                        name: p.metadata.name,
                        node: p.spec.node_name.filter(|n| !n.is_empty()),
                        labels: p.metadata.labels.unwrap_or_default(),
                        ready_since: ready.map(|c| {
                            c.last_transition_time
                                .as_deref()
                                .and_then(|t| tether_kube_store::convert::parse_time(t).ok())
                                .unwrap_or(0)
                        }),
                    }
                }));
            })?;
        Ok(out)
    }

    /// The ConfigMap `namespace/name`; `None` when there is none.
    pub fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ConfigMapData>, KubeStoreError> {
        let what = format!("GET of configmap {namespace}/{name}");
        let req = Request::new(format!("/api/v1/namespaces/{namespace}/configmaps"))
            .get(name, &GetParams::default())
            .map_err(|e| self.api.protocol(&what, e.to_string()))?;
        match self.api.send::<ConfigMapObject>(Verb::Get, &what, req) {
            Ok(c) => Ok(Some(ConfigMapData {
                data: c.data.unwrap_or_default(),
                resource_version: c.metadata.resource_version.unwrap_or_default(),
            })),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(self.api.map_other("get", "configmaps", &what, e)),
        }
    }

    /// Replace the data of the ConfigMap `namespace/name`, as read at `resource_version` (its
    /// labels and annotations kept). `Ok(false)`: it changed since (409), nothing written.
    pub fn write_config_map(
        &self,
        namespace: &str,
        name: &str,
        data: &BTreeMap<String, String>,
        resource_version: &str,
    ) -> Result<bool, KubeStoreError> {
        let what = format!("UPDATE of configmap {namespace}/{name}");
        let path = format!("/api/v1/namespaces/{namespace}/configmaps");
        // Read again for its labels and annotations: an update replaces the whole object.
        let get = Request::new(&path)
            .get(name, &GetParams::default())
            .map_err(|e| self.api.protocol(&what, e.to_string()))?;
        let mut cm: ConfigMapObject = self
            .api
            .send(Verb::Get, &what, get)
            .map_err(|e| self.api.map_other("get", "configmaps", &what, e))?;
        cm.metadata.resource_version = Some(resource_version.to_string());
        cm.metadata.name = name.to_string();
        cm.metadata.namespace = namespace.to_string();
        cm.data = Some(data.clone());
        let mut body =
            serde_json::to_value(&cm).map_err(|e| self.api.protocol(&what, e.to_string()))?;
        body["apiVersion"] = "v1".into();
        body["kind"] = "ConfigMap".into();
        let req = Request::new(&path)
            .replace(
                name,
                &self.api.post_params(),
                serde_json::to_vec(&body).unwrap_or_default(),
            )
            .map_err(|e| self.api.protocol(&what, e.to_string()))?;
        match self.api.send::<serde_json::Value>(Verb::Update, &what, req) {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(self.api.map_other("update", "configmaps", &what, e)),
        }
    }
}

impl Versioned for LiteObject {
    fn resource_version(&self) -> Option<String> {
        self.metadata.resource_version.clone()
    }
}
