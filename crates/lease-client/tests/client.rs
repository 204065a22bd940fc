//! The plugin's side against a scripted agent on a real unix socket, with a node-local file store
//! standing for the API server (the agent and the direct path write the same records): which
//! path each request takes, and that a write whose answer was lost with the agent is not done
//! twice. No root needed but for the ownership checks (the suites run as root).

use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tether_lease_client::client::{AgentConnection, Direct, ServedStore};
use tether_lease_client::protocol::{
    MAX_REQUEST, PROTOCOL, Reply, Request, StoreIdentity, read_frame, write_frame,
};
use tether_leases::{
    CasResult, FileJournal, FileStore, Lease, LeaseState, LeaseStore, PodRef, Scope, StoreError,
    Taken,
};

const NET: &str = "mgmt";
const NODE: &str = "gpu-1";

/// A directory of this test's, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let p =
            std::env::temp_dir().join(format!("tether-lease-client-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::DirBuilder::new().mode(0o700).create(&p).unwrap();
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The "API server": a file store both sides write.
#[derive(Clone)]
struct Backend(Arc<FileStore>);

/// The direct path over the backend, counting its requests.
struct FakeDirect {
    backend: Backend,
    requests: AtomicU64,
}

impl LeaseStore for FakeDirect {
    fn list(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.backend.0.list(scope)
    }
    fn claim(&self, new: Lease, expected: Option<&Lease>) -> CasResult<Lease> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.backend.0.claim(new, expected)
    }
    fn remove(&self, expected: &Lease) -> CasResult<()> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.backend.0.remove(expected)
    }
}

impl Direct for FakeDirect {
    fn node_records(&self, network: &str, node: &str) -> Result<Vec<Lease>, StoreError> {
        Ok(self
            .list(&Scope::cluster(network))?
            .into_iter()
            .filter(|l| l.node.as_deref() == Some(node))
            .collect())
    }
    fn api_requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

/// What the scripted agent does with a request.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Do it on the backend and answer.
    Serve,
    /// Do it, then hang up without answering (killed mid-request).
    DoAndVanish,
    /// Do it, then answer that the API timed out (it may have been done).
    DoAndTimeOut,
    /// Answer that it is stopping; do nothing.
    Refuse,
    /// Answer a permanent failure (403); do nothing.
    Forbid,
}

fn lease(addr: &str, cid: &str) -> Lease {
    Lease {
        network: NET.into(),
        domain: None,
        address: addr.parse().unwrap(),
        prefix_len: 24,
        range_index: Some(0),
        container_id: cid.into(),
        ifname: "net1".into(),
        pod: PodRef::new("ns", cid, "u"),
        node: Some(NODE.into()),
        state: LeaseState::Leased,
        since: 1_700_000_000,
        version: None,
    }
}

fn identity() -> StoreIdentity {
    StoreIdentity {
        kubeconfig: Some("/etc/cni/net.d/tether.d/tether.kubeconfig".into()),
        api_root: None,
        list_from_cache: true,
        page_size: 500,
        group: "ipam.tether.dev".into(),
        node: Some(NODE.into()),
    }
}

/// The reply the backend gives to `req`.
fn serve(b: &Backend, req: Request) -> Reply {
    let fail = |e: StoreError| Reply::Failed {
        transient: e.is_transient(),
        message: e.to_string(),
    };
    match req {
        Request::Get { scope, address } => match b.0.get(&scope, address) {
            Ok(lease) => Reply::Record { lease },
            Err(e) => fail(e),
        },
        Request::Claim { new, expected } => match b.0.claim(new, expected.as_ref()) {
            Ok(Ok(lease)) => Reply::Written { lease },
            Ok(Err(Taken { current })) => Reply::Taken { current },
            Err(e) => fail(e),
        },
        Request::Remove { expected } => match b.0.remove(&expected) {
            Ok(Ok(())) => Reply::Removed,
            Ok(Err(Taken { current })) => Reply::Taken { current },
            Err(e) => fail(e),
        },
        Request::List { scope } => match b.0.list(&scope) {
            Ok(leases) => Reply::Records { leases },
            Err(e) => fail(e),
        },
        Request::ListNode { network } => match b.0.list(&Scope::cluster(network)) {
            Ok(leases) => Reply::Records {
                leases: leases
                    .into_iter()
                    .filter(|l| l.node.as_deref() == Some(NODE))
                    .collect(),
            },
            Err(e) => fail(e),
        },
        other => Reply::Refused {
            reason: format!("not scripted: {other:?}"),
        },
    }
}

