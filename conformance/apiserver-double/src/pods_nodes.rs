//! Pods and nodes: read-only to clients, written by the test (in-process or through the control
//! endpoints).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::object_meta::{now_rfc3339, uuid4};
use crate::objects::{Event, Kind, State, Stored, key, meta_str};
use crate::shared::Shared;

pub(crate) fn upsert_pod(sh: &Shared, pod: Value) -> Result<Value, String> {
    upsert(sh, Kind::Pod, pod)
}

pub(crate) fn delete_pod(sh: &Shared, ns: &str, name: &str) -> bool {
    delete(sh, Kind::Pod, &key(Some(ns), name))
}

pub(crate) fn upsert_node(sh: &Shared, node: Value) -> Result<Value, String> {
    upsert(sh, Kind::Node, node)
}

pub(crate) fn delete_node(sh: &Shared, name: &str) -> bool {
    delete(sh, Kind::Node, name)
}

/// The map holding `kind`: pods keyed `namespace/name`, nodes by name.
fn objects(st: &mut State, kind: Kind) -> &mut BTreeMap<String, Arc<Stored>> {
    match kind {
        Kind::Pod => &mut st.pods,
        Kind::Node => &mut st.nodes,
        Kind::Lease => unreachable!("leases are written through the API (leases.rs)"),
    }
}

/// Create or replace a pod or node: `apiVersion`, `kind`, `uid` (kept across replacements),
/// `creationTimestamp` and `resourceVersion` set as the API server would; watchers notified.
fn upsert(sh: &Shared, kind: Kind, mut obj: Value) -> Result<Value, String> {
    let (what, api_kind) = match kind {
        Kind::Pod => ("pod", "Pod"),
        _ => ("node", "Node"),
    };
    let name = meta_str(&obj, "name")
        .ok_or(format!("{what} needs metadata.name"))?
        .to_string();
    let k = match kind {
        Kind::Pod => key(
            Some(meta_str(&obj, "namespace").ok_or("pod needs metadata.namespace")?),
            &name,
        ),
        _ => name,
    };
    let mut st = sh.state();
    let old = objects(&mut st, kind).get(&k).cloned();
    let rv = st.next_rv();
    obj["apiVersion"] = json!("v1");
    obj["kind"] = json!(api_kind);
    let meta = obj["metadata"]
        .as_object_mut()
        .ok_or(format!("{what} metadata is not an object"))?;
    if kind == Kind::Node {
        meta.remove("namespace");
    }
    if !meta.contains_key("uid") {
        let uid = old
            .as_ref()
            .and_then(|o| meta_str(&o.value, "uid").map(str::to_string))
            .unwrap_or_else(uuid4);
        meta.insert("uid".into(), json!(uid));
    }
    if !meta.contains_key("creationTimestamp") {
        meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    }
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    let stored = Stored::new(obj);
    objects(&mut st, kind).insert(k, stored.clone());
    let type_ = if old.is_some() { "MODIFIED" } else { "ADDED" };
    st.record(
        Arc::new(Event {
            kind,
            type_,
            rv,
            obj: stored.clone(),
        }),
        &sh.events,
    );
    Ok(stored.value.clone())
}

/// Delete the pod or node stored under `k`; false if there is none.
fn delete(sh: &Shared, kind: Kind, k: &str) -> bool {
    let mut st = sh.state();
    let Some(old) = objects(&mut st, kind).remove(k) else {
        return false;
    };
    let rv = st.next_rv();
    let mut gone = old.value.clone();
    gone["metadata"]["resourceVersion"] = json!(rv.to_string());
    st.record(
        Arc::new(Event {
            kind,
            type_: "DELETED",
            rv,
            obj: Stored::new(gone),
        }),
        &sh.events,
    );
    true
}
