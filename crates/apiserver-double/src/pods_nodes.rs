//! Pods and nodes: read-only to clients, written by the test (in-process or through the control
//! endpoints).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::object_meta::{now_rfc3339, uuid4};
use crate::objects::{Event, Kind, Stored, key, meta_str};
use crate::server::{ApiServerDouble, Shared};

impl ApiServerDouble {
    /// Create or replace a pod (needs `metadata.namespace` and `metadata.name`). The double sets
    /// `uid` (if absent), `resourceVersion` and `creationTimestamp` (if absent) and notifies
    /// watchers. Returns the stored pod.
    pub fn upsert_pod(&self, pod: Value) -> Result<Value, String> {
        upsert_pod(&self.shared, pod)
    }

    /// Delete a pod; false if it did not exist.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> bool {
        delete_pod(&self.shared, namespace, name)
    }

    /// Create or replace a node (needs `metadata.name`), like [`ApiServerDouble::upsert_pod`].
    pub fn upsert_node(&self, node: Value) -> Result<Value, String> {
        upsert_node(&self.shared, node)
    }

    /// Delete a node; false if it did not exist.
    pub fn delete_node(&self, name: &str) -> bool {
        delete_node(&self.shared, name)
    }

    /// Every stored node.
    pub fn nodes(&self) -> Vec<Value> {
        self.shared
            .state()
            .nodes
            .values()
            .map(|s| s.value.clone())
            .collect()
    }

    /// Every stored pod.
    pub fn pods(&self) -> Vec<Value> {
        self.shared
            .state()
            .pods
            .values()
            .map(|s| s.value.clone())
            .collect()
    }
}

pub(crate) fn upsert_pod(sh: &Shared, mut pod: Value) -> Result<Value, String> {
    let ns = meta_str(&pod, "namespace")
        .ok_or("pod needs metadata.namespace")?
        .to_string();
    let name = meta_str(&pod, "name")
        .ok_or("pod needs metadata.name")?
        .to_string();
    let mut st = sh.state();
    let k = key(Some(&ns), &name);
    let old = st.pods.get(&k).cloned();
    let rv = st.next_rv();
    pod["apiVersion"] = json!("v1");
    pod["kind"] = json!("Pod");
    let meta = pod["metadata"]
        .as_object_mut()
        .ok_or("pod metadata is not an object")?;
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
    let stored = Stored::new(pod);
    st.pods.insert(k, stored.clone());
    let type_ = if old.is_some() { "MODIFIED" } else { "ADDED" };
    let ev = Arc::new(Event {
        kind: Kind::Pod,
        type_,
        rv,
        obj: stored.clone(),
    });
    st.record(ev, &sh.events);
    Ok(stored.value.clone())
}

pub(crate) fn delete_pod(sh: &Shared, ns: &str, name: &str) -> bool {
    let mut st = sh.state();
    let Some(old) = st.pods.remove(&key(Some(ns), name)) else {
        return false;
    };
    let rv = st.next_rv();
    let mut gone = old.value.clone();
    gone["metadata"]["resourceVersion"] = json!(rv.to_string());
    let ev = Arc::new(Event {
        kind: Kind::Pod,
        type_: "DELETED",
        rv,
        obj: Stored::new(gone),
    });
    st.record(ev, &sh.events);
    true
}

pub(crate) fn upsert_node(sh: &Shared, mut node: Value) -> Result<Value, String> {
    let name = meta_str(&node, "name")
        .ok_or("node needs metadata.name")?
        .to_string();
    let mut st = sh.state();
    let old = st.nodes.get(&name).cloned();
    let rv = st.next_rv();
    node["apiVersion"] = json!("v1");
    node["kind"] = json!("Node");
    let meta = node["metadata"]
        .as_object_mut()
        .ok_or("node metadata is not an object")?;
    meta.remove("namespace");
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
    let stored = Stored::new(node);
    st.nodes.insert(name, stored.clone());
    let type_ = if old.is_some() { "MODIFIED" } else { "ADDED" };
    let ev = Arc::new(Event {
        kind: Kind::Node,
        type_,
        rv,
        obj: stored.clone(),
    });
    st.record(ev, &sh.events);
    Ok(stored.value.clone())
}

pub(crate) fn delete_node(sh: &Shared, name: &str) -> bool {
    let mut st = sh.state();
    let Some(old) = st.nodes.remove(name) else {
        return false;
    };
    let rv = st.next_rv();
    let mut gone = old.value.clone();
    gone["metadata"]["resourceVersion"] = json!(rv.to_string());
    let ev = Arc::new(Event {
        kind: Kind::Node,
        type_: "DELETED",
        rv,
        obj: Stored::new(gone),
    });
    st.record(ev, &sh.events);
    true
}
