//! GET of one object and LIST: selectors, `limit`/`continue` pages, `resourceVersion` checks,
//! metadata-only answers.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::objects::{Kind, Stored, key};
use crate::query::{hex, unhex};
use crate::response::{Resp, bad_request, json_bytes, metadata_json, not_found, status};
use crate::selector::Filter;
use crate::shared::Shared;

pub(crate) fn get(sh: &Shared, kind: Kind, ns: Option<&str>, name: &str, meta_only: bool) -> Resp {
    let k = key(ns, name);
    let obj = sh.state().map(kind).get(&k).cloned();
    match obj {
        Some(o) if meta_only => json_bytes(200, metadata_json(&o, false)),
        Some(o) => json_bytes(200, o.json.clone()),
        None => not_found(kind, name),
    }
}

pub(crate) fn list(
    sh: &Shared,
    kind: Kind,
    ns: Option<&str>,
    q: &BTreeMap<String, String>,
    meta_only: bool,
) -> Resp {
    let filter = match Filter::parse(kind, ns.map(str::to_string), q) {
        Ok(f) => f,
        Err(r) => return r,
    };
    let limit: Option<usize> = match q.get("limit").filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => match s.parse::<usize>() {
            Ok(0) => None,
            Ok(n) => Some(n),
            Err(_) => return bad_request(&format!("invalid limit {s:?}")),
        },
    };
    // continue token: "<list rv>:<hex of the last name returned>"
    let cont = match q.get("continue").filter(|s| !s.is_empty()) {
        None => None,
        Some(tok) => {
            let parsed = tok
                .split_once(':')
                .and_then(|(rv, h)| Some((rv.parse::<u64>().ok()?, unhex(h)?)));
            match parsed {
                Some(p) => Some(p),
                None => return bad_request("continue key is not valid: malformed token"),
            }
        }
    };
    let (items, list_rv) = {
        let st = sh.state();
        let current = st.rv;
        if cont.is_none()
            && let Some(rv) = q.get("resourceVersion").filter(|s| !s.is_empty())
        {
            let Ok(want) = rv.parse::<u64>() else {
                return bad_request(&format!("invalid resource version {rv:?}"));
            };
            let exact = q.get("resourceVersionMatch").map(String::as_str) == Some("Exact");
            if exact && want != current {
                return status(
                    410,
                    "Expired",
                    &format!("too old resource version: {want} ({current})"),
                    Value::Null,
                );
            }
            if want > current {
                return status(
                    504,
                    "Timeout",
                    &format!("Too large resource version: {want}, current: {current}"),
                    json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
                );
            }
        }
        let map = match kind {
            Kind::Lease => &st.leases,
            Kind::Pod => &st.pods,
            Kind::Node => &st.nodes,
        };
        let start = cont.as_ref().map(|(_, after)| after.clone());
        let iter: Box<dyn Iterator<Item = (&String, &Arc<Stored>)>> = match &start {
            Some(after) => Box::new(map.range::<String, _>((
                std::ops::Bound::Excluded(after.clone()),
                std::ops::Bound::Unbounded,
            ))),
            None => Box::new(map.iter()),
        };
        let items: Vec<(String, Arc<Stored>)> = iter
            .filter(|(_, o)| filter.accepts(&o.value))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        let list_rv = cont.as_ref().map(|(rv, _)| *rv).unwrap_or(current);
        (items, list_rv)
    };
    let (page, rest) = match limit {
        Some(n) if items.len() > n => (&items[..n], items.len() - n),
        _ => (&items[..], 0),
    };
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if rest > 0 {
        let last = &page[page.len() - 1].0;
        meta["continue"] = json!(format!("{list_rv}:{}", hex(last)));
        meta["remainingItemCount"] = json!(rest);
    }
    let mut body =
        Vec::with_capacity(64 + page.iter().map(|(_, o)| o.json.len() + 1).sum::<usize>());
    let (list_kind, api_version) = if meta_only {
        ("PartialObjectMetadataList", "meta.k8s.io/v1")
    } else {
        (kind.list_kind(), kind.api_version())
    };
    body.extend_from_slice(
        format!(
            "{{\"kind\":\"{list_kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{meta},\"items\":["
        )
        .as_bytes(),
    );
    for (i, (_, o)) in page.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        if meta_only {
            body.extend_from_slice(&metadata_json(o, true));
        } else {
            body.extend_from_slice(&o.json);
        }
    }
    body.extend_from_slice(b"]}");
    json_bytes(200, Bytes::from(body))
}
