//! The node-agent's lease service on the real API server, with the plugin as a runtime runs it:
//! ADD, CHECK and DEL through it as the node's own credential; the node scope still enforced by the
//! API server for what it sends; a config naming another store not served; and the plugin going
//! on directly, with no failed ADD and no address given twice, when the service stops or is
//! killed while ADDs run.

mod reconcile_support;

use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use reconcile_support::*;
use serde_json::{Value, json};
use tether_lease_client::protocol::{
    MAX_REPLY, MAX_REQUEST, PROTOCOL, Reply, Request, StoreIdentity, read_frame, write_frame,
};
use tether_lease_service::{LeaseService, ServiceOptions};
use tether_leases::{Lease, LeaseState, PodRef};

fn conf(network: &str) -> Value {
    json!({"cniVersion": "1.0.0", "name": network, "type": "tether-ipvlan", "master": "lo",
           "ipam": {"type": "tether-ipam", "range": "10.91.0.0/16", "probe": false,
                    "isolated_fabric": fabric_of(network), "store": "kubernetes"}})
}

/// A service for `node` on a socket in its directory.
fn service(node: &Node) -> (LeaseService, PathBuf) {
    let socket = node.dir.join("run/leases.sock");
    let opts = ServiceOptions::new(socket.clone(), node.kubeconfig.clone(), None);
    (LeaseService::start(opts).unwrap(), socket)
}

