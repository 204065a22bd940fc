//! IPLease writes: create, replace and delete with the API server's conflicts and
//! preconditions, and an imitation of the CRD's validation.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::KIND;
use crate::object_meta::{is_dns_subdomain, now_rfc3339, uuid4};
use crate::objects::{Event, Kind, Stored, meta_str};
use crate::response::{
    Resp, bad_request, conflict, details, invalid, json_bytes, not_found, parse_object, status,
};
use crate::shared::Shared;

/// Imitates the CRD schema and its CEL rules (see deploy/crds/ipleases.yaml).
fn validate_lease(name: &str, v: &Value, old: Option<&Value>) -> Result<(), Resp> {
    if v.get("apiVersion").and_then(Value::as_str) != Some("ipam.tether.dev/v1alpha1")
        || v.get("kind").and_then(Value::as_str) != Some(KIND)
    {
        return Err(bad_request(&format!(
            "expected apiVersion ipam.tether.dev/v1alpha1 and kind {KIND}, got {} {}",
            v.get("apiVersion").unwrap_or(&Value::Null),
            v.get("kind").unwrap_or(&Value::Null)
        )));
    }
    let Some(spec) = v.get("spec").and_then(Value::as_object) else {
        return Err(invalid(name, "spec", "Required value"));
    };
    for f in [
        "network",
        "address",
        "containerID",
        "ifname",
        "state",
        "since",
    ] {
        match spec.get(f) {
            Some(Value::String(s)) if !(s.is_empty() && (f == "network" || f == "address")) => {}
            Some(Value::String(_)) => {
                return Err(invalid(name, &format!("spec.{f}"), "must not be empty"));
            }
            Some(_) => {
                return Err(invalid(
                    name,
                    &format!("spec.{f}"),
                    "must be of type string",
                ));
            }
            None => return Err(invalid(name, &format!("spec.{f}"), "Required value")),
        }
    }
    match spec.get("prefixLength").and_then(Value::as_u64) {
        Some(n) if n <= 128 => {}
        _ => {
            return Err(invalid(
                name,
                "spec.prefixLength",
                "must be an integer between 0 and 128",
            ));
        }
    }
    let state = spec["state"].as_str().unwrap_or("");
    if !["Leased", "Released", "Quarantined"].contains(&state) {
        return Err(invalid(
            name,
            "spec.state",
            &format!(
                "Unsupported value: \"{state}\": supported values: \"Leased\", \"Released\", \"Quarantined\""
            ),
        ));
    }
    if state == "Quarantined" && !spec.contains_key("quarantine") {
        return Err(invalid(
            name,
            "spec",
            "a Quarantined lease needs quarantine.mac and quarantine.at",
        ));
    }
    if state == "Released" && !spec.contains_key("releasedAt") {
        return Err(invalid(name, "spec", "a Released lease needs releasedAt"));
    }
    if let Some(old) = old {
        for f in ["network", "address"] {
            if old.pointer(&format!("/spec/{f}")) != spec.get(f) {
                return Err(invalid(
                    name,
                    &format!("spec.{f}"),
                    &format!("{f} is immutable"),
                ));
            }
        }
    }
    Ok(())
}

