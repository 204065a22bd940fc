//! [`ApiClient`]: the connection every request goes through — credentials, one time budget,
//! request counters, the traffic counters it was handed, how lists are read (watch cache or
//! pages) and the mapping of a failed request to a [`KubeStoreError`] that says what to do. It
//! knows nothing of leases or pods: the lease store ([`KubeStore`](crate::KubeStore)) and the
//! operator's reader (`Cluster`, in the tether-cluster crate) above it do, and may share one
//! client. What the operator's reader builds its requests with is public for it; the plugins
//! use the lease store only.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::AsyncBufReadExt;
use kube::Client;
use kube::core::params::PostParams;
use serde::de::DeserializeOwned;

use crate::crd::PLURAL;
use crate::error::{CredentialSource, KubeStoreError, error_chain, forbidden_identity};
use crate::settings::KubeSettings;
use crate::traffic::{ApiTraffic, CountWatchEvents, list_items};

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

/// The verb a request is counted under and named by in its errors.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verb {
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

/// A client of one API server with one time budget; see the module doc. Synchronous: each call
/// runs on the client's own current-thread tokio runtime. Shared (`Arc`) by the lease store and
/// the cluster reader built on it: one connection, one budget, one set of counters.
pub struct ApiClient {
    client: Option<Client>,
    rt: Option<tokio::runtime::Runtime>,
    pub(crate) server: String,
    pub(crate) source: CredentialSource,
    /// The budget's length ([`KubeSettings::timeout`]).
    timeout: Duration,
    /// API group of the lease resource, for naming it in a 403.
    pub(crate) group: String,
    /// [`KubeSettings::field_manager`]: named on every write.
    field_manager: String,
    /// [`KubeSettings::list_from_cache`].
    pub(crate) list_from_cache: bool,
    /// [`KubeSettings::page_size`].
    pub(crate) page_size: u32,
    /// The node the credentials' token is bound to, if it is a bound service-account token.
    bound_node: Option<String>,
    budgets: Mutex<Budgets>,
    counters: Counters,
    traffic: ApiTraffic,
}

/// The time budgets of a client's callers.
struct Budgets {
    /// Started with the client.
    first: Instant,
    /// Restarted by a thread ([`ApiClient::restart_budget`]).
    restarted: HashMap<std::thread::ThreadId, Instant>,
}