/// An agent on `socket` that welcomes one connection and follows `script`, one step per request
/// (`Serve` after the script); returns how many requests it saw.
fn agent(socket: &Path, backend: Backend, script: Vec<Step>) -> JoinHandle<usize> {
    let listener = UnixListener::bind(socket).unwrap();
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let Some(Request::Hello { protocol, store }) =
            read_frame::<Request>(&mut s, MAX_REQUEST).unwrap()
        else {
            panic!("no hello");
        };
        assert_eq!((protocol, store), (PROTOCOL, identity()));
        write_frame(&mut s, &Reply::Welcome { node: NODE.into() }).unwrap();
        let mut seen = 0;
        while let Ok(Some(req)) = read_frame::<Request>(&mut s, MAX_REQUEST) {
            let step = script.get(seen).copied().unwrap_or(Step::Serve);
            seen += 1;
            let reply = match step {
                Step::Serve => serve(&backend, req),
                Step::DoAndVanish => {
                    serve(&backend, req);
                    return seen;
                }
                Step::DoAndTimeOut => {
                    serve(&backend, req);
                    Reply::Failed {
                        message: "the API server did not answer within 2.5 s".into(),
                        transient: true,
                    }
                }
                Step::Refuse => Reply::Refused {
                    reason: "the node-agent is stopping".into(),
                },
                Step::Forbid => Reply::Failed {
                    message: "forbidden".into(),
                    transient: false,
                },
            };
            write_frame(&mut s, &reply).unwrap();
        }
        seen
    })
}

/// A served store over `script`, its backend, how often the direct path was connected, and the
/// agent's thread.
struct Setup {
    _dir: Dir,
    store: ServedStore<FakeDirect>,
    backend: Backend,
    connects: Arc<AtomicUsize>,
    agent: JoinHandle<usize>,
}

fn setup(tag: &str, script: Vec<Step>) -> Setup {
    let dir = Dir::new(tag);
    let backend = Backend(Arc::new(FileStore::new(dir.0.join("backend"))));
    let socket = dir.0.join("leases.sock");
    let agent = agent(&socket, backend.clone(), script);
    let link = AgentConnection::open(&socket, &identity(), Duration::from_secs(2)).unwrap();
    let connects = Arc::new(AtomicUsize::new(0));
    let (b, c) = (backend.clone(), connects.clone());
    let store = ServedStore::with_direct(
        link,
        FileJournal::new(dir.0.join("journal")),
        std::time::Instant::now() + Duration::from_secs(10),
        Box::new(move |_left| {
            c.fetch_add(1, Ordering::Relaxed);
            Ok(FakeDirect {
                backend: b.clone(),
                requests: AtomicU64::new(0),
            })
        }),
    );
    Setup {
        _dir: dir,
        store,
        backend,
        connects,
        agent,
    }
}

impl Setup {
    fn records(&self) -> Vec<Lease> {
        self.backend.0.list(&Scope::cluster(NET)).unwrap()
    }
    /// Drop the store (its connection) and return how many requests the agent saw.
    fn agent_saw(self) -> usize {
        let Setup { store, agent, .. } = self;
        drop(store);
        agent.join().unwrap()
    }
}

fn ip(a: &str) -> IpAddr {
    a.parse().unwrap()
}

#[test]
fn an_answering_agent_serves_every_request_and_the_direct_path_is_never_opened() {
    let s = setup("served", vec![]);
    let got = s
        .store
        .claim(lease("10.0.0.5", "c1"), None)
        .unwrap()
        .unwrap();
    assert_eq!(
        s.store.get(&Scope::cluster(NET), ip("10.0.0.5")).unwrap(),
        Some(got.clone())
    );
    let lost = s.store.claim(lease("10.0.0.5", "c2"), None).unwrap();
    assert_eq!(
        lost,
        Err(Taken {
            current: Some(got.clone())
        })
    );
    assert_eq!(
        s.store.list_mine(&Scope::cluster(NET)).unwrap(),
        vec![got.clone()]
    );
    s.store.remove(&got).unwrap().unwrap();
    assert_eq!(s.connects.load(Ordering::Relaxed), 0);
    assert_eq!(s.store.traffic(), (5, None));
    assert!(s.records().is_empty());
    assert_eq!(s.agent_saw(), 5);
}

#[test]
fn a_create_whose_answer_was_lost_with_the_agent_is_not_done_twice() {
    let s = setup("lost-create", vec![Step::DoAndVanish]);
    let new = lease("10.0.0.7", "c1");
    let got = s
        .store
        .claim(new.clone(), None)
        .unwrap()
        .expect("the agent's create counts");
    assert_eq!(got.container_id, "c1");
    assert_eq!(s.records(), vec![got.clone()], "one record, the agent's");
    assert_eq!(s.connects.load(Ordering::Relaxed), 1, "direct from then on");
    // The rest of the call is direct.
    s.store.remove(&got).unwrap().unwrap();
    assert_eq!(s.store.traffic(), (0, Some(2)));
    assert_eq!(s.agent_saw(), 1);
}

