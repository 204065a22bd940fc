//! The service's own life, without an API server (it sends nothing until asked; its watch of
//! a network is started only when a plugin asks about one): the socket it makes, the one it leaves
//! alone, the workers that serve its connections.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use std::time::Duration;
use tether_kube_store::KubeSettings;

use tether_lease_client::client::{AgentConnection, identity};
use tether_lease_client::protocol::{MAX_REPLY, PROTOCOL, Reply, Request, read_frame, write_frame};
use tether_lease_service::{LeaseService, ServiceGauges, ServiceOptions};

fn dir(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("tether-lease-svc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::DirBuilder::new().mode(0o700).create(&p).unwrap();
    p
}

/// A kubeconfig for a server that is not there (nothing is asked of it here).
fn kubeconfig(d: &Path) -> PathBuf {
    let p = d.join("kubeconfig");
    std::fs::write(
        &p,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:9\n    insecure-skip-tls-verify: true\n\
         users:\n- name: u\n  user:\n    token: x\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
    )
    .unwrap();
    p
}

/// The settings of a plugin on node "gpu-1" whose store is `kc`'s.
fn on_gpu_1(kc: &Path) -> KubeSettings {
    let mut settings = KubeSettings::with_kubeconfig(kc);
    settings.node = Some("gpu-1".into());
    settings
}

/// A service for node "gpu-1" in `d` (its kubeconfig and socket there), its socket, and the
/// settings of a plugin on that node.
fn running(d: &Path) -> (LeaseService, PathBuf, KubeSettings) {
    let kc = kubeconfig(d);
    let socket = d.join("run/leases.sock");
    let opts = ServiceOptions::new(socket.clone(), kc.clone(), Some("gpu-1".into()));
    (LeaseService::start(opts).unwrap(), socket, on_gpu_1(&kc))
}

#[test]
fn the_socket_is_roots_alone_and_a_stopping_service_leaves_its_successors_socket() {
    let d = dir("succession");
    let kc = kubeconfig(&d);
    let socket = d.join("run/leases.sock");
    let opts = ServiceOptions::new(socket.clone(), kc.clone(), Some("gpu-1".into()));
    let old = LeaseService::start(opts.clone()).unwrap();
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let dir_mode = std::fs::metadata(d.join("run"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        dir_mode & 0o777,
        0o700,
        "a directory made for the socket is root's alone"
    );
    let settings = on_gpu_1(&kc);
    let link =
        AgentConnection::open(&socket, &identity(&settings), Duration::from_secs(2)).unwrap();
    assert_eq!(link.node(), "gpu-1");
    drop(link);

    // A new agent starts while the old one is still stopping (a roll with surge).
    let new = LeaseService::start(opts).unwrap();
    old.stop(Duration::from_secs(1));
    assert!(
        socket.exists(),
        "the old service left its successor's socket"
    );
    let link =
        AgentConnection::open(&socket, &identity(&settings), Duration::from_secs(2)).unwrap();
    assert_eq!(link.node(), "gpu-1", "and the successor answers on it");
    drop(link);
    new.stop(Duration::from_secs(1));
    assert!(
        !socket.exists(),
        "a stopped service takes its own socket away"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn connections_one_after_another_reuse_one_worker_and_at_once_get_one_each() {
    let d = dir("workers");
    let (svc, socket, settings) = running(&d);
    let open =
        || AgentConnection::open(&socket, &identity(&settings), Duration::from_secs(2)).unwrap();
    let workers = || {
        svc.stats()
            .workers
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    // One CNI call after another (each its own connection): the same worker takes them.
    for _ in 0..20 {
        drop(open());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(workers(), 1, "one worker for calls one after another");
    // Eight calls at once: eight connections served together.
    let links: Vec<AgentConnection> = (0..8).map(|_| open()).collect();
    assert_eq!(links.len(), 8);
    assert!(
        (8..=9).contains(&workers()),
        "{} workers for 8 calls at once",
        workers()
    );
    drop(links);
    svc.stop(Duration::from_secs(1));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn the_networks_asked_about_show_in_the_gauges_while_the_service_runs() {
    let d = dir("gauges");
    let kc = kubeconfig(&d);
    let socket = d.join("run/leases.sock");
    let gauges = ServiceGauges::default();
    let mut opts = ServiceOptions::new(socket.clone(), kc.clone(), Some("gpu-1".into()));
    opts.gauges = gauges.clone();
    let svc = LeaseService::start(opts).unwrap();
    assert!(gauges.networks().is_empty(), "nothing asked yet");
    let settings = on_gpu_1(&kc);
    let mut s = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let hello = Request::Hello {
        protocol: PROTOCOL,
        store: identity(&settings),
    };
    write_frame(&mut s, &hello).unwrap();
    let welcome: Reply = read_frame(&mut s, MAX_REPLY).unwrap().unwrap();
    assert!(matches!(welcome, Reply::Welcome { .. }), "{welcome:?}");
    // A question about network "mgmt": the service starts keeping it. Its API server is not
    // there, so the answer is a failure, and the network is not synced.
    let ask = Request::Get {
        scope: tether_leases::Scope::cluster("mgmt"),
        address: "10.0.0.1".parse().unwrap(),
    };
    write_frame(&mut s, &ask).unwrap();
    let reply: Reply = read_frame(&mut s, MAX_REPLY).unwrap().unwrap();
    let Reply::Failed { message, .. } = &reply else {
        panic!("{reply:?}")
    };
    // The store's own words, as a direct call shows them: nothing prefixed on the way.
    assert!(
        message.starts_with("cannot reach the Kubernetes API server")
            || message.starts_with("no answer from"),
        "{message}"
    );
    let shown = gauges.networks();
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0].network, "mgmt");
    assert_ne!(shown[0].standing.as_str(), "synced");
    assert_eq!(
        gauges
            .stats()
            .welcomed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    drop(s);
    svc.stop(Duration::from_secs(1));
    assert!(
        gauges.networks().is_empty(),
        "a stopped service's networks are not shown"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn without_a_node_bound_credential_only_a_plugin_naming_the_agents_node_is_served() {
    let d = dir("node");
    let (svc, socket, mut settings) = running(&d);
    // Its direct path would write "gpu-2" on its leases (NODE_NAME or hostname): served, they
    // would say "gpu-1".
    settings.node = Some("gpu-2".into());
    let e =
        AgentConnection::open(&socket, &identity(&settings), Duration::from_secs(2)).unwrap_err();
    assert!(e.contains("\"gpu-1\"") && e.contains("\"gpu-2\""), "{e}");
    settings.node = Some("gpu-1".into());
    assert!(AgentConnection::open(&socket, &identity(&settings), Duration::from_secs(2)).is_ok());
    svc.stop(Duration::from_secs(1));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn an_agent_that_does_not_accept_never_holds_a_plugin_up() {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, listen, socket,
    };
    use std::os::fd::AsRawFd;
    let d = dir("frozen");
    let kc = kubeconfig(&d);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(d.join("run"))
        .unwrap();
    let path = d.join("run/leases.sock");
    // A listener that never accepts (a stopped or frozen agent), its queue one deep.
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(fd.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    listen(&fd, Backlog::new(1).unwrap()).unwrap();
    let settings = on_gpu_1(&kc);
    let (tx, rx) = std::sync::mpsc::channel();
    let (sock, id) = (path.clone(), identity(&settings));
    std::thread::spawn(move || {
        // Past the queue's length: a blocking connect would wait here for ever.
        let outcomes: Vec<_> = (0..6)
            .map(|_| AgentConnection::open(&sock, &id, Duration::from_millis(50)).map(|_| ()))
            .collect();
        let _ = tx.send(outcomes);
    });
    let outcomes = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("a plugin waited on an agent that does not accept");
    assert!(outcomes.iter().all(Result::is_err), "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .any(|o| o.as_ref().is_err_and(|e| e.contains("connecting to"))),
        "the queue filled up and the connect was refused at once: {outcomes:?}"
    );
    drop(fd);
    let _ = std::fs::remove_dir_all(&d);
}
