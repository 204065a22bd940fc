//! Errors of the Kubernetes lease store. Every message says what to do.

use std::path::PathBuf;
use std::time::Duration;

use tether_leases::{BackendFailure, StoreError};

use tether_pool::NODE_KUBECONFIG;

use crate::crd::{CRD_MANIFEST, CRD_NAME};

/// Where the store's credentials came from (quoted in messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// `ipam.kubernetes.kubeconfig`.
    Config(PathBuf),
    /// The pod's service account (`KUBERNETES_SERVICE_HOST` and the token under
    /// `/var/run/secrets/kubernetes.io/serviceaccount/`).
    InCluster,
    /// The `KUBECONFIG` environment variable.
    Env(String),
}

impl std::fmt::Display for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialSource::Config(p) => {
                write!(f, "kubeconfig {} (ipam.kubernetes.kubeconfig)", p.display())
            }
            CredentialSource::InCluster => f.write_str("the in-cluster service account"),
            CredentialSource::Env(p) => write!(f, "kubeconfig {p} (KUBECONFIG)"),
        }
    }
}

/// Errors of [`KubeStore`](crate::KubeStore).
#[derive(Debug, thiserror::Error)]
pub enum KubeStoreError {
    /// A key of the `kubernetes` object has a value the store cannot use.
    #[error("ipam.kubernetes.{key} {value}: {reason}")]
    Config {
        /// Key under `ipam.kubernetes`.
        key: String,
        /// The value, as JSON text.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// No credentials at all.
    #[error(
        "no Kubernetes credentials for the lease store: set ipam.kubernetes.kubeconfig to a kubeconfig file \
         readable by the container runtime, run with a service account (KUBERNETES_SERVICE_HOST), or set KUBECONFIG"
    )]
    NoCredentials,
    /// The kubeconfig is missing, unreadable or invalid.
    #[error(
        "cannot use {source_}: {detail}; fix the file, or point ipam.kubernetes.kubeconfig at a valid one"
    )]
    Kubeconfig {
        /// Which kubeconfig.
        source_: CredentialSource,
        /// What is wrong.
        detail: String,
    },
    /// In-cluster credentials are incomplete.
    #[error(
        "cannot use the in-cluster service account: {detail}; set ipam.kubernetes.kubeconfig instead"
    )]
    InCluster {
        /// What is wrong.
        detail: String,
    },
    /// The IPLease CRD is not installed (the API answers 404 for the resource).
    #[error(
        "the IPLease custom resource ({CRD_NAME}) is not installed in the cluster at {server}: \
         install tether's manifest (`kubectl apply -f deploy/tether.yaml`, or the CRD alone: {CRD_MANIFEST}); \
         pods waiting for it are retried by the kubelet and start by themselves"
    )]
    CrdMissing {
        /// API server URL.
        server: String,
    },
    /// The CRD exists but is not yet established.
    #[error(
        "the IPLease custom resource ({CRD_NAME}) is installed at {server} but not established yet ({detail}); \
         wait a moment, or check `kubectl get crd {CRD_NAME} -o yaml` for naming conflicts"
    )]
    CrdNotEstablished {
        /// API server URL.
        server: String,
        /// Condition message.
        detail: String,
    },
    /// RBAC forbids a request: on the leases, or on what the operator reads (pods, nodes, NADs,
    /// access reviews). What to do depends on who asked: tether's own identity lacks a grant,
    /// any other (whereabouts') is the wrong credential ([`forbidden_advice`]).
    #[error(
        "the Kubernetes API at {server} forbids `{verb}` on {resource} for {} ({source_}): {message}; {}",
        .identity.as_deref().unwrap_or("this identity"),
        forbidden_advice(.identity.as_deref(), .source_, .verb, .resource)
    )]
    Forbidden {
        /// API server URL.
        server: String,
        /// RBAC verb (`list`, `create`, ...).
        verb: String,
        /// Resource (`ipleases.ipam.tether.dev`, `pods`, ...).
        resource: String,
        /// Credentials used.
        source_: CredentialSource,
        /// The user the API server saw, from its message ([`forbidden_identity`]).
        identity: Option<String>,
        /// The server's message.
        message: String,
    },
    /// An admission policy refused a lease write: tether's node-scope policy
    /// (deploy/base/policy.yaml) when a node's credential writes another node's lease, or has no
    /// node claim.
    #[error(
        "the Kubernetes API at {server} refused the {what} for {source_}: {message} (tether's \
         node-scope policy, deploy/base/policy.yaml: a node writes only its own leases)"
    )]
    ForbiddenByPolicy {
        /// API server URL.
        server: String,
        /// RBAC verb (`create`, `update`, `delete`).
        verb: String,
        /// The request (`CREATE of IPLease <name>`).
        what: String,
        /// Credentials used.
        source_: CredentialSource,
        /// The server's message: names the policy and why.
        message: String,
    },
    /// The credentials were rejected.
    #[error(
        "the Kubernetes API at {server} rejected the credentials from {source_} (401 Unauthorized: {message}); \
         renew the token or client certificate"
    )]
    Unauthorized {
        /// API server URL.
        server: String,
        /// Credentials used.
        source_: CredentialSource,
        /// The server's message.
        message: String,
    },
    /// The API server could not be reached (connection refused, DNS, reset, ...).
    #[error(
        "cannot reach the Kubernetes API server at {server} ({what}): {detail}; check the server address in \
         {source_} and that the API server is up (retry later)"
    )]
    Unreachable {
        /// API server URL.
        server: String,
        /// The request.
        what: String,
        /// Credentials used.
        source_: CredentialSource,
        /// Cause.
        detail: String,
    },
    /// TLS with the API server failed.
    #[error(
        "TLS with the Kubernetes API server at {server} failed ({what}): {detail}; check certificate-authority-data, \
         the server name and the client certificate in {source_}"
    )]
    Tls {
        /// API server URL.
        server: String,
        /// The request.
        what: String,
        /// Credentials used.
        source_: CredentialSource,
        /// Cause.
        detail: String,
    },
    /// The time budget of this call ran out.
    #[error(
        "no answer from the Kubernetes API server at {server} within the {}s budget of this call ({what}); \
         the API server may be overloaded or unreachable (retry later, or raise ipam.kubernetes.timeout_s)",
        budget.as_secs_f64()
    )]
    Timeout {
        /// API server URL.
        server: String,
        /// The request that was cut off.
        what: String,
        /// The budget.
        budget: Duration,
    },
    /// The API server answered with an error not covered above.
    #[error("the Kubernetes API at {server} refused {what}: {code} {reason}: {message}")]
    Api {
        /// API server URL.
        server: String,
        /// The request.
        what: String,
        /// HTTP status.
        code: u16,
        /// Status reason.
        reason: String,
        /// Status message.
        message: String,
    },
    /// The answer could not be understood.
    #[error("unexpected answer from the Kubernetes API at {server} to {what}: {detail}")]
    Protocol {
        /// API server URL.
        server: String,
        /// The request.
        what: String,
        /// What was wrong.
        detail: String,
    },
    /// An answer longer than the reader keeps in memory (the node-agent's list of a network).
    #[error(
        "the answer of the Kubernetes API at {server} to {what} is longer than {limit} bytes, more than is kept in memory"
    )]
    TooLarge {
        /// API server URL.
        server: String,
        /// The request.
        what: String,
        /// The most bytes read.
        limit: usize,
    },
    /// A lease cannot be represented as an IPLease (e.g. a time beyond year 9999).
    #[error("cannot store the lease of {address} in network {network}: {detail}")]
    Unrepresentable {
        /// Network.
        network: String,
        /// Address.
        address: String,
        /// Why.
        detail: String,
    },
    /// The async runtime could not be built.
    #[error("cannot start the Kubernetes client runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// Conditional writes kept losing to someone else's (retry later).
    #[error("{what} kept changing under us ({attempts} attempt(s)); retry later")]
    Contention {
        /// What was being written.
        what: String,
        /// Writes tried.
        attempts: usize,
    },
}

