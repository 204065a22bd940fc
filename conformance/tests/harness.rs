//! Ungated checks of the harness itself (run on any kernel, as root).

use std::time::Duration;

use tether_conformance::{Libcni, NetNs, cmd, eventually, veth_pair};

#[test]
fn netns_guard_creates_and_cleans_up() {
    let (a_name, b_name);
    {
        let a = NetNs::new("guard-a");
        let b = NetNs::new("guard-b");
        a_name = a.name().to_string();
        b_name = b.name().to_string();
        assert!(a_name.starts_with("tether-guard-a-"), "{a_name}");
        assert_ne!(a_name, b_name);
        assert!(NetNs::exists(&a_name) && a.path().exists());
        let listed = cmd::run_ok("ip", &["netns", "list"]).stdout;
        assert!(listed.contains(&a_name), "{listed}");
        // lo is up, a veth crosses namespaces, addresses and ping work.
        assert_eq!(a.link("lo").unwrap()["operstate"], "UNKNOWN");
        veth_pair(&a, "ta0", &b, "tb0");
        a.addr_add("ta0", "192.0.2.1/24");
        b.addr_add("tb0", "192.0.2.2/24");
        assert_eq!(a.addrs("ta0"), vec!["192.0.2.1/24".to_string()]);
        assert!(b.has_link("tb0") && !a.has_link("tb0"));
        b.ping("192.0.2.1", 1).assert_success();
        // Command running inside the namespace sees only its links.
        let out = a.exec_ok("ip", &["-j", "link", "show"]).json();
        let names: Vec<_> = out
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["ifname"].clone())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        drop(a);
        assert!(!NetNs::exists(&a_name), "{a_name} survived its guard");
        // Deleting a's namespace destroys the veth, peer included, but
        // asynchronously (the kernel's netns cleanup work).
        assert!(
            eventually(Duration::from_secs(10), || !b.has_link("tb0")),
            "tb0 outlived its peer's netns"
        );
    }
    assert!(!NetNs::exists(&b_name), "{b_name} survived its guard");
}

#[test]
fn netns_guard_cleans_up_on_panic() {
    let name = std::sync::Mutex::new(String::new());
    let r = std::panic::catch_unwind(|| {
        let ns = NetNs::new("guard-panic");
        *name.lock().unwrap() = ns.name().to_string();
        panic!("boom");
    });
    assert!(r.is_err());
    let name = name.into_inner().unwrap();
    assert!(
        !name.is_empty() && !NetNs::exists(&name),
        "{name} survived a panic"
    );
}

#[test]
fn capture_reports_status_and_streams() {
    let out = cmd::run("sh", &["-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(out.code(), Some(3));
    assert_eq!(out.stdout, "out\n");
    assert_eq!(out.stderr, "err\n");
    assert!(!out.success());
    let out = cmd::capture_with_stdin(&mut std::process::Command::new("cat"), Some(b"{\"a\":1}"));
    assert_eq!(out.json()["a"], 1);
}

/// The libcni driver reports a plugin's error: JSON on stdout, text on stderr,
/// exit 1. (Works on any kernel: the master does not exist.)
#[test]
fn libcni_driver_reports_plugin_errors() {
    let pod = NetNs::new("drv-err");
    let net = Libcni::new(&serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "drverr",
        "plugins": [{"type": "ipvlan", "master": "no-such-if0", "mode": "l2",
                     "ipam": {"type": "host-local", "subnet": "10.1.2.0/24"}}]
    }))
    .ifname("net1");
    let out = net.add(&pod.path());
    assert_eq!(out.code(), Some(1), "{out}");
    let err = out.json();
    // libcni re-marshals the plugin's error as types.Error {code,msg,details}.
    assert!(
        err["code"].as_u64().is_some() && err["msg"].is_string(),
        "{out}"
    );
    assert!(out.stderr.contains("no-such-if0"), "{out}");
    assert!(!net.cache_file().exists());
}
