//! The `/_double/` control endpoints (see the crate docs): neither counted nor delayed.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use hyper::Method;
use serde_json::{Value, json};

use crate::pods_nodes::{delete_node, delete_pod, upsert_node, upsert_pod};
use crate::response::{Resp, bad_request, json_resp, parse_object, status};
use crate::shared::Shared;
use crate::watch::expire_watches;

pub(crate) fn control(sh: &Shared, method: &Method, rest: &[String], body: Bytes) -> Resp {
    let parts: Vec<&str> = rest.iter().map(String::as_str).collect();
    match (method, parts.as_slice()) {
        (&Method::GET, ["stats"]) => {
            let st = sh.state();
            let counts = sh.counts.lock().unwrap().clone();
            json_resp(
                200,
                &json!({"requests": counts, "resourceVersion": st.rv.to_string(),
                        "ipleases": st.leases.len(), "pods": st.pods.len(), "nodes": st.nodes.len()}),
            )
        }
        (&Method::POST, ["reset"]) => {
            sh.counts.lock().unwrap().clear();
            json_resp(200, &json!({}))
        }
        (&Method::POST, ["config"]) => {
            let v: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return bad_request(&format!("config is not JSON: {e}")),
            };
            if let Some(ms) = v.get("latencyMs").and_then(Value::as_f64) {
                sh.latency_us.store((ms * 1000.0) as u64, Ordering::Relaxed);
            }
            if let Some(b) = v.get("crdInstalled").and_then(Value::as_bool) {
                sh.crd_installed.store(b, Ordering::Relaxed);
            }
            if v.get("allowAll").and_then(Value::as_bool) == Some(true) {
                sh.forbidden.lock().unwrap().clear();
                sh.forbidden_in.lock().unwrap().clear();
            }
            if let Some(list) = v.get("forbid").and_then(Value::as_array) {
                let mut f = sh.forbidden.lock().unwrap();
                let mut f_in = sh.forbidden_in.lock().unwrap();
                for pair in list {
                    if let (Some(verb), Some(res)) = (
                        pair.get(0).and_then(Value::as_str),
                        pair.get(1).and_then(Value::as_str),
                    ) {
                        match pair.get(2).and_then(Value::as_str) {
                            Some(ns) => {
                                f_in.insert((verb.to_string(), res.to_string(), ns.to_string()))
                            }
                            None => f.insert((verb.to_string(), res.to_string())),
                        };
                    }
                }
            }
            json_resp(200, &json!({}))
        }
        (&Method::PUT, ["pods"]) => match parse_object(&body)
            .map_err(|_| "not JSON".to_string())
            .and_then(|p| upsert_pod(sh, p))
        {
            Ok(p) => json_resp(200, &p),
            Err(e) => bad_request(&e),
        },
        (&Method::PUT, ["nodes"]) => match parse_object(&body)
            .map_err(|_| "not JSON".to_string())
            .and_then(|n| upsert_node(sh, n))
        {
            Ok(n) => json_resp(200, &n),
            Err(e) => bad_request(&e),
        },
        (&Method::DELETE, ["nodes", name]) => {
            if delete_node(sh, name) {
                json_resp(200, &json!({}))
            } else {
                status(404, "NotFound", "no such node", Value::Null)
            }
        }
        (&Method::POST, ["expire"]) => {
            expire_watches(sh);
            json_resp(200, &json!({}))
        }
        (&Method::DELETE, ["pods", ns, name]) => {
            if delete_pod(sh, ns, name) {
                json_resp(200, &json!({}))
            } else {
                status(404, "NotFound", "no such pod", Value::Null)
            }
        }
        _ => status(404, "NotFound", "unknown control endpoint", Value::Null),
    }
}
