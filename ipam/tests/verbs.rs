//! CHECK, GC and STATUS of tether-ipam, and the file store's guarantees seen from outside: modes,
//! a corrupt state file never reset.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use serde_json::json;

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// CHECK passes while the lease is held and fails once it is gone (DEL, or GC).
#[test]
fn check_fails_when_the_lease_is_gone() {
    let net = Net::new(json!({"range": "10.1.2.0/24", "ipRanges": [{"range": "fd00:1:2::/64"}]}));
    let att = Att::new("c1");
    net.add(&att).expect_ok();
    assert!(
        net.check(&att).expect_ok().is_null(),
        "CHECK prints nothing"
    );
    net.del(&att).expect_ok();
    let msg = net.check(&att).expect_err(106);
    assert!(msg.contains("c1") && msg.contains("net1"), "{msg}");
    net.check(&Att::new("never")).expect_err(106);
    // Gone by GC.
    let b = Att::new("c2");
    net.add(&b).expect_ok();
    net.call_conf(
        "GC",
        None,
        &net.conf_with(json!({"cni.dev/valid-attachments": []})),
    )
    .expect_ok();
    net.check(&b).expect_err(106);
}

/// GC with `cni.dev/valid-attachments` releases unlisted leases and keeps listed ones; the legacy key
/// `cni.dev/attachments` works the same; without either, GC is refused and releases nothing.
#[test]
fn h55_h56_gc_releases_unlisted_and_keeps_listed() {
    for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
        let net = Net::new(json!({"range": "10.1.2.0/24"}));
        let atts = [
            Att::new("c1"),
            Att::new("c1").ifname("net2"),
            Att::new("c2"),
            Att::new("c3"),
        ];
        for a in &atts {
            net.add(a).expect_ok();
        }
        // Without the list: refused, nothing released.
        let msg = net.call("GC", None).expect_err(7);
        assert!(msg.contains("valid-attachments"), "{msg}");
        assert_eq!(net.leased().len(), 4);
        // Needs 1.1.0.
        let old = json!({"cniVersion": "1.0.0", key: [{"containerID": "c1", "ifname": "net1"}]});
        net.call_conf("GC", None, &net.conf_with(old)).expect_err(1);
        assert_eq!(net.leased().len(), 4);

        let list = json!([{"containerID": "c1", "ifname": "net1"}, {"containerID": "c3", "ifname": "net1"}, {"containerID": "gone", "ifname": "net1"}]);
        net.call_conf("GC", None, &net.conf_with(json!({key: list})))
            .expect_ok();
        let kept: Vec<_> = net.leased().into_values().collect();
        assert_eq!(kept.len(), 2, "{key}: {kept:?}");
        assert!(
            kept.contains(&("c1".into(), "net1".into()))
                && kept.contains(&("c3".into(), "net1".into())),
            "{key}: {kept:?}"
        );
        for gone in [&atts[1], &atts[2]] {
            net.check(gone).expect_err(106);
        }
        // An empty list releases everything.
        net.call_conf("GC", None, &net.conf_with(json!({key: []})))
            .expect_ok();
        assert!(net.leased().is_empty(), "{key}");
    }
}

/// STATUS: 0 while an address is free; 50 when every address is leased; 0 again after a DEL; 50 when
/// the store is unusable (dataDir is a file).
#[test]
fn status_reports_exhaustion_and_unusable_store() {
    let net = Net::new(json!({"range": "10.1.2.10-10.1.2.12/24", "cooldown_s": 600}));
    net.status().expect_ok();
    net.add(&Att::new("c1")).expect_ok();
    net.add(&Att::new("c2")).expect_ok();
    net.status().expect_ok();
    net.add(&Att::new("c3")).expect_ok();
    let msg = net.status().expect_err(50);
    assert!(
        msg.contains("10.1.2.10-10.1.2.12/24") && msg.contains("3 leased"),
        "{msg}"
    );
    // A released address within its cooldown can still be handed out as a last resort: ready.
    net.del(&Att::new("c2")).expect_ok();
    net.status().expect_ok();
    // Dual-stack: one full range is enough for 50.
    let net =
        Net::new(json!({"ipRanges": [{"range": "10.1.2.0/24"}, {"range": "fd00:1:2::5/128"}]}));
    net.add(&Att::new("c1")).expect_ok();
    let msg = net.status().expect_err(50);
    assert!(msg.contains("fd00:1:2::5"), "{msg}");
    // Needs 1.1.0.
    net.call_conf(
        "STATUS",
        None,
        &net.conf_with(json!({"cniVersion": "1.0.0"})),
    )
    .expect_err(1);

    // The data dir is a file: STATUS 50, ADD fails with code 7 naming the path (it will not
    // pass by itself: only the operator can fix it).
    let net = Net::new(json!({"range": "10.1.2.0/24"}));
    std::fs::write(net.data_dir(), b"not a directory").unwrap();
    let msg = net.status().expect_err(50);
    assert!(msg.contains(net.data_dir().to_str().unwrap()), "{msg}");
    let msg = net.add(&Att::new("c1")).expect_err(7);
    assert!(msg.contains(net.data_dir().to_str().unwrap()), "{msg}");
}

