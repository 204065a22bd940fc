//! The server itself: its options, the thread and tokio runtime it runs on, the accept loop
//! (plain HTTP/1.1 on 127.0.0.1), and the state every connection shares.

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{broadcast, oneshot};

use crate::kubeconfig::kubeconfig_for;
use crate::objects::{Event, State};
use crate::routing::handle;

/// How to start the double.
#[derive(Debug, Clone)]
pub struct Options {
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Delay added before answering each API request (not the control endpoints).
    pub latency: Duration,
    /// Whether the IPLease CRD is installed (false: its group answers 404).
    pub crd_installed: bool,
    /// Worker threads of the double's own runtime.
    pub worker_threads: usize,
    /// User name quoted in 403 messages.
    pub user: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            port: 0,
            latency: Duration::ZERO,
            crd_installed: true,
            worker_threads: 2,
            user: "system:serviceaccount:kube-system:tether".to_string(),
        }
    }
}

/// What every connection shares: the objects, the knobs, the counters, the event feed.
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) latency_us: AtomicU64,
    pub(crate) crd_installed: AtomicBool,
    /// How many more IPLease lists from the watch cache answer 429 (a cache still filling).
    pub(crate) cache_unready: AtomicU64,
    pub(crate) forbidden: Mutex<HashSet<(String, String)>>,
    /// (verb, resource, namespace): 403 on requests in that namespace only.
    pub(crate) forbidden_in: Mutex<HashSet<(String, String, String)>>,
    pub(crate) counts: Mutex<BTreeMap<String, u64>>,
    pub(crate) events: broadcast::Sender<Arc<Event>>,
    pub(crate) user: String,
}

impl Shared {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running double. Dropping it stops the server (and ends open watches).
pub struct ApiServerDouble {
    addr: SocketAddr,
    pub(crate) shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ApiServerDouble {
    /// Start with default options on a free port of 127.0.0.1.
    pub fn start() -> io::Result<ApiServerDouble> {
        ApiServerDouble::start_with(Options::default())
    }

    /// Start with `opts`. The server runs on its own thread and tokio runtime.
    pub fn start_with(opts: Options) -> io::Result<ApiServerDouble> {
        let listener = std::net::TcpListener::bind(("127.0.0.1", opts.port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (events, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            latency_us: AtomicU64::new(opts.latency.as_micros() as u64),
            crd_installed: AtomicBool::new(opts.crd_installed),
            cache_unready: AtomicU64::new(0),
            forbidden: Mutex::new(HashSet::new()),
            forbidden_in: Mutex::new(HashSet::new()),
            counts: Mutex::new(BTreeMap::new()),
            events,
            user: opts.user.clone(),
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.worker_threads.max(1))
            .thread_name("apiserver-double")
            .enable_all()
            .build()?;
        let (stop, stop_rx) = oneshot::channel();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("apiserver-double".into())
            .spawn(move || {
                rt.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => serve(l, sh, stop_rx).await,
                        Err(e) => log::error!("apiserver double: {e}"),
                    }
                });
                rt.shutdown_background();
            })?;
        Ok(ApiServerDouble {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Socket address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig pointing at the double (no credentials: the double does not authenticate).
    pub fn kubeconfig(&self) -> String {
        kubeconfig_for(&self.url())
    }

    /// Write [`ApiServerDouble::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.kubeconfig())
    }
}

impl Drop for ApiServerDouble {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stop => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let sh = shared.clone();
                    tokio::spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            let sh = sh.clone();
                            async move { Ok::<_, Infallible>(handle(sh, req).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    });
                }
                Err(e) => {
                    log::warn!("apiserver double: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}
