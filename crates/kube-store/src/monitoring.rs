//! What the node-agent's monitor needs from the API beyond leases and pods: the tether-ipam
//! configurations of the cluster's NetworkAttachmentDefinitions (pool sizes), a Warning Event
//! on a pod, and this process's API request, error and object counts (Prometheus counters).
//!
//! | call | request |
//! |---|---|
//! | [`KubeStore::network_attachment_definitions`] | LIST `k8s.cni.cncf.io/v1` network-attachment-definitions, every namespace, `resourceVersion=0` (the watch cache) |
//! | [`KubeStore::post_pod_event`] | CREATE of a core/v1 Event in the pod's namespace (`409 AlreadyExists` → [`Posted::AlreadyThere`]) |

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use kube::core::Request;
use kube::core::params::ListParams;
use serde_json::{Value, json};

use crate::convert::time_text;
use crate::error::KubeStoreError;
use crate::store::{Budget, KubeStore, Verb};

/// Verbs counted in [`api_requests`] and [`api_errors`].
pub const VERBS: [&str; 6] = ["list", "get", "create", "update", "delete", "watch"];

static REQUESTS: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];
static ERRORS: Mutex<BTreeMap<(&'static str, String), u64>> = Mutex::new(BTreeMap::new());
static OBJECTS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// API requests sent by every store of this process, by verb ([`VERBS`]), answered or not.
pub fn api_requests() -> Vec<(&'static str, u64)> {
    VERBS
        .iter()
        .zip(&REQUESTS)
        .map(|(v, n)| (*v, n.load(Ordering::Relaxed)))
        .collect()
}

/// Failed API requests of this process by (verb, code): the HTTP status, or `timeout`, `network`,
/// `decode`. Answers that are outcomes, not failures (404 absent, 409 lost race or already
/// exists, 410 expired), are not counted.
pub fn api_errors() -> Vec<(&'static str, String, u64)> {
    ERRORS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|((v, c), n)| (*v, c.clone(), *n))
        .collect()
}

/// Objects this process received from the API server, by resource (the last segment of the
/// collection's path: `pods`, `ipleases`, ...): the items of every LIST answer (each page) and
/// the events of every watch (bookmarks included). What a client makes the server read and send
/// for it, which request counts alone do not show: one LIST may carry one object or every
/// object of the cluster.
pub fn api_objects_read() -> Vec<(String, u64)> {
    OBJECTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(r, n)| (r.clone(), *n))
        .collect()
}

/// Count `n` objects of the collection at `path` received.
pub(crate) fn record_objects(path: &str, n: u64) {
    let resource = path.rsplit('/').find(|s| !s.is_empty()).unwrap_or("");
    let mut objects = OBJECTS.lock().unwrap_or_else(|p| p.into_inner());
    match objects.get_mut(resource) {
        Some(c) => *c += n,
        None => {
            objects.insert(resource.to_string(), n);
        }
    }
}

/// The number of `items` of a LIST answer, without building them (the caller parses the answer
/// into its own type).
pub(crate) fn list_items(text: &str) -> u64 {
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
    serde_json::from_str::<Items>(text)
        .ok()
        .and_then(|l| l.items)
        .map_or(0, |c| c.0)
}

/// Counts the events of watch answers as they stream by (a layer of every store's client): the
/// API server writes each event of a JSON watch as one line, so the newlines of the body are
/// its events, counted without parsing them again. Other answers pass untouched.
#[derive(Clone, Copy)]
pub(crate) struct CountWatchEvents;

impl<S> tower::Layer<S> for CountWatchEvents {
    type Service = WatchEvents<S>;
    fn layer(&self, inner: S) -> WatchEvents<S> {
        WatchEvents(inner)
    }
}

#[derive(Clone)]
pub(crate) struct WatchEvents<S>(S);

