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

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use tether_kube_store::{
    Change, KubeSettings, KubeStore, KubeStoreError, RequestCounts, WatchEnd, jittered,
};
use tether_leases::{LeaseStore, StoreError};
use tether_trusted_fs::{Place, TrustedDir};

use crate::network_cache::{MAX_LIST_BYTES, NetworkLeases, Networks, Standing};

use crate::protocol::{
    MAX_REQUEST, PROTOCOL, Reply, Request, StoreIdentity, peer_uid, read_frame, write_frame,
};

/// How long the service gives one request against the API server: less than the plugin waits
/// for its answer ([`crate::client::ANSWER_WAIT`]), so a slow API server is reported to the
/// plugin (which then tries directly) rather than left unanswered.
pub const REQUEST_BUDGET: Duration = Duration::from_millis(2500);

/// How the service runs.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
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
    /// Requests answered.
    pub requests: AtomicU64,
    /// Requests answered from a kept network's records, without the API.
    pub from_cache: AtomicU64,
    /// Worker threads started (an idle one takes the next connection).
    pub workers: AtomicU64,
}

struct Shared {
    identity: StoreIdentity,
    node: String,
    settings: KubeSettings,
    store: RwLock<(Arc<KubeStore>, Option<SystemTime>)>,
    networks: Networks,
    /// Held while a network is listed (one at a time).
    listing: Mutex<()>,
    /// The networks' watch threads, started as plugins first ask about each.
    watchers: Mutex<Vec<JoinHandle<()>>>,
    stopping: AtomicBool,
    open: AtomicUsize,
    /// Workers waiting for a connection.
    idle: AtomicUsize,
    max_connections: usize,
    stats: ServiceStats,
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

/// The same file, however it is written (`/var/run/…` for `/run/…`).
fn same_path(a: &Path, b: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    canon(a) == canon(b)
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
        let listener = bind(&opts.socket)?;
        let made = file_id(&opts.socket).ok_or("the socket vanished as it was made")?;
        let shared = Arc::new(Shared {
            identity: crate::client::identity(&opts.settings),
            node,
            settings: opts.settings.clone(),
            store: RwLock::new((Arc::new(store), mtime(Some(&kubeconfig)))),
            networks: Networks::default(),
            listing: Mutex::default(),
            watchers: Mutex::default(),
            stopping: AtomicBool::new(false),
            open: AtomicUsize::new(0),
            idle: AtomicUsize::new(0),
            max_connections: opts.max_connections.max(1),
            stats: ServiceStats::default(),
        });
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
        &self.shared.stats
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
    let (Some(dir), Some(name)) = (socket.parent(), socket.file_name().and_then(|n| n.to_str()))
    else {
        return Err(format!("{} names no socket", socket.display()));
    };
    let dir = TrustedDir::open("the lease service socket", dir, Place::State, true)
        .map_err(|e| e.to_string())?;
    if dir.is_trusted_socket(name) {
        dir.remove(name).map_err(|e| e.to_string())?;
    }
    let pinned = dir.pinned_path(name).map_err(|e| e.to_string())?;
    let listener =
        UnixListener::bind(&pinned).map_err(|e| format!("binding {}: {e}", socket.display()))?;
    let cname = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: the directory fd is open (owned by `dir`), `cname` is a valid C string.
    let rc = unsafe {
        libc::fchmodat(
            std::os::fd::AsFd::as_fd(&dir).as_raw_fd(),
            cname.as_ptr(),
            0o600,
            0,
        )
    };
    if rc != 0 {
        return Err(format!(
            "chmod {}: {}",
            socket.display(),
            io::Error::last_os_error()
        ));
    }
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    Ok(listener)
}

fn failure(e: StoreError) -> Reply {
    Reply::Failed {
        transient: e.is_transient(),
        message: e.to_string(),
    }
}

/// How long a connection may sit between two requests (a CNI call sends them back to back).
const IDLE: Duration = Duration::from_secs(30);

/// How long a worker waits for another connection before it ends.
const IDLE_WORKER: Duration = Duration::from_secs(60);

/// Count one out of `n` unless it is zero.
fn take_one(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

impl Shared {
    fn accept_loop(self: Arc<Shared>, listener: UnixListener) {
        // Connections go to idle workers when there are some (a thread per CNI call would cost
        // the node a thread's creation and teardown, stack mappings included, every call).
        let (tx, rx) = std::sync::mpsc::channel::<UnixStream>();
        let rx = Arc::new(Mutex::new(rx));
        while !self.stopping.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, _)) => {
                    self.open.fetch_add(1, Ordering::SeqCst);
                    if take_one(&self.idle) {
                        // An idle worker was counted: one of them takes it.
                        let _ = tx.send(stream);
                        continue;
                    }
                    let (sh, rx) = (self.clone(), rx.clone());
                    let spawned = std::thread::Builder::new()
                        .name("lease-conn".into())
                        .spawn(move || sh.work(stream, &rx));
                    if spawned.is_ok() {
                        self.stats.workers.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Err(e) = spawned {
                        self.open.fetch_sub(1, Ordering::SeqCst);
                        log::warn!("lease service: cannot serve a connection: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    poll_readable(&listener, Duration::from_millis(200));
                }
                Err(e) => {
                    log::warn!("lease service: accept: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// A worker: serve `first`, then each connection handed over while it is idle; end after
    /// [`IDLE_WORKER`] without one, or when the accept loop has ended.
    fn work(
        self: &Arc<Self>,
        first: UnixStream,
        rx: &Mutex<std::sync::mpsc::Receiver<UnixStream>>,
    ) {
        let mut stream = first;
        loop {
            self.serve(stream);
            self.open.fetch_sub(1, Ordering::SeqCst);
            self.idle.fetch_add(1, Ordering::SeqCst);
            stream = loop {
                let next = rx
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .recv_timeout(IDLE_WORKER);
                match next {
                    Ok(s) => break s,
                    // Counted out by the accept loop meanwhile: a connection is on its way.
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !take_one(&self.idle) => {}
                    Err(_) => return,
                }
            };
        }
    }

    /// One plugin's connection: a hello, then its requests, each answered in turn.
    fn serve(self: &Arc<Self>, mut s: UnixStream) {
        let _ = s.set_nonblocking(false);
        let me = // SAFETY: geteuid has no preconditions and cannot fail.
            unsafe { libc::geteuid() };
        match peer_uid(&s) {
            Ok(uid) if uid == 0 || uid == me => {}
            other => {
                log::warn!("lease service: refusing a peer of uid {other:?} (root only)");
                return;
            }
        }
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        let Ok(Some(hello)) = read_frame::<Request>(&mut s, MAX_REQUEST) else {
            return;
        };
        let welcome = self.welcome(&hello);
        let welcomed = matches!(welcome, Reply::Welcome { .. });
        let counter = if welcomed {
            &self.stats.welcomed
        } else {
            &self.stats.refused
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if write_frame(&mut s, &welcome).is_err() || !welcomed {
            return;
        }
        let _ = s.set_read_timeout(Some(IDLE));
        while let Ok(Some(req)) = read_frame::<Request>(&mut s, MAX_REQUEST) {
            let reply = if self.stopping.load(Ordering::SeqCst) {
                Reply::Refused {
                    reason: "the node-agent is stopping".into(),
                }
            } else {
                self.answer(req)
            };
            self.stats.requests.fetch_add(1, Ordering::Relaxed);
            if write_frame(&mut s, &reply).is_err() {
                return;
            }
        }
    }

    fn welcome(&self, hello: &Request) -> Reply {
        let refused = |reason: String| Reply::Refused { reason };
        let Request::Hello { protocol, store } = hello else {
            return refused("a connection starts with a hello".into());
        };
        if self.stopping.load(Ordering::SeqCst) {
            return refused("the node-agent is stopping".into());
        }
        if *protocol != PROTOCOL {
            return refused(format!("protocol {protocol}, this agent speaks {PROTOCOL}"));
        }
        if self.open.load(Ordering::SeqCst) > self.max_connections {
            return refused(format!("{} connections open", self.max_connections));
        }
        let mine = &self.identity;
        let same_kubeconfig = match (&store.kubeconfig, &mine.kubeconfig) {
            (Some(a), Some(b)) => same_path(a, b),
            _ => false,
        };
        if !same_kubeconfig
            || store.api_root != mine.api_root
            || store.list_from_cache != mine.list_from_cache
            || store.page_size != mine.page_size
            || store.group != mine.group
        {
            return refused(format!(
                "this agent serves the store of {:?}, not {:?}",
                mine.kubeconfig, store.kubeconfig
            ));
        }
        Reply::Welcome {
            node: self.node.clone(),
        }
    }

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
                Err(e) => log::warn!("lease service: reading the changed kubeconfig: {e}"),
            }
        }
        g.0.clone()
    }

    /// `network`'s cache, its watch started on the first ask; `None` once stopping.
    fn network(self: &Arc<Self>, network: &str) -> Option<Arc<NetworkLeases>> {
        if self.stopping.load(Ordering::SeqCst) {
            return None;
        }
        let (cache, new) = self.networks.entry(network);
        if new {
            let (sh, net, c) = (self.clone(), network.to_string(), cache.clone());
            let spawned = std::thread::Builder::new()
                .name("lease-watch".into())
                .spawn(move || sh.keep_network(&net, &c));
            match spawned {
                Ok(h) => self
                    .watchers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(h),
                Err(e) => {
                    log::warn!("lease service: cannot watch network {network}: {e}");
                    cache.unsynced();
                }
            }
        }
        Some(cache)
    }

    /// `network`'s cache when it can answer: its first list waited for (a node's first ADD in
    /// a network), no longer.
    fn kept(self: &Arc<Self>, network: &str) -> Option<Arc<NetworkLeases>> {
        self.network(network)
            .filter(|c| c.standing(WARM_UP) == Standing::Synced)
    }

    fn answer(self: &Arc<Self>, req: Request) -> Reply {
        let store = self.store();
        store.restart_budget();
        let cached = |r: Reply| {
            self.stats.from_cache.fetch_add(1, Ordering::Relaxed);
            r
        };
        let kept = |network: &str| self.kept(network);
        match req {
            Request::Hello { .. } => Reply::Refused {
                reason: "already welcomed".into(),
            },
            Request::Get { network, address } => {
                match kept(&network).and_then(|c| c.get(address)) {
                    Some(lease) => cached(Reply::Record { lease }),
                    None => match store.get(&network, address) {
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
            Request::List { network } => {
                let all = kept(&network).and_then(|c| c.of_network());
                match all {
                    Some(leases) => cached(Reply::Records { leases }),
                    None => match store.list(&network) {
                        Ok(leases) => Reply::Records { leases },
                        Err(e) => failure(e),
                    },
                }
            }
            Request::ListNode { network } => {
                match kept(&network).and_then(|c| c.of_node(&self.node)) {
                    Some(leases) => cached(Reply::Records { leases }),
                    None => match store.list_network_node(&network, &self.node) {
                        Ok(leases) => Reply::Records { leases },
                        Err(e) => failure(e.into()),
                    },
                }
            }
            Request::ByPod { network, pod } => match kept(&network).and_then(|c| c.by_pod(&pod)) {
                Some(leases) => cached(Reply::Records { leases }),
                None => match store.by_pod(&network, &pod) {
                    Ok(leases) => Reply::Records {
                        leases: leases.unwrap_or_default(),
                    },
                    Err(e) => failure(e),
                },
            },
        }
    }

    /// List `network`'s records, then watch them; list again after an expired watch, with
    /// back-off after a failure (answers go to the API meanwhile). A network too big to keep is
    /// left alone. One network is listed at a time: a list's answer is the largest thing the
    /// service holds.
    fn keep_network(&self, network: &str, cache: &NetworkLeases) {
        let stop = || self.stopping.load(Ordering::SeqCst);
        let too_big = |why: &dyn std::fmt::Display| {
            log::warn!(
                "lease service: network {network} is not kept in memory ({why}); its plugins' requests go to the API server"
            );
        };
        let mut backoff = Duration::from_secs(1);
        while !stop() {
            let store = self.store();
            store.restart_budget();
            let listed = {
                let _one = self.listing.lock().unwrap_or_else(|p| p.into_inner());
                store.list_network_at(network, MAX_LIST_BYTES)
            };
            let mut rv = match listed {
                Ok((leases, rv)) => {
                    let (n, room) = (leases.len(), self.networks.room(network));
                    cache.replace_all(leases, room);
                    if cache.standing(Duration::ZERO) != Standing::Synced {
                        too_big(&format_args!("{n} records, room for {room}"));
                        return;
                    }
                    backoff = Duration::from_secs(1);
                    rv
                }
                Err(e @ KubeStoreError::TooLarge { .. }) => {
                    cache.unsynced();
                    too_big(&e);
                    return;
                }
                Err(e) => {
                    cache.unsynced();
                    log::warn!("lease service: listing network {network}: {e}");
                    sleep_unless(&stop, jittered(backoff));
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            // Until stopping, or the network grows past its room (then listed again).
            let keep_going = || !stop() && cache.standing(Duration::ZERO) == Standing::Synced;
            loop {
                match store.watch_network(
                    network,
                    &rv,
                    Duration::from_secs(300),
                    &keep_going,
                    |c| cache.apply(c),
                ) {
                    Ok(WatchEnd::Closed { resource_version }) if keep_going() => {
                        rv = resource_version
                    }
                    Ok(_) => break,
                    Err(e) => {
                        cache.unsynced();
                        log::warn!("lease service: watching network {network}: {e}");
                        sleep_unless(&stop, jittered(backoff));
                        break;
                    }
                }
            }
        }
    }
}

/// How long a node's first request about a network waits for the network's first list.
const WARM_UP: Duration = Duration::from_secs(2);

fn sleep_unless(stop: &dyn Fn() -> bool, d: Duration) {
    let until = Instant::now() + d;
    while !stop() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Wait until `l` can accept, at most `d`.
fn poll_readable(l: &UnixListener, d: Duration) {
    let mut fds = libc::pollfd {
        fd: l.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the listener's open fd.
    unsafe { libc::poll(&mut fds, 1, d.as_millis() as libc::c_int) };
}
