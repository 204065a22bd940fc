//! A service-account token bound to a Node (TokenRequest, `boundObjectRef.kind: Node`).
//!
//! The node-agent hands the plugin such a token instead of its own pod's: a pod-bound token is
//! refused by the API server as soon as the pod is gone, so every ADD on the node failed with 401
//! from the deletion of the agent's pod (a DaemonSet roll, a restart) until its successor had
//! written a fresh kubeconfig — under load, a minute and more (seen on the e2e node). A node-bound
//! token stays valid while the node exists, until it expires, and carries the same node claim
//! (`authentication.kubernetes.io/node-name`), so the node-scope policies hold it to its node
//! exactly as before. deploy/base/policy.yaml lets only an agent pod's own token ask for one, for
//! its own node.

use kube::core::Request;
use kube::core::params::PostParams;
use serde_json::{Value, json};

use crate::cluster::Cluster;
use tether_kube_store::KubeStoreError;
use tether_kube_store::api::Verb;
use tether_kube_store::convert::parse_time;

/// A token the API server issued, and when it stops accepting it (seconds since the epoch).
#[derive(Clone, PartialEq, Eq)]
pub struct IssuedToken {
    pub token: String,
    pub expires_at: u64,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself: debug output ends up in logs.
        f.debug_struct("IssuedToken")
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A token of `namespace/service_account` bound to Node `node`, valid for `expiration_s`
    /// (the API server may shorten it). The default audiences (the API server's own).
    pub fn request_node_token(
        &self,
        namespace: &str,
        service_account: &str,
        node: &str,
        expiration_s: u64,
    ) -> Result<IssuedToken, KubeStoreError> {
        let what = format!("TokenRequest for {namespace}/{service_account} bound to node {node}");
        let body = json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_s,
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Node", "name": node}}
        });
        let req = Request::new(format!(
            "/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
        ))
        .create(
            &PostParams::default(),
            serde_json::to_vec(&body).expect("json"),
        )
        .map_err(|e| self.api().protocol(&what, e.to_string()))?;
        let v = self
            .api()
            .send::<Value>(Verb::Create, &what, req)
            .map_err(|e| {
                self.api()
                    .map_other("create", "serviceaccounts/token", &what, e)
            })?;
        let token = v
            .pointer("/status/token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                self.api()
                    .protocol(&what, "the answer has no status.token".into())
            })?;
        let expires_at = v
            .pointer("/status/expirationTimestamp")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                self.api()
                    .protocol(&what, "the answer has no expirationTimestamp".into())
            })
            .and_then(|t| parse_time(t).map_err(|e| self.api().protocol(&what, e)))?;
        Ok(IssuedToken {
            token: token.to_string(),
            expires_at,
        })
    }
}