/// The data dir is created 0700 (parents 0755), state and lock files 0600, whatever the umask.
#[test]
fn state_files_are_private() {
    let dir = TempDir::new("modes");
    let data = dir.path().join("a/b/state");
    let net = Net::new(json!({"range": "10.1.2.0/24", "dataDir": data}));
    // A permissive umask must not leak into the modes.
    let c = net.command("ADD", Some(&Att::new("c1")));
    let mut sh = std::process::Command::new("sh");
    sh.arg("-c")
        .arg("umask 000; exec \"$0\"")
        .arg(c.get_program());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    let out = run_with_stdin(&mut sh, net.conf().to_string().as_bytes());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(mode(&data), 0o700, "data dir");
    // Parents are traversable (0755, like /var/lib/cni): only the data dir itself is private.
    assert_eq!(mode(&dir.path().join("a")), 0o755, "created parent");
    assert_eq!(mode(&net.state_path()), 0o600, "state file");
    assert_eq!(
        mode(&net.state_path().with_extension("lock")),
        0o600,
        "lock file"
    );
    // Still private after more writes (DEL rewrites the file).
    net.del(&Att::new("c1")).expect_ok();
    assert_eq!(mode(&net.state_path()), 0o600);
    for e in std::fs::read_dir(&data).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(mode(&p) & 0o077, 0, "{} is readable by others", p.display());
    }
}

