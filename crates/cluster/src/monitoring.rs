//! What the monitors need from the API beyond leases and pods: the tether-ipam configurations of
//! the cluster's NetworkAttachmentDefinitions (pool sizes, overlap checks), a Warning Event on a
//! pod (the node-agent's) or on a NAD (the controller's). (What the clients sent and read is
//! counted in [`tether_kube_store::traffic`].)
//!
//! | call | request |
//! |---|---|
//! | [`Cluster::network_attachment_definitions`] | LIST `k8s.cni.cncf.io/v1` network-attachment-definitions, every namespace, `resourceVersion=0` (the watch cache) |
//! | [`Cluster::post_pod_event`] | CREATE of a core/v1 Event in the pod's namespace (`409 AlreadyExists` → [`Posted::AlreadyThere`]) |
//! | [`Cluster::post_nad_event`] | CREATE of a core/v1 Event in the NAD's namespace (the same) |

use kube::core::Request;
use kube::core::params::ListParams;
use serde_json::{Value, json};

use crate::cluster::Cluster;
use tether_kube_store::KubeStoreError;
use tether_kube_store::api::Verb;
use tether_kube_store::convert::time_text;

/// One NetworkAttachmentDefinition's CNI configuration (`spec.config`, JSON text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NadConfig {
    /// Namespace of the NAD.
    pub namespace: String,
    /// Name of the NAD.
    pub name: String,
    /// `metadata.uid` (empty when the object had none): Events about the NAD name it, so that
    /// `kubectl describe` finds them.
    pub uid: String,
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

/// A Warning Event about a NetworkAttachmentDefinition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NadWarning {
    /// The NAD's namespace (the Event's).
    pub namespace: String,
    /// The NAD's name.
    pub nad: String,
    /// The NAD's uid, when known.
    pub uid: Option<String>,
    /// Distinguishes this finding: the Event is named `<nad>.<key>` (see [`PodWarning::key`]).
    pub key: String,
    /// `reason` (CamelCase).
    pub reason: String,
    /// `message`.
    pub message: String,
    /// `source.component` and `reportingComponent` (e.g. `tether-controller`).
    pub component: String,
    /// `reportingInstance`: which replica posted it.
    pub instance: String,
    /// When it was found (unix seconds).
    pub at: u64,
}

/// What [`Cluster::post_pod_event`] and [`Cluster::post_nad_event`] did.
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
                    uid: text(o, "/metadata/uid"),
                    config: text(o, "/spec/config"),
                })
                .collect(),
        ))
    }

    /// Post `w` as a core/v1 Event of type Warning on its pod.
    pub fn post_pod_event(&self, w: &PodWarning) -> Result<Posted, KubeStoreError> {
        let mut involved =
            json!({"apiVersion": "v1", "kind": "Pod", "namespace": w.namespace, "name": w.pod});
        if let Some(uid) = &w.uid {
            involved["uid"] = json!(uid);
        }
        let node: String = w.node.chars().take(128).collect();
        self.post_warning(
            &w.namespace,
            &event_name(&w.pod, &w.key),
            involved,
            json!({
                "source": {"component": EVENT_COMPONENT, "host": w.node},
                "reason": w.reason,
                "message": w.message,
                "reportingComponent": EVENT_COMPONENT,
                "reportingInstance": node,
            }),
            w.at,
        )
    }

    /// Post `w` as a core/v1 Event of type Warning on its NetworkAttachmentDefinition.
    pub fn post_nad_event(&self, w: &NadWarning) -> Result<Posted, KubeStoreError> {
        let mut involved = json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                                  "namespace": w.namespace, "name": w.nad});
        if let Some(uid) = &w.uid {
            involved["uid"] = json!(uid);
        }
        let instance: String = w.instance.chars().take(128).collect();
        self.post_warning(
            &w.namespace,
            &event_name(&w.nad, &w.key),
            involved,
            json!({
                "source": {"component": w.component},
                "reason": w.reason,
                "message": w.message,
                "reportingComponent": w.component,
                "reportingInstance": instance,
            }),
            w.at,
        )
    }

    /// CREATE of the Warning Event `name` in `namespace` about `involved`, with `fields` (source,
    /// reason, message, reporting*), happened `at`.
    fn post_warning(
        &self,
        namespace: &str,
        name: &str,
        involved: Value,
        fields: Value,
        at: u64,
    ) -> Result<Posted, KubeStoreError> {
        let what = format!("CREATE of Event {namespace}/{name}");
        let at = time_text(at).map_err(|e| self.api().protocol(&what, e))?;
        let mut body = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "type": "Warning",
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
        });
        if let (Some(b), Value::Object(f)) = (body.as_object_mut(), fields) {
            b.extend(f);
        }
        let req = Request::new(format!("/api/v1/namespaces/{namespace}/events"))
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

/// `<object>.<key>`, within the 253 characters of an object name (the object's part shortened).
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
