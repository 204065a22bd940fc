//! The plugin's side: [`ServedStore`], the cluster lease store of one CNI call, through the
//! node-agent's lease service while it answers, directly otherwise.
//!
//! The engine runs in the plugin exactly as on the direct path (the node journal included); only
//! the store's requests travel over the socket, and the agent sends each as the same conditional
//! request, with the same node-bound credential, on its kept connection. Whenever the agent is
//! absent, refuses, is too slow or breaks mid-call, the call goes on directly
//! ([`KubeStore`], connected then) with what is left of its budget, so a pod never fails because
//! the agent is restarting. A write whose answer was lost with the agent may have been done: it
//! is sent again directly, and when the store then holds exactly the record that write would have
//! made, that is its success.

use std::io;
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tether_kube_store::{Kinds, Naming, convert::naming_of};
use tether_kube_store::{KubeSettings, KubeStore};
use tether_leases::{
    AttachmentIndex, BackendFailure, CasResult, FileJournal, JournalBacked, Lease, LeaseStore,
    PodRef, Scope, StoreError, Taken, validate_claim,
};
use tether_trusted_fs::{Place, TrustedDir};

use crate::protocol::{
    MAX_REPLY, PROTOCOL, Reply, Request, StoreIdentity, check_peer, read_frame, socket_place,
    write_frame,
};

/// How long the plugin waits for the agent's welcome: an agent that cannot answer a hello at once
/// is not one to wait for.
pub const WELCOME_WAIT: Duration = Duration::from_millis(500);

/// How long one request may wait for the agent's answer before the call goes on directly (capped
/// by what is left of the call's budget).
pub const ANSWER_WAIT: Duration = Duration::from_secs(3);

/// A connection to the node-agent's lease service that welcomed one store.
#[derive(Debug)]
pub struct AgentConnection {
    stream: UnixStream,
    node: String,
}

/// Why a request got no answer.
#[derive(Debug)]
enum Gone {
    /// It was never (completely) sent: nothing was done.
    Unsent(io::Error),
    /// It was sent; it may have been done.
    Unanswered(String),
}

impl AgentConnection {
    /// Connect to the service at `socket` and ask it to serve `store`. `Err`: why not (no agent
    /// there, a socket or directory someone else controls, another store or protocol): the
    /// caller takes the direct path.
    pub fn open(
        socket: &Path,
        store: &StoreIdentity,
        wait: Duration,
    ) -> Result<AgentConnection, String> {
        let (dir, name) = socket_place(socket)?;
        // Only a socket root owns, in a directory only root controls: a local user must not be
        // able to stand in for the agent.
        let dir = TrustedDir::open("the lease service socket", dir, Place::State, false)
            .map_err(|e| e.to_string())?;
        if !dir.is_trusted_socket(name) {
            return Err(format!("no socket of root's at {}", socket.display()));
        }
        let path = dir.pinned_path(name).map_err(|e| e.to_string())?;
        let stream =
            connect_now(&path).map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
        check_peer(&stream).map_err(|e| format!("{}: {e}", socket.display()))?;
        let mut link = AgentConnection {
            stream,
            node: String::new(),
        };
        let hello = Request::Hello {
            protocol: PROTOCOL,
            store: store.clone(),
        };
        match link.call(&hello, wait) {
            Ok(Reply::Welcome { node }) if !node.is_empty() => {
                link.node = node;
                Ok(link)
            }
            Ok(Reply::Refused { reason }) => Err(format!("the lease service refused: {reason}")),
            Ok(other) => Err(format!("the lease service answered {other:?} to a hello")),
            Err(e) => Err(format!("the lease service did not welcome us: {e:?}")),
        }
    }

    /// The node the agent serves (the node its credential is bound to).
    pub fn node(&self) -> &str {
        &self.node
    }

