//! The API plumbing under [`KubeStore`]: every request goes through `send` (the time budget,
//! the request counters, the error mapping to [`KubeStoreError`]).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::DeserializeOwned;

use crate::crd::PLURAL;
use crate::error::{KubeStoreError, error_chain};
use crate::store::KubeStore;

/// API requests a store has sent, by verb (every attempt, answered or not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// LIST (one per page).
    pub list: u64,
    /// GET.
    pub get: u64,
    /// CREATE (POST).
    pub create: u64,
    /// UPDATE (PUT).
    pub update: u64,
    /// DELETE.
    pub delete: u64,
}

impl RequestCounts {
    /// All requests.
    pub fn total(&self) -> u64 {
        self.list + self.get + self.create + self.update + self.delete
    }
}

impl std::ops::Sub for RequestCounts {
    type Output = RequestCounts;
    fn sub(self, o: RequestCounts) -> RequestCounts {
        RequestCounts {
            list: self.list - o.list,
            get: self.get - o.get,
            create: self.create - o.create,
            update: self.update - o.update,
            delete: self.delete - o.delete,
        }
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) list: AtomicU64,
    pub(crate) get: AtomicU64,
    pub(crate) create: AtomicU64,
    pub(crate) update: AtomicU64,
    pub(crate) delete: AtomicU64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    List,
    Get,
    Create,
    Update,
    Delete,
}

impl Verb {
    pub(crate) fn rbac(self) -> &'static str {
        match self {
            Verb::List => "list",
            Verb::Get => "get",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Delete => "delete",
        }
    }
}

impl KubeStore {
    pub(crate) fn counter(&self, v: Verb) -> &AtomicU64 {
        match v {
            Verb::List => &self.counters.list,
            Verb::Get => &self.counters.get,
            Verb::Create => &self.counters.create,
            Verb::Update => &self.counters.update,
            Verb::Delete => &self.counters.delete,
        }
    }

    /// Run `fut` within the remaining budget.
    pub(crate) fn within<T>(
        &self,
        what: &str,
        fut: impl Future<Output = T>,
    ) -> Result<T, KubeStoreError> {
        let timeout = |_| KubeStoreError::Timeout {
            server: self.server.clone(),
            what: what.to_string(),
            budget: self.settings.timeout,
        };
        let left = self.remaining();
        if left.is_zero() {
            return Err(timeout(()));
        }
        let rt = self
            .rt
            .as_ref()
            .expect("runtime lives as long as the store");
        rt.block_on(async { tokio::time::timeout(left, fut).await })
            .map_err(|_| timeout(()))
    }

    /// Send one request and parse the answer; the outer error is the budget running out.
    pub(crate) fn send<T: DeserializeOwned>(
        &self,
        verb: Verb,
        what: &str,
        req: http::Request<Vec<u8>>,
    ) -> Result<T, kube::Error> {
        self.counter(verb).fetch_add(1, Ordering::Relaxed);
        let client = self
            .client
            .as_ref()
            .expect("client lives as long as the store");
        // A LIST's items are counted (objects read); its path names the resource.
        let list_path = (verb == Verb::List).then(|| req.uri().path().to_string());
        let answer = async {
            let text = client.request_text(req).await?;
            if let Some(path) = &list_path {
                crate::monitoring::record_objects(path, crate::monitoring::list_items(&text));
            }
            serde_json::from_str::<T>(&text).map_err(kube::Error::SerdeError)
        };
        let r = match self.within(what, answer) {
            Ok(r) => r,
            Err(t) => Err(kube::Error::Service(Box::new(Budget(t)))),
        };
        crate::monitoring::record(verb.rbac(), r.as_ref().err());
        r
    }

    pub(crate) fn protocol(&self, what: &str, detail: String) -> KubeStoreError {
        KubeStoreError::Protocol {
            server: self.server.clone(),
            what: what.to_string(),
            detail,
        }
    }

    /// Map a failed request to an actionable error. 404 here means the resource is not served
    /// (callers handle "object not found" before).
    pub(crate) fn map_error(&self, verb: Verb, what: &str, e: kube::Error) -> KubeStoreError {
        let server = self.server.clone();
        match e {
            kube::Error::Service(b) if b.is::<Budget>() => b
                .downcast::<Budget>()
                .map(|b| b.0)
                .unwrap_or_else(|b| self.protocol(what, b.to_string())),
            kube::Error::Api(s) => match s.code {
                401 => KubeStoreError::Unauthorized {
                    server,
                    source_: self.source.clone(),
                    message: s.message.clone(),
                },
                403 if s.message.contains("ValidatingAdmissionPolicy") => {
                    KubeStoreError::ForbiddenByPolicy {
                        server,
                        verb: verb.rbac().to_string(),
                        what: what.to_string(),
                        source_: self.source.clone(),
                        message: s.message.clone(),
                    }
                }
                403 => KubeStoreError::Forbidden {
                    server,
                    verb: verb.rbac().to_string(),
                    resource: format!("{PLURAL}.{}", self.settings.group),
                    source_: self.source.clone(),
                    message: s.message.clone(),
                },
                404 => KubeStoreError::CrdMissing { server },
                code => KubeStoreError::Api {
                    server,
                    what: what.to_string(),
                    code,
                    reason: s.reason.clone(),
                    message: s.message.clone(),
                },
            },
            kube::Error::SerdeError(e) => self.protocol(what, e.to_string()),
            kube::Error::Auth(e) => KubeStoreError::Kubeconfig {
                source_: self.source.clone(),
                detail: format!("cannot authenticate: {}", error_chain(&e)),
            },
            other => {
                let detail = error_chain(&other);
                let lower = detail.to_ascii_lowercase();
                if is_tls(&other)
                    || ["certificate", "x509", "handshake"]
                        .iter()
                        .any(|k| lower.contains(k))
                {
                    KubeStoreError::Tls {
                        server,
                        what: what.to_string(),
                        source_: self.source.clone(),
                        detail,
                    }
                } else {
                    KubeStoreError::Unreachable {
                        server,
                        what: what.to_string(),
                        source_: self.source.clone(),
                        detail,
                    }
                }
            }
        }
    }

    /// Is this 404 about the object (it has a name in its details) rather than the resource?
    pub(crate) fn object_missing(s: &kube::core::Status) -> bool {
        s.code == 404 && s.details.as_ref().is_some_and(|d| !d.name.is_empty())
    }
}

/// The budget ran out (carried through `kube::Error::Service`).
#[derive(Debug)]
pub(crate) struct Budget(pub(crate) KubeStoreError);

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Budget {}

/// Is a rustls error somewhere in the chain (also inside an `io::Error`, whose `source()` skips
/// the error it wraps)?
fn is_tls(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if c.is::<rustls::Error>() {
            return true;
        }
        // io::Error::source() skips the wrapped error: look inside explicitly (nested too).
        let mut inner = c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref());
        while let Some(i) = inner {
            if i.is::<rustls::Error>() {
                return true;
            }
            inner = i
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref());
        }
        cur = c.source();
    }
    false
}