fn leased_to(env: &Env, network: &str, addr: &str) -> Option<(LeaseState, Option<String>)> {
    env.leases(network)
        .into_iter()
        .find(|l| l.address.to_string() == addr)
        .map(|l| (l.state, l.node))
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn add_check_and_del_go_through_the_service_as_the_nodes_own_credential() {
    let env = Env::real("svc");
    let n = node(&env, "svc-a");
    let net = env.name("svc-net");
    let (svc, socket) = service(&n);
    let c = conf(net);

    let (code, r) = call_through(&n, Some(&socket), "ADD", "p0", "s0", &c);
    assert_eq!(code, 0, "{r}");
    let addr = first_address(&r);
    assert_eq!(
        leased_to(&env, net, &addr),
        Some((LeaseState::Leased, Some(n.name.to_string()))),
        "the lease names the node the credential is bound to, not the NODE_NAME that lies"
    );
    let st = svc.stats();
    assert_eq!(st.welcomed.load(Ordering::Relaxed), 1);
    assert!(
        svc.keeps(net, Duration::ZERO),
        "the network is kept by a watch now"
    );
    // The node's first ADD in the network: the journal's rebuild and the pod's records came from
    // the network's list (one LIST and one WATCH for the node, not per ADD), the address from
    // one CREATE.
    let api = svc.api_requests();
    assert_eq!((api.create, api.get), (1, 0), "{api:?}");
    assert!(api.list <= 2, "the network's LIST and its WATCH: {api:?}");
    assert!(
        st.from_cache.load(Ordering::Relaxed) >= 2,
        "the journal's rebuild and the pod's records answered from memory"
    );
    // A second pod: one request.
    let before = svc.api_requests();
    let (code, r1) = call_through(&n, Some(&socket), "ADD", "p9", "s9", &c);
    assert_eq!(code, 0, "{r1}");
    assert_eq!(
        (svc.api_requests() - before).total(),
        1,
        "a free address: one CREATE"
    );

    let mut check = c.clone();
    check["prevResult"] = r.clone();
    let (code, out) = call_through(&n, Some(&socket), "CHECK", "p0", "s0", &check);
    assert_eq!(code, 0, "{out}");
    let (code, out) = call_through(&n, Some(&socket), "DEL", "p0", "s0", &c);
    assert_eq!(code, 0, "{out}");
    assert!(matches!(
        leased_to(&env, net, &addr),
        Some((LeaseState::Released { .. }, _))
    ));
    assert_eq!(
        st.welcomed.load(Ordering::Relaxed),
        4,
        "two ADDs, CHECK and DEL"
    );
    // The same pod back: its address (sticky), through the service.
    let (code, again) = call_through(&n, Some(&socket), "ADD", "p0", "s1", &c);
    assert_eq!((code, first_address(&again)), (0, addr.clone()), "{again}");

    // Stopped: the socket is gone, the plugin goes straight to the API server.
    svc.stop(Duration::from_secs(2));
    assert!(!socket.exists());
    let (code, r2) = call_through(&n, Some(&socket), "ADD", "p1", "s2", &c);
    assert_eq!(code, 0, "{r2}");
    assert_ne!(first_address(&r2), addr);
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn another_store_is_not_served_and_the_node_scope_holds_through_the_service() {
    let env = Env::real("svc-scope");
    let n = node(&env, "svc-b");
    let net = env.name("svc-scope-net");
    let (svc, socket) = service(&n);

    // The same credential under another path is another store to the service: direct.
    let copy = n.dir.join("copy.kubeconfig");
    std::fs::copy(&n.kubeconfig, &copy).unwrap();
    let mut c = conf(net);
    c["ipam"]["kubernetes"] = json!({"kubeconfig": copy});
    let (code, r) = run_ipam(
        &ipam_bin(),
        &[
            ("CNI_COMMAND", "ADD".to_string()),
            ("CNI_CONTAINERID", "ctr-other".to_string()),
            ("CNI_NETNS", "/run/netns/unused".to_string()),
            ("CNI_IFNAME", "net1".to_string()),
            ("TETHER_LEASE_SOCKET", socket.display().to_string()),
        ],
        &json!({"cniVersion": "1.0.0", "name": net, "type": "tether-ipam",
                "ipam": {"type": "tether-ipam", "range": "10.92.0.0/16", "probe": false,
                         "isolated_fabric": fabric_of(net),
                         "dataDir": n.dir.join("other"), "kubernetes": {"kubeconfig": copy}}}),
    );
    assert_eq!(code, 0, "{r}");
    let st = svc.stats();
    assert_eq!(st.welcomed.load(Ordering::Relaxed), 0);
    assert_eq!(st.refused.load(Ordering::Relaxed), 1);

    // A root client that asks the service to lease an address to another node: the API server
    // refuses the node's credential, through the service as without it.
    let mut s = UnixStream::connect(&socket).unwrap();
    let store = StoreIdentity {
        kubeconfig: Some(n.kubeconfig.clone()),
        api_root: None,
        list_from_cache: true,
        page_size: 500,
        group: "ipam.tether.dev".into(),
        // The credential names the node: the plugin's own idea of it is not asked.
        node: None,
    };
    write_frame(
        &mut s,
        &Request::Hello {
            protocol: PROTOCOL,
            store,
        },
    )
    .unwrap();
    let welcome: Reply = read_frame(&mut s, MAX_REPLY).unwrap().unwrap();
    assert!(
        matches!(welcome, Reply::Welcome { ref node } if node == n.name),
        "{welcome:?}"
    );
    let stolen = Lease {
        network: net.to_string(),
        domain: Some(fabric_of(net)),
        address: "10.91.0.9".parse().unwrap(),
        prefix_len: 16,
        range_index: Some(0),
        container_id: "ctr-forged".into(),
        ifname: "net1".into(),
        pod: PodRef::default(),
        node: Some("another-node".into()),
        state: LeaseState::Leased,
        since: now(),
        version: None,
    };
    write_frame(
        &mut s,
        &Request::Claim {
            new: stolen,
            expected: None,
        },
    )
    .unwrap();
    let answer: Reply = read_frame(&mut s, MAX_REPLY).unwrap().unwrap();
    match answer {
        Reply::Failed { message, transient } => {
            assert!(!transient, "{message}");
            assert!(
                message.contains("another-node") || message.contains("node"),
                "{message}"
            );
        }
        other => panic!("the policy must refuse another node's lease: {other:?}"),
    }
    assert!(leased_to(&env, net, "10.91.0.9").is_none());
}

/// `tether lease-service` in a process of its own (it can then be killed).
fn service_process(node: &Node, socket: &Path) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["lease-service", "--kubeconfig"])
        .arg(&node.kubeconfig)
        .arg("--socket")
        .arg(socket)
        .env_clear()
        .spawn()
        .unwrap();
    let up = wait_until(Duration::from_secs(20), || socket.exists());
    assert!(up.is_some(), "the service listens");
    child
}

