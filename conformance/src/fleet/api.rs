//! The harness's own view of the API server: an admin client for what the simulated cluster
//! does (nodes, pods, heartbeats, tokens, the final checks), a watch of one network's IPLeases
//! that timestamps every release as it happens, and the server's own list metrics.

use std::collections::{BTreeMap, HashMap};

pub use crate::prometheus_text::parse_labels;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use serde_json::Value;
use tether_kube_store::crd::network_selector;
use tether_kube_store::{IPLease, LeasePhase};

/// Every request of the harness is bounded: a wait of its own never hangs on a server.
const REQUEST_BUDGET: Duration = Duration::from_secs(30);

/// A failed request: the HTTP status when the server answered, and what it said.
#[derive(Debug, Clone)]
pub struct Fail {
    pub code: Option<u16>,
    pub message: String,
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.code {
            Some(c) => write!(f, "{c}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl From<kube::Error> for Fail {
    fn from(e: kube::Error) -> Fail {
        match e {
            kube::Error::Api(s) => Fail {
                code: Some(s.code),
                message: s.message,
            },
            other => Fail {
                code: None,
                message: other.to_string(),
            },
        }
    }
}

/// A blocking client with the cluster-admin kubeconfig (one per thread: its runtime is a
/// current-thread one).
pub struct Admin {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    kubeconfig: PathBuf,
    server: String,
    ca_data: String,
}

impl Admin {
    pub fn connect(kubeconfig: &Path) -> Result<Admin, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)
            .map_err(|e| format!("{}: {e}", kubeconfig.display()))?;
        let cluster = kc
            .clusters
            .first()
            .and_then(|c| c.cluster.clone())
            .ok_or_else(|| format!("{}: no cluster", kubeconfig.display()))?;
        let server = cluster.server.clone().unwrap_or_default();
        let ca_data = cluster
            .certificate_authority_data
            .clone()
            .unwrap_or_default();
        let client = rt.block_on(async {
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| e.to_string())?;
            kube::Client::try_from(cfg).map_err(|e| e.to_string())
        })?;
        Ok(Admin {
            rt,
            client,
            kubeconfig: kubeconfig.to_path_buf(),
            server,
            ca_data,
        })
    }

    /// Another client for the same server (for another thread).
    pub fn again(&self) -> Result<Admin, String> {
        Admin::connect(&self.kubeconfig)
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The server's URL (`https://127.0.0.1:PORT`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The server's CA, base64 PEM as in a kubeconfig.
    pub fn ca_data(&self) -> &str {
        &self.ca_data
    }

    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Run `fut` on this client's runtime, within the request budget.
    pub fn block<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, Fail>>,
    ) -> Result<T, Fail> {
        self.rt
            .block_on(async { tokio::time::timeout(REQUEST_BUDGET, fut).await })
            .unwrap_or_else(|_| {
                Err(Fail {
                    code: None,
                    message: format!("no answer within {REQUEST_BUDGET:?}"),
                })
            })
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&Value>,
    ) -> Result<String, Fail> {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("Content-Type", content_type)
            .body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default())
            .map_err(|e| Fail {
                code: None,
                message: e.to_string(),
            })?;
        self.block(async { self.client.request_text(req).await.map_err(Fail::from) })
    }

    fn json(text: String) -> Value {
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    /// POST `body` to the collection at `path`.
    pub fn post(&self, path: &str, body: &Value) -> Result<Value, Fail> {
        self.send("POST", path, "application/json", Some(body))
            .map(Self::json)
    }

    /// GET `path` (an object, a list, or `/metrics`-style text as a JSON string).
    pub fn get(&self, path: &str) -> Result<Value, Fail> {
        self.send("GET", path, "application/json", None)
            .map(Self::json)
    }

    /// GET `path` as text.
    pub fn text(&self, path: &str) -> Result<String, Fail> {
        self.send("GET", path, "application/json", None)
    }

    /// A JSON merge patch of the object at `path`.
    pub fn merge_patch(&self, path: &str, body: &Value) -> Result<Value, Fail> {
        self.send("PATCH", path, "application/merge-patch+json", Some(body))
            .map(Self::json)
    }

    /// DELETE the object at `path` at once (grace period 0: no kubelet confirms a graceful
    /// deletion here). False when there was none.
    pub fn delete(&self, path: &str) -> Result<bool, Fail> {
        let body = serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0});
        match self.send("DELETE", path, "application/json", Some(&body)) {
            Ok(_) => Ok(true),
            Err(Fail {
                code: Some(404), ..
            }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The IPLeases of `network`, from a consistent (etcd) read: what is stored, not what a
    /// cache says.
    pub fn leases(&self, network: &str) -> Result<Vec<IPLease>, Fail> {
        let api: Api<IPLease> = Api::all(self.client.clone());
        let lp = ListParams::default().labels(&network_selector(network));
        let list = self.block(async { api.list(&lp).await.map_err(Fail::from) })?;
        Ok(list
            .items
            .into_iter()
            .filter(|l| l.spec.network == network)
            .collect())
    }

    /// The server's own counters of the objects it read to serve LISTs, by metric and
    /// resource: `storage` (read from etcd: `apiserver_storage_list_fetched_objects_total`) and
    /// `cache` (read from the watch cache: `apiserver_cache_list_fetched_objects_total`), plus
    /// `requests` (`apiserver_request_total` of clients, the server's own loopback requests
    /// excluded) by resource. They start from 0 when the server restarts.
    pub fn server_reads(&self) -> Result<ServerReads, Fail> {
        let text = self.text("/metrics")?;
        Ok(ServerReads::parse(&text))
    }
}

/// See [`Admin::server_reads`].
#[derive(Debug, Clone, Default)]
pub struct ServerReads {
    /// Objects read from etcd to serve LISTs, by resource.
    pub storage: BTreeMap<String, f64>,
    /// Objects read from the watch cache to serve LISTs, by resource.
    pub cache: BTreeMap<String, f64>,
    /// Client requests, by resource.
    pub requests: BTreeMap<String, f64>,
}

impl ServerReads {
    pub fn parse(text: &str) -> ServerReads {
        let mut r = ServerReads::default();
        for line in text.lines() {
            let Some((name, rest)) = line.split_once('{') else {
                continue;
            };
            let target = match name {
                "apiserver_storage_list_fetched_objects_total" => &mut r.storage,
                "apiserver_cache_list_fetched_objects_total" => &mut r.cache,
                "apiserver_request_total" => &mut r.requests,
                _ => continue,
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let labels = parse_labels(labels);
            if labels.get("system_client").map(String::as_str) == Some("kube-apiserver") {
                continue;
            }
            let resource = labels.get("resource").cloned().unwrap_or_default();
            if resource.is_empty() {
                continue;
            }
            *target.entry(resource).or_default() += value.trim().parse::<f64>().unwrap_or(0.0);
        }
        r
    }

    /// What was read since `before` (`before` from the same server process; after a restart the
    /// counters began again at 0, so `self` is the count since the restart).
    pub fn since(&self, before: &ServerReads, restarted: bool) -> ServerReads {
        let d = |a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>| {
            a.iter()
                .map(|(k, v)| {
                    let base = if restarted {
                        0.0
                    } else {
                        b.get(k).copied().unwrap_or(0.0)
                    };
                    (k.clone(), (v - base).max(0.0))
                })
                .filter(|(_, v)| *v > 0.0)
                .collect()
        };
        ServerReads {
            storage: d(&self.storage, &before.storage),
            cache: d(&self.cache, &before.cache),
            requests: d(&self.requests, &before.requests),
        }
    }
}

/// The last record the watch saw of one IPLease object.
#[derive(Debug, Clone)]
pub struct Seen {
    pub state: LeasePhase,
    /// The uid of the pod the record names (its holder, or its last holder once released).
    pub pod_uid: Option<String>,
    /// When this harness first saw the record `Released` since it was last seen otherwise.
    pub released_seen: Option<Instant>,
}

#[derive(Default)]
struct WatchState {
    leases: HashMap<String, Seen>,
    synced: bool,
    relists: usize,
}

/// A watch of the IPLeases of one network, on its own thread: every release is timestamped when
/// the event arrives, so reclaim times are measured without polling the server. Lists again
/// after any error (an outage), so what changed meanwhile is seen at the relist.
pub struct LeaseWatch {
    state: Arc<Mutex<WatchState>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LeaseWatch {
    pub fn start(admin: &Admin, network: &str) -> Result<LeaseWatch, String> {
        let admin = admin.again()?;
        let (state, stop) = (
            Arc::<Mutex<WatchState>>::default(),
            Arc::new(AtomicBool::new(false)),
        );
        let (s, st, net) = (state.clone(), stop.clone(), network.to_string());
        let thread = std::thread::Builder::new()
            .name("lease-watch".into())
            .spawn(move || watch_leases(&admin, &net, &s, &st))
            .map_err(|e| e.to_string())?;
        let w = LeaseWatch {
            state,
            stop,
            thread: Some(thread),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !w.lock().synced {
            if Instant::now() > deadline {
                return Err("the IPLease watch did not list within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(w)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WatchState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the record `name` was seen released while naming pod `uid`.
    pub fn released(&self, name: &str, uid: &str) -> Option<Instant> {
        let s = self.lock();
        let seen = s.leases.get(name)?;
        (seen.state == LeasePhase::Released && seen.pod_uid.as_deref() == Some(uid))
            .then_some(seen.released_seen)
            .flatten()
    }

    /// How often the watch listed again (the first list excluded).
    pub fn relists(&self) -> usize {
        self.lock().relists.saturating_sub(1)
    }
}

impl Drop for LeaseWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn observe(s: &mut WatchState, l: &IPLease, now: Instant) {
    let Some(name) = l.metadata.name.clone() else {
        return;
    };
    let state = l.spec.state;
    let pod_uid = l.spec.pod.as_ref().and_then(|p| p.uid.clone());
    let prev = s.leases.get(&name);
    let released_seen = match (&state, prev) {
        (LeasePhase::Released, Some(p))
            if p.state == LeasePhase::Released && p.pod_uid == pod_uid =>
        {
            p.released_seen
        }
        (LeasePhase::Released, _) => Some(now),
        _ => None,
    };
    s.leases.insert(
        name,
        Seen {
            state,
            pod_uid,
            released_seen,
        },
    );
}

fn watch_leases(admin: &Admin, network: &str, state: &Mutex<WatchState>, stop: &AtomicBool) {
    let api: Api<IPLease> = Api::all(admin.client());
    let selector = network_selector(network);
    let lock = || state.lock().unwrap_or_else(|p| p.into_inner());
    while !stop.load(Ordering::Relaxed) {
        // From the watch cache (resourceVersion=0): the harness must not add etcd reads to
        // what it measures after an outage.
        let listed = admin.block(async {
            api.list(&ListParams::default().match_any().labels(&selector))
                .await
                .map_err(Fail::from)
        });
        let mut rv = match listed {
            Ok(list) => {
                let now = Instant::now();
                let mut s = lock();
                for l in &list.items {
                    observe(&mut s, l, now);
                }
                s.synced = true;
                s.relists += 1;
                list.metadata.resource_version.unwrap_or_default()
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
        };
        // Watch from the list until an error or expiry, then list again. Bounded: the server
        // ends each watch after `timeout`, and `stop` is looked at every 200 ms.
        loop {
            let wp = WatchParams::default().labels(&selector).timeout(60);
            let ended = admin.rt.block_on(async {
                let stream = match tokio::time::timeout(REQUEST_BUDGET, api.watch(&wp, &rv)).await {
                    Ok(Ok(s)) => s,
                    _ => return false,
                };
                tokio::pin!(stream);
                let mut tick = tokio::time::interval(Duration::from_millis(200));
                loop {
                    tokio::select! {
                        ev = stream.try_next() => match ev {
                            Ok(Some(WatchEvent::Added(l))) | Ok(Some(WatchEvent::Modified(l))) => {
                                if let Some(v) = l.metadata.resource_version.clone() { rv = v; }
                                observe(&mut lock(), &l, Instant::now());
                            }
                            Ok(Some(WatchEvent::Deleted(l))) => {
                                if let Some(v) = l.metadata.resource_version.clone() { rv = v; }
                                if let Some(n) = &l.metadata.name { lock().leases.remove(n); }
                            }
                            Ok(Some(WatchEvent::Bookmark(b))) => rv = b.metadata.resource_version,
                            Ok(Some(WatchEvent::Error(_))) | Err(_) => return false,
                            Ok(None) => return true,
                        },
                        _ = tick.tick() => if stop.load(Ordering::Relaxed) { return true; },
                    }
                }
            });
            if !ended || stop.load(Ordering::Relaxed) {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_metrics_are_read_by_resource() {
        let text = r#"# HELP x
apiserver_storage_list_fetched_objects_total{group="",index="",resource="pods"} 12
apiserver_storage_list_fetched_objects_total{group="ipam.tether.dev",index="",resource="ipleases"} 3
apiserver_cache_list_fetched_objects_total{group="",index="spec.nodeName",resource="pods"} 40
apiserver_request_total{code="200",component="apiserver",resource="pods",verb="LIST"} 5
apiserver_request_total{code="200",component="apiserver",resource="leases",system_client="kube-apiserver",verb="PUT"} 99
"#;
        let r = ServerReads::parse(text);
        assert_eq!(r.storage.get("pods"), Some(&12.0));
        assert_eq!(r.storage.get("ipleases"), Some(&3.0));
        assert_eq!(r.cache.get("pods"), Some(&40.0));
        assert_eq!(r.requests.get("pods"), Some(&5.0));
        assert_eq!(
            r.requests.get("leases"),
            None,
            "the server's own requests are left out"
        );
        let later = ServerReads::parse(&text.replace("} 12", "} 20"));
        assert_eq!(later.since(&r, false).storage.get("pods"), Some(&8.0));
        assert_eq!(later.since(&r, true).storage.get("pods"), Some(&20.0));
        assert_eq!(
            parse_labels(r#"a="x",b="y\"z""#),
            BTreeMap::from([("a".into(), "x".into()), ("b".into(), "y\"z".into())])
        );
    }
}
