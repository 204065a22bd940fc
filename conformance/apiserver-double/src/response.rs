//! Building responses: JSON bodies, `Status` errors as the API server words them, and the
//! `PartialObjectMetadata` view of an object; and reading a request body as a JSON object (or
//! the `400` that answers one that is not).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::Response;
use serde_json::{Value, json};

use crate::objects::{Kind, Stored};
use crate::{GROUP, KIND};

type Body = BoxBody<Bytes, Infallible>;
pub(crate) type Resp = Response<Body>;

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

pub(crate) fn json_bytes(code: u16, bytes: Bytes) -> Resp {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(full(bytes))
        .expect("valid response")
}

pub(crate) fn json_resp(code: u16, v: &Value) -> Resp {
    json_bytes(
        code,
        Bytes::from(serde_json::to_vec(v).expect("serialises")),
    )
}

pub(crate) fn status_value(code: u16, reason: &str, message: &str, details: Value) -> Value {
    let mut v = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if !details.is_null() {
        v["details"] = details;
    }
    v
}

pub(crate) fn status(code: u16, reason: &str, message: &str, details: Value) -> Resp {
    json_resp(code, &status_value(code, reason, message, details))
}

pub(crate) fn details(kind: Kind, name: &str) -> Value {
    json!({"name": name, "group": kind.group(), "kind": kind.resource()})
}

pub(crate) fn not_found(kind: Kind, name: &str) -> Resp {
    status(
        404,
        "NotFound",
        &format!("{} \"{name}\" not found", kind.qualified()),
        details(kind, name),
    )
}

pub(crate) fn no_such_resource() -> Resp {
    status(
        404,
        "NotFound",
        "the server could not find the requested resource",
        json!({}),
    )
}

/// The request body as a JSON object, or the `400 BadRequest` answering it.
pub(crate) fn parse_object(body: &Bytes) -> Result<Value, Resp> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| bad_request(&format!("the request body is not a JSON object: {e}")))?;
    if !v.is_object() {
        return Err(bad_request("the request body is not a JSON object"));
    }
    Ok(v)
}

pub(crate) fn bad_request(msg: &str) -> Resp {
    status(400, "BadRequest", msg, Value::Null)
}

pub(crate) fn conflict(kind: Kind, name: &str, why: &str) -> Resp {
    status(
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            kind.qualified()
        ),
        details(kind, name),
    )
}

pub(crate) fn invalid(name: &str, field_path: &str, msg: &str) -> Resp {
    status(
        422,
        "Invalid",
        &format!("{KIND}.{GROUP} \"{name}\" is invalid: {field_path}: {msg}"),
        json!({"name": name, "group": GROUP, "kind": KIND,
               "causes": [{"reason": "FieldValueInvalid", "message": msg, "field": field_path}]}),
    )
}

/// The object as a `PartialObjectMetadata` (kind and apiVersion omitted inside a list, as the API
/// server does).
pub(crate) fn metadata_json(obj: &Stored, in_list: bool) -> Bytes {
    let meta = obj
        .value
        .get("metadata")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let v = if in_list {
        json!({"metadata": meta})
    } else {
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
    };
    Bytes::from(serde_json::to_vec(&v).expect("serialises"))
}