pub(crate) fn create_lease(sh: &Shared, body: Bytes) -> Resp {
    let mut v = match parse_object(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    if meta_str(&v, "resourceVersion").is_some() {
        return status(
            500,
            "InternalError",
            "Internal error occurred: resourceVersion should not be set on objects to be created",
            Value::Null,
        );
    }
    let name = match (meta_str(&v, "name"), meta_str(&v, "generateName")) {
        (Some(n), _) => n.to_string(),
        (None, Some(g)) => format!("{g}{}", &uuid4()[..5]),
        (None, None) => {
            return invalid(
                "",
                "metadata.name",
                "Required value: name or generateName is required",
            );
        }
    };
    if !is_dns_subdomain(&name) {
        return invalid(
            &name,
            "metadata.name",
            &format!(
                "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
                 characters, '-' or '.', and must start and end with an alphanumeric character"
            ),
        );
    }
    if let Err(r) = validate_lease(&name, &v, None) {
        return r;
    }
    let mut st = sh.state();
    if st.leases.contains_key(&name) {
        return status(
            409,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", Kind::Lease.qualified()),
            details(Kind::Lease, &name),
        );
    }
    let rv = st.next_rv();
    let meta = v["metadata"]
        .as_object_mut()
        .expect("checked: metadata has a name");
    meta.insert("name".into(), json!(name));
    meta.remove("generateName");
    meta.insert("uid".into(), json!(uuid4()));
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    meta.insert("generation".into(), json!(1));
    meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
    let stored = Stored::new(v);
    st.leases.insert(name, stored.clone());
    let ev = Arc::new(Event {
        kind: Kind::Lease,
        type_: "ADDED",
        rv,
        obj: stored.clone(),
    });
    st.record(ev, &sh.events);
    json_bytes(201, stored.json.clone())
}

pub(crate) fn update_lease(sh: &Shared, name: &str, body: Bytes) -> Resp {
    let mut v = match parse_object(&body) {
        Ok(v) => v,
        Err(r) => return r,
    };
    if meta_str(&v, "name") != Some(name) {
        return bad_request(&format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta_str(&v, "name").unwrap_or("")
        ));
    }
    let mut st = sh.state();
    let Some(old) = st.leases.get(name).cloned() else {
        return not_found(Kind::Lease, name);
    };
    let old_uid = meta_str(&old.value, "uid").unwrap_or("").to_string();
    if let Some(uid) = meta_str(&v, "uid")
        && uid != old_uid
    {
        return conflict(
            Kind::Lease,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
            ),
        );
    }
    if let Some(rv) = meta_str(&v, "resourceVersion")
        && rv != old.rv().to_string()
    {
        return conflict(
            Kind::Lease,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        );
    }
    if let Err(r) = validate_lease(name, &v, Some(&old.value)) {
        return r;
    }
    let rv = st.next_rv();
    let spec_changed = old.value.get("spec") != v.get("spec");
    let generation = old
        .value
        .pointer("/metadata/generation")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        + u64::from(spec_changed);
    let meta = v["metadata"]
        .as_object_mut()
        .expect("checked: metadata has a name");
    meta.insert("uid".into(), json!(old_uid));
    meta.insert("resourceVersion".into(), json!(rv.to_string()));
    meta.insert("generation".into(), json!(generation));
    meta.insert(
        "creationTimestamp".into(),
        old.value
            .pointer("/metadata/creationTimestamp")
            .cloned()
            .unwrap_or(Value::Null),
    );
    let stored = Stored::new(v);
    st.leases.insert(name.to_string(), stored.clone());
    let ev = Arc::new(Event {
        kind: Kind::Lease,
        type_: "MODIFIED",
        rv,
        obj: stored.clone(),
    });
    st.record(ev, &sh.events);
    json_bytes(200, stored.json.clone())
}

pub(crate) fn delete_lease(sh: &Shared, name: &str, body: Bytes) -> Resp {
    let opts: Value = if body.iter().all(|b| b.is_ascii_whitespace()) {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return bad_request(&format!("DeleteOptions are not valid JSON: {e}")),
        }
    };
    let mut st = sh.state();
    let Some(old) = st.leases.get(name).cloned() else {
        return not_found(Kind::Lease, name);
    };
    let old_uid = meta_str(&old.value, "uid").unwrap_or("").to_string();
    let old_rv = old.rv().to_string();
    if let Some(uid) = opts.pointer("/preconditions/uid").and_then(Value::as_str)
        && uid != old_uid
    {
        return conflict(
            Kind::Lease,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
            ),
        );
    }
    if let Some(rv) = opts
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        && rv != old_rv
    {
        return conflict(
            Kind::Lease,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {old_rv}"
            ),
        );
    }
    st.leases.remove(name);
    let rv = st.next_rv();
    let mut gone = old.value.clone();
    gone["metadata"]["resourceVersion"] = json!(rv.to_string());
    let stored = Stored::new(gone);
    let ev = Arc::new(Event {
        kind: Kind::Lease,
        type_: "DELETED",
        rv,
        obj: stored.clone(),
    });
    st.record(ev, &sh.events);
    // Custom resources answer a delete with the object as it was.
    json_bytes(200, old.json.clone())
}