    fn call(&mut self, req: &Request, wait: Duration) -> Result<Reply, Gone> {
        let wait = wait.max(Duration::from_millis(1));
        self.stream
            .set_write_timeout(Some(wait))
            .and_then(|()| self.stream.set_read_timeout(Some(wait)))
            .map_err(Gone::Unsent)?;
        write_frame(&mut self.stream, req).map_err(Gone::Unsent)?;
        match read_frame::<Reply>(&mut self.stream, MAX_REPLY) {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(Gone::Unanswered("the agent closed the connection".into())),
            Err(e) => Err(Gone::Unanswered(e.to_string())),
        }
    }
}

/// Connect without waiting: an agent that is alive but not accepting (stopped, frozen, its
/// backlog full) makes a blocking connect wait with no limit, where the plugin must go on
/// directly at once.
fn connect_now(path: &Path) -> io::Result<UnixStream> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // A unix socket connects at once or fails (EAGAIN: its backlog is full); it never waits.
    connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// The identity of the store `settings` open, as the agent compares it.
pub fn identity(settings: &KubeSettings) -> StoreIdentity {
    StoreIdentity {
        kubeconfig: settings.kubeconfig.clone(),
        api_root: settings.api_root.clone(),
        list_from_cache: settings.list_from_cache,
        page_size: settings.page_size,
        group: settings.group.clone(),
        node: settings.node.clone(),
    }
}

/// The direct path a [`ServedStore`] falls back to: the Kubernetes store (a fake in tests).
pub trait Direct: LeaseStore {
    /// `node`'s records of `network` (the journal's rebuild).
    fn node_records(&self, network: &str, node: &str) -> Result<Vec<Lease>, StoreError>;
    /// API requests sent so far.
    fn api_requests(&self) -> u64;
}

impl Direct for KubeStore {
    fn node_records(&self, network: &str, node: &str) -> Result<Vec<Lease>, StoreError> {
        Ok(self.list_network_node(network, node, Kinds::Domain)?)
    }
    fn api_requests(&self) -> u64 {
        self.requests().total()
    }
}

/// Connects the direct path with the time left.
type Connect<D> = Box<dyn Fn(Duration) -> Result<D, StoreError> + Send + Sync>;

/// The cluster lease store of one CNI call; see the module docs.
pub struct ServedStore<D: Direct = KubeStore> {
    link: Mutex<Option<AgentConnection>>,
    direct: OnceLock<D>,
    connect: Connect<D>,
    journal: FileJournal,
    node: String,
    deadline: Instant,
    served: AtomicU64,
}

impl<D: Direct> std::fmt::Debug for ServedStore<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedStore")
            .field("node", &self.node)
            .field("journal", &self.journal)
            .finish()
    }
}

