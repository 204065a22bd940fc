//! From a request to its handler: the path's target (see `target`), the verb and resource it
//! counts as, the knobs applied before it is served (latency, 403, CRD missing).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request};
use serde_json::{Value, json};

use crate::FAKE_VERSION;
use crate::access_review::access_review;
use crate::control::control;
use crate::crd::crd;
use crate::knobs::forbidden;
use crate::leases::{create_lease, delete_lease, update_lease};
use crate::objects::Kind;
use crate::query::{parse_query, percent_decode};
use crate::read::{get, list};
use crate::response::{Resp, json_resp, no_such_resource, status};
use crate::shared::Shared;
use crate::target::{Target, route};
use crate::watch::watch_objects;

pub(crate) async fn handle(sh: Arc<Shared>, req: Request<Incoming>) -> Resp {
    let method = req.method().clone();
    let path = percent_decode(req.uri().path());
    let q = parse_query(req.uri().query());
    let target = route(&path);
    // `Accept: application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`: metadata only.
    let meta_only = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
    if let Target::Control(rest) = target {
        let body = read_body(req).await;
        return control(&sh, &method, &rest, body);
    }
    let watch = matches!(q.get("watch").map(String::as_str), Some("true") | Some("1"));
    let (verb, resource) = match (&target, &method) {
        (Target::Version, _) => ("get", "version".to_string()),
        (Target::Crd(_), &Method::GET) => ("get", "customresourcedefinitions".to_string()),
        (Target::AccessReview, &Method::POST) => ("create", "selfsubjectaccessreviews".to_string()),
        (Target::Collection(k, _), &Method::GET) if watch => ("watch", k.resource().to_string()),
        (Target::Collection(k, _), &Method::GET) => ("list", k.resource().to_string()),
        (Target::Collection(k, _), &Method::POST) => ("create", k.resource().to_string()),
        (Target::Collection(k, _), &Method::DELETE) => {
            ("deletecollection", k.resource().to_string())
        }
        (Target::Item(k, _, _), &Method::GET) => ("get", k.resource().to_string()),
        (Target::Item(k, _, _), &Method::PUT) => ("update", k.resource().to_string()),
        (Target::Item(k, _, _), &Method::PATCH) => ("patch", k.resource().to_string()),
        (Target::Item(k, _, _), &Method::DELETE) => ("delete", k.resource().to_string()),
        _ => (method_verb(&method), "unknown".to_string()),
    };
    sh.count(format!("{verb} {resource}"));
    let lat = sh.latency();
    if !lat.is_zero() {
        tokio::time::sleep(lat).await;
    }
    let target_ns = match &target {
        Target::Collection(_, ns) | Target::Item(_, ns, _) => ns.as_deref(),
        _ => None,
    };
    if sh.is_forbidden(verb, &resource) || sh.is_forbidden_in(verb, &resource, target_ns) {
        return forbidden(&sh, verb, &resource, &target);
    }
    let lease_target = matches!(
        target,
        Target::Collection(Kind::Lease, _) | Target::Item(Kind::Lease, _, _)
    );
    if lease_target && !sh.crd_installed.load(Ordering::Relaxed) {
        return no_such_resource();
    }
    match (target, method) {
        (Target::Version, Method::GET) => json_resp(
            200,
            &json!({"major": "1", "minor": "33", "gitVersion": FAKE_VERSION,
                    "platform": "linux/amd64", "goVersion": "none (tether apiserver double)"}),
        ),
        (Target::Crd(name), Method::GET) => crd(&sh, &name),
        (Target::Collection(kind, ns), Method::GET) => {
            if kind == Kind::Lease && !watch {
                if q.get("resourceVersion").is_some_and(|v| !v.is_empty()) {
                    let unready =
                        sh.cache_unready
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                                n.checked_sub(1)
                            });
                    if unready.is_ok() {
                        return status(
                            429,
                            "TooManyRequests",
                            "Too many requests, please try again later.",
                            json!({"retryAfterSeconds": 1}),
                        );
                    }
                } else {
                    sh.count("consistent-list ipleases".to_string());
                }
            }
            if watch {
                watch_objects(&sh, kind, ns, &q, meta_only)
            } else {
                list(&sh, kind, ns.as_deref(), &q, meta_only)
            }
        }
        (Target::Collection(Kind::Lease, _), Method::POST) => {
            let body = read_body(req).await;
            create_lease(&sh, body)
        }
        (Target::Item(kind, ns, name), Method::GET) => {
            get(&sh, kind, ns.as_deref(), &name, meta_only)
        }
        (Target::AccessReview, Method::POST) => {
            let body = read_body(req).await;
            access_review(&sh, body)
        }
        (Target::Item(Kind::Lease, _, name), Method::PUT) => {
            let body = read_body(req).await;
            update_lease(&sh, &name, body)
        }
        (Target::Item(Kind::Lease, _, name), Method::DELETE) => {
            let body = read_body(req).await;
            delete_lease(&sh, &name, body)
        }
        (Target::Unknown, _) => no_such_resource(),
        (_, m) => status(
            405,
            "MethodNotAllowed",
            &format!("the double does not support {m} on {path}"),
            Value::Null,
        ),
    }
}

fn method_verb(m: &Method) -> &'static str {
    match *m {
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

async fn read_body(req: Request<Incoming>) -> Bytes {
    match req.into_body().collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => Bytes::new(),
    }
}
