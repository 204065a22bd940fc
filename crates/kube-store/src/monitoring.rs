//! What the node-agent's monitor needs from the API beyond leases and pods: the tether-ipam
//! configurations of the cluster's NetworkAttachmentDefinitions (pool sizes), a Warning Event
//! on a pod. (What the agent's clients sent and read is counted in [`crate::traffic`].)
//!
//! | call | request |
//! |---|---|
//! | [`Cluster::network_attachment_definitions`] | LIST `k8s.cni.cncf.io/v1` network-attachment-definitions, every namespace, `resourceVersion=0` (the watch cache) |
//! | [`Cluster::post_pod_event`] | CREATE of a core/v1 Event in the pod's namespace (`409 AlreadyExists` → [`Posted::AlreadyThere`]) |

use kube::core::Request;
use kube::core::params::ListParams;
use serde_json::{Value, json};

use crate::api::Verb;
use crate::cluster::Cluster;
use crate::convert::time_text;
use crate::error::KubeStoreError;

/// One NetworkAttachmentDefinition's CNI configuration (`spec.config`, JSON text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NadConfig {
    /// Namespace of the NAD.
    pub namespace: String,
    /// Name of the NAD.
    pub name: String,
    /// `spec.config`; empty when the NAD names a file on the nodes instead.
    pub config: String,
}

/// A Warning Event about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodWarning {
    /// The pod's namespace (the Event's).
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's uid, when known.
    pub uid: Option<String>,
    /// Distinguishes this occurrence: the Event is named `<pod>.<key>`, so posting it again (a
    /// restarted agent) finds it there instead of adding a second one.
    pub key: String,
    /// `reason` (CamelCase, e.g. `AddressConflict`).
    pub reason: String,
    /// `message`.
    pub message: String,
    /// Reporting node (`source.host`, `reportingInstance`).
    pub node: String,
    /// When it happened (unix seconds).
    pub at: u64,
}

/// What [`Cluster::post_pod_event`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    /// The Event was created.
    Created,
    /// An Event of that name exists already (posted before).
    AlreadyThere,
}

/// Component name on the Events tether posts.
pub const EVENT_COMPONENT: &str = "tether-ipam";

impl Cluster {
    /// The CNI configurations of every NetworkAttachmentDefinition in the cluster, from the
    /// watch cache. `None` when the NAD resource is not served (no Multus CRD).
    pub fn network_attachment_definitions(&self) -> Result<Option<Vec<NadConfig>>, KubeStoreError> {
        let what = "LIST of network-attachment-definitions";
        let req = Request::new("/apis/k8s.cni.cncf.io/v1/network-attachment-definitions")
            .list(&ListParams::default().match_any())
            .map_err(|e| self.api().protocol(what, e.to_string()))?;
        let v = match self.api().send::<Value>(Verb::List, what, req) {
            Ok(v) => v,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => {
                return Err(self.api().map_other(
                    "list",
                    "network-attachment-definitions.k8s.cni.cncf.io",
                    what,
                    e,
                ));
            }
        };
        let items = v
            .get("items")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let text = |o: &Value, p: &str| {
            o.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        Ok(Some(
            items
                .iter()
                .map(|o| NadConfig {
                    namespace: text(o, "/metadata/namespace"),
                    name: text(o, "/metadata/name"),
                    config: text(o, "/spec/config"),
                })
                .collect(),
        ))
    }

    /// Post `w` as a core/v1 Event of type Warning on its pod.
    pub fn post_pod_event(&self, w: &PodWarning) -> Result<Posted, KubeStoreError> {
        let name = event_name(&w.pod, &w.key);
        let what = format!("CREATE of Event {}/{name}", w.namespace);
        let at = time_text(w.at).map_err(|e| self.api().protocol(&what, e))?;
        let mut involved =
            json!({"apiVersion": "v1", "kind": "Pod", "namespace": w.namespace, "name": w.pod});
        if let Some(uid) = &w.uid {
            involved["uid"] = json!(uid);
        }
        let node: String = w.node.chars().take(128).collect();
        let body = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": w.namespace},
            "involvedObject": involved,
            "reason": w.reason,
            "message": w.message,
            "type": "Warning",
            "source": {"component": EVENT_COMPONENT, "host": w.node},
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": node,
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
        });
        let req = Request::new(format!("/api/v1/namespaces/{}/events", w.namespace))
            .create(
                &self.api().post_params(),
                serde_json::to_vec(&body).expect("json"),
            )
            .map_err(|e| self.api().protocol(&what, e.to_string()))?;
        match self.api().send::<Value>(Verb::Create, &what, req) {
            Ok(_) => Ok(Posted::Created),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Posted::AlreadyThere),
            Err(e) => Err(self.api().map_other("create", "events", &what, e)),
        }
    }
}

/// `<pod>.<key>`, within the 253 characters of an object name (the pod part shortened).
fn event_name(pod: &str, key: &str) -> String {
    let room = 253usize.saturating_sub(key.len() + 1);
    let pod = pod
        .get(..room.min(pod.len()))
        .unwrap_or(pod)
        .trim_end_matches(['-', '.']);
    format!("{pod}.{key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_fit() {
        assert_eq!(event_name("train-0", "0123abcd"), "train-0.0123abcd");
        let long = format!("{}-{}", "a".repeat(243), "b".repeat(9));
        let n = event_name(&long, "0123456789abcdef");
        assert!(
            n.len() <= 253 && n.ends_with(".0123456789abcdef") && !n.contains("-."),
            "{n}"
        );
    }
}