#[test]
fn a_create_the_agent_reports_timed_out_is_redone_directly_without_a_duplicate() {
    let s = setup("timed-out", vec![Step::DoAndTimeOut]);
    let got = s
        .store
        .claim(lease("10.0.0.8", "c1"), None)
        .unwrap()
        .unwrap();
    assert_eq!(s.records(), vec![got]);
    assert_eq!(s.connects.load(Ordering::Relaxed), 1);
    // Another pod's record at the address is still a lost race, not a success.
    let other = s.store.claim(lease("10.0.0.8", "c9"), None).unwrap();
    assert!(matches!(other, Err(Taken { current: Some(l) }) if l.container_id == "c1"));
    assert_eq!(s.agent_saw(), 1);
}

#[test]
fn a_remove_whose_answer_was_lost_is_done() {
    let s = setup("lost-remove", vec![Step::Serve, Step::DoAndVanish]);
    let got = s
        .store
        .claim(lease("10.0.0.9", "c1"), None)
        .unwrap()
        .unwrap();
    assert_eq!(s.store.remove(&got).unwrap(), Ok(()));
    assert!(s.records().is_empty());
    assert_eq!(s.agent_saw(), 2);
}

#[test]
fn a_stopping_agent_did_nothing_and_the_call_goes_on_directly() {
    let s = setup("refused", vec![Step::Refuse]);
    let got = s
        .store
        .claim(lease("10.0.0.10", "c1"), None)
        .unwrap()
        .unwrap();
    assert_eq!(s.records(), vec![got]);
    assert_eq!(s.connects.load(Ordering::Relaxed), 1);
    assert_eq!(s.store.traffic(), (0, Some(1)));
    assert_eq!(s.agent_saw(), 1);
}

#[test]
fn a_permanent_failure_is_the_answer_not_a_reason_to_go_direct() {
    let s = setup("forbidden", vec![Step::Forbid]);
    let e = s.store.claim(lease("10.0.0.11", "c1"), None).unwrap_err();
    assert!(
        e.to_string().contains("forbidden") && !e.is_transient(),
        "{e}"
    );
    assert_eq!(s.connects.load(Ordering::Relaxed), 0);
    assert!(s.records().is_empty());
    assert_eq!(s.agent_saw(), 1);
}

#[test]
fn the_journal_is_rebuilt_from_the_agents_list_of_this_nodes_records() {
    use tether_leases::AttachmentIndex;
    let s = setup("journal", vec![]);
    s.backend
        .0
        .claim(lease("10.0.0.12", "c1"), None)
        .unwrap()
        .unwrap();
    let mut theirs = lease("10.0.0.13", "c2");
    theirs.node = Some("gpu-2".into());
    s.backend.0.claim(theirs, None).unwrap().unwrap();
    let found = s
        .store
        .lookup(NET, "c1", "net1", &PodRef::new("ns", "c1", "u"))
        .unwrap();
    assert_eq!(found.mine.map(|e| e.leases.len()), Some(1));
    assert!(
        s.store
            .lookup(NET, "c2", "net1", &PodRef::default())
            .unwrap()
            .mine
            .is_none(),
        "another node's record is not this node's to journal"
    );
    assert_eq!(s.connects.load(Ordering::Relaxed), 0);
    assert_eq!(
        s.agent_saw(),
        1,
        "one ListNode, then the journal is complete"
    );
}

#[test]
fn only_roots_socket_in_roots_directory_is_used() {
    let dir = Dir::new("trust");
    let socket = dir.0.join("leases.sock");
    let t = agent(
        &socket,
        Backend(Arc::new(FileStore::new(dir.0.join("b")))),
        vec![],
    );
    // A directory others may write: someone could have put the socket there.
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = AgentConnection::open(&socket, &identity(), Duration::from_secs(1)).unwrap_err();
    assert!(e.contains("writable by others"), "{e}");
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A socket of another user's.
    std::os::unix::fs::chown(&socket, Some(65534), None).unwrap();
    let e = AgentConnection::open(&socket, &identity(), Duration::from_secs(1)).unwrap_err();
    assert!(e.contains("no socket of root's"), "{e}");
    std::os::unix::fs::chown(&socket, Some(0), None).unwrap();
    // The real one is welcome.
    let l = AgentConnection::open(&socket, &identity(), Duration::from_secs(1)).unwrap();
    assert_eq!(l.node(), NODE);
    drop(l);
    assert_eq!(t.join().unwrap(), 0);
    // Nothing listening: no agent, no wait.
    let gone = AgentConnection::open(&socket, &identity(), Duration::from_secs(1)).unwrap_err();
    assert!(gone.contains("connecting"), "{gone}");
}
