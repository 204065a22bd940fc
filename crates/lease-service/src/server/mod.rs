//! The node-agent's side: [`LeaseService`], a root-only unix socket in front of one long-lived
//! [`KubeStore`] (one kept connection to the API server, the plugin's own node-bound credential)
//! and the records of each network its plugins use, kept by a watch ([`NetworkLeases`]).
//!
//! It serves a plugin only when the plugin's configuration names the same store (the kubeconfig
//! the agent writes for the plugins, the same server and reading rules): a request through it is
//! the request the plugin would have sent, as the same identity, so the API server's node-scope
//! policy holds it to this node exactly as before. Only root may connect (the socket is 0600 in a
//! 0700 directory, and each peer's uid is checked). Stopping removes the socket first, then
//! refuses what is still asked on open connections, so every plugin goes on directly.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tether_kube_store::{Change, Kinds, KubeSettings, KubeStore, RequestCounts};
use tether_leases::{LeaseStore, StoreError};
use tether_trusted_fs::{Place, TrustedDir};

use crate::network_cache::{NetworkGauge, Networks, Standing};
use tether_lease_client::protocol::{Reply, Request, StoreIdentity, socket_place};

mod connections;
mod network_watch;

/// How long the service gives one request against the API server: less than the plugin waits
/// for its answer ([`tether_lease_client::client::ANSWER_WAIT`]), so a slow API server is reported to the
/// plugin (which then tries directly) rather than left unanswered.
pub const REQUEST_BUDGET: Duration = Duration::from_millis(2500);

/// How the service runs.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// Where its counters and networks show (the node-agent's metrics); a fresh one by default.
    pub gauges: ServiceGauges,
    /// Where to listen (a root-only directory is made for it).
    pub socket: PathBuf,
    /// The store it serves: the plugins' kubeconfig (with its node-bound token), as NADs name it.
    pub settings: KubeSettings,
    /// Connections served at once; more are refused (their plugins go on directly).
    pub max_connections: usize,
}

impl ServiceOptions {
    /// Serve the store of the plugins' `kubeconfig` on `socket`, as `node` when the
    /// credential is not bound to one: the settings the plugin's own configuration gives
    /// (`kubernetes.kubeconfig` alone), each request within [`REQUEST_BUDGET`], writes named
    /// after the plugin (they are its writes).
    pub fn new(socket: PathBuf, kubeconfig: PathBuf, node: Option<String>) -> ServiceOptions {
        let mut settings = KubeSettings::with_kubeconfig(kubeconfig);
        settings.timeout = REQUEST_BUDGET;
        settings.node = node;
        ServiceOptions {
            gauges: ServiceGauges::default(),
            socket,
            settings,
            max_connections: 256,
        }
    }
}

/// What the service has done, for logs and metrics.
#[derive(Debug, Default)]
pub struct ServiceStats {
    /// Connections welcomed.
    pub welcomed: AtomicU64,
    /// Connections refused (another store, protocol, busy, stopping).
    pub refused: AtomicU64,
    /// Requests answered (from memory or with an API request; refusals not counted).
    pub requests: AtomicU64,
    /// Requests answered from a kept network's records, without the API.
    pub from_cache: AtomicU64,
    /// Worker threads started (an idle one takes the next connection).
    pub workers: AtomicU64,
}

/// What services show the node-agent's metrics: made by whoever starts them, handed to each in
/// its options, read while they run. The counters add up across services (one after another);
/// the networks are the running service's.
#[derive(Clone, Default)]
pub struct ServiceGauges(Arc<GaugeState>);

#[derive(Default)]
struct GaugeState {
    stats: ServiceStats,
    networks: Mutex<Option<Arc<Networks>>>,
}

impl std::fmt::Debug for ServiceGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServiceGauges")
    }
}

impl ServiceGauges {
    /// The counters.
    pub fn stats(&self) -> &ServiceStats {
        &self.0.stats
    }