/// The store behind one request of a [`ServedStore`].
// Lives for one request.
#[allow(clippy::large_enum_variant)]
enum Via<'a, D> {
    Agent(Reply),
    Direct(&'a D),
    /// The agent took the request and vanished: it may have been done.
    Redo(&'a D),
}

fn failed(message: String, transient: bool) -> StoreError {
    StoreError::Backend(BackendFailure::new(message, transient))
}

impl ServedStore<KubeStore> {
    /// Through `link`, for a call with `settings` whose budget started at `started` (before the
    /// link was opened); directly with the same settings and what is left of the budget. Needs
    /// the node journal's directory ([`KubeSettings::journal_dir`]).
    pub fn new(
        link: AgentConnection,
        settings: KubeSettings,
        started: Instant,
    ) -> Result<ServedStore, StoreError> {
        let dir = settings.journal_dir.clone().ok_or_else(|| {
            StoreError::Invalid("the lease service needs the node journal's directory".into())
        })?;
        let deadline = started + settings.timeout;
        let connect: Connect<KubeStore> = Box::new(move |left| {
            let mut s = settings.clone();
            s.timeout = left;
            KubeStore::connect(s).map_err(StoreError::from)
        });
        Ok(ServedStore::with_direct(
            link,
            FileJournal::new(dir),
            deadline,
            connect,
        ))
    }
}

impl<D: Direct> ServedStore<D> {
    /// Through `link`, with `journal`, until `deadline`; `connect` opens the direct path.
    pub fn with_direct(
        link: AgentConnection,
        journal: FileJournal,
        deadline: Instant,
        connect: Connect<D>,
    ) -> ServedStore<D> {
        ServedStore {
            node: link.node.clone(),
            link: Mutex::new(Some(link)),
            direct: OnceLock::new(),
            connect,
            deadline,
            journal,
            served: AtomicU64::new(0),
        }
    }

    /// The node the leases name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Requests the agent answered, and whether the call went direct (and how many requests it
    /// sent then).
    pub fn traffic(&self) -> (u64, Option<u64>) {
        (
            self.served.load(Ordering::Relaxed),
            self.direct.get().map(Direct::api_requests),
        )
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// The direct store, connected on first need with what is left of the budget.
    fn direct(&self) -> Result<&D, StoreError> {
        if let Some(k) = self.direct.get() {
            return Ok(k);
        }
        let k = (self.connect)(self.remaining().max(Duration::from_millis(1)))?;
        let _ = self.direct.set(k);
        Ok(self.direct.get().expect("set just above"))
    }

    /// Send `req` to the agent while it answers; the direct store once it does not.
    fn via(&self, req: &Request) -> Result<Via<'_, D>, StoreError> {
        let mut guard = self.link.lock().unwrap_or_else(|p| p.into_inner());
        let Some(link) = guard.as_mut() else {
            drop(guard);
            return Ok(Via::Direct(self.direct()?));
        };
        let outcome = link.call(req, ANSWER_WAIT.min(self.remaining()));
        let redo = match outcome {
            // Stopping, or not ready: it did nothing.
            Ok(Reply::Refused { reason }) => {
                log::info!("the lease service refused a request ({reason}); going on directly");
                false
            }
            // The API server was slow or unavailable for the agent: try it directly while the
            // budget lasts, as the direct path would have (the request may have been done).
            Ok(Reply::Failed {
                message,
                transient: true,
            }) => {
                log::warn!("through the node-agent: {message}; going on directly");
                true
            }
            Ok(reply) => {
                self.served.fetch_add(1, Ordering::Relaxed);
                return Ok(Via::Agent(reply));
            }
            Err(Gone::Unsent(e)) => {
                log::warn!("the lease service went away ({e}); going on directly");
                false
            }
            Err(Gone::Unanswered(e)) => {
                log::warn!(
                    "the lease service did not answer ({e}); going on directly, its last request sent again"
                );
                true
            }
        };
        *guard = None;
        drop(guard);
        let direct = self.direct()?;
        Ok(if redo {
            Via::Redo(direct)
        } else {
            Via::Direct(direct)
        })
    }

    /// This node's records of `network` (the journal's rebuild).
    fn list_node(&self, network: &str) -> Result<Vec<Lease>, StoreError> {
        let req = Request::ListNode {
            network: network.to_string(),
        };
        match self.via(&req)? {
            Via::Agent(Reply::Records { leases }) => Ok(leases),
            Via::Agent(other) => Err(unexpected(other)),
            Via::Direct(k) | Via::Redo(k) => k.node_records(network, &self.node),
        }
    }
}

/// A reply of the wrong kind, or the API's failure as the agent reported it.
fn unexpected(r: Reply) -> StoreError {
    match r {
        Reply::Failed { message, transient } => failed(message, transient),
        other => failed(
            format!("the lease service answered out of turn: {other:?}"),
            true,
        ),
    }
}

/// Is `current` exactly the record a write of `new` makes (its version aside)?
fn is_written(current: &Lease, new: &Lease) -> bool {
    Lease {
        version: None,
        ..current.clone()
    } == Lease {
        version: None,
        ..new.clone()
    }
}

impl<D: Direct> LeaseStore for ServedStore<D> {
    fn list(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        let req = Request::List {
            scope: scope.clone(),
        };
        match self.via(&req)? {
            Via::Agent(Reply::Records { leases }) => Ok(leases),
            Via::Agent(other) => Err(unexpected(other)),
            Via::Direct(k) | Via::Redo(k) => k.list(scope),
        }
    }

    fn get(&self, scope: &Scope, address: IpAddr) -> Result<Option<Lease>, StoreError> {
        let req = Request::Get {
            scope: scope.clone(),
            address,
        };
        match self.via(&req)? {
            Via::Agent(Reply::Record { lease }) => Ok(lease),
            Via::Agent(other) => Err(unexpected(other)),
            Via::Direct(k) | Via::Redo(k) => k.get(scope, address),
        }
    }

    fn index(&self) -> Option<&dyn AttachmentIndex> {
        Some(self)
    }

    fn by_pod(&self, scope: &Scope, pod: &PodRef) -> Result<Option<Vec<Lease>>, StoreError> {
        let req = Request::ByPod {
            scope: scope.clone(),
            pod: pod.clone(),
        };
        match self.via(&req)? {
            Via::Agent(Reply::Records { leases }) => Ok(Some(leases)),
            Via::Agent(other) => Err(unexpected(other)),
            Via::Direct(k) | Via::Redo(k) => k.by_pod(scope, pod),
        }
    }

    /// This node's records of the network in its domain.
    fn list_mine(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        Ok(self
            .list_node(&scope.network)?
            .into_iter()
            .filter(|l| l.in_domain(scope.domain.as_deref()) && naming_of(l) == Naming::Domain)
            .collect())
    }

    fn claim(&self, new: Lease, expected: Option<&Lease>) -> CasResult<Lease> {
        validate_claim(&new, expected)?;
        let req = Request::Claim {
            new: new.clone(),
            expected: expected.cloned(),
        };
        match self.via(&req)? {
            Via::Agent(Reply::Written { lease }) => Ok(Ok(lease)),
            Via::Agent(Reply::Taken { current }) => Ok(Err(Taken { current })),
            Via::Agent(other) => Err(unexpected(other)),
            Via::Direct(k) => k.claim(new, expected),
            // Done by the agent already if the store now holds exactly this record.
            Via::Redo(k) => Ok(match k.claim(new.clone(), expected)? {
                Err(Taken { current: Some(c) }) if is_written(&c, &new) => Ok(c),
                other => other,
            }),
        }
    }

    fn remove(&self, expected: &Lease) -> CasResult<()> {
        let req = Request::Remove {
            expected: expected.clone(),
        };
        match self.via(&req)? {
            Via::Agent(Reply::Removed) => Ok(Ok(())),
            Via::Agent(Reply::Taken { current }) => Ok(Err(Taken { current })),
            Via::Agent(other) => Err(unexpected(other)),
            Via::Direct(k) => k.remove(expected),
            // Gone: the agent's DELETE was done (or someone's; either way nothing is left).
            Via::Redo(k) => Ok(match k.remove(expected)? {
                Err(Taken { current: None }) => Ok(()),
                other => other,
            }),
        }
    }
}

/// The node journal, made authoritative for a network first: its rebuild lists this node's
/// records through the agent (from its watch, no API request) or directly.
impl<D: Direct> JournalBacked for ServedStore<D> {
    fn journal_for(&self, network: &str) -> Result<&FileJournal, StoreError> {
        if !self.journal.is_complete(network) {
            self.journal.rebuild(network, || self.list_node(network))?;
        }
        Ok(&self.journal)
    }
}

/// Open the lease service for `settings` if one answers at `socket`: `None` (logged at debug)
/// means the direct path.
pub fn open_served(socket: &Path, settings: &KubeSettings) -> Option<ServedStore> {
    // The call's budget includes the hello.
    let started = Instant::now();
    let link = match AgentConnection::open(socket, &identity(settings), WELCOME_WAIT) {
        Ok(l) => l,
        Err(why) => {
            log::debug!("not through the node-agent: {why}");
            return None;
        }
    };
    match ServedStore::new(link, settings.clone(), started) {
        Ok(s) => Some(s),
        Err(e) => {
            log::debug!("not through the node-agent: {e}");
            None
        }
    }
}