/// Between the plugins and the service: frames pass both ways, except the service's answer to a
/// claim once [`ClaimAnswers::hold`] is on. That answer is kept back (the claim itself is done:
/// the service has written the lease) and counted, and the plugin's connection is closed when
/// [`ClaimAnswers::cut`] says so, as a service killed before it could answer would leave it.
struct ClaimAnswers {
    socket: PathBuf,
    holding: Arc<AtomicBool>,
    held: Arc<AtomicUsize>,
    cut: Arc<AtomicBool>,
}

impl ClaimAnswers {
    fn start(service: &Path, socket: PathBuf) -> ClaimAnswers {
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).unwrap();
        let me = ClaimAnswers {
            socket,
            holding: Arc::default(),
            held: Arc::default(),
            cut: Arc::default(),
        };
        let (holding, held, cut) = (me.holding.clone(), me.held.clone(), me.cut.clone());
        let service = service.to_path_buf();
        std::thread::spawn(move || {
            for plugin in listener.incoming().flatten() {
                let Ok(agent) = UnixStream::connect(&service) else {
                    continue;
                };
                let gates = (holding.clone(), held.clone(), cut.clone());
                std::thread::spawn(move || relay(plugin, agent, gates));
            }
        });
        me
    }

    fn hold(&self) {
        self.holding.store(true, Ordering::SeqCst);
    }

    fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

/// One plugin's connection: requests to the agent as they come; each answer back, unless it
/// answers a claim while holding (see [`ClaimAnswers`]).
fn relay(
    plugin: UnixStream,
    agent: UnixStream,
    (holding, held, cut): (Arc<AtomicBool>, Arc<AtomicUsize>, Arc<AtomicBool>),
) {
    let (Ok(mut from_plugin), Ok(mut to_agent)) = (plugin.try_clone(), agent.try_clone()) else {
        return;
    };
    let (kinds, answered) = std::sync::mpsc::channel::<bool>();
    std::thread::spawn(move || {
        while let Ok(Some(req)) = read_frame::<Request>(&mut from_plugin, MAX_REQUEST) {
            let _ = kinds.send(matches!(req, Request::Claim { .. }));
            if write_frame(&mut to_agent, &req).is_err() {
                break;
            }
        }
    });
    let (mut from_agent, mut to_plugin) = (agent, plugin);
    while let Ok(Some(reply)) = read_frame::<Reply>(&mut from_agent, MAX_REPLY) {
        let is_claim = answered.recv().unwrap_or(false);
        if is_claim && holding.load(Ordering::SeqCst) {
            held.fetch_add(1, Ordering::SeqCst);
            while !cut.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            break;
        }
        if write_frame(&mut to_plugin, &reply).is_err() {
            break;
        }
    }
    let _ = to_plugin.shutdown(Shutdown::Both);
}

