//! What this identity may do and what the server is, for `doctor`, the agent and the CLI:
//!
//! | call | request |
//! |---|---|
//! | [`Cluster::can_i`] | CREATE selfsubjectaccessreviews |
//! | [`Cluster::who_am_i`] | CREATE selfsubjectreviews |
//! | [`Cluster::node_scope`] | CREATE ipleases `dryRun=All` of another node's lease (nothing is stored) |
//! | [`Cluster::server_version`] | GET /version |
//! | [`Cluster::crd_state`] | GET of the IPLease CRD |

use kube::core::Request;
use kube::core::params::{GetParams, PostParams};
use serde_json::{Value, json};

use crate::cluster::Cluster;
use tether_kube_store::KubeStoreError;
use tether_kube_store::api::Verb;
use tether_kube_store::crd::PLURAL;

/// Answer of a SelfSubjectAccessReview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// Allowed?
    pub allowed: bool,
    /// The authorizer's reason, when it gave one.
    pub reason: String,
}

/// This identity as the API server authenticates it (a SelfSubjectReview).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// User name.
    pub username: String,
    /// The node its token is bound to (`authentication.kubernetes.io/node-name`), if any.
    pub node: Option<String>,
}

/// Whether the API server keeps this identity to its own node's leases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeScope {
    /// A write of another node's lease was refused by an admission policy: its message.
    Enforced(String),
    /// The same write would have been stored.
    NotEnforced,
}

/// The node no lease of a real node names, for the dry-run of [`Cluster::node_scope`].
const NO_SUCH_NODE: &str = "tether-doctor.invalid";

/// The IPLease CRD as `doctor` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrdState {
    /// Installed and Established.
    Established,
    /// Installed but not (yet) Established; the condition's message.
    NotEstablished(String),
    /// Not installed.
    Missing,
    /// This identity may not read CRDs (403): the server's message.
    Unreadable(String),
}

