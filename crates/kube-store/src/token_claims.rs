//! What a service-account token says about where it may be used: the node of the pod it is
//! bound to. Read without verifying the signature: the API server verifies the token; this only
//! learns which node name the server will compare lease writes with (the node-scope policy,
//! deploy/base/policy.yaml), so the leases name exactly that node whatever `NODE_NAME` or the
//! hostname say.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// A JWT larger than this is not a service-account token we would parse.
const MAX_TOKEN_LEN: usize = 16 * 1024;

/// The `kubernetes.io.node.name` claim of a bound service-account token, if `token` is a JWT
/// that has one.
pub fn bound_node(token: &str) -> Option<String> {
    let token = token.trim();
    if token.len() > MAX_TOKEN_LEN {
        return None;
    }
    let mut parts = token.split('.');
    let (_header, payload, _sig) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    // Tokens are unpadded base64url; tolerate padding.
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let node = claims
        .get("kubernetes.io")?
        .get("node")?
        .get("name")?
        .as_str()?;
    (!node.is_empty() && node.len() <= 253).then(|| node.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(payload: &serde_json::Value) -> String {
        let enc = |b: &[u8]| URL_SAFE_NO_PAD.encode(b);
        format!(
            "{}.{}.{}",
            enc(br#"{"alg":"RS256"}"#),
            enc(payload.to_string().as_bytes()),
            enc(b"sig")
        )
    }

    #[test]
    fn reads_the_bound_node_and_nothing_else() {
        let bound = serde_json::json!({"sub": "system:serviceaccount:kube-system:tether",
            "kubernetes.io": {"namespace": "kube-system", "node": {"name": "gpu-07", "uid": "u"},
                              "pod": {"name": "tether-x", "uid": "p"}}});
        assert_eq!(bound_node(&jwt(&bound)).as_deref(), Some("gpu-07"));
        assert_eq!(
            bound_node(&format!("{}\n", jwt(&bound))).as_deref(),
            Some("gpu-07")
        );
        // Not bound to a node, not a JWT, garbage, oversized.
        let unbound = serde_json::json!({"kubernetes.io": {"namespace": "kube-system"}});
        assert_eq!(bound_node(&jwt(&unbound)), None);
        for t in ["", "static-token", "a.b", "a.!!!.c", "a.b.c.d"] {
            assert_eq!(bound_node(t), None, "{t}");
        }
        let huge = serde_json::json!({"kubernetes.io": {"node": {"name": "n"}}, "pad": "x".repeat(20_000)});
        assert_eq!(bound_node(&jwt(&huge)), None);
        let empty = serde_json::json!({"kubernetes.io": {"node": {"name": ""}}});
        assert_eq!(bound_node(&jwt(&empty)), None);
    }
}