impl KubeStoreError {
    /// Worth retrying later (CNI code 11 "try again later")? True for an unreachable or slow API
    /// server and for 429/5xx answers.
    pub fn is_transient(&self) -> bool {
        match self {
            KubeStoreError::Unreachable { .. } | KubeStoreError::Timeout { .. } => true,
            KubeStoreError::CrdNotEstablished { .. } | KubeStoreError::Contention { .. } => true,
            KubeStoreError::Api { code, .. } => *code == 429 || *code >= 500,
            _ => false,
        }
    }
}

impl KubeStoreError {
    /// The configuration is what must change (CNI code 7): a bad `ipam.kubernetes` value, a
    /// kubeconfig that cannot be used or none at all, or credentials that are not tether's (a
    /// 403 for another program's identity, see [`forbidden_advice`]).
    pub fn is_config(&self) -> bool {
        match self {
            KubeStoreError::Config { .. }
            | KubeStoreError::Kubeconfig { .. }
            | KubeStoreError::NoCredentials => true,
            KubeStoreError::Forbidden { identity, .. } => identity
                .as_deref()
                .is_some_and(|u| !TETHER_IDENTITIES.contains(&u)),
            _ => false,
        }
    }
}

impl From<KubeStoreError> for StoreError {
    fn from(e: KubeStoreError) -> StoreError {
        let transient = e.is_transient();
        StoreError::Backend(BackendFailure::new(e, transient))
    }
}

impl KubeStoreError {
    /// The store error inside a [`StoreError::Backend`], if it is one of ours.
    pub fn from_store_error(e: &StoreError) -> Option<&KubeStoreError> {
        match e {
            StoreError::Backend(f) => f.downcast_ref::<KubeStoreError>(),
            StoreError::Invalid(_) => None,
        }
    }
}

/// The service accounts tether ships (deploy/base): the node identity the plugins and the
/// node-agents use, and the controller's.
pub const TETHER_IDENTITIES: &[&str] = &[
    "system:serviceaccount:kube-system:tether",
    "system:serviceaccount:kube-system:tether-controller",
];

