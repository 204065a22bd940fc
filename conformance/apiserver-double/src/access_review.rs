//! `SelfSubjectAccessReview`: what the 403 knob forbids is what a review denies.

use bytes::Bytes;
use serde_json::{Value, json};

use crate::response::{Resp, json_resp, parse_object, status};
use crate::shared::Shared;

/// `SelfSubjectAccessReview`: allowed unless the (verb, resource) pair is forbidden with
/// [`ApiServerDouble::forbid`] (the group is not considered; subresources and names are ignored).
///
/// [`ApiServerDouble::forbid`]: crate::ApiServerDouble::forbid
pub(crate) fn access_review(sh: &Shared, body: Bytes) -> Resp {
    let mut v = match parse_object(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    let attrs = v.pointer("/spec/resourceAttributes").cloned();
    let Some(attrs) = attrs.filter(Value::is_object) else {
        return invalid_review(
            "spec.resourceAttributes",
            "Required value: the double answers resource attributes only",
        );
    };
    let verb = attrs.get("verb").and_then(Value::as_str).unwrap_or("");
    let resource = attrs.get("resource").and_then(Value::as_str).unwrap_or("");
    if verb.is_empty() || resource.is_empty() {
        return invalid_review("spec.resourceAttributes", "verb and resource are required");
    }
    let allowed = !sh.is_forbidden(verb, resource);
    v["apiVersion"] = json!("authorization.k8s.io/v1");
    v["kind"] = json!("SelfSubjectAccessReview");
    v["metadata"] = json!({"creationTimestamp": null});
    v["status"] = if allowed {
        json!({"allowed": true, "reason": "allowed by the tether apiserver double"})
    } else {
        json!({"allowed": false, "reason": format!("the double forbids {verb} on {resource} for User \"{}\"", sh.user)})
    };
    json_resp(201, &v)
}

fn invalid_review(field_path: &str, msg: &str) -> Resp {
    status(
        422,
        "Invalid",
        &format!(
            "SelfSubjectAccessReview.authorization.k8s.io \"\" is invalid: {field_path}: {msg}"
        ),
        json!({"group": "authorization.k8s.io", "kind": "SelfSubjectAccessReview",
               "causes": [{"reason": "FieldValueRequired", "message": msg, "field": field_path}]}),
    )
}