impl Cluster {
    /// May this identity `verb` the `resource` of API `group` (`""` for the core group),
    /// cluster-wide? One SelfSubjectAccessReview.
    pub fn can_i(&self, verb: &str, group: &str, resource: &str) -> Result<Access, KubeStoreError> {
        let what = format!("SelfSubjectAccessReview of {verb} {resource}");
        let body = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource}}
        });
        let req = Request::new("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
            .create(
                &PostParams::default(),
                serde_json::to_vec(&body).expect("json"),
            )
            .map_err(|e| self.api().protocol(&what, e.to_string()))?;
        let v = self
            .api()
            .send::<Value>(Verb::Create, &what, req)
            .map_err(|e| {
                self.api().map_other(
                    "create",
                    "selfsubjectaccessreviews.authorization.k8s.io",
                    &what,
                    e,
                )
            })?;
        let st = v.get("status").cloned().unwrap_or(Value::Null);
        Ok(Access {
            allowed: st.get("allowed").and_then(Value::as_bool).unwrap_or(false),
            reason: st
                .get("reason")
                .or_else(|| st.get("evaluationError"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        })
    }

    /// Who this identity is, and the node its token is bound to. One SelfSubjectReview.
    pub fn who_am_i(&self) -> Result<Identity, KubeStoreError> {
        let what = "SelfSubjectReview";
        let body = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
        let req = Request::new("/apis/authentication.k8s.io/v1/selfsubjectreviews")
            .create(
                &PostParams::default(),
                serde_json::to_vec(&body).expect("json"),
            )
            .map_err(|e| self.api().protocol(what, e.to_string()))?;
        let v = self
            .api()
            .send::<Value>(Verb::Create, what, req)
            .map_err(|e| {
                self.api().map_other(
                    "create",
                    "selfsubjectreviews.authentication.k8s.io",
                    what,
                    e,
                )
            })?;
        let user = v
            .pointer("/status/userInfo")
            .cloned()
            .unwrap_or(Value::Null);
        let node = user
            .pointer("/extra/authentication.kubernetes.io~1node-name/0")
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(Identity {
            username: user
                .get("username")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            node,
        })
    }

    /// Would the API server let this identity lease an address to another node? A dry-run CREATE
    /// (`dryRun=All`: admission runs, nothing is stored) of a Leased record naming a node that
    /// does not exist, in a network and fabric no config uses. Needs `create` on ipleases.
    pub fn node_scope(&self) -> Result<NodeScope, KubeStoreError> {
        let what = "dry-run CREATE of another node's IPLease";
        let address: std::net::IpAddr = "192.0.2.1".parse().expect("address");
        let network = "tether-doctor-node-scope";
        // An isolated fabric of its own: no record of a real network can have that name.
        let fabric = "tether-doctor";
        let body = json!({
            "apiVersion": format!("{}/{}", self.api().group(), tether_kube_store::crd::VERSION),
            "kind": "IPLease",
            "metadata": {"name": tether_kube_store::crd::object_name(Some(fabric), address)},
            "spec": {"network": network, "isolatedFabric": fabric, "address": address.to_string(), "prefixLength": 32,
                     "containerID": "tether-doctor", "ifname": "net1", "node": NO_SUCH_NODE,
                     "state": "Leased", "since": "2000-01-01T00:00:00Z"}
        });
        let params = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let req = Request::new(format!(
            "/apis/{}/{}/{PLURAL}",
            self.api().group(),
            tether_kube_store::crd::VERSION
        ))
        .create(&params, serde_json::to_vec(&body).expect("json"))
        .map_err(|e| self.api().protocol(what, e.to_string()))?;
        match self.api().send::<Value>(Verb::Create, what, req) {
            Ok(_) => Ok(NodeScope::NotEnforced),
            // Someone really holds that record: the admission was not the question.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(NodeScope::NotEnforced),
            Err(kube::Error::Api(s))
                if s.code == 403 && s.message.contains("ValidatingAdmissionPolicy") =>
            {
                Ok(NodeScope::Enforced(s.message.clone()))
            }
            Err(e) => Err(self.api().map_error(Verb::Create, what, e)),
        }
    }

    /// `gitVersion` of GET /version.
    pub fn server_version(&self) -> Result<String, KubeStoreError> {
        let what = "GET /version";
        let req = http::Request::get("/version")
            .body(Vec::new())
            .map_err(|e| self.api().protocol(what, e.to_string()))?;
        let v = self
            .api()
            .send::<Value>(Verb::Get, what, req)
            .map_err(|e| self.api().map_other("get", "version", what, e))?;
        Ok(v.get("gitVersion")
            .and_then(Value::as_str)
            .unwrap_or("(unknown version)")
            .to_string())
    }

    /// Is the IPLease CRD installed and established?
    pub fn crd_state(&self) -> Result<CrdState, KubeStoreError> {
        let crd_name = format!("{PLURAL}.{}", self.api().group());
        let what = "GET of the IPLease CRD";
        let req = Request::new("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
            .get(&crd_name, &GetParams::default())
            .map_err(|e| self.api().protocol(what, e.to_string()))?;
        match self.api().send::<Value>(Verb::Get, what, req) {
            Ok(crd) => {
                let c = crd
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .and_then(|cs| cs.iter().find(|c| c["type"] == "Established"));
                Ok(match c {
                    Some(c) if c["status"] == "True" => CrdState::Established,
                    other => CrdState::NotEstablished(
                        other
                            .and_then(|c| c["message"].as_str())
                            .unwrap_or("no Established condition")
                            .to_string(),
                    ),
                })
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(CrdState::Missing),
            Err(kube::Error::Api(s)) if s.code == 403 => {
                Ok(CrdState::Unreadable(s.message.clone()))
            }
            Err(e) => Err(self
                .api()
                .map_other("get", "customresourcedefinitions", what, e)),
        }
    }
}
