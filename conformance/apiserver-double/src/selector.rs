//! Label and field selectors: parsing, matching, and the selectors of one list or watch request.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::objects::Kind;
use crate::response::{Resp, bad_request};

/// One term of a label or field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// `key=value` or `key==value`.
    Eq(String, String),
    /// `key!=value` (true when the key is absent).
    Ne(String, String),
    /// `key` (label selectors only).
    Exists(String),
    /// `!key` (label selectors only).
    NotExists(String),
}

/// Parse a selector: comma-separated equality-based terms. Set-based terms (`in`, `notin`) are
/// not supported by the double and give an error.
pub fn parse_selector(s: &str, allow_existence: bool) -> Result<Vec<Term>, String> {
    let mut terms = Vec::new();
    for raw in s.split(',') {
        let t = raw.trim();
        if t.is_empty() {
            continue;
        }
        if t.contains(" in ") || t.contains(" notin ") || t.contains('(') {
            return Err(format!(
                "set-based selector term {t:?} is not supported by the double"
            ));
        }
        let term = if let Some((k, v)) = t.split_once("!=") {
            Term::Ne(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = t.split_once("==") {
            Term::Eq(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = t.split_once('=') {
            Term::Eq(k.trim().to_string(), v.trim().to_string())
        } else if !allow_existence {
            return Err(format!(
                "invalid field selector term {t:?}: expected key=value or key!=value"
            ));
        } else if let Some(k) = t.strip_prefix('!') {
            Term::NotExists(k.trim().to_string())
        } else {
            Term::Exists(t.to_string())
        };
        let key = match &term {
            Term::Eq(k, _) | Term::Ne(k, _) | Term::Exists(k) | Term::NotExists(k) => k,
        };
        if key.is_empty() {
            return Err(format!("selector term {t:?} has an empty key"));
        }
        terms.push(term);
    }
    Ok(terms)
}

/// Does `lookup` (key → value) satisfy every term?
pub fn matches(terms: &[Term], lookup: impl Fn(&str) -> Option<String>) -> bool {
    terms.iter().all(|t| match t {
        Term::Eq(k, v) => lookup(k).as_deref() == Some(v.as_str()),
        Term::Ne(k, v) => lookup(k).as_deref() != Some(v.as_str()),
        Term::Exists(k) => lookup(k).is_some(),
        Term::NotExists(k) => lookup(k).is_none(),
    })
}

/// A label of `obj`.
pub fn label(obj: &Value, key: &str) -> Option<String> {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// A field of `obj` by dotted path (`spec.nodeName`), as text.
pub fn field(obj: &Value, path: &str) -> Option<String> {
    let mut cur = obj;
    for part in path.split('.') {
        cur = cur.get(part)?;
    }
    match cur {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// The namespace and selectors of one list or watch request, checked against what the API
/// server lets a client select on for the kind.
pub(crate) struct Filter {
    ns: Option<String>,
    labels: Vec<Term>,
    fields: Vec<Term>,
}

impl Filter {
    pub(crate) fn parse(
        kind: Kind,
        ns: Option<String>,
        q: &BTreeMap<String, String>,
    ) -> Result<Filter, Resp> {
        let labels = parse_selector(
            q.get("labelSelector").map(String::as_str).unwrap_or(""),
            true,
        )
        .map_err(|e| bad_request(&format!("unable to parse requirement: {e}")))?;
        let fields = parse_selector(
            q.get("fieldSelector").map(String::as_str).unwrap_or(""),
            false,
        )
        .map_err(|e| bad_request(&e))?;
        let allowed: &[&str] = match kind {
            Kind::Lease => &["metadata.name"],
            Kind::Node => &["metadata.name"],
            Kind::Pod => &[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "status.phase",
                "status.podIP",
            ],
        };
        for t in &fields {
            let (Term::Eq(k, _) | Term::Ne(k, _) | Term::Exists(k) | Term::NotExists(k)) = t;
            if !allowed.contains(&k.as_str()) {
                return Err(bad_request(&format!(
                    "\"{k}\" is not a known field selector: only \"{}\"",
                    allowed.join("\", \"")
                )));
            }
        }
        Ok(Filter { ns, labels, fields })
    }

    pub(crate) fn accepts(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.ns
            && field(obj, "metadata.namespace").as_deref() != Some(ns.as_str())
        {
            return false;
        }
        matches(&self.labels, |k| label(obj, k)) && matches(&self.fields, |k| field(obj, k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select() {
        let t = parse_selector("a=1,b!=2,c,!d", true).unwrap();
        assert_eq!(t.len(), 4);
        let obj = serde_json::json!({"metadata": {"labels": {"a": "1", "c": ""}}});
        assert!(matches(&t, |k| label(&obj, k)));
        assert!(parse_selector("a in (x)", true).is_err());
        assert!(parse_selector("a", false).is_err());
    }
}