impl Drop for ApiClient {
    fn drop(&mut self) {
        drop(self.client.take());
        // Never wait for a blocking task (e.g. a hung DNS lookup): the CNI call must end.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl ApiClient {
    /// Read the credentials (kubeconfig, in-cluster, `KUBECONFIG`, in that order) and build the
    /// client; sends no request. The time budget starts now.
    pub fn connect(settings: &KubeSettings) -> Result<Arc<ApiClient>, KubeStoreError> {
        let started = Instant::now();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(KubeStoreError::Runtime)?;
        let (mut config, source) = rt
            .block_on(async {
                tokio::time::timeout(settings.timeout, crate::credentials::load_config(settings))
                    .await
            })
            .map_err(|_| KubeStoreError::Timeout {
                server: "(not yet known)".into(),
                what: "reading the credentials".into(),
                budget: settings.timeout,
            })??;
        if let Some(root) = &settings.api_root {
            config.cluster_url = root.parse().map_err(|e| KubeStoreError::Config {
                key: "k8s_api_root".into(),
                value: format!("{root:?}"),
                reason: format!("not a URL: {e}"),
            })?;
        }
        let server = config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string();
        let bound_node = {
            use secrecy::ExposeSecret;
            config
                .auth_info
                .token
                .as_ref()
                .and_then(|t| crate::token_claims::bound_node(t.expose_secret()))
        };
        config.connect_timeout = Some(settings.timeout);
        config.write_timeout = Some(settings.timeout);
        config.read_timeout = None; // the call budget bounds every request
        config.default_retry = false; // no hidden waits: a 429/5xx is reported as transient
        let traffic = settings.traffic.clone();
        let client = {
            let _guard = rt.enter();
            kube::client::ClientBuilder::try_from(config)
                .map(|b| b.with_layer(&CountWatchEvents(traffic.clone())).build())
                .map_err(|e| match e {
                    kube::Error::InferKubeconfig(k) => KubeStoreError::Kubeconfig {
                        source_: source.clone(),
                        detail: k.to_string(),
                    },
                    other => KubeStoreError::Tls {
                        server: server.clone(),
                        what: "building the client".into(),
                        source_: source.clone(),
                        detail: error_chain(&other),
                    },
                })?
        };
        Ok(Arc::new(ApiClient {
            client: Some(client),
            rt: Some(rt),
            server,
            source,
            timeout: settings.timeout,
            group: settings.group.clone(),
            field_manager: settings.field_manager.clone(),
            list_from_cache: settings.list_from_cache,
            page_size: settings.page_size,
            bound_node,
            budgets: Mutex::new(Budgets {
                first: started + settings.timeout,
                restarted: HashMap::new(),
            }),
            counters: Counters::default(),
            traffic,
        }))
    }

    /// The node the credentials' token is bound to (`kubernetes.io.node.name`), if any: the
    /// node the API server compares lease writes with.
    pub fn bound_node(&self) -> Option<&str> {
        self.bound_node.as_deref()
    }

    /// Parameters of a create or replace: named after the program that writes.
    pub fn post_params(&self) -> PostParams {
        PostParams {
            field_manager: Some(self.field_manager.clone()),
            ..PostParams::default()
        }
    }

    /// The API server URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The API group of the lease resource ([`KubeSettings::group`]).
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Where the credentials came from.
    pub fn credentials(&self) -> &CredentialSource {
        &self.source
    }

    /// Start a new time budget of [`KubeSettings::timeout`] from now, for the calling thread's
    /// requests (the node-agent's threads share one client; each call runs on one thread).
    pub fn restart_budget(&self) {
        let now = Instant::now();
        let mut b = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        // A budget restarted later than the first ends later: once spent it is the same as none.
        b.restarted.retain(|_, until| *until > now);
        b.restarted
            .insert(std::thread::current().id(), now + self.timeout);
    }

    /// Time left of the calling thread's budget (the one started with the client, unless this
    /// thread restarted its own).
    pub fn remaining(&self) -> Duration {
        let b = self.budgets.lock().unwrap_or_else(|p| p.into_inner());
        b.restarted
            .get(&std::thread::current().id())
            .unwrap_or(&b.first)
            .saturating_duration_since(Instant::now())
    }

    /// Requests this client has sent so far.
    pub fn requests(&self) -> RequestCounts {
        let c = &self.counters;
        RequestCounts {
            list: c.list.load(Ordering::Relaxed),
            get: c.get.load(Ordering::Relaxed),
            create: c.create.load(Ordering::Relaxed),
            update: c.update.load(Ordering::Relaxed),
            delete: c.delete.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn counter(&self, v: Verb) -> &AtomicU64 {
        match v {
            Verb::List => &self.counters.list,
            Verb::Get => &self.counters.get,
            Verb::Create => &self.counters.create,
            Verb::Update => &self.counters.update,
            Verb::Delete => &self.counters.delete,
        }
    }

    /// The kube client and the runtime, for a request that streams beyond the budget (a watch);
    /// it counts itself with [`ApiClient::traffic`].
    pub(crate) fn unbudgeted(&self) -> (Client, &tokio::runtime::Runtime, &ApiTraffic) {
        let client = self.client.as_ref().expect("the client lives until drop");
        let rt = self.rt.as_ref().expect("the runtime lives until drop");
        (client.clone(), rt, &self.traffic)
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
            budget: self.timeout,
        };
        let left = self.remaining();
        if left.is_zero() {
            return Err(timeout(()));
        }
        let rt = self.rt.as_ref().expect("the runtime lives until drop");
        rt.block_on(async { tokio::time::timeout(left, fut).await })
            .map_err(|_| timeout(()))
    }

    /// Send one request and parse the answer; the outer error is the budget running out.
    pub fn send<T: DeserializeOwned>(
        &self,
        verb: Verb,
        what: &str,
        req: http::Request<Vec<u8>>,
    ) -> Result<T, kube::Error> {
        self.send_at_most(verb, what, req, None)
    }

    /// [`ApiClient::send`], giving up on an answer longer than `max_bytes` (without holding
    /// more of it than that).
    pub(crate) fn send_at_most<T: DeserializeOwned>(
        &self,
        verb: Verb,
        what: &str,
        req: http::Request<Vec<u8>>,
        max_bytes: Option<usize>,
    ) -> Result<T, kube::Error> {
        self.counter(verb).fetch_add(1, Ordering::Relaxed);
        let client = self.client.as_ref().expect("the client lives until drop");
        // A LIST's items are counted (objects read); its path names the resource.
        let list_path = (verb == Verb::List).then(|| req.uri().path().to_string());
        let answer = async {
            let body = match max_bytes {
                None => client.request_text(req).await?.into_bytes(),
                Some(max) => self.read_at_most(client, req, what, max).await?,
            };
            if let Some(path) = &list_path {
                self.traffic.record_objects(path, list_items(&body));
            }
            serde_json::from_slice::<T>(&body).map_err(kube::Error::SerdeError)
        };
        let r = match self.within(what, answer) {
            Ok(r) => r,
            Err(t) => Err(kube::Error::Service(Box::new(Budget(t)))),
        };
        self.traffic
            .record(verb.rbac(), r.as_ref().err().and_then(failure_code));
        r
    }

    async fn read_at_most(
        &self,
        client: &Client,
        req: http::Request<Vec<u8>>,
        what: &str,
        max: usize,
    ) -> Result<Vec<u8>, kube::Error> {
        let mut answer = std::pin::pin!(client.request_stream(req).await?);
        let mut body = Vec::new();
        loop {
            let chunk = answer.fill_buf().await.map_err(kube::Error::ReadEvents)?;
            if chunk.is_empty() {
                return Ok(body);
            }
            if body.len() + chunk.len() > max {
                return Err(kube::Error::Service(Box::new(Budget(
                    KubeStoreError::TooLarge {
                        server: self.server.clone(),
                        what: what.to_string(),
                        limit: max,
                    },
                ))));
            }
            body.extend_from_slice(chunk);
            let n = chunk.len();
            answer.as_mut().consume_unpin(n);
        }
    }

    /// A request that could not be built, or an answer that made no sense.
    pub fn protocol(&self, what: &str, detail: String) -> KubeStoreError {
        KubeStoreError::Protocol {
            server: self.server.clone(),
            what: what.to_string(),
            detail,
        }
    }

    /// Map a failed request to an actionable error. 404 here means the resource is not served
    /// (callers handle "object not found" before).
    pub fn map_error(&self, verb: Verb, what: &str, e: kube::Error) -> KubeStoreError {
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
                    resource: format!("{PLURAL}.{}", self.group),
                    source_: self.source.clone(),
                    identity: forbidden_identity(&s.message),
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

    /// Map a failed request for another resource than leases (`verb` on `resource`): a 403 names
    /// them, a 404 is the server's answer as it is.
    pub fn map_other(
        &self,
        verb: &str,
        resource: &str,
        what: &str,
        e: kube::Error,
    ) -> KubeStoreError {
        match e {
            kube::Error::Api(s) if s.code == 403 => KubeStoreError::Forbidden {
                server: self.server.clone(),
                verb: verb.to_string(),
                resource: resource.to_string(),
                source_: self.source.clone(),
                identity: forbidden_identity(&s.message),
                message: s.message.clone(),
            },
            kube::Error::Api(s) if s.code == 404 => KubeStoreError::Api {
                server: self.server.clone(),
                what: what.to_string(),
                code: 404,
                reason: s.reason.clone(),
                message: s.message.clone(),
            },
            other => self.map_error(Verb::Get, what, other),
        }
    }

    /// Is this 404 about the object (it has a name in its details) rather than the resource?
    pub(crate) fn object_missing(s: &kube::core::Status) -> bool {
        s.code == 404 && s.details.as_ref().is_some_and(|d| !d.name.is_empty())
    }
}

/// What [`ApiTraffic::errors`] counts a failed request as: the HTTP status, or `timeout`,
/// `network`, `decode`. `None` for answers that are outcomes, not failures (404 absent, 409 lost
/// race or already exists, 410 expired).
pub(crate) fn failure_code(e: &kube::Error) -> Option<String> {
    Some(match e {
        kube::Error::Api(s) if matches!(s.code, 404 | 409 | 410) => return None,
        kube::Error::Api(s) => s.code.to_string(),
        kube::Error::Service(b) => match b.downcast_ref::<Budget>() {
            Some(Budget(KubeStoreError::TooLarge { .. })) => "too_large".to_string(),
            Some(_) => "timeout".to_string(),
            None => "network".to_string(),
        },
        kube::Error::SerdeError(_) => "decode".to_string(),
        _ => "network".to_string(),
    })
}

/// The budget of time (or of an answer's length) ran out (carried through
/// `kube::Error::Service`).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_not_failures() {
        let status = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            )
        };
        for c in [404, 409, 410] {
            assert_eq!(failure_code(&status(c)), None, "{c}");
        }
        assert_eq!(failure_code(&status(503)).as_deref(), Some("503"));
        let budget = Budget(KubeStoreError::CrdMissing { server: "s".into() });
        assert_eq!(
            failure_code(&kube::Error::Service(Box::new(budget))).as_deref(),
            Some("timeout")
        );
        let bad = serde_json::from_str::<u8>("x").unwrap_err();
        assert_eq!(
            failure_code(&kube::Error::SerdeError(bad)).as_deref(),
            Some("decode")
        );
    }
}