    /// The running service's networks (none when no service runs).
    pub fn networks(&self) -> Vec<NetworkGauge> {
        let kept = self.lock().clone();
        kept.map(|n| n.gauges()).unwrap_or_default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<Networks>>> {
        self.0.networks.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Shared {
    /// The store served (its kubeconfig's path canonical).
    identity: StoreIdentity,
    node: String,
    /// Whether the credential is bound to `node` (else `node` is the agent's `NODE_NAME`).
    bound: bool,
    settings: KubeSettings,
    store: RwLock<(Arc<KubeStore>, Option<SystemTime>)>,
    networks: Arc<Networks>,
    gauges: ServiceGauges,
    /// Held while a network is listed (one at a time).
    listing: Mutex<()>,
    /// The networks' watch threads, started as plugins first ask about each.
    watchers: Mutex<Vec<JoinHandle<()>>>,
    stopping: AtomicBool,
    open: AtomicUsize,
    /// Workers waiting for a connection.
    idle: AtomicUsize,
    max_connections: usize,
}

/// A running service; [`LeaseService::stop`] (or drop) ends it.
pub struct LeaseService {
    shared: Arc<Shared>,
    socket: PathBuf,
    /// The socket file this service made (device, inode): a newer service may have replaced it
    /// (a DaemonSet rolling with surge), and stopping must not remove that one.
    made: (u64, u64),
    threads: Vec<JoinHandle<()>>,
}

fn mtime(p: Option<&Path>) -> Option<SystemTime> {
    p.and_then(|p| std::fs::metadata(p).ok())
        .and_then(|m| m.modified().ok())
}

impl LeaseService {
    /// Connect the store, bind the socket, start the accept loop (each network is watched from
    /// its first request on). Needs a kubeconfig whose credential names a node (the node-agent's plugin
    /// kubeconfig), or `settings.node`.
    pub fn start(opts: ServiceOptions) -> Result<LeaseService, String> {
        let kubeconfig = opts.settings.kubeconfig.clone().ok_or(
            "the lease service serves the plugins' kubeconfig: give its path (--kubeconfig)",
        )?;
        let store = KubeStore::connect(opts.settings.clone()).map_err(|e| e.to_string())?;
        let node = store.node().map(str::to_string).ok_or(
            "the lease service needs the node's name: a credential bound to the node, or NODE_NAME",
        )?;
        let bound = store.api().bound_node().is_some();
        let mut identity = tether_lease_client::client::identity(&opts.settings);
        identity.kubeconfig = Some(
            std::fs::canonicalize(&kubeconfig)
                .map_err(|e| format!("the plugins' kubeconfig {}: {e}", kubeconfig.display()))?,
        );
        let listener = bind(&opts.socket)?;
        let made = file_id(&opts.socket).ok_or("the socket vanished as it was made")?;
        let shared = Arc::new(Shared {
            identity,
            node,
            bound,
            settings: opts.settings.clone(),
            store: RwLock::new((Arc::new(store), mtime(Some(&kubeconfig)))),
            networks: Arc::default(),
            gauges: opts.gauges.clone(),
            listing: Mutex::default(),
            watchers: Mutex::default(),
            stopping: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            idle: AtomicUsize::new(0),
            max_connections: opts.max_connections.max(1),
        });
        *shared.gauges.lock() = Some(shared.networks.clone());
        let mut threads = Vec::new();
        let sh = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("lease-service".into())
                .spawn(move || sh.accept_loop(listener))
                .map_err(|e| format!("cannot start the lease service: {e}"))?,
        );
        log::info!(
            "lease service on {} for node {} ({})",
            opts.socket.display(),
            shared.node,
            kubeconfig.display()
        );
        Ok(LeaseService {
            shared,
            socket: opts.socket,
            made,
            threads,
        })
    }

    /// What it has done so far.
    pub fn stats(&self) -> &ServiceStats {
        self.shared.gauges.stats()
    }

    /// Is `network` kept (its list read, its watch running), waiting up to `wait` for it? Asking
    /// starts keeping it.
    pub fn keeps(&self, network: &str, wait: Duration) -> bool {
        self.shared
            .network(network)
            .is_some_and(|c| c.standing(wait) == Standing::Synced)
    }

    /// API requests its client has sent (its lists and watches included).
    pub fn api_requests(&self) -> RequestCounts {
        self.shared.store().requests()
    }

    /// Stop: the socket goes first (new plugins go direct), then requests on open connections
    /// are refused (theirs go on directly); waits up to `grace` for the connections to end.
    pub fn stop(mut self, grace: Duration) {
        self.halt(grace);
    }

    fn halt(&mut self, grace: Duration) {
        if self.shared.stopping.swap(true, Ordering::SeqCst) {
            return;
        }
        if file_id(&self.socket) == Some(self.made) {
            let _ = std::fs::remove_file(&self.socket);
        }
        {
            // A successor's networks, if one started meanwhile, stay shown.
            let mut shown = self.shared.gauges.lock();
            if shown
                .as_ref()
                .is_some_and(|n| Arc::ptr_eq(n, &self.shared.networks))
            {
                *shown = None;
            }
        }
        let until = Instant::now() + grace;
        while self.shared.open.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let watchers = std::mem::take(
            &mut *self
                .shared
                .watchers
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for t in self.threads.drain(..).chain(watchers) {
            let _ = t.join();
        }
    }
}

impl Drop for LeaseService {
    fn drop(&mut self) {
        self.halt(Duration::from_secs(2));
    }
}

/// (device, inode) of the file at `p`, not following a symlink.
fn file_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// A root-only directory for the socket (0700, made when missing), the socket in it (0600),
/// replacing a stale one.
fn bind(socket: &Path) -> Result<UnixListener, String> {
    let (dir, name) = socket_place(socket)?;
    let dir = TrustedDir::open("the lease service socket", dir, Place::State, true)
        .map_err(|e| e.to_string())?;
    if dir.is_trusted_socket(name) {
        dir.remove(name).map_err(|e| e.to_string())?;
    }
    let pinned = dir.pinned_path(name).map_err(|e| e.to_string())?;
    let listener =
        UnixListener::bind(&pinned).map_err(|e| format!("binding {}: {e}", socket.display()))?;
    dir.chmod(name, 0o600)
        .map_err(|e| format!("chmod {}: {e}", socket.display()))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    Ok(listener)
}

fn failure(e: StoreError) -> Reply {
    Reply::Failed {
        transient: e.is_transient(),
        message: e.to_string(),
    }
}

impl Shared {
    /// The store, connected again when the kubeconfig changed (the agent renews its token).
    fn store(&self) -> Arc<KubeStore> {
        let path = self.settings.kubeconfig.as_deref();
        let now = mtime(path);
        {
            let g = self.store.read().unwrap_or_else(|p| p.into_inner());
            if g.1 == now {
                return g.0.clone();
            }
        }
        let mut g = self.store.write().unwrap_or_else(|p| p.into_inner());
        if g.1 != now {
            match KubeStore::connect(self.settings.clone()) {
                Ok(k) => {
                    log::info!("lease service: the plugins' kubeconfig changed; connected again");
                    *g = (Arc::new(k), now);
                }
                // Kept until the file changes again (the agent rewrites it whole).
                Err(e) => {
                    log::warn!("lease service: reading the changed kubeconfig: {e}");
                    g.1 = now;
                }
            }
        }
        g.0.clone()
    }

    fn answer(self: &Arc<Self>, req: Request) -> Reply {
        let store = self.store();
        store.restart_budget();
        let cached = |r: Reply| {
            self.gauges
                .stats()
                .from_cache
                .fetch_add(1, Ordering::Relaxed);
            r
        };
        let kept = |network: &str| self.kept(network);
        match req {
            Request::Hello { .. } => Reply::Refused {
                reason: "already welcomed".into(),
            },
            Request::Get { scope, address } => {
                match kept(&scope.network).and_then(|c| c.get(scope.domain.as_deref(), address)) {
                    Some(lease) => cached(Reply::Record { lease }),
                    None => match store.get(&scope, address) {
                        Ok(lease) => Reply::Record { lease },
                        Err(e) => failure(e),
                    },
                }
            }
            Request::Claim { new, expected } => {
                let network = new.network.clone();
                match store.claim(new, expected.as_ref()) {
                    Ok(Ok(lease)) => {
                        if let Some(c) = self.network(&network) {
                            c.apply(Change::Upsert(lease.clone()));
                        }
                        Reply::Written { lease }
                    }
                    Ok(Err(t)) => Reply::Taken { current: t.current },
                    Err(e) => failure(e),
                }
            }
            Request::Remove { expected } => match store.remove(&expected) {
                Ok(Ok(())) => {
                    if let Some(c) = self.network(&expected.network) {
                        c.apply(Change::Deleted(expected));
                    }
                    Reply::Removed
                }
                Ok(Err(t)) => Reply::Taken { current: t.current },
                Err(e) => failure(e),
            },
            Request::List { scope } => {
                let all = kept(&scope.network).and_then(|c| c.of_network(&scope));
                match all {
                    Some(leases) => cached(Reply::Records { leases }),
                    None => match store.list(&scope) {
                        Ok(leases) => Reply::Records { leases },
                        Err(e) => failure(e),
                    },
                }
            }
            Request::ListNode { network } => {
                match kept(&network).and_then(|c| c.of_node(&self.node)) {
                    Some(leases) => cached(Reply::Records { leases }),
                    None => match store.list_network_node(&network, &self.node, Kinds::Domain) {
                        Ok(leases) => Reply::Records { leases },
                        Err(e) => failure(e.into()),
                    },
                }
            }
            Request::ByPod { scope, pod } => {
                match kept(&scope.network).and_then(|c| c.by_pod(&scope, &pod)) {
                    Some(leases) => cached(Reply::Records { leases }),
                    None => match store.by_pod(&scope, &pod) {
                        Ok(leases) => Reply::Records {
                            leases: leases.unwrap_or_default(),
                        },
                        Err(e) => failure(e),
                    },
                }
            }
        }
    }
}