/// A lease whose stored prefix cannot fit its address (a hand-edited state file; on the cluster
/// store an IPLease with `prefixLength: 99`) fails the ADD that returns it with code 105 naming the
/// lease, not with a panic (code 999).
#[test]
fn a_stored_prefix_that_does_not_fit_is_a_store_error() {
    let net = Net::new(json!({"range": "10.1.2.0/24"}));
    let att = Att::new("c1");
    let ip = net.add(&att).expect_ok();
    let addr = ip["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let state = std::fs::read_to_string(net.state_path()).unwrap();
    assert!(state.contains("\"prefix_len\": 24"), "{state}");
    std::fs::write(
        net.state_path(),
        state.replace("\"prefix_len\": 24", "\"prefix_len\": 99"),
    )
    .unwrap();
    let msg = net.add(&att).expect_err(105);
    assert!(
        msg.contains(&addr) && msg.contains("prefix length 99"),
        "{msg}"
    );
}

/// The IPAM reads `master` as the attacher does (tether_cni::MasterKeys): a name no link can
/// have is code 7 naming it, before anything is leased, instead of a probe through a link never found.
#[test]
fn a_master_no_link_can_have_is_refused_before_leasing() {
    let net = Net::new(json!({"range": "10.1.2.0/24", "probe": true}));
    let att = Att::new("c1");
    let msg = net
        .add_with(&att, json!({"master": "eth0/../x"}))
        .expect_err(7);
    assert!(msg.contains("is not an interface name"), "{msg}");
    let msg = net
        .add_with(&att, json!({"master": "eth0", "linkInContainer": "yes"}))
        .expect_err(7);
    assert!(
        msg.contains("linkInContainer must be true or false"),
        "{msg}"
    );
    let state = std::fs::read_to_string(net.state_path()).unwrap_or_default();
    assert!(!state.contains("\"c1\""), "{state}");
}

/// A corrupt state file is a clear error naming the file, for every verb, and is never reset.
#[test]
fn corrupt_state_file_is_never_reset() {
    let net = Net::new(json!({"range": "10.1.2.0/24"}));
    net.add(&Att::new("c1")).expect_ok();
    let good = std::fs::read(net.state_path()).unwrap();
    let corruptions: Vec<Vec<u8>> = vec![
        b"{ this is not json".to_vec(),
        good[..good.len() / 2].to_vec(), // a torn write
        Vec::new(),
        br#"{"format": 2, "domain": "x", "next_version": 1, "leases": []}"#.to_vec(),
        br#"{"format": 1, "network": "x", "next_version": 1, "leases": []}"#.to_vec(),
        String::from_utf8(good.clone())
            .unwrap()
            .replacen("\"leased\"", "\"banana\"", 1)
            .into_bytes(),
        br#"{"network": "n", "leases": []}"#.to_vec(),
    ];
    for bad in corruptions {
        std::fs::write(net.state_path(), &bad).unwrap();
        let path = net.state_path().display().to_string();
        let msg = net.add(&Att::new("c2")).expect_err(105);
        assert!(msg.contains(&path), "names the file: {msg}");
        assert!(!msg.contains("resetting"), "{msg}");
        for verb_out in [
            net.del(&Att::new("c1")),
            net.check(&Att::new("c1")),
            net.call_conf(
                "GC",
                None,
                &net.conf_with(json!({"cni.dev/valid-attachments": []})),
            ),
        ] {
            let m = if verb_out.ok() {
                panic!("{verb_out}")
            } else {
                verb_out.stdout.clone()
            };
            assert!(m.contains(&path), "{verb_out}");
        }
        let m = net.status().expect_err(50);
        assert!(m.contains(&path), "{m}");
        assert_eq!(
            std::fs::read(net.state_path()).unwrap(),
            bad,
            "the corrupt file was changed"
        );
    }
    // Repaired → works again, with the old lease intact.
    std::fs::write(net.state_path(), &good).unwrap();
    net.check(&Att::new("c1")).expect_ok();
    net.add(&Att::new("c2")).expect_ok();
}

/// The config's routes and dns reach the Result whole, CNI 1.1 route fields included (as the
/// reference host-local passes them), so tether-ipvlan can put a route in its table.
#[test]
fn routes_and_dns_reach_the_result_whole() {
    let net = Net::new(json!({"range": "10.1.2.0/24",
        "routes": [{"dst": "10.9.0.0/16", "gw": "10.1.2.1", "priority": 10, "table": 100, "mtu": 9000}],
        "dns": {"nameservers": ["10.1.2.53"], "search": ["svc"]}}));
    let r = net.add(&Att::new("c1")).expect_ok();
    assert_eq!(
        r["routes"],
        json!([{"dst": "10.9.0.0/16", "gw": "10.1.2.1", "mtu": 9000, "priority": 10, "table": 100}]),
        "{r}"
    );
    assert_eq!(
        r["dns"],
        json!({"nameservers": ["10.1.2.53"], "search": ["svc"]}),
        "{r}"
    );
}

/// Every call leaves one record for the node-agent's metrics: verb, network, CNI code and how
/// long it took; a call that fails before its config is read still says its verb and code.
#[test]
fn each_call_leaves_one_record_for_the_node_agent() {
    use tether_cni::call_spool::{SPOOL_ENV, Spool};
    let net = Net::new(json!({"range": "10.1.2.0/30"}));
    let spool_dir = net.dir.path().join("calls");
    std::fs::create_dir(&spool_dir).unwrap();
    std::fs::set_permissions(net.dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&spool_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let run = |verb: &str, att: Option<&Att>, stdin: &str| {
        let mut c = net.command(verb, att);
        c.env(SPOOL_ENV, &spool_dir);
        run_with_stdin(&mut c, stdin.as_bytes())
    };
    let conf = net.conf().to_string();
    let (a, b, c) = (Att::new("c1"), Att::new("c2"), Att::new("c3"));
    assert!(run("ADD", Some(&a), &conf).status.success());
    assert!(run("ADD", Some(&b), &conf).status.success());
    // A /30 has two usable addresses: the third ADD fails, pool exhausted (102).
    assert!(!run("ADD", Some(&c), &conf).status.success());
    assert!(run("DEL", Some(&a), &conf).status.success());
    assert!(!run("ADD", Some(&c), "{not json").status.success());
    assert!(run("VERSION", None, "{}").status.success());
    let spool = Spool::existing(&spool_dir).unwrap().expect("the spool");
    let taken = spool.take(100).unwrap();
    assert_eq!(taken.unreadable, 0);
    let mut seen: Vec<(String, String, u32)> = taken
        .records
        .iter()
        .map(|r| {
            assert_eq!(r.plugin, "tether-ipam");
            assert!(r.seconds > 0.0 && r.seconds < 60.0, "{r:?}");
            (r.verb.clone(), r.network.clone(), r.code)
        })
        .collect();
    seen.sort();
    let n = net.name.clone();
    let mut want = vec![
        ("ADD".to_string(), String::new(), 6),
        ("ADD".to_string(), n.clone(), 0),
        ("ADD".to_string(), n.clone(), 0),
        ("ADD".to_string(), n.clone(), 102),
        ("DEL".to_string(), n.clone(), 0),
        ("VERSION".to_string(), String::new(), 0),
    ];
    want.sort();
    assert_eq!(seen, want);
}

/// An environment variable that is not UTF-8 (a runtime may pass any bytes) never keeps the plugin
/// from answering with one JSON object: VERSION answers, and a CNI variable with such bytes is
/// refused with code 4, naming it.
#[test]
fn an_environment_that_is_not_utf8_still_gets_one_json_answer() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let net = Net::new(json!({"range": "10.1.2.0/24"}));
    let mut c = net.command("VERSION", None);
    c.env("JUNK", OsStr::from_bytes(b"\xff\xfe"));
    let o = Out::from(
        "VERSION".into(),
        run_with_stdin(&mut c, br#"{"cniVersion":"1.0.0"}"#),
    );
    assert_eq!(o.expect_ok()["cniVersion"], "1.0.0");
    let mut c = net.command("ADD", Some(&Att::new("c1")));
    c.env("CNI_IFNAME", OsStr::from_bytes(b"net\xff"));
    let o = Out::from(
        "ADD".into(),
        run_with_stdin(&mut c, net.conf().to_string().as_bytes()),
    );
    let msg = o.expect_err(4);
    assert!(
        msg.contains("CNI_IFNAME") && msg.contains("not valid UTF-8"),
        "{msg}"
    );
}