/// The user a 403's message names (`... is forbidden: User "system:serviceaccount:ns:sa" cannot
/// list resource ...`).
pub fn forbidden_identity(message: &str) -> Option<String> {
    let rest = &message[message.find("User \"")? + "User \"".len()..];
    Some(rest[..rest.find('"')?].to_string()).filter(|u| !u.is_empty())
}

/// What to do about a 403. tether's own identity (or one the server did not name) lacks a grant;
/// any other is a credential that is not tether's (measured: a NAD keeping whereabouts'
/// kubeconfig got "grant RBAC to this identity", which would have widened whereabouts'
/// service account), so the advice is the key to change.
pub fn forbidden_advice(
    identity: Option<&str>,
    source: &CredentialSource,
    verb: &str,
    resource: &str,
) -> String {
    match identity {
        Some(user) if !TETHER_IDENTITIES.contains(&user) => {
            let change = match source {
                CredentialSource::Config(_) => format!(
                    "set ipam.kubernetes.kubeconfig to the kubeconfig tether's node-agent writes ({NODE_KUBECONFIG}), \
                     or remove the key on a node where the agent runs"
                ),
                CredentialSource::Env(_) => {
                    format!("point KUBECONFIG at tether's kubeconfig ({NODE_KUBECONFIG})")
                }
                CredentialSource::InCluster => format!(
                    "set ipam.kubernetes.kubeconfig to tether's kubeconfig ({NODE_KUBECONFIG})"
                ),
            };
            format!(
                "{user} is not tether's service account ({}), so these are not tether's credentials: {change}",
                TETHER_IDENTITIES[0]
            )
        }
        _ => format!(
            "grant `{verb}` on {resource} to this identity (deploy/base/rbac.yaml has the ClusterRoles)"
        ),
    }
}

/// `e: cause: cause ...` (first lines only), without repeating a cause already in the text.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let first = e.to_string();
    let mut out = first
        .strip_prefix("ServiceError: ")
        .unwrap_or(&first)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let full = c.to_string();
        let s = full.lines().next().unwrap_or("");
        if !out.contains(s) {
            out.push_str(": ");
            out.push_str(s);
        }
        cur = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden(message: &str, source: CredentialSource) -> String {
        KubeStoreError::Forbidden {
            server: "https://10.0.0.1:6443".into(),
            verb: "list".into(),
            resource: "ipleases.ipam.tether.dev".into(),
            source_: source,
            identity: forbidden_identity(message),
            message: message.into(),
        }
        .to_string()
    }

    fn said_by_the_server(user: &str) -> String {
        format!(
            "ipleases.ipam.tether.dev is forbidden: User \"{user}\" cannot list resource \"ipleases\" in API group \
             \"ipam.tether.dev\" at the cluster scope"
        )
    }

    #[test]
    fn another_programs_identity_is_told_which_key_to_change() {
        let whereabouts = "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig";
        let m = forbidden(
            &said_by_the_server("system:serviceaccount:kube-system:whereabouts"),
            CredentialSource::Config(whereabouts.into()),
        );
        assert!(
            m.contains("forbids `list` on ipleases.ipam.tether.dev for system:serviceaccount:kube-system:whereabouts"),
            "{m}"
        );
        assert!(
            m.contains(
                "is not tether's service account (system:serviceaccount:kube-system:tether)"
            ) && m.contains(
                "set ipam.kubernetes.kubeconfig to the kubeconfig tether's node-agent writes"
            ),
            "{m}"
        );
        assert!(!m.contains("grant"), "no RBAC for the wrong identity: {m}");
        let e = |user: &str| KubeStoreError::Forbidden {
            server: String::new(),
            verb: "list".into(),
            resource: "pods".into(),
            source_: CredentialSource::InCluster,
            identity: Some(user.into()),
            message: String::new(),
        };
        assert!(e("system:serviceaccount:kube-system:whereabouts").is_config());
        assert!(
            !e(TETHER_IDENTITIES[0]).is_config(),
            "a missing grant is not the config's"
        );
        let m = forbidden(
            &said_by_the_server("alice"),
            CredentialSource::Env("/home/alice/.kube/config".into()),
        );
        assert!(m.contains("point KUBECONFIG at tether's kubeconfig"), "{m}");
    }

    #[test]
    fn tethers_own_identity_is_told_what_to_grant() {
        for user in TETHER_IDENTITIES {
            let m = forbidden(&said_by_the_server(user), CredentialSource::InCluster);
            assert!(
                m.contains(&format!("for {user} (the in-cluster service account)")),
                "{m}"
            );
            assert!(
                m.ends_with("grant `list` on ipleases.ipam.tether.dev to this identity (deploy/base/rbac.yaml has the ClusterRoles)"),
                "{m}"
            );
        }
        // A message that names nobody: the advice as before.
        let m = forbidden("forbidden", CredentialSource::InCluster);
        assert!(
            m.contains("for this identity") && m.contains("grant `list`"),
            "{m}"
        );
        assert_eq!(forbidden_identity("User \"\" cannot"), None);
        assert_eq!(forbidden_identity("User \"unterminated"), None);
    }
}
