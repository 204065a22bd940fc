//! The node-agent's lease service on the real API server, with the plugin as a runtime runs it:
//! ADD, CHECK and DEL through it as the node's own credential; the node scope still enforced by the
//! API server for what it sends; a config naming another store not served; and the plugin going
//! on directly, with no failed ADD and no address given twice, when the service stops or is
//! killed while ADDs run.

mod reconcile_support;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::Ordering;
use std::time::Duration;

use reconcile_support::*;
use serde_json::{Value, json};
use tether_lease_client::protocol::{
    MAX_REPLY, PROTOCOL, Reply, Request, StoreIdentity, read_frame, write_frame,
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

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn adds_running_while_the_service_stops_or_is_killed_all_succeed_once() {
    let env = Env::real("svc-kill");
    let n = node(&env, "svc-c");
    let net = env.name("svc-kill-net");
    let socket = n.dir.join("run/leases.sock");
    // Killed (SIGKILL: mid-request for some), then stopped (SIGTERM: refusing what is asked).
    for (round, signal) in [(0, libc::SIGKILL), (1, libc::SIGTERM)] {
        // Each call logs (debug) how many requests went through the service and how many direct.
        let log = n.dir.join(format!("round{round}.log"));
        let mut c = conf(net);
        c["ipam"]["log_level"] = json!("debug");
        c["ipam"]["log_file"] = json!(log);
        let mut svc = service_process(&n, &socket);
        std::thread::sleep(Duration::from_millis(500));
        // The signal goes as soon as the first ADD is done: the others are on their way.
        let done = std::sync::atomic::AtomicUsize::new(0);
        let results: Vec<(i32, Value)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..24)
                .map(|k| {
                    let (n, c, socket, done) = (&n, &c, &socket, &done);
                    s.spawn(move || {
                        let r = call_through(
                            n,
                            Some(socket),
                            "ADD",
                            &format!("r{round}-p{k}"),
                            &format!("r{round}-s{k}"),
                            c,
                        );
                        done.fetch_add(1, Ordering::SeqCst);
                        r
                    })
                })
                .collect();
            let first = wait_until(Duration::from_secs(30), || done.load(Ordering::SeqCst) > 0);
            assert!(first.is_some(), "no ADD finished");
            // SAFETY: a plain kill(2) of our own child.
            unsafe { libc::kill(svc.id() as i32, signal) };
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let _ = svc.wait();
        let mut addrs = std::collections::HashSet::new();
        for (code, r) in &results {
            assert_eq!(*code, 0, "round {round}: {r}");
            assert!(
                addrs.insert(first_address(r)),
                "round {round}: an address given twice"
            );
        }
        // Every address is one Leased record of the pod that got it, and only those.
        let mine: Vec<_> = env
            .leases(net)
            .into_iter()
            .filter(|l| l.container_id.starts_with(&format!("ctr-r{round}-")))
            .collect();
        assert_eq!(mine.len(), 24, "round {round}: one record per ADD");
        for l in &mine {
            assert!(
                l.is_leased() && addrs.contains(&l.address.to_string()),
                "{l:?}"
            );
        }
        // Some calls were served before the signal, some went direct after it (or in the middle).
        let text = std::fs::read_to_string(&log).unwrap();
        let served = text
            .lines()
            // The call's closing line, not "not through the node-agent" (a call that went direct).
            .filter(|l| l.contains("request(s) through the node-agent") && !l.contains("directly"))
            .count();
        let direct = text
            .lines()
            .filter(|l| l.contains("API request(s)"))
            .count();
        let midway = text
            .lines()
            .filter(|l| l.contains("going on directly"))
            .count();
        eprintln!(
            "round {round} (signal {signal}): {served} calls through the service, {direct} direct or \
             finished directly, {midway} switched in the middle of a call"
        );
        assert!(
            served >= 1,
            "round {round}: the first ADD went through the service"
        );
        // SIGKILL cuts calls off in the middle; SIGTERM lets what is on its way finish (what a
        // stopping service refuses is the client tests' case), and the socket is gone after.
        if signal == libc::SIGKILL {
            assert!(
                midway >= 1,
                "no call was cut off in the middle: the round proves nothing"
            );
        } else {
            assert!(!socket.exists(), "a stopped service removes its socket");
        }
        assert_eq!(served + direct, 24, "every call accounted for once");
        let _ = std::fs::remove_file(&socket);
    }
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
