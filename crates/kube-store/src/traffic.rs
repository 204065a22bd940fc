//! What this process's API clients sent and received, for the node-agent's Prometheus counters:
//! requests by verb, failures by (verb, code), objects read by resource. An [`ApiTraffic`] is a
//! value handed to each client through [`KubeSettings::traffic`](crate::KubeSettings::traffic):
//! the agent gives all its clients one and its metrics endpoint reads it; a CNI call's client
//! gets its own, which nobody reads.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Verbs counted in [`ApiTraffic::requests`] and [`ApiTraffic::errors`].
pub const VERBS: [&str; 6] = ["list", "get", "create", "update", "delete", "watch"];

/// Shared counters (cloning shares them).
#[derive(Clone, Default)]
pub struct ApiTraffic(Arc<Counts>);

#[derive(Default)]
struct Counts {
    requests: [AtomicU64; 6],
    errors: Mutex<BTreeMap<(&'static str, String), u64>>,
    objects: Mutex<BTreeMap<String, u64>>,
}

impl std::fmt::Debug for ApiTraffic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiTraffic")
            .field("requests", &self.requests())
            .finish()
    }
}

/// The same counters, not equal ones: two settings are alike only when their clients count
/// into one place.
impl PartialEq for ApiTraffic {
    fn eq(&self, other: &ApiTraffic) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl ApiTraffic {
    /// API requests sent, by verb ([`VERBS`]), answered or not.
    pub fn requests(&self) -> Vec<(&'static str, u64)> {
        VERBS
            .iter()
            .zip(&self.0.requests)
            .map(|(v, n)| (*v, n.load(Ordering::Relaxed)))
            .collect()
    }

    /// Failed API requests by (verb, code): the HTTP status, or `timeout`, `network`, `decode`,
    /// `too_large` (an answer longer than its reader keeps).
    /// Answers that are outcomes, not failures (404 absent, 409 lost race or already exists, 410
    /// expired), are not counted.
    pub fn errors(&self) -> Vec<(&'static str, String, u64)> {
        lock(&self.0.errors)
            .iter()
            .map(|((v, c), n)| (*v, c.clone(), *n))
            .collect()
    }

    /// Objects received from the API server, by resource (the last segment of the collection's
    /// path: `pods`, `ipleases`, ...): the items of every LIST answer (each page) and the events
    /// of every watch (bookmarks included). What a client makes the server read and send for it,
    /// which request counts alone do not show: one LIST may carry one object or every object of
    /// the cluster.
    pub fn objects_read(&self) -> Vec<(String, u64)> {
        lock(&self.0.objects)
            .iter()
            .map(|(r, n)| (r.clone(), *n))
            .collect()
    }

    /// Count one request of `verb` (a watch when it starts) and its failure, if any
    /// (`failure`: the code [`ApiTraffic::errors`] shows).
    pub(crate) fn record(&self, verb: &'static str, failure: Option<String>) {
        if let Some(i) = VERBS.iter().position(|v| *v == verb) {
            self.0.requests[i].fetch_add(1, Ordering::Relaxed);
        }
        self.record_failure(verb, failure);
    }

    /// Count the failure of a request of `verb` already counted (a watch, when it ends).
    pub(crate) fn record_failure(&self, verb: &'static str, failure: Option<String>) {
        if let Some(code) = failure {
            *lock(&self.0.errors).entry((verb, code)).or_insert(0) += 1;
        }
    }

    /// Count `n` objects of the collection at `path` received.
    pub(crate) fn record_objects(&self, path: &str, n: u64) {
        let resource = path.rsplit('/').find(|s| !s.is_empty()).unwrap_or("");
        let mut objects = lock(&self.0.objects);
        match objects.get_mut(resource) {
            Some(c) => *c += n,
            None => {
                objects.insert(resource.to_string(), n);
            }
        }
    }
}

/// The counters stay usable after a thread panicked holding them: they are only added to.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The number of `items` of a LIST answer, without building them (the caller parses the answer
/// into its own type).
pub(crate) fn list_items(body: &[u8]) -> u64 {
    struct Count(u64);
    impl<'de> serde::Deserialize<'de> for Count {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Count, D::Error> {
            struct Seq;
            impl<'de> serde::de::Visitor<'de> for Seq {
                type Value = Count;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a list of items, or null")
                }
                fn visit_unit<E>(self) -> Result<Count, E> {
                    Ok(Count(0))
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(
                    self,
                    mut a: A,
                ) -> Result<Count, A::Error> {
                    let mut n = 0;
                    while a.next_element::<serde::de::IgnoredAny>()?.is_some() {
                        n += 1;
                    }
                    Ok(Count(n))
                }
            }
            d.deserialize_any(Seq)
        }
    }
    #[derive(serde::Deserialize)]
    struct Items {
        #[serde(default)]
        items: Option<Count>,
    }
    serde_json::from_slice::<Items>(body)
        .ok()
        .and_then(|l| l.items)
        .map_or(0, |c| c.0)
}

/// Counts the events of watch answers as they stream by (a layer of every store's client): the
/// API server writes each event of a JSON watch as one line, so the newlines of the body are
/// its events, counted without parsing them again. Other answers pass untouched.
#[derive(Clone)]
pub(crate) struct CountWatchEvents(pub(crate) ApiTraffic);

impl<S> tower::Layer<S> for CountWatchEvents {
    type Service = WatchEvents<S>;
    fn layer(&self, inner: S) -> WatchEvents<S> {
        WatchEvents(inner, self.0.clone())
    }
}

#[derive(Clone)]
pub(crate) struct WatchEvents<S>(S, ApiTraffic);

/// A response body counting the lines it carries for `path` (`None`: not a watch).
pub(crate) struct EventLines<B> {
    body: B,
    path: Option<String>,
    traffic: ApiTraffic,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<kube::client::Body>> for WatchEvents<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<EventLines<B>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let watch = req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        let path = watch.then(|| req.uri().path().to_string());
        let answer = self.0.call(req);
        let traffic = self.1.clone();
        Box::pin(async move {
            let res = answer.await?;
            // An error answer (a Status) carries no events.
            let path = path.filter(|_| res.status().is_success());
            Ok(res.map(|body| EventLines {
                body,
                path,
                traffic,
            }))
        })
    }
}

