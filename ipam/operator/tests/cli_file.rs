//! The command line over the node-local file store (a temporary directory): leases, release,
//! doctor, validate, version, usage errors.

mod fake_plugins;
mod reconcile_support;

use fake_plugins::plugins_of_this_build;
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
        [
            "NETWORK",
            "ADDRESS",
            "POD",
            "INTERFACE",
            "NODE",
            "STATE",
            "AGE"
        ]
    );
    assert_eq!(lines.len(), 4, "{out}");
    assert!(
        lines[1].starts_with("net-a")
            && lines[1].contains("10.3.0.10/24")
            && lines[1].contains("ns/p1")
            && lines[1].contains(" net1 ")
            && lines[1].contains("Leased")
            && lines[1].contains("10m"),
        "{out}"
    );
    assert!(lines[2].contains("(container ctr-10.3.0.1)"), "{out}");
    assert!(
        lines[3].starts_with("net-b") && lines[3].contains("Released"),
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
    assert_eq!(v["kind"], "LeaseList");
    let v = &v["items"];
    assert_eq!(v.as_array().unwrap().len(), 1);
    assert_eq!(v[0]["address"], "10.4.0.5");
    assert_eq!(v[0]["state"], "Released");
    assert_eq!(v[0]["ifname"], "net1");
    assert!(
        v[0]["releasedAt"].as_str().unwrap().ends_with('Z'),
        "RFC 3339: {v}"
    );
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
    assert_eq!(
        (o.status.code(), json_out(&o)["items"].clone()),
        (Some(0), json!([]))
    );
    assert!(
        stderr(&o).contains("no leases match, in the node-local file store"),
        "an empty answer says where it looked: {}",
        stderr(&o)
    );
}

