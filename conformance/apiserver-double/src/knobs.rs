//! Test knobs as the request path reads them: injected latency, `403 Forbidden` on demand (and
//! its message), and the request counters benchmarks read. The test sets them through
//! `ApiServerDouble` (double.rs) or the control endpoints.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use crate::response::{Resp, status};
use crate::shared::Shared;
use crate::target::Target;

impl Shared {
    pub(crate) fn latency(&self) -> Duration {
        Duration::from_micros(self.latency_us.load(Ordering::Relaxed))
    }
    pub(crate) fn count(&self, key: String) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default() += 1;
    }
    pub(crate) fn is_forbidden(&self, verb: &str, resource: &str) -> bool {
        self.forbidden
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(verb.to_string(), resource.to_string()))
    }
    pub(crate) fn is_forbidden_in(&self, verb: &str, resource: &str, ns: Option<&str>) -> bool {
        let Some(ns) = ns else { return false };
        self.forbidden_in
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(verb.to_string(), resource.to_string(), ns.to_string()))
    }
}

pub(crate) fn forbidden(sh: &Shared, verb: &str, resource: &str, target: &Target) -> Resp {
    let (group, name, ns) = match target {
        Target::Collection(k, ns) => (k.group(), None, ns.clone()),
        Target::Item(k, ns, n) => (k.group(), Some(n.clone()), ns.clone()),
        Target::Crd(n) => ("apiextensions.k8s.io", Some(n.clone()), None),
        Target::AccessReview => ("authorization.k8s.io", None, None),
        _ => ("", None, None),
    };
    let qualified = if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    };
    let subject = match &name {
        Some(n) => format!("{qualified} \"{n}\""),
        None => qualified,
    };
    let scope = match &ns {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    let msg = format!(
        "{subject} is forbidden: User \"{}\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}",
        sh.user
    );
    let mut d = json!({"group": group, "kind": resource});
    if let Some(n) = name {
        d["name"] = json!(n);
    }
    status(403, "Forbidden", &msg, d)
}
