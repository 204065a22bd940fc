//! Test knobs: injected latency, `403 Forbidden` on demand, "CRD not installed", expired
//! watches, and the request counters benchmarks read.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use crate::response::{Resp, status};
use crate::routing::Target;
use crate::server::{ApiServerDouble, Shared};
use crate::watch::expire_watches;

impl ApiServerDouble {
    /// Delay every API request by `latency` from now on.
    pub fn set_latency(&self, latency: Duration) {
        self.shared
            .latency_us
            .store(latency.as_micros() as u64, Ordering::Relaxed);
    }

    /// Install or "uninstall" the IPLease CRD (objects are kept, as with a real uninstall they
    /// would not be, but they are unreachable while it is off).
    pub fn set_crd_installed(&self, installed: bool) {
        self.shared
            .crd_installed
            .store(installed, Ordering::Relaxed);
    }

    /// Answer 403 to `verb` (`get`, `list`, `watch`, `create`, `update`, `delete`) on `resource`
    /// (`ipleases`, `pods`, `customresourcedefinitions`).
    pub fn forbid(&self, verb: &str, resource: &str) {
        self.shared
            .forbidden
            .lock()
            .unwrap()
            .insert((verb.to_string(), resource.to_string()));
    }

    /// Answer 403 to `verb` on the namespaced `resource` (`pods`) in `namespace` only, as a
    /// Role missing in that namespace would: requests of other namespaces and cluster-wide ones
    /// (`/api/v1/pods`) are still served, and access reviews (cluster-wide) are unaffected.
    pub fn forbid_in(&self, verb: &str, resource: &str, namespace: &str) {
        self.shared.forbidden_in.lock().unwrap().insert((
            verb.to_string(),
            resource.to_string(),
            namespace.to_string(),
        ));
    }

    /// Undo one [`ApiServerDouble::forbid`].
    pub fn allow(&self, verb: &str, resource: &str) {
        self.shared
            .forbidden
            .lock()
            .unwrap()
            .remove(&(verb.to_string(), resource.to_string()));
    }

    /// Undo every [`ApiServerDouble::forbid`].
    pub fn allow_all(&self) {
        self.shared.forbidden.lock().unwrap().clear();
        self.shared.forbidden_in.lock().unwrap().clear();
    }

    /// Requests served so far, by `"verb resource"` (e.g. `"create ipleases"`, `"get version"`).
    pub fn request_counts(&self) -> BTreeMap<String, u64> {
        self.shared.counts.lock().unwrap().clone()
    }

    /// Requests of `verb` on `resource` so far.
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.request_counts()
            .get(&format!("{verb} {resource}"))
            .copied()
            .unwrap_or(0)
    }

    /// Every request to `resource` so far.
    pub fn total(&self, resource: &str) -> u64 {
        self.request_counts()
            .iter()
            .filter(|(k, _)| k.rsplit(' ').next() == Some(resource))
            .map(|(_, v)| *v)
            .sum()
    }

    /// Answer the next `n` IPLease lists from the watch cache (`resourceVersion` given) with 429
    /// TooManyRequests, as a restarted API server does while its watch cache fills. Consistent
    /// lists (no `resourceVersion`, what etcd must serve) are answered, and counted as
    /// `consistent-list ipleases`.
    pub fn set_cache_unready(&self, n: u64) {
        self.shared.cache_unready.store(n, Ordering::Relaxed);
    }

    /// Zero the counters.
    pub fn reset_counts(&self) {
        self.shared.counts.lock().unwrap().clear();
    }

    /// Expire every open watch (each ends with an `ERROR` event carrying `410 Expired`) and forget
    /// the event history, so a watch from any earlier `resourceVersion` gets `410` too: what a
    /// real API server does after its watch cache or etcd compacted past a client.
    pub fn expire_watches(&self) {
        expire_watches(&self.shared)
    }
}

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
