//! The command line over the node-local file store (a temporary directory): leases, release,
//! doctor, validate, version, usage errors.

mod reconcile_support;

use reconcile_support::*;
use serde_json::{Value, json};
use tether_leases::{FileStore, LeaseState, LeaseStore};

fn setup(tag: &str) -> (TempDir, FileStore, String) {
    let dir = TempDir::new(tag);
    let data = dir.join("data");
    let fs = FileStore::new(&data);
    let t = now() - 600;
    fs.claim(
        lease("net-a", "10.3.0.10", Some(("ns", "p1", "u1")), "n1", t),
        None,
    )
    .unwrap()
    .unwrap();
    fs.claim(lease("net-a", "10.3.0.11", None, "n1", t), None)
        .unwrap()
        .unwrap();
    let mut rel = lease("net-b", "10.4.0.5", Some(("ns", "old", "u0")), "n1", t);
    rel.state = LeaseState::Released { at: t };
    fs.claim(rel, None).unwrap().unwrap();
    let d = data.to_str().unwrap().to_string();
    (dir, fs, d)
}

#[test]
fn leases_table_and_json() {
    let (_dir, _fs, data) = setup("leases");
    let o = tether(&["leases", "--data-dir", &data]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["NETWORK", "ADDRESS", "POD", "NODE", "STATE", "AGE"]
    );
    assert_eq!(lines.len(), 4, "{out}");
    assert!(
        lines[1].starts_with("net-a")
            && lines[1].contains("10.3.0.10/24")
            && lines[1].contains("ns/p1")
            && lines[1].contains("leased")
            && lines[1].contains("10m"),
        "{out}"
    );
    assert!(lines[2].contains("(container ctr-10.3.0.1)"), "{out}");
    assert!(
        lines[3].starts_with("net-b") && lines[3].contains("released"),
        "{out}"
    );

    let o = tether(&[
        "leases",
        "--data-dir",
        &data,
        "--network",
        "net-b",
        "-o",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let v = json_out(&o);
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["address"], "10.4.0.5");
    assert_eq!(v[0]["state"], "released");
    assert_eq!(
        v[0]["pod"],
        json!({"namespace": "ns", "name": "old", "uid": "u0"})
    );
    assert_eq!(v[0]["node"], "n1");

    let empty = TempDir::new("leases-empty");
    let o = tether(&[
        "leases",
        "--data-dir",
        empty.path().to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!((o.status.code(), json_out(&o)), (Some(0), json!([])));
}

#[test]
fn release_refuses_leased_without_api_and_force_overrides() {
    let (_dir, fs, data) = setup("release");
    let o = tether(&[
        "release",
        "10.3.0.10",
        "--network",
        "net-a",
        "--data-dir",
        &data,
    ]);
    assert_eq!(o.status.code(), Some(3), "refused");
    assert!(
        stderr(&o).contains("--force") && stderr(&o).contains("ns/p1"),
        "{}",
        stderr(&o)
    );
    assert!(
        fs.list_mine(&scope_of("net-a"))
            .unwrap()
            .iter()
            .any(|l| l.address.to_string() == "10.3.0.10" && l.is_leased())
    );

    let o = tether(&[
        "release",
        "10.3.0.10",
        "--network",
        "net-a",
        "--data-dir",
        &data,
        "--force",
        "-o",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json_out(&o);
    assert_eq!(v["released"], "10.3.0.10");
    assert_eq!(v["was"]["state"], "leased");
    assert!(
        !fs.list_mine(&scope_of("net-a"))
            .unwrap()
            .iter()
            .any(|l| l.address.to_string() == "10.3.0.10")
    );

    // A Released record: removing it ends its cooldown; no --force needed.
    let o = tether(&[
        "release",
        "10.4.0.5",
        "--network",
        "net-b",
        "--data-dir",
        &data,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("cooldown ends now"), "{}", stdout(&o));
    assert!(fs.list_mine(&scope_of("net-b")).unwrap().is_empty());

    // Unknown address: failed (1); bad address: usage (2).
    assert_eq!(
        tether(&[
            "release",
            "10.3.0.99",
            "--network",
            "net-a",
            "--data-dir",
            &data
        ])
        .status
        .code(),
        Some(1)
    );
    assert_eq!(
        tether(&[
            "release",
            "not-an-ip",
            "--network",
            "net-a",
            "--data-dir",
            &data
        ])
        .status
        .code(),
        Some(2)
    );
    assert_eq!(
        tether(&["release", "10.3.0.11", "--data-dir", &data])
            .status
            .code(),
        Some(2),
        "--network is required"
    );
}

#[test]
fn doctor_happy_path_on_lo_exits_0() {
    let dir = TempDir::new("doctor-file");
    let nad = dir.join("nad.json");
    let data = dir.join("data");
    std::fs::write(
        &nad,
        serde_json::to_vec(&json!({"cniVersion": "1.0.0", "name": "ok-net", "type": "tether-ipvlan", "master": "lo",
            "ipam": {"type": "tether-ipam", "range": "10.5.0.0/28", "probe": false, "dataDir": data}}))
        .unwrap(),
    )
    .unwrap();
    let o = tether(&["doctor", "--config", nad.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    for check in ["config", "master", "store", "pool", "conflicts"] {
        assert_eq!(
            findings(&out, "OK", check).len().min(1),
            1,
            "OK {check}: {out}"
        );
    }
    assert!(
        out.lines().skip(1).all(|l| l.starts_with("OK ")),
        "one finding per line, status first: {out}"
    );
    let o = tether(&["doctor", "--config", nad.to_str().unwrap(), "-o", "json"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        json_out(&o)
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["ok"] == true)
    );

    // A master that does not exist: FAIL naming what to do, exit 1.
    std::fs::write(
        &nad,
        serde_json::to_vec(&json!({"cniVersion": "1.0.0", "name": "ok-net", "type": "tether-ipvlan", "master": "nosuch0",
            "ipam": {"type": "tether-ipam", "range": "10.5.0.0/28", "probe": false, "dataDir": data}}))
        .unwrap(),
    )
    .unwrap();
    let o = tether(&["doctor", "--config", nad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(
        findings(&out, "FAIL", "master")
            .iter()
            .any(|l| l.contains("does not exist")),
        "{out}"
    );
}

#[test]
fn validate_version_help_and_usage() {
    let dir = TempDir::new("validate");
    let nad = dir.join("nad.json");
    std::fs::write(&nad, r#"{"cniVersion":"1.0.0","name":"v","type":"tether-ipvlan","ipam":{"type":"tether-ipam","range":"10.6.0.0/29"}}"#).unwrap();
    let o = tether(&["validate", "--config", nad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("network v: 10.6.0.0/29"),
        "{}",
        stdout(&o)
    );
    std::fs::write(&nad, r#"{"name":"v","ipam":{"type":"tether-ipam"}}"#).unwrap();
    assert_eq!(
        tether(&["validate", "--config", nad.to_str().unwrap()])
            .status
            .code(),
        Some(1)
    );
    let o = tether(&["version"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).starts_with("tether "));
    let o = tether(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    for cmd in [
        "leases",
        "release",
        "doctor",
        "validate",
        "reconcile",
        "node-agent",
        "version",
    ] {
        assert!(stdout(&o).contains(cmd), "--help lists {cmd}");
    }
    let o = tether(&["reconcile", "--help"]);
    for flag in [
        "--kubeconfig",
        "--node",
        "--data-dir",
        "--grace-s",
        "--interval-s",
        "--once",
        "--agent-namespace",
        "--agent-selector",
    ] {
        assert!(
            stdout(&o).contains(flag),
            "reconcile --help lists {flag}: {}",
            stdout(&o)
        );
    }
    let o = tether(&["node-agent", "--help"]);
    for flag in [
        "--grace-s",
        "--interval-s",
        "--node",
        "--no-reconcile",
        "--agent-namespace",
        "--agent-selector",
    ] {
        assert!(stdout(&o).contains(flag), "node-agent --help lists {flag}");
    }
    assert_eq!(tether(&["frobnicate"]).status.code(), Some(2));
}

/// The per-pod plugin takes no operator commands: a person typing one gets told where it went.
#[test]
fn the_plugin_binary_points_operator_commands_to_tether() {
    let o = std::process::Command::new(ipam_bin())
        .args(["leases", "--data-dir", "/nonexistent"])
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(o.stdout.is_empty(), "nothing on stdout: {}", stdout(&o));
    assert!(
        stderr(&o).contains("run `tether leases --data-dir /nonexistent`"),
        "{}",
        stderr(&o)
    );
}

/// A NAD is used on every node: with the node-local file store each node would hand out the range
/// on its own. `validate` says so (exit 0), `--strict` fails on it (exit 1), `--node-local` (a range
/// that belongs to one node) and the cluster store are quiet. A config that names no store is the
/// cluster store's on the cluster's nodes (tether's node-agent runs on each), and `validate` says
/// where it is not. A NAD object as JSON is read too.
#[test]
fn validate_warns_when_file_stores_would_share_a_range_across_nodes() {
    let dir = TempDir::new("validate-store");
    let nad = dir.join("nad.json");
    let p = nad.to_str().unwrap();
    let kc = r#""kubernetes":{"kubeconfig":"/etc/cni/net.d/tether.d/tether.kubeconfig"}"#;
    let unnamed = r#"{"cniVersion":"1.0.0","name":"mgmt","type":"tether-ipvlan","ipam":{"type":"tether-ipam","range":"10.20.30.241-10.20.30.250/24"}}"#;
    let file_conf = unnamed.replace(r#""range""#, r#""store":"file","range""#);

    std::fs::write(&nad, unnamed).unwrap();
    let o = tether(&["validate", "--strict", "--config", p]);
    assert_eq!((o.status.code(), stderr(&o)), (Some(0), String::new()));
    assert!(
        stdout(&o).contains(
            "Kubernetes store (no store named, and tether's node-agent is installed, with tether's node-agent \
             kubeconfig /etc/cni/net.d/tether.d/tether.kubeconfig); on a host without tether's node-agent (cnitool, \
             one node), the node-local file store"
        ),
        "{}",
        stdout(&o)
    );

    {
        std::fs::write(&nad, &file_conf).unwrap();
        let o = tether(&["validate", "--config", p]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "a warning is not an error: {}",
            stderr(&o)
        );
        let err = stderr(&o);
        assert!(
            err.contains("warning") && err.contains("network mgmt") && err.contains("file store"),
            "{err}"
        );
        assert!(
            err.contains("10.20.30.241-10.20.30.250/24")
                && err.contains("\"kubernetes\"")
                && err.contains("--node-local"),
            "{err}"
        );
        let o = tether(&["validate", "--strict", "--config", p]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "--strict fails on the warning: {}",
            stderr(&o)
        );
        let o = tether(&["validate", "--strict", "--node-local", "--config", p]);
        assert_eq!(
            (o.status.code(), stderr(&o)),
            (Some(0), String::new()),
            "--node-local: the range belongs to one node"
        );
    }

    // The cluster store, asked for either way: no warning, --strict passes.
    for ipam_keys in [
        kc.to_string(),
        format!(r#""store":"kubernetes",{kc}"#),
        r#""store":"kubernetes""#.to_string(),
    ] {
        std::fs::write(&nad, format!(r#"{{"cniVersion":"1.0.0","name":"mgmt","type":"tether-ipvlan","ipam":{{"type":"tether-ipam","range":"10.20.30.0/24",{ipam_keys}}}}}"#))
            .unwrap();
        let o = tether(&["validate", "--strict", "--config", p]);
        assert_eq!(
            (o.status.code(), stderr(&o)),
            (Some(0), String::new()),
            "{ipam_keys}"
        );
        assert!(
            stdout(&o).contains("Kubernetes store (ipam."),
            "{}",
            stdout(&o)
        );
    }

    // The NAD object itself (`kubectl get net-attach-def -o json`): spec.config, with the NAD's name.
    let wrap = |config: &str| {
        serde_json::to_string(
            &json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": "pool-a", "namespace": "default"}, "spec": {"config": config}}),
        )
        .unwrap()
    };
    std::fs::write(&nad, wrap(&file_conf.replace(r#""name":"mgmt","#, ""))).unwrap();
    let o = tether(&["validate", "--config", p]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).starts_with("network pool-a: "),
        "Multus injects the NAD's name: {}",
        stdout(&o)
    );
    assert!(
        stderr(&o).contains("network pool-a keeps its leases in the node-local file store"),
        "{}",
        stderr(&o)
    );
    std::fs::write(
        &nad,
        wrap(&unnamed.replace(r#""range""#, &format!(r#"{kc},"range""#))),
    )
    .unwrap();
    let o = tether(&["validate", "--strict", "--config", p]);
    assert_eq!((o.status.code(), stderr(&o)), (Some(0), String::new()));
    std::fs::write(
        &nad,
        r#"{"kind":"NetworkAttachmentDefinition","metadata":{"name":"x"},"spec":{}}"#,
    )
    .unwrap();
    let o = tether(&["validate", "--config", p]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no spec.config"), "{}", stderr(&o));
}

/// Several `--config`s: their ranges are compared. Two uniqueness domains handing out the same
/// addresses on one master, and one domain with another prefix, are warnings naming both configs
/// (exit 0; 1 with `--strict`); other masters, or the same subnet in one domain, are quiet. A
/// config that does not parse fails the run (exit 1) without hiding what the others say.
#[test]
fn item94_validate_compares_the_ranges_of_several_configs() {
    let dir = TempDir::new("validate-overlap");
    let write = |file: &str, name: &str, master: &str, ipam: &str| {
        let p = dir.join(file);
        std::fs::write(
            &p,
            format!(
                r#"{{"cniVersion":"1.0.0","name":"{name}","type":"tether-ipvlan","master":"{master}","ipam":{{"type":"tether-ipam","store":"kubernetes",{ipam}}}}}"#
            ),
        )
        .unwrap();
        p.to_str().unwrap().to_string()
    };
    let mgmt = write("mgmt.json", "mgmt", "enp6s0", r#""range":"10.40.0.0/24""#);
    let rail = write(
        "rail.json",
        "rail-1",
        "enp6s0",
        r#""range":"10.40.0.128/25","isolated_fabric":"rail-1""#,
    );
    let o = tether(&["validate", "--config", &mgmt, "--config", &rail]);
    assert_eq!(o.status.code(), Some(0), "a warning: {}", stderr(&o));
    let (out, err) = (stdout(&o), stderr(&o));
    assert!(
        out.contains("network mgmt: 10.40.0.0/24")
            && out.contains("network rail-1: 10.40.0.128/25")
            && out.contains("ranges of 2 config(s) compared: 1 overlap finding(s)"),
        "{out}"
    );
    assert_eq!(err.matches("tether: warning:").count(), 1, "{err}");
    for part in [
        &format!("{mgmt} (network mgmt, range 10.40.0.0/24) in the cluster-wide domain"),
        &format!("{rail} (network rail-1, range 10.40.0.128/25) in isolated fabric rail-1"),
        "126 addresses (10.40.0.129-10.40.0.254) on master enp6s0",
        "\"isolated_fabric\"",
    ] {
        assert!(err.contains(part), "{part:?} in {err}");
    }
    let o = tether(&["validate", "--strict", "--config", &mgmt, "--config", &rail]);
    assert_eq!(o.status.code(), Some(1), "--strict: {}", stderr(&o));

    // The rail on its own NIC, and a second NAD of mgmt's subnet (bounds of its own): quiet.
    let rail_own_nic = write(
        "rail2.json",
        "rail-2",
        "enp7s0",
        r#""range":"10.40.0.0/24","isolated_fabric":"rail-2""#,
    );
    let mgmt_part = write(
        "mgmt-b.json",
        "mgmt-b",
        "enp9s0",
        r#""range":"10.40.0.100-10.40.0.150/24""#,
    );
    let o = tether(&[
        "validate",
        "--strict",
        "--config",
        &mgmt,
        "--config",
        &rail_own_nic,
        "--config",
        &mgmt_part,
    ]);
    assert_eq!((o.status.code(), stderr(&o)), (Some(0), String::new()));
    assert!(
        stdout(&o).contains("ranges of 3 config(s) compared: 0 overlap finding(s)"),
        "{}",
        stdout(&o)
    );

    // One domain, another prefix: the subnet disagrees.
    let wide = write("wide.json", "wide", "enp1s0", r#""range":"10.40.0.0/16""#);
    let o = tether(&["validate", "--config", &mgmt, "--config", &wide]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o)
            .contains("in the cluster-wide domain on masters enp6s0 and enp1s0 but not their subnet (prefix /24 against /16)"),
        "{}",
        stderr(&o)
    );

    // A config that does not parse: named, exit 1, the others still read and compared.
    let broken = write(
        "broken.json",
        "broken",
        "enp1s0",
        r#""range":"10.40.0.0/33""#,
    );
    let o = tether(&[
        "validate", "--config", &mgmt, "--config", &broken, "--config", &rail,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("tether: {broken}: ipam.range"))
            && stderr(&o).contains("tether: warning:")
            && stdout(&o).contains("ranges of 2 config(s) compared: 1 overlap finding(s)"),
        "{}\n{}",
        stdout(&o),
        stderr(&o)
    );
}

/// whereabouts' keys with only `type` changed: its kubeconfig is replaced (warned), its
/// `configuration_path` and a `log_file` directly in /tmp are not read (warned), a `datastore`
/// other than "kubernetes" is refused naming the key.
#[test]
fn validate_tells_a_whereabouts_nad_what_tether_does_with_its_keys() {
    let dir = TempDir::new("validate-whereabouts");
    let nad = dir.join("nad.json");
    let p = nad.to_str().unwrap();
    let conf = |ipam: Value| {
        let mut i = json!({"type": "tether-ipam", "range": "192.168.2.225/28"});
        i.as_object_mut()
            .unwrap()
            .extend(ipam.as_object().unwrap().clone());
        std::fs::write(
            &nad,
            json!({"cniVersion": "0.3.0", "name": "whereaboutsexample", "type": "macvlan", "ipam": i}).to_string(),
        )
        .unwrap();
    };
    conf(json!({"datastore": "kubernetes",
                "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"},
                "configuration_path": "/etc/cni/net.d/whereabouts.d/whereabouts.conf",
                "log_file": "/tmp/whereabouts.log", "log_level": "debug"}));
    let o = tether(&["validate", "--config", p]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(
            "Kubernetes store (ipam.datastore, with tether's node-agent kubeconfig \
             /etc/cni/net.d/tether.d/tether.kubeconfig in place of whereabouts' \
             /etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig)"
        ),
        "{}",
        stdout(&o)
    );
    let err = stderr(&o);
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("tether: warning: "))
        .collect();
    assert_eq!(warnings.len(), 3, "{err}");
    assert!(
        warnings[0].contains("is whereabouts' credential")
            && warnings[0].contains(
                "Set ipam.kubernetes.kubeconfig to /etc/cni/net.d/tether.d/tether.kubeconfig"
            ),
        "{err}"
    );
    assert!(
        warnings[1].contains("ipam.configuration_path")
            && warnings[1].contains("tether does not read it"),
        "{err}"
    );
    assert!(
        warnings[2].contains("ipam.log_file \"/tmp/whereabouts.log\"")
            && warnings[2].contains("not directly in /tmp")
            && warnings[2].contains("ignore it and log to stderr"),
        "{err}"
    );
    assert_eq!(
        tether(&["validate", "--strict", "--config", p])
            .status
            .code(),
        Some(1)
    );

    conf(json!({"datastore": "etcd", "etcd_host": "etcd:2379"}));
    let o = tether(&["validate", "--config", p]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("ipam.datastore \"etcd\": tether keeps its leases as IPLease objects"),
        "{}",
        stderr(&o)
    );
}

/// The Kubernetes store part on a real API server (TETHER_TEST_KUBECONFIG; `make test` starts
/// one). `node-agent` sweeps the leases of deleted nodes: no other test of this binary meanwhile.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn node_agent_once_installs_and_reconciles() {
    let env = Env::real_exclusive("agent");
    let (ns, n1, knet) = (env.name("ns"), env.name("n1"), env.name("knet"));
    env.agent(n1);
    let dir = &env.dir;
    let (src, bin, sa) = (dir.join("src"), dir.join("bin"), dir.join("sa"));
    for d in [&src, &sa] {
        std::fs::create_dir_all(d).unwrap();
    }
    for b in ["tether-ipvlan", "tether-ipam"] {
        std::fs::write(src.join(b), format!("#!/bin/sh\n# {b}\n")).unwrap();
    }
    std::fs::write(sa.join("token"), "tok").unwrap();
    std::fs::write(sa.join("ca.crt"), "CA").unwrap();
    let data = dir.join("data");
    let fs = FileStore::new(&data);
    fs.claim(
        lease(
            "fnet",
            "10.8.0.1",
            Some((ns, "gone", "u")),
            n1,
            now() - 3600,
        ),
        None,
    )
    .unwrap()
    .unwrap();
    env.put(lease(
        knet,
        "10.8.1.1",
        Some((ns, "gone-too", "u2")),
        n1,
        now() - 3600,
    ));
    let o = tether_env(
        &[
            "node-agent",
            "--cni-bin-dir",
            bin.to_str().unwrap(),
            "--kubeconfig-out",
            dir.join("out/tether.kubeconfig").to_str().unwrap(),
            "--source-dir",
            src.to_str().unwrap(),
            "--service-account-dir",
            sa.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
            "--kubeconfig",
            env.kubeconfig.to_str().unwrap(),
            "--agent-namespace",
            env.agent_ns(),
            "--once",
        ],
        &[("KUBERNETES_SERVICE_HOST", "10.43.0.1"), ("NODE_NAME", n1)],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(bin.join("tether-ipam").is_file() && dir.join("out/tether.kubeconfig").is_file());
    assert!(
        matches!(
            fs.list_mine(&scope_of("fnet")).unwrap()[0].state,
            LeaseState::Released { .. }
        ),
        "file store reconciled"
    );
    assert!(
        is_released(&env.state(knet, "10.8.1.1")),
        "kubernetes store reconciled"
    );
    assert!(stderr(&o).contains("released 10.8.0.1"), "{}", stderr(&o));
}