/// 24 ADDs of round `round`, all at once; the ADD results in order.
fn adds(n: &Node, socket: &Path, round: usize, c: &Value) -> Vec<(i32, Value)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..24)
            .map(|k| {
                s.spawn(move || {
                    let (pod, sandbox) = (format!("r{round}-p{k}"), format!("r{round}-s{k}"));
                    call_through(n, Some(socket), "ADD", &pod, &sandbox, c)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Every ADD of the round succeeded with an address of its own, and each is one Leased record of
/// the pod that got it.
fn each_once(env: &Env, net: &str, round: usize, results: &[(i32, Value)]) {
    let mut addrs = std::collections::HashSet::new();
    for (code, r) in results {
        assert_eq!(*code, 0, "round {round}: {r}");
        assert!(
            addrs.insert(first_address(r)),
            "round {round}: an address given twice"
        );
    }
    let mine: Vec<_> = env
        .leases(net)
        .into_iter()
        .filter(|l| l.container_id.starts_with(&format!("ctr-r{round}-")))
        .collect();
    assert_eq!(
        mine.len(),
        results.len(),
        "round {round}: one record per ADD"
    );
    for l in &mine {
        assert!(
            l.is_leased() && addrs.contains(&l.address.to_string()),
            "{l:?}"
        );
    }
}

/// Killed with every ADD in the middle: each plugin's claim is done by the service (the lease is
/// written) and its answer not yet back when SIGKILL lands. Each plugin then goes on directly,
/// sending its claim again, and must find what the service wrote: no failed ADD, no address
/// twice, no second record. Then stopped (SIGTERM) while ADDs run: it finishes what is on its
/// way, refuses the rest, exits cleanly and removes its socket.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn adds_running_while_the_service_stops_or_is_killed_all_succeed_once() {
    let env = Env::real("svc-kill");
    let n = node(&env, "svc-c");
    let net = env.name("svc-kill-net");
    let socket = n.dir.join("run/leases.sock");
    let c = conf(net);

    // Round 0: SIGKILL with 24 claims done and unanswered.
    let mut svc = service_process(&n, &socket);
    let relay = ClaimAnswers::start(&socket, n.dir.join("run/relay.sock"));
    relay.hold();
    let results = std::thread::scope(|s| {
        let running = s.spawn(|| adds(&n, &relay.socket, 0, &c));
        let all_held = wait_until(Duration::from_secs(60), || relay.held() == 24);
        assert!(
            all_held.is_some(),
            "{} of 24 claims reached the service",
            relay.held()
        );
        svc.kill().unwrap();
        let status = svc.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        relay.cut();
        running.join().unwrap()
    });
    each_once(&env, net, 0, &results);
    let _ = std::fs::remove_file(&socket);

    // Round 1: SIGTERM while ADDs run.
    let svc = service_process(&n, &socket);
    let results = std::thread::scope(|s| {
        let running = s.spawn(|| adds(&n, &socket, 1, &c));
        // SAFETY: a plain kill(2) of our own child.
        unsafe { libc::kill(svc.id() as i32, libc::SIGTERM) };
        let status = svc.wait_with_output().unwrap().status;
        assert!(
            status.success(),
            "a stopped service exits cleanly: {status:?}"
        );
        running.join().unwrap()
    });
    each_once(&env, net, 1, &results);
    assert!(!socket.exists(), "a stopped service removes its socket");
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn returning_pods_at_once_each_get_their_address_back_from_memory() {
    let env = Env::real("svc-batch");
    let n = node(&env, "svc-d");
    let net = env.name("svc-batch-net");
    let (svc, socket) = service(&n);
    let c = conf(net);
    let pods = 16;
    let call = |verb: &str, k: usize, sandbox: &str| {
        let (code, r) = call_through(
            &n,
            Some(&socket),
            verb,
            &format!("p{k}"),
            &format!("{sandbox}{k}"),
            &c,
        );
        assert_eq!(code, 0, "{verb} p{k}: {r}");
        r
    };
    // Each pod gets an address and lets it go (Released, kept for it).
    let first: Vec<String> = (0..pods)
        .map(|k| {
            let r = call("ADD", k, "a");
            call("DEL", k, "a");
            first_address(&r)
        })
        .collect();
    let (api, cached) = (
        svc.api_requests(),
        svc.stats().from_cache.load(Ordering::Relaxed),
    );
    // The same pods come back all at once, as new sandboxes: each finds its record in the
    // network's kept records (no pod-label LIST, which costs the API server a scan of every
    // record of the group) and takes it back with one UPDATE.
    let again: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..pods)
            .map(|k| s.spawn(move || first_address(&call("ADD", k, "b"))))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(again, first, "every pod its own address back");
    let sent = svc.api_requests() - api;
    eprintln!("{pods} returning pods at once: {sent:?}");
    assert_eq!(sent.list, 0, "no LIST for a returning pod: {sent:?}");
    assert_eq!(
        (sent.update, sent.create, sent.total()),
        (pods as u64, 0, pods as u64),
        "one UPDATE each, nothing else: {sent:?}"
    );
    let from_memory = svc.stats().from_cache.load(Ordering::Relaxed) - cached;
    assert!(
        from_memory >= pods as u64,
        "each pod's lookup answered from memory: {from_memory} answers"
    );
}
