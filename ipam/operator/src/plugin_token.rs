//! The token the node-agent puts into the plugin's kubeconfig: one bound to this **node**, asked
//! for with the agent's own (pod-bound) credential, renewed at half its life.
//!
//! Why not the agent's own token: the API server refuses a pod-bound token once its pod is gone,
//! so every ADD on the node failed with 401 from the agent pod's deletion (a DaemonSet roll, a
//! restart) until the next agent wrote its own — a minute and more on a busy node (the e2e
//! roll). A node-bound token outlives the agent's pod by up to [`LIFETIME`], dies with the Node,
//! and carries the same node claim the node-scope policies check (tether_cluster::node_token).
//! When one cannot be had (the API server is away, the RBAC or policy of an older install), the
//! agent's own token is used as before, and the reason logged once.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tether_cluster::{Cluster, IssuedToken};
use tether_kube_store::KubeSettings;

/// How long an issued token is valid: how long the plugin keeps working without any agent.
/// deploy/base/policy.yaml allows at most this.
pub const LIFETIME: Duration = Duration::from_secs(2 * 3600);

/// The node-bound token, renewed as time passes.
pub struct PluginToken {
    api: Option<KubeSettings>,
    cluster: Option<Cluster>,
    /// (namespace, service account, node) of this agent's own credential.
    identity: Option<(String, String, String)>,
    issued: Option<(IssuedToken, u64)>,
    /// What stopped the last attempt, logged once until it changes.
    last_error: Option<String>,
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl PluginToken {
    /// Ask the API at `api` (the agent's own credential); `None`: never ask (the agent's token).
    pub fn new(api: Option<KubeSettings>) -> PluginToken {
        PluginToken {
            api,
            cluster: None,
            identity: None,
            issued: None,
            last_error: None,
        }
    }

    /// The token to write now: the node-bound one (renewed once half its life is gone), else
    /// `None` (the caller uses its own token).
    pub fn current(&mut self) -> Option<String> {
        let now = now_s();
        if let Some((t, issued_at)) = &self.issued
            && now < issued_at + (t.expires_at.saturating_sub(*issued_at)) / 2
        {
            return Some(t.token.clone());
        }
        match self.issue() {
            Ok(t) => {
                if self.issued.is_none() || self.last_error.is_some() {
                    let (_, _, node) = self.identity.as_ref().expect("identity before a token");
                    log::warn!(
                        "the plugin's kubeconfig carries a token bound to node {node}, renewed every {} min",
                        LIFETIME.as_secs() / 120
                    );
                }
                self.last_error = None;
                self.issued = Some((t, now));
            }
            Err(e) => {
                if self.last_error.as_deref() != Some(&e) {
                    log::error!(
                        "no node-bound token for the plugin ({e}); its kubeconfig carries this pod's token, which \
                         stops working when this pod is deleted"
                    );
                }
                self.last_error = Some(e);
            }
        }
        // An earlier token still valid for a minute is better than the pod's.
        self.issued
            .as_ref()
            .filter(|(t, _)| t.expires_at > now + 60)
            .map(|(t, _)| t.token.clone())
    }

    fn issue(&mut self) -> Result<IssuedToken, String> {
        let api = self.api.as_ref().ok_or("no API settings")?;
        if self.cluster.is_none() {
            self.cluster = Some(Cluster::connect(api).map_err(|e| e.to_string())?);
        }
        let cluster = self.cluster.as_ref().expect("connected above");
        cluster.restart_budget();
        if self.identity.is_none() {
            let me = cluster.who_am_i().map_err(|e| e.to_string())?;
            self.identity = Some(own_identity(&me.username, me.node.as_deref())?);
        }
        let (ns, sa, node) = self.identity.as_ref().expect("set above");
        cluster
            .request_node_token(ns, sa, node, LIFETIME.as_secs())
            .map_err(|e| e.to_string())
    }
}

/// (namespace, service account, node) from what the API server says of this credential.
fn own_identity(username: &str, node: Option<&str>) -> Result<(String, String, String), String> {
    let mut parts = username.splitn(4, ':');
    let (Some("system"), Some("serviceaccount"), Some(ns), Some(sa)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!(
            "the agent runs as {username:?}, not as a service account"
        ));
    };
    let node = node.ok_or_else(|| {
        format!(
            "the agent's credential ({username}) is not bound to a node: not a projected pod token?"
        )
    })?;
    Ok((ns.to_string(), sa.to_string(), node.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_node_bound_service_account_asks_for_one() {
        assert_eq!(
            own_identity("system:serviceaccount:kube-system:tether", Some("gpu-07")).unwrap(),
            ("kube-system".into(), "tether".into(), "gpu-07".into())
        );
        assert!(
            own_identity("system:serviceaccount:kube-system:tether", None)
                .unwrap_err()
                .contains("not bound to a node")
        );
        assert!(
            own_identity("kubernetes-admin", Some("n"))
                .unwrap_err()
                .contains("not as a service account")
        );
    }

    #[test]
    fn without_an_api_the_caller_keeps_its_own_token() {
        let mut t = PluginToken::new(None);
        assert_eq!(t.current(), None);
        assert_eq!(t.last_error.as_deref(), Some("no API settings"));
    }
}
