//! What the controller reads of nodes to tell a silent node (one that stopped reporting without
//! being deleted): the kubelets' heartbeats (their Leases in `kube-node-lease`, renewed every
//! 10 s), a node's `Ready` condition, and where a pod is bound. Only the fields needed are
//! decoded: a Node object carries its image list and can be tens of kilobytes.

// KubeStoreError is large by design (it carries what the operator needs); this is not a hot path.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;

use kube::core::Request;
use kube::core::params::GetParams;
use serde::Deserialize;

use crate::cluster::Cluster;
use tether_kube_store::KubeStoreError;
use tether_kube_store::api::Verb;
use tether_kube_store::convert::null_as_empty;
use tether_kube_store::listing::ListRequest;

/// Where the kubelets renew their heartbeat Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// A node's last signs of life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHealth {
    /// Status of the `Ready` condition (`True`, `False`, `Unknown`); `None` without one.
    pub ready: Option<String>,
    /// Unix seconds of the kubelet's last heartbeat: its Lease's `renewTime`, else the `Ready`
    /// condition's `lastHeartbeatTime`; `None` when neither says.
    pub heartbeat: Option<u64>,
}

impl NodeHealth {
    /// Does the node report `Ready=True`?
    pub fn is_ready(&self) -> bool {
        self.ready.as_deref() == Some("True")
    }
}

/// Where a pod is: its uid and the node it is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlacement {
    /// UID.
    pub uid: String,
    /// `spec.nodeName`; `None` while unscheduled.
    pub node: Option<String>,
    /// Being deleted (`metadata.deletionTimestamp` set): its sandbox is stopped or stopping.
    pub terminating: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct HeartbeatSpec {
    #[serde(default)]
    renew_time: Option<String>,
}

#[derive(Deserialize, Default)]
struct NameOnly {
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct Heartbeat {
    #[serde(default)]
    metadata: NameOnly,
    #[serde(default)]
    spec: HeartbeatSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Condition {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    last_heartbeat_time: Option<String>,
}

#[derive(Deserialize, Default)]
struct NodeStatus {
    #[serde(default, deserialize_with = "null_as_empty")]
    conditions: Vec<Condition>,
}

#[derive(Deserialize)]
struct NodeObject {
    #[serde(default)]
    status: NodeStatus,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PodSpec {
    #[serde(default)]
    node_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PodMeta {
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    deletion_timestamp: Option<String>,
}

#[derive(Deserialize)]
struct PodObject {
    #[serde(default)]
    metadata: PodMeta,
    #[serde(default)]
    spec: PodSpec,
}

/// RFC 3339 (with or without fractions, as MicroTime and Time are written) → unix seconds.
fn unix_s(t: &str) -> Option<u64> {
    let ts: k8s_openapi::jiff::Timestamp = t.parse().ok()?;
    u64::try_from(ts.as_second()).ok()
}

impl Cluster {
    /// The kubelets' last heartbeats: node name → unix seconds of its Lease's `renewTime`. One
    /// LIST served from the watch cache (`resourceVersion=0`; a few hundred bytes per node).
    pub fn node_heartbeats(&self) -> Result<BTreeMap<String, u64>, KubeStoreError> {
        let mut out = BTreeMap::new();
        let req = ListRequest {
            path: &format!("/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases"),
            what: &format!("LIST of leases in namespace {NODE_LEASE_NAMESPACE}"),
            resource: Some("leases.coordination.k8s.io"),
            labels: None,
            fields: None,
            metadata_only: false,
            cache: self.api().any_cached(),
            max_bytes: None,
        };
        self.api().list_each(&req, |items: Vec<Heartbeat>, fresh| {
            if fresh {
                out.clear();
            }
            for h in items {
                if let (Some(n), Some(t)) = (
                    h.metadata.name,
                    h.spec.renew_time.as_deref().and_then(unix_s),
                ) {
                    out.insert(n, t);
                }
            }
        })?;
        Ok(out)
    }

    /// Node `name`'s health, read fresh (a GET of the Node and of its heartbeat Lease);
    /// `None`: no such Node.
    pub fn node_health(&self, name: &str) -> Result<Option<NodeHealth>, KubeStoreError> {
        let what = format!("GET of node {name}");
        let req = Request::new("/api/v1/nodes")
            .get(name, &GetParams::default())
            .map_err(|e| self.api().protocol(&what, e.to_string()))?;
        let node = match self.api().send::<NodeObject>(Verb::Get, &what, req) {
            Ok(n) => n,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => return Err(self.api().map_other("get", "nodes", &what, e)),
        };
        let ready = node
            .status
            .conditions
            .into_iter()
            .find(|c| c.kind == "Ready");
        let what = format!("GET of lease {NODE_LEASE_NAMESPACE}/{name}");
        let req = Request::new(format!(
            "/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASE_NAMESPACE}/leases"
        ))
        .get(name, &GetParams::default())
        .map_err(|e| self.api().protocol(&what, e.to_string()))?;
        let renewed = match self.api().send::<Heartbeat>(Verb::Get, &what, req) {
            Ok(h) => h.spec.renew_time.as_deref().and_then(unix_s),
            Err(kube::Error::Api(s)) if s.code == 404 => None,
            Err(e) => {
                return Err(self
                    .api()
                    .map_other("get", "leases.coordination.k8s.io", &what, e));
            }
        };
        let heartbeat = renewed.or_else(|| {
            ready
                .as_ref()
                .and_then(|c| c.last_heartbeat_time.as_deref())
                .and_then(unix_s)
        });
        Ok(Some(NodeHealth {
            ready: ready.map(|c| c.status),
            heartbeat,
        }))
    }

    /// Pod `namespace/name`'s uid and node, read fresh; `None`: no such pod.
    pub fn pod_placement(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PodPlacement>, KubeStoreError> {
        let what = format!("GET of pod {namespace}/{name}");
        let req = Request::new(format!("/api/v1/namespaces/{namespace}/pods"))
            .get(name, &GetParams::default())
            .map_err(|e| self.api().protocol(&what, e.to_string()))?;
        match self.api().send::<PodObject>(Verb::Get, &what, req) {
            Ok(p) => Ok(Some(PodPlacement {
                uid: p.metadata.uid.unwrap_or_default(),
                node: p.spec.node_name.filter(|n| !n.is_empty()),
                terminating: p.metadata.deletion_timestamp.is_some(),
            })),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(e) => Err(self.api().map_other("get", "pods", &what, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_times_as_the_api_writes_them() {
        assert_eq!(unix_s("2026-12-02T15:00:00Z"), Some(1_796_223_600));
        assert_eq!(unix_s("2026-12-02T15:00:00.123456Z"), Some(1_796_223_600));
        assert_eq!(unix_s("yesterday"), None);
    }
}