#[test]
fn leases_filters_and_kubectls_output_forms() {
    let (_dir, _fs, data) = setup("leases-forms");
    let run = |extra: &[&str]| {
        let mut args = vec!["leases", "--data-dir", &data];
        args.extend_from_slice(extra);
        let o = tether(&args);
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {}", stderr(&o));
        o
    };
    // `-o name` is what `release` takes.
    assert_eq!(
        stdout(&run(&["-o", "name"])),
        "net-a/10.3.0.10\nnet-a/10.3.0.11\nnet-b/10.4.0.5\n"
    );
    let names = |extra: &[&str]| {
        let mut a = extra.to_vec();
        a.extend(["-o", "name"]);
        stdout(&run(&a))
    };
    assert_eq!(names(&["--state", "released"]), "net-b/10.4.0.5\n");
    assert_eq!(
        names(&["--state", "Leased", "--network", "net-a"])
            .lines()
            .count(),
        2
    );
    assert_eq!(names(&["--pod", "ns/p1"]), "net-a/10.3.0.10\n");
    assert_eq!(names(&["--pod", "old"]), "net-b/10.4.0.5\n");
    assert_eq!(names(&["--node", "n2"]), "");
    assert_eq!(names(&["--node", "n1"]).lines().count(), 3);
    // Label selectors match the labels the leases' objects carry.
    assert_eq!(
        names(&["-l", "ipam.tether.dev/network=net-b"]),
        "net-b/10.4.0.5\n"
    );
    assert_eq!(
        names(&["-l", "ipam.tether.dev/pod,ipam.tether.dev/network!=net-b"]),
        "net-a/10.3.0.10\n"
    );
    // YAML is the JSON's list.
    let yaml = stdout(&run(&["-o", "yaml", "--network", "net-a"]));
    let v: Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(v["kind"], "LeaseList");
    assert_eq!(v["items"][0]["address"], "10.3.0.10");
    assert_eq!(v["items"][0]["state"], "Leased");
    // Wide adds the fabric, the container and the MAC.
    let wide = stdout(&run(&["-o", "wide"]));
    let head: Vec<&str> = wide.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(&head[7..], ["ISOLATED-FABRIC", "CONTAINER", "MAC"]);
    assert!(wide.contains("ctr-10.3.0.1"), "{wide}");
    // Usage errors exit 2 before anything is read.
    let o = tether(&["leases", "--data-dir", &data, "--state", "held"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("Leased, Released and Quarantined"));
    let o = tether(&["leases", "--data-dir", &data, "-o", "xml"]);
    assert_eq!(o.status.code(), Some(2));
    let o = tether(&["leases", "--data-dir", &data, "-l", "tier in (a,b)"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("set-based"), "{}", stderr(&o));
}

#[test]
fn without_credentials_it_says_it_read_the_node_local_file_store() {
    // No --kubeconfig, KUBECONFIG, ~/.kube/config, pod or node-agent credential (the harness
    // removes this machine's): the node's file store, and stderr says so and why.
    let o = tether(&["leases", "-o", "name"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("the node-local file store in /var/lib/cni/tether")
            && err.contains("no cluster credentials were found"),
        "{err}"
    );
    // A KUBECONFIG naming nothing is an error, as kubectl's, not a quiet fallback.
    let o = tether_env(&["leases"], &[("KUBECONFIG", "/nonexistent/kubeconfig")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("names no file that exists"),
        "{}",
        stderr(&o)
    );
    let o = tether(&["leases", "--context", "prod"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--context prod"), "{}", stderr(&o));
}

#[test]
fn pools_count_a_config_against_the_file_store() {
    let (dir, _fs, data) = setup("pools");
    let cfg = dir.join("net-a.json");
    std::fs::write(
        &cfg,
        json!({"cniVersion": "1.0.0", "name": "net-a", "type": "tether-ipvlan",
               "ipam": {"type": "tether-ipam", "store": "file", "isolated_fabric": fabric_of("net-a"),
                        "ipRanges": [{"range": "10.3.0.8/29"}, {"range": "10.3.1.0/30"}]}})
        .to_string(),
    )
    .unwrap();
    // The config on a pipe is read once (it used to be read again for the ranges, and empty).
    let piped = tether_piped(
        &[
            "pools",
            "--config",
            "/dev/stdin",
            "--data-dir",
            &data,
            "-o",
            "json",
        ],
        &std::fs::read(&cfg).unwrap(),
    );
    assert_eq!(piped.status.code(), Some(0), "{}", stderr(&piped));
    assert_eq!(json_out(&piped)["items"].as_array().map(Vec::len), Some(2));
    let cfg = cfg.to_str().unwrap();
    let o = tether(&["pools", "--config", cfg, "--data-dir", &data, "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json_out(&o);
    assert_eq!(v["kind"], "PoolList");
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{v}");
    assert_eq!(items[0]["network"], "net-a");
    assert_eq!(
        (&items[0]["leased"], &items[0]["size"], &items[0]["free"]),
        (&json!(2), &json!(6), &json!(4)),
        "{v}"
    );
    assert_eq!(
        (&items[1]["leased"], &items[1]["free"]),
        (&json!(0), &json!(2))
    );
    let o = tether(&["pools", "--config", cfg, "--data-dir", &data]);
    let out = stdout(&o);
    assert_eq!(
        out.lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        [
            "NETWORK",
            "RANGE",
            "SIZE",
            "LEASED",
            "QUARANTINED",
            "COOLING",
            "FREE"
        ]
    );
    let o = tether(&[
        "pools",
        "--config",
        cfg,
        "--data-dir",
        &data,
        "--by-node",
        "-o",
        "json",
    ]);
    let v = json_out(&o);
    assert_eq!(
        v["items"].as_array().unwrap().len(),
        1,
        "only n1 holds any: {v}"
    );
    assert_eq!(
        (&v["items"][0]["node"], &v["items"][0]["leased"]),
        (&json!("n1"), &json!(2))
    );
    // Without NADs to read, it says where the ranges could come from.
    let o = tether(&["pools", "--data-dir", &data]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--config FILE"), "{}", stderr(&o));
}

#[test]
fn release_takes_what_leases_o_name_prints() {
    let (_dir, fs, data) = setup("release-name");
    let o = tether(&[
        "leases",
        "--data-dir",
        &data,
        "--state",
        "Released",
        "-o",
        "name",
    ]);
    let name = stdout(&o).trim().to_string();
    assert_eq!(name, "net-b/10.4.0.5");
    let o = tether(&["release", &name, "--data-dir", &data]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(fs.list_mine(&scope_of("net-b")).unwrap().is_empty());
    let o = tether(&["release", "net-a/10.4.0.5", "--data-dir", &data]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("network net-a has no record of 10.4.0.5 in the node-local file store"),
        "{}",
        stderr(&o)
    );
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
    assert_eq!(v["was"]["state"], "Leased");
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
    let plugins = plugins_of_this_build(dir.path());
    let plugins = plugins.to_str().unwrap();
    let o = tether(&[
        "doctor",
        "--config",
        nad.to_str().unwrap(),
        "--cni-bin-dir",
        plugins,
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    for check in ["plugins", "config", "master", "store", "pool", "conflicts"] {
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
    // On a pipe, as the install page shows it (`kubectl get net-attach-def … | tether doctor
    // --config /dev/stdin`): read once, every check passes (the store check read the config again
    // and found nothing).
    let piped = tether_piped(
        &["doctor", "--config", "/dev/stdin", "--cni-bin-dir", plugins],
        &std::fs::read(&nad).unwrap(),
    );
    let piped_out = stdout(&piped);
    assert_eq!(
        piped.status.code(),
        Some(0),
        "{piped_out}{}",
        stderr(&piped)
    );
    assert_eq!(findings(&piped_out, "OK", "store").len(), 1, "{piped_out}");
    let o = tether(&[
        "doctor",
        "--config",
        nad.to_str().unwrap(),
        "--cni-bin-dir",
        plugins,
        "-o",
        "json",
    ]);
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
    let o = tether(&[
        "doctor",
        "--config",
        nad.to_str().unwrap(),
        "--cni-bin-dir",
        plugins,
    ]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert!(
        findings(&out, "FAIL", "master")
            .iter()
            .any(|l| l.contains("does not exist")),
        "{out}"
    );
}

/// Without --config, the doctor checks the installed plugins only: this build's are OK, a
/// directory without them FAILs naming each (the agent's pod runs it so after an upgrade).
#[test]
fn doctor_without_a_config_checks_the_plugins() {
    let dir = TempDir::new("doctor-plugins");
    let plugins = plugins_of_this_build(dir.path());
    let o = tether(&["doctor", "--cni-bin-dir", plugins.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert_eq!(findings(&out, "OK", "plugins").len(), 2, "{out}");
    assert_eq!(
        out.lines().count(),
        3,
        "a header and the two plugins: {out}"
    );
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let o = tether(&["doctor", "--cni-bin-dir", empty.to_str().unwrap()]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let fail = findings(&out, "FAIL", "plugins");
    assert!(
        fail[0].contains("tether-ipvlan is not in") && fail[1].contains("tether-ipam is not in"),
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
    assert_eq!(stdout(&o).trim_end(), tether_build_info::line("tether"));
    assert_eq!(stdout(&tether(&["--version"])), stdout(&o));
    let o = tether(&["version", "-o", "json"]);
    assert_eq!(o.status.code(), Some(0));
    let v = json_out(&o);
    assert_eq!(
        (&v["version"], &v["commit"], &v["target"]),
        (
            &json!(tether_build_info::VERSION),
            &json!(tether_build_info::COMMIT),
            &json!(tether_build_info::TARGET)
        )
    );
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
        stderr(&o).contains(&format!("tether: network broken ({broken}): ipam.range"))
            && stderr(&o).contains("tether: warning:")
            && stdout(&o).contains("ranges of 2 config(s) compared: 1 overlap finding(s)"),
        "{}\n{}",
        stdout(&o),
        stderr(&o)
    );
}

/// The repository's example NADs and recipes, as a user applies them: one YAML manifest each,
/// checked in one run, compared with each other (the fixed and the pool NAD share addresses in one
/// domain, with one prefix and gateway: no finding); the recipes' pods are skipped.
#[test]
fn validate_reads_the_example_manifests_as_they_are() {
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy");
    let mut args = vec![
        "validate".to_string(),
        "-o".into(),
        "json".into(),
        "--strict".into(),
    ];
    for dir in ["examples", "recipes"] {
        for f in std::fs::read_dir(deploy.join(dir)).unwrap() {
            args.push(f.unwrap().path().to_str().unwrap().to_string());
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = tether(&args);
    let v = json_out(&o);
    assert_eq!(o.status.code(), Some(0), "{v:#}{}", stderr(&o));
    let networks: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["ipam"]["network"].as_str().unwrap())
        .collect();
    assert_eq!(networks.len(), 3, "{v:#}");
    for n in ["mgmt-pool", "mgmt-fixed", "compute"] {
        assert!(networks.contains(&n), "{n}: {v:#}");
    }
    assert_eq!(v["valid"], true);
    assert!(
        v["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("skipped Pod")),
        "the recipes' pods are skipped, said: {v:#}"
    );
}

/// What each plugin refuses or ignores, found before a pod meets it: one YAML manifest of several
/// NADs, each with one fault.
#[test]
fn validate_checks_the_whole_nad_as_both_plugins_read_it() {
    let dir = TempDir::new("validate-whole");
    let manifest = dir.join("nads.yaml");
    let nad = |name: &str, config: Value| {
        format!(
            "---\napiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {{name: {name}, namespace: ml}}\nspec:\n  config: '{}'\n",
            config
        )
    };
    let ipam = |extra: Value| {
        let mut i = json!({"type": "tether-ipam", "range": "10.8.0.0/24"});
        i.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        i
    };
    let text = [
        nad("ok", json!({"cniVersion": "1.0.0", "type": "tether-ipvlan", "master": "eth1", "ipam": ipam(json!({}))})),
        nad("bad-mode", json!({"cniVersion": "1.0.0", "type": "tether-ipvlan", "mode": "l4", "ipam": ipam(json!({}))})),
        nad("mac", json!({"cniVersion": "1.0.0", "type": "tether-ipvlan", "capabilities": {"mac": true, "ips": true},
                          "ipam": ipam(json!({"range": "10.8.1.0/24"}))})),
        nad("log-number", json!({"cniVersion": "1.0.0", "type": "tether-ipvlan", "log_file": 7,
                                 "ipam": ipam(json!({"range": "10.8.2.0/24"}))})),
        nad("data-dir", json!({"cniVersion": "1.0.0", "type": "tether-ipvlan",
                               "ipam": ipam(json!({"range": "10.8.3.0/24", "dataDir": "/etc/tether"}))})),
        nad("no-ipam", json!({"cniVersion": "1.0.0", "type": "tether-ipvlan"})),
        nad("bad-version", json!({"cniVersion": "9.9.9", "type": "tether-ipvlan", "ipam": ipam(json!({"range": "10.8.4.0/24"}))})),
    ]
    .concat();
    std::fs::write(&manifest, text).unwrap();
    let o = tether(&["validate", manifest.to_str().unwrap(), "-o", "json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v = json_out(&o);
    let of = |name: &str| -> Value {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["nad"] == format!("ml/{name}"))
            .unwrap_or_else(|| panic!("{name}: {v:#}"))
            .clone()
    };
    let text = |i: &Value, key: &str| i[key].to_string();
    assert_eq!(
        (of("ok")["valid"].clone(), of("ok")["errors"].clone()),
        (json!(true), json!([]))
    );
    assert!(
        text(&of("bad-mode"), "errors").contains("unknown ipvlan mode \\\"l4\\\""),
        "{v:#}"
    );
    let mac = of("mac");
    assert_eq!(mac["valid"], true);
    assert!(text(&mac, "warnings").contains("capabilities.mac"), "{v:#}");
    assert!(
        text(&of("log-number"), "errors").contains("log_file must be a string"),
        "{v:#}"
    );
    assert!(
        text(&of("data-dir"), "errors").contains("ipam.dataDir"),
        "{v:#}"
    );
    assert!(
        text(&of("no-ipam"), "errors").contains("no ipam section"),
        "{v:#}"
    );
    assert!(
        text(&of("bad-version"), "errors").contains("9.9.9"),
        "{v:#}"
    );
    assert_eq!(v["valid"], false);

    // The same as a person reads it: errors name the NAD and the document.
    let o = tether(&["validate", manifest.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("tether: NAD ml/bad-mode (") && err.contains("(document 2)"),
        "{err}"
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