/// A response body counting the lines it carries for `path` (`None`: not a watch).
pub(crate) struct EventLines<B> {
    body: B,
    path: Option<String>,
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
        Box::pin(async move {
            let res = answer.await?;
            // An error answer (a Status) carries no events.
            let path = path.filter(|_| res.status().is_success());
            Ok(res.map(|body| EventLines { body, path }))
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
                record_objects(path, events);
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

/// Count one request of `verb` and, when it failed, its error.
pub(crate) fn record(verb: &'static str, error: Option<&kube::Error>) {
    record_request(verb);
    record_error(verb, error);
}

/// Count one request of `verb` (a watch when it starts).
pub(crate) fn record_request(verb: &'static str) {
    if let Some(i) = VERBS.iter().position(|v| *v == verb) {
        REQUESTS[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// Count the error of a request of `verb`, if it is a failure.
pub(crate) fn record_error(verb: &'static str, error: Option<&kube::Error>) {
    let code = match error {
        None => return,
        Some(kube::Error::Api(s)) if matches!(s.code, 404 | 409 | 410) => return,
        Some(kube::Error::Api(s)) => s.code.to_string(),
        Some(kube::Error::Service(b)) if b.is::<Budget>() => "timeout".to_string(),
        Some(kube::Error::SerdeError(_)) => "decode".to_string(),
        Some(_) => "network".to_string(),
    };
    *ERRORS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry((verb, code))
        .or_insert(0) += 1;
}

/// One NetworkAttachmentDefinition's CNI configuration (`spec.config`, JSON text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NadConfig {
    /// Namespace of the NAD.
    pub namespace: String,
    /// Name of the NAD.
    pub name: String,
    /// `spec.config`; empty when the NAD names a file on the nodes instead.
    pub config: String,
}

/// A Warning Event about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodWarning {
    /// The pod's namespace (the Event's).
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's uid, when known.
    pub uid: Option<String>,
    /// Distinguishes this occurrence: the Event is named `<pod>.<key>`, so posting it again (a
    /// restarted agent) finds it there instead of adding a second one.
    pub key: String,
    /// `reason` (CamelCase, e.g. `AddressConflict`).
    pub reason: String,
    /// `message`.
    pub message: String,
    /// Reporting node (`source.host`, `reportingInstance`).
    pub node: String,
    /// When it happened (unix seconds).
    pub at: u64,
}

/// What [`KubeStore::post_pod_event`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    /// The Event was created.
    Created,
    /// An Event of that name exists already (posted before).
    AlreadyThere,
}

/// Component name on the Events tether posts.
pub const EVENT_COMPONENT: &str = "tether-ipam";

impl KubeStore {
    /// The CNI configurations of every NetworkAttachmentDefinition in the cluster, from the
    /// watch cache. `None` when the NAD resource is not served (no Multus CRD).
    pub fn network_attachment_definitions(&self) -> Result<Option<Vec<NadConfig>>, KubeStoreError> {
        let what = "LIST of network-attachment-definitions";
        let req = Request::new("/apis/k8s.cni.cncf.io/v1/network-attachment-definitions")
            .list(&ListParams::default().match_any())
            .map_err(|e| self.protocol(what, e.to_string()))?;
        let v = match self.send::<Value>(Verb::List, what, req) {
            Ok(v) => v,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => {
                return Err(self.map_other(
                    "list",
                    "network-attachment-definitions.k8s.cni.cncf.io",
                    what,
                    e,
                ));
            }
        };
        let items = v
            .get("items")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let text = |o: &Value, p: &str| {
            o.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        Ok(Some(
            items
                .iter()
                .map(|o| NadConfig {
                    namespace: text(o, "/metadata/namespace"),
                    name: text(o, "/metadata/name"),
                    config: text(o, "/spec/config"),
                })
                .collect(),
        ))
    }

    /// Post `w` as a core/v1 Event of type Warning on its pod.
    pub fn post_pod_event(&self, w: &PodWarning) -> Result<Posted, KubeStoreError> {
        let name = event_name(&w.pod, &w.key);
        let what = format!("CREATE of Event {}/{name}", w.namespace);
        let at = time_text(w.at).map_err(|e| self.protocol(&what, e))?;
        let mut involved =
            json!({"apiVersion": "v1", "kind": "Pod", "namespace": w.namespace, "name": w.pod});
        if let Some(uid) = &w.uid {
            involved["uid"] = json!(uid);
        }
        let node: String = w.node.chars().take(128).collect();
        let body = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": w.namespace},
            "involvedObject": involved,
            "reason": w.reason,
            "message": w.message,
            "type": "Warning",
            "source": {"component": EVENT_COMPONENT, "host": w.node},
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": node,
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
        });
        let req = Request::new(format!("/api/v1/namespaces/{}/events", w.namespace))
            .create(
                &self.post_params(),
                serde_json::to_vec(&body).expect("json"),
            )
            .map_err(|e| self.protocol(&what, e.to_string()))?;
        match self.send::<Value>(Verb::Create, &what, req) {
            Ok(_) => Ok(Posted::Created),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Posted::AlreadyThere),
            Err(e) => Err(self.map_other("create", "events", &what, e)),
        }
    }
}

/// `<pod>.<key>`, within the 253 characters of an object name (the pod part shortened).
fn event_name(pod: &str, key: &str) -> String {
    let room = 253usize.saturating_sub(key.len() + 1);
    let pod = pod
        .get(..room.min(pod.len()))
        .unwrap_or(pod)
        .trim_end_matches(['-', '.']);
    format!("{pod}.{key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_fit() {
        assert_eq!(event_name("train-0", "0123abcd"), "train-0.0123abcd");
        let long = format!("{}-{}", "a".repeat(243), "b".repeat(9));
        let n = event_name(&long, "0123456789abcdef");
        assert!(
            n.len() <= 253 && n.ends_with(".0123456789abcdef") && !n.contains("-."),
            "{n}"
        );
    }

    #[test]
    fn list_items_are_counted_by_resource() {
        assert_eq!(
            list_items(
                r#"{"kind":"PodList","metadata":{"resourceVersion":"7"},"items":[{"a":[1,{"b":2}]},{}]}"#
            ),
            2
        );
        // A metadata-only list with no items says null; a Status or garbage counts nothing.
        assert_eq!(list_items(r#"{"items":null}"#), 0);
        assert_eq!(list_items(r#"{"kind":"Status","code":500}"#), 0);
        assert_eq!(list_items("not json"), 0);
        let read = |r: &str| {
            api_objects_read()
                .into_iter()
                .find(|(x, _)| x == r)
                .map_or(0, |(_, n)| n)
        };
        let (pods, leases) = (read("pods"), read("ipleases"));
        record_objects("/api/v1/namespaces/kube-system/pods", 3);
        record_objects("/api/v1/pods/", 1);
        record_objects("/apis/ipam.tether.dev/v1alpha1/ipleases", 5);
        assert_eq!((read("pods"), read("ipleases")), (pods + 4, leases + 5));
    }

    #[test]
    fn outcomes_are_not_errors() {
        let status = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("x", "y")
                    .with_code(code)
                    .boxed(),
            )
        };
        let before: u64 = api_errors()
            .iter()
            .filter(|(v, _, _)| *v == "delete")
            .map(|(_, _, n)| n)
            .sum();
        for c in [404, 409, 410] {
            record("delete", Some(&status(c)));
        }
        record("delete", None);
        let after: u64 = api_errors()
            .iter()
            .filter(|(v, _, _)| *v == "delete")
            .map(|(_, _, n)| n)
            .sum();
        assert_eq!(after, before);
        record("delete", Some(&status(503)));
        assert!(
            api_errors()
                .iter()
                .any(|(v, c, n)| *v == "delete" && c == "503" && *n >= 1)
        );
        assert!(
            api_requests()
                .iter()
                .any(|(v, n)| *v == "delete" && *n >= 5)
        );
    }
}