impl<B> http_body::Body for EventLines<B>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    type Data = bytes::Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, B::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if let (Some(path), std::task::Poll::Ready(Some(Ok(frame)))) = (&self.path, &polled)
            && let Some(data) = frame.data_ref()
        {
            let events = data.iter().filter(|b| **b == b'\n').count() as u64;
            if events > 0 {
                self.traffic.record_objects(path, events);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_items_are_counted_by_resource() {
        assert_eq!(
            list_items(
                br#"{"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[{"a":[1,{"b":2}]},{}]}"#
            ),
            2
        );
        // A metadata-only list with no items says null; a Status or garbage counts nothing.
        assert_eq!(list_items(br#"{"items":null}"#), 0);
        assert_eq!(list_items(br#"{"kind":"Status","code":500}"#), 0);
        assert_eq!(list_items(b"not json"), 0);
        let t = ApiTraffic::default();
        t.record_objects("/api/v1/namespaces/kube-system/pods", 3);
        t.record_objects("/api/v1/pods/", 1);
        t.record_objects("/apis/ipam.tether.dev/v1alpha1/ipleases", 5);
        assert_eq!(
            t.objects_read(),
            vec![("ipleases".to_string(), 5), ("pods".to_string(), 4)]
        );
    }

    #[test]
    fn clones_share_and_new_ones_do_not() {
        let agent = ApiTraffic::default();
        let client = agent.clone();
        client.record("get", None);
        client.record("delete", Some("503".into()));
        assert_eq!(agent, client);
        assert!(agent.requests().contains(&("get", 1)));
        assert_eq!(agent.errors(), vec![("delete", "503".to_string(), 1)]);
        let other = ApiTraffic::default();
        assert_ne!(agent, other);
        assert!(other.requests().iter().all(|(_, n)| *n == 0));
    }
}
