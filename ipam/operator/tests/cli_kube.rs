//! The command line over the Kubernetes store, against a real API server (TETHER_TEST_KUBECONFIG;
//! `make test` starts one): leases, release (with pod checks), doctor (happy path, 403 on verbs,
//! CRDs unreadable, unreachable API, bad kubeconfig). Two doctor cases use the API double, for
//! what a server shared by parallel tests cannot be made to do: lose the CRD, and refuse the
//! access reviews themselves.

mod fake_plugins;
mod reconcile_support;

use fake_plugins::plugins_of_this_build;
use reconcile_support::*;
use serde_json::{Value, json};
use tether_leases::{FileStore, LeaseState, LeaseStore};

/// A test's names: networks, the pods' namespace, nodes.
struct Names {
    net: &'static str,
    other: &'static str,
    ml: &'static str,
    n1: &'static str,
    n2: &'static str,
}

fn names(env: &Env) -> Names {
    Names {
        net: env.name("gpu-net"),
        other: env.name("other-net"),
        ml: env.name("ml"),
        n1: env.name("n1"),
        n2: env.name("n2"),
    }
}

/// Pods and leases: a live pod's, a gone pod's, a replaced pod's, an anonymous one, and a released
/// record in another network.
fn fill(env: &Env) -> Names {
    let n = names(env);
    let t = now() - 600;
    let live = env.pod(n.ml, "trainer-0", "u-live", n.n1);
    env.pod(n.ml, "sts-0", "u-new", n.n1);
    env.put(lease(
        n.net,
        "10.77.0.10",
        Some((n.ml, "trainer-0", &live)),
        n.n1,
        t,
    ));
    env.put(lease(
        n.net,
        "10.77.0.11",
        Some((n.ml, "gone", "u-gone")),
        n.n1,
        t,
    ));
    env.put(lease(
        n.net,
        "10.77.0.12",
        Some((n.ml, "sts-0", "u-old")),
        n.n1,
        t,
    ));
    env.put(lease(n.net, "10.77.0.13", None, n.n1, t));
    let mut rel = lease(n.other, "10.88.0.1", Some((n.ml, "x", "u-x")), n.n2, t);
    rel.state = LeaseState::Released { at: t };
    env.put(rel);
    n
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn leases_table_and_json_for_all_networks_or_one() {
    let env = Env::real("kleases");
    let n = fill(&env);
    let kc = env.kubeconfig.to_str().unwrap();
    let o = tether(&["leases", "--kubeconfig", kc]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.lines().next().unwrap().starts_with("NETWORK"), "{out}");
    // Every network of the cluster: the other tests' on this server too; ours are these.
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with(&env.id)).collect();
    assert_eq!(lines.len(), 5, "every network's records: {out}");
    assert!(
        lines[0].starts_with(n.net)
            && lines[0].contains("10.77.0.10/24")
            && lines[0].contains(&format!("{}/trainer-0", n.ml))
            && lines[0].contains(n.n1),
        "{out}"
    );
    assert!(
        lines[4].starts_with(n.other) && lines[4].contains("Released") && lines[4].contains(n.n2),
        "{out}"
    );

    let o = tether(&[
        "leases",
        "--kubeconfig",
        kc,
        "--network",
        n.net,
        "-o",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let v = json_out(&o)["items"].clone();
    assert_eq!(v.as_array().unwrap().len(), 4);
    assert_eq!(v[0]["pod"]["namespace"], n.ml);
    assert_eq!(v[0]["pod"]["name"], "trainer-0");
    assert_eq!(v[0]["state"], "Leased");

    // The store from a NAD (its ipam.kubernetes.kubeconfig): that network by default.
    let nad = env.nad(n.net);
    let o = tether(&["leases", "--config", nad.to_str().unwrap(), "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(json_out(&o)["items"].as_array().unwrap().len(), 4);
}

/// `tether leases` of this test's network, with `env` and nothing else: its `-o name` lines.
fn names_found(n: &Names, args: &[&str], env: &[(&str, &str)]) -> (String, String) {
    let mut a = vec!["leases", "--network", n.net, "-o", "name"];
    a.extend_from_slice(args);
    let o = tether_env(&a, env);
    assert_eq!(o.status.code(), Some(0), "{args:?} {env:?}: {}", stderr(&o));
    (stdout(&o), stderr(&o))
}

/// A kubeconfig whose current context points where nothing listens, and whose context `good` is
/// the real server's: only `--context good` reaches the cluster.
fn two_contexts(env: &Env, dir: &std::path::Path) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&env.kubeconfig).unwrap();
    let mut kc: Value = serde_saphyr::from_str(&text).unwrap();
    let mut dead = kc["clusters"][0].clone();
    dead["name"] = json!("dead");
    dead["cluster"]["server"] = json!(closed_url().replace("http://", "https://"));
    kc["clusters"].as_array_mut().unwrap().push(dead);
    let good = kc["contexts"][0].clone();
    let mut bad = good.clone();
    bad["name"] = json!("broken");
    bad["context"]["cluster"] = json!("dead");
    let mut good = good;
    good["name"] = json!("good");
    kc["contexts"] = json!([bad, good]);
    kc["current-context"] = json!("broken");
    let p = dir.join("two-contexts.kubeconfig");
    std::fs::write(&p, kc.to_string()).unwrap();
    p
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn leases_find_the_cluster_as_kubectl_does() {
    let env = Env::real("kfind");
    let n = fill(&env);
    let kc = env.kubeconfig.to_str().unwrap();
    let want: String = (10..14)
        .map(|i| format!("{}/10.77.0.{i}\n", n.net))
        .collect();

    // KUBECONFIG, no flag.
    let (out, err) = names_found(&n, &[], &[("KUBECONFIG", kc)]);
    assert_eq!(out, want);
    assert!(
        err.contains("from the cluster store at https://")
            && err.contains(&format!("KUBECONFIG ({kc})")),
        "{err}"
    );
    // ~/.kube/config, no flag and no KUBECONFIG: a workstation's.
    let home = env.dir.path().join("home");
    std::fs::create_dir_all(home.join(".kube")).unwrap();
    std::fs::copy(kc, home.join(".kube/config")).unwrap();
    let (out, err) = names_found(&n, &[], &[("HOME", home.to_str().unwrap())]);
    assert_eq!(out, want);
    assert!(err.contains(".kube/config"), "{err}");
    // --context picks a context other than the current one.
    let two = two_contexts(&env, env.dir.path());
    let two = two.to_str().unwrap();
    let (out, err) = names_found(&n, &["--context", "good"], &[("KUBECONFIG", two)]);
    assert_eq!(out, want);
    assert!(err.contains("context good"), "{err}");
    let o = tether_env(&["leases", "--network", n.net], &[("KUBECONFIG", two)]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "the current context reaches nothing: {}",
        stderr(&o)
    );
    // As root on a node with only tether's credential: the node-agent's kubeconfig.
    let node_kc = env.dir.path().join("tether.kubeconfig");
    std::fs::copy(kc, &node_kc).unwrap();
    let (out, err) = names_found(
        &n,
        &[],
        &[("TETHER_NODE_KUBECONFIG", node_kc.to_str().unwrap())],
    );
    assert_eq!(out, want);
    assert!(err.contains("this node's tether credential"), "{err}");
    // An answer with nothing in it says so, and where it looked.
    let o = tether_env(
        &["leases", "--network", n.net, "--node", "no-such-node"],
        &[("KUBECONFIG", kc)],
    );
    assert_eq!(
        (o.status.code(), stdout(&o).lines().count()),
        (Some(0), 1),
        "the header only"
    );
    assert!(
        stderr(&o).contains("no leases match, in the cluster store at https://"),
        "{}",
        stderr(&o)
    );
    // The API server matches -l.
    let (out, _) = names_found(
        &n,
        &["-l", &format!("ipam.tether.dev/pod={}.trainer-0", n.ml)],
        &[("KUBECONFIG", kc)],
    );
    assert_eq!(out, format!("{}/10.77.0.10\n", n.net));
    let o = tether_env(&["leases", "-l", "a b=c"], &[("KUBECONFIG", kc)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn kubectl_runs_it_as_its_tether_plugin() {
    let env = Env::real("kplugin");
    let n = fill(&env);
    let bin = env.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_tether"), bin.join("kubectl-tether")).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |args: &[&str]| {
        std::process::Command::new(kubectl())
            .args(args)
            .env("PATH", &path)
            .env("KUBECONFIG", &env.kubeconfig)
            .env("HOME", env.dir.path())
            .env("TETHER_NODE_KUBECONFIG", "")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .unwrap()
    };
    let o = run(&[
        "tether",
        "leases",
        "--network",
        n.net,
        "--state",
        "Leased",
        "-o",
        "name",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 4, "{}", stdout(&o));
    let o = run(&["plugin", "list"]);
    assert!(
        stdout(&o).contains("kubectl-tether"),
        "{}{}",
        stdout(&o),
        stderr(&o)
    );
    let o = run(&["tether", "--help"]);
    assert!(
        stdout(&o).contains("Usage: kubectl tether"),
        "{}",
        stdout(&o)
    );
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn pools_from_the_clusters_nads() {
    let env = Env::real("kpools");
    let n = fill(&env);
    nad_crd(&env);
    let kc = env.kubeconfig.to_str().unwrap();
    let ipam = |range: &str| {
        json!({"type": "tether-ipam", "range": range, "isolated_fabric": fabric_of(n.net),
               "network_name": n.net})
    };
    let _a = cluster_nad(
        &env,
        n.ml,
        "pool",
        &json!({"cniVersion": "1.0.0", "name": "pool", "type": "tether-ipvlan", "master": "eth1",
                "ipam": ipam("10.77.0.8/29")}),
    );
    let o = tether_env(
        &["pools", "--network", n.net, "-o", "json"],
        &[("KUBECONFIG", kc)],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json_out(&o);
    let item = &v["items"][0];
    assert_eq!(v["items"].as_array().unwrap().len(), 1, "{v}");
    // .10 .11 .12 .13 in 10.77.0.8/29 (.9-.14 usable): four leased, two free.
    assert_eq!(
        (&item["size"], &item["leased"], &item["free"]),
        (&json!(6), &json!(4), &json!(2)),
        "{v}"
    );
    assert_eq!(item["nads"], json!([format!("{}/pool", n.ml)]));
    let o = tether_env(
        &["pools", "--network", n.net, "--by-node", "-o", "yaml"],
        &[("KUBECONFIG", kc)],
    );
    let v: Value = serde_saphyr::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["items"][0]["node"], n.n1);
    assert_eq!(v["items"][0]["leased"], 4);
    // A second NAD naming the network with other ranges: counted with the first's, and said.
    let _b = cluster_nad(
        &env,
        n.ml,
        "pool-wider",
        &json!({"cniVersion": "1.0.0", "name": "pool-wider", "type": "tether-ipvlan", "master": "eth1",
                "ipam": ipam("10.77.0.0/24")}),
    );
    let o = tether_env(&["pools", "--network", n.net], &[("KUBECONFIG", kc)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("other ranges"), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 2, "{}", stdout(&o));
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn release_network_slash_address_on_the_cluster() {
    let env = Env::real("krelname");
    let n = fill(&env);
    let kc = env.kubeconfig.to_str().unwrap();
    let gone = format!("{}/10.77.0.11", n.net);
    let o = tether_env(&["release", &gone], &[("KUBECONFIG", kc)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("releasing in the cluster store at https://"),
        "{}",
        stderr(&o)
    );
    let (out, _) = names_found(&n, &[], &[("KUBECONFIG", kc)]);
    assert!(!out.contains("10.77.0.11"), "{out}");
    // The live pod's is refused, by exit code 3.
    let o = tether_env(
        &["release", &format!("{}/10.77.0.10", n.net)],
        &[("KUBECONFIG", kc)],
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn release_checks_the_pod() {
    let env = Env::real("krelease");
    let n = fill(&env);
    let kc = env.kubeconfig.to_str().unwrap();
    let rel = |addr: &str, extra: &[&str]| {
        let mut a = vec!["release", addr, "--network", n.net, "--kubeconfig", kc];
        a.extend_from_slice(extra);
        tether(&a)
    };
    // Live pod with the lease's uid: refused, exit 3, lease untouched.
    let o = rel("10.77.0.10", &[]);
    assert_eq!(o.status.code(), Some(3));
    assert!(
        stderr(&o).contains(&format!("{}/trainer-0", n.ml))
            && stderr(&o).contains("exists")
            && stderr(&o).contains("--force"),
        "{}",
        stderr(&o)
    );
    let o = rel("10.77.0.10", &["-o", "json"]);
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(json_out(&o)["refused"], "10.77.0.10");
    assert!(matches!(
        env.state(n.net, "10.77.0.10"),
        Some(LeaseState::Leased)
    ));
    // A lease naming no pod: cannot tell, refused.
    assert_eq!(rel("10.77.0.13", &[]).status.code(), Some(3));
    // Pod gone, or replaced by another uid: released without --force.
    let o = rel("10.77.0.11", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("no longer exists"), "{}", stdout(&o));
    assert_eq!(env.state(n.net, "10.77.0.11"), None);
    let o = rel("10.77.0.12", &["-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        json_out(&o)["reason"]
            .as_str()
            .unwrap()
            .contains("another pod")
    );
    // --force releases a live one.
    let o = rel("10.77.0.10", &["--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(env.state(n.net, "10.77.0.10"), None);
    // A released record: removed (cooldown ends), exit 0.
    let o = tether(&[
        "release",
        "10.88.0.1",
        "--network",
        n.other,
        "--kubeconfig",
        kc,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(env.state(n.other, "10.88.0.1"), None);
    // No such record: exit 1.
    assert_eq!(rel("10.77.0.99", &[]).status.code(), Some(1));
    // Reading pods forbidden (RBAC): the live check cannot be made, refused.
    let env2 = Env::real("krelease-403");
    let n2 = fill(&env2);
    let kc2 = env2.forbidding(&[("get", "pods")]);
    let o = tether(&[
        "release",
        "10.77.0.11",
        "--network",
        n2.net,
        "--kubeconfig",
        kc2.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "checking the pod failed: refuse; {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("pods"), "{}", stderr(&o));
    assert!(matches!(
        env2.state(n2.net, "10.77.0.11"),
        Some(LeaseState::Leased)
    ));
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn file_store_with_a_kubeconfig_checks_pods_too() {
    let env = Env::real("kfile");
    let (ml, n1) = (env.name("ml"), env.name("n1"));
    let a = env.pod(ml, "alive", "u-a", n1);
    let data = env.dir.join("data");
    let fs = FileStore::new(&data);
    let t = now() - 600;
    fs.claim(
        lease("fnet", "10.9.0.1", Some((ml, "alive", &a)), n1, t),
        None,
    )
    .unwrap()
    .unwrap();
    fs.claim(
        lease("fnet", "10.9.0.2", Some((ml, "gone", "u-g")), n1, t),
        None,
    )
    .unwrap()
    .unwrap();
    let (d, kc) = (data.to_str().unwrap(), env.kubeconfig.to_str().unwrap());
    assert_eq!(
        tether(&[
            "release",
            "10.9.0.1",
            "--network",
            "fnet",
            "--data-dir",
            d,
            "--kubeconfig",
            kc
        ])
        .status
        .code(),
        Some(3)
    );
    assert_eq!(
        tether(&["release", "10.9.0.2", "--network", "fnet", "--data-dir", d])
            .status
            .code(),
        Some(3),
        "no API: refused"
    );
    let o = tether(&[
        "release",
        "10.9.0.2",
        "--network",
        "fnet",
        "--data-dir",
        d,
        "--kubeconfig",
        kc,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let left: Vec<String> = fs
        .list_mine(&scope_of("fnet"))
        .unwrap()
        .iter()
        .map(|l| l.address.to_string())
        .collect();
    assert_eq!(left, vec!["10.9.0.1".to_string()]);
    let o = tether(&["leases", "--data-dir", d, "-o", "json"]);
    assert_eq!(json_out(&o)["items"].as_array().unwrap().len(), 1);
}

/// `tether doctor` of `nad`, with plugins of this build beside it.
fn doctor_nad(nad: &std::path::Path) -> (Option<i32>, String) {
    let plugins = plugins_of_this_build(nad.parent().unwrap());
    let o = tether(&[
        "doctor",
        "--config",
        nad.to_str().unwrap(),
        "--cni-bin-dir",
        plugins.to_str().unwrap(),
    ]);
    (o.status.code(), stdout(&o))
}

fn doctor(env: &Env, network: &str) -> (Option<i32>, String) {
    doctor_nad(&env.nad(network))
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn doctor_happy_path() {
    let env = Env::real("kdoctor-ok");
    let n = fill(&env);
    // What a node has: the node-agent's credential, bound to its pod on this node.
    let a = node(&env, "a");
    let (code, out) = doctor_nad(&env.nad_with(n.net, &a.kubeconfig));
    assert_eq!(code, Some(0), "{out}");
    assert!(
        findings(&out, "OK", "node-scope")[0].contains(&format!("bound to node {}", a.name)),
        "{out}"
    );
    for check in [
        "config",
        "master",
        "kubeconfig",
        "api",
        "crd",
        "rbac",
        "node-scope",
        "store",
        "pool",
        "conflicts",
    ] {
        assert!(!findings(&out, "OK", check).is_empty(), "OK {check}: {out}");
    }
    let rbac = findings(&out, "OK", "rbac");
    assert_eq!(
        rbac.len(),
        2,
        "exactly the leases' verbs and pods get/list/watch: {out}"
    );
    assert!(
        rbac[0].contains("get, list, watch, create, update, delete on ipleases.ipam.tether.dev"),
        "{out}"
    );
    assert!(rbac[1].contains("get, list, watch on pods"), "{out}");
    assert!(
        !out.contains("nodes"),
        "no access to nodes is needed: {out}"
    );
    assert!(
        findings(&out, "OK", "store")[0].contains("4 record(s)"),
        "{out}"
    );
    assert!(out.lines().skip(1).all(|l| l.starts_with("OK ")), "{out}");
}

/// A credential that is not held to one node (here the admin's: no node claim, not matched by
/// the policy) on a node is a finding: every node would hold a credential that can free or steal
/// any node's addresses.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn doctor_says_when_the_credential_is_not_held_to_its_node() {
    let env = Env::real("kdoctor-scope");
    let n = fill(&env);
    let (code, out) = doctor(&env, n.net);
    assert_eq!(code, Some(1), "{out}");
    let f = findings(&out, "FAIL", "node-scope");
    assert_eq!(f.len(), 1, "{out}");
    assert!(
        f[0].contains("not held to one node") && f[0].contains("deploy/base/policy.yaml"),
        "{out}"
    );
    // A token of the node account that is bound to no pod: refused by the policy, and told why.
    let unbound = token_kubeconfig(&env, "kubeconfig-unbound", &token(&env, "tether", None));
    let (code, out) = doctor_nad(&env.nad_with(n.net, &unbound));
    assert_eq!(code, Some(1), "{out}");
    let f = findings(&out, "FAIL", "node-scope");
    assert!(
        f[0].contains("carries no node claim") && f[0].contains("tether.kubeconfig"),
        "{out}"
    );
}

/// The API double: the CRD of a server that parallel tests share cannot be uninstalled for one
/// test (and the NAD has no knob to point the store at another API group).
#[test]
fn doctor_without_the_crd_says_how_to_install_it() {
    let env = Env::double("kdoctor-nocrd");
    env.double_api().set_crd_installed(false);
    let (code, out) = doctor(&env, env.name("gpu-net"));
    assert_eq!(code, Some(1), "{out}");
    let f = findings(&out, "FAIL", "crd");
    assert_eq!(f.len(), 1, "{out}");
    assert!(
        f[0].contains("kubectl apply -f deploy/tether.yaml")
            && f[0].contains("deploy/crds/ipleases.yaml"),
        "{out}"
    );
    assert!(
        !findings(&out, "OK", "api").is_empty(),
        "the API itself answers: {out}"
    );
    assert!(
        findings(&out, "OK", "store").is_empty(),
        "no store line repeating the failure: {out}"
    );
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn doctor_without_access_to_crds_lists_the_leases_instead() {
    // RBAC may forbid reading CRDs: doctor says so and falls back to listing the leases.
    let env = Env::real("kdoctor-nocrdread");
    let n = fill(&env);
    let kc = env.forbidding(&[("get", "customresourcedefinitions")]);
    let (_, out) = doctor_nad(&env.nad_with(n.net, &kc));
    // The impersonated test user is no node credential: that is the only finding.
    assert!(
        out.lines()
            .skip(1)
            .all(|l| l.starts_with("OK ") || l.starts_with("FAIL    node-scope")),
        "{out}"
    );
    assert!(
        findings(&out, "OK", "crd")[0].contains("listing ipleases works"),
        "{out}"
    );
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn doctor_names_forbidden_verbs_and_what_to_grant() {
    let env = Env::real("kdoctor-403");
    let n = fill(&env);
    let kc = env.forbidding(&[
        ("create", "ipleases"),
        ("delete", "ipleases"),
        ("watch", "pods"),
    ]);
    let (code, out) = doctor_nad(&env.nad_with(n.net, &kc));
    assert_eq!(code, Some(1), "{out}");
    let f = findings(&out, "FAIL", "rbac");
    assert_eq!(f.len(), 2, "{out}");
    assert!(
        f[0].contains("create")
            && f[0].contains("delete")
            && f[0].contains("ipleases.ipam.tether.dev")
            && f[0].contains("grant"),
        "{out}"
    );
    assert!(f[0].contains("deploy/base/rbac.yaml"), "{out}");
    assert!(f[1].contains("watch") && f[1].contains("pods"), "{out}");
    assert!(
        findings(&out, "OK", "rbac").is_empty(),
        "only two rbac lines, both failing: {out}"
    );
}

/// The API double: every authenticated user of a real server may create access reviews
/// (system:basic-user), which a server shared by parallel tests cannot take away for one test.
#[test]
fn doctor_with_access_reviews_forbidden_says_how_to_check_by_hand() {
    let env = Env::double("kdoctor-ssar");
    env.double_api()
        .forbid("create", "selfsubjectaccessreviews");
    let (code, out) = doctor(&env, env.name("gpu-net"));
    assert_eq!(code, Some(1), "{out}");
    assert!(
        findings(&out, "FAIL", "rbac")[0].contains("kubectl auth can-i"),
        "{out}"
    );
}

/// No server at all: a closed port, a token file that cannot be read, no kubeconfig.
#[test]
fn doctor_with_an_unreachable_api_or_a_bad_kubeconfig() {
    let dir = TempDir::new("kdoctor-down");
    let kubeconfig = dir.join("kubeconfig");
    let nad = nad_file(dir.path(), "gpu-net", &kubeconfig);
    let url = closed_url();
    std::fs::write(&kubeconfig, tether_apiserver_double::kubeconfig_for(&url)).unwrap();
    let (code, out) = doctor_nad(&nad);
    assert_eq!(code, Some(1), "{out}");
    let f = findings(&out, "FAIL", "api");
    assert_eq!(f.len(), 1, "{out}");
    assert!(f[0].contains("cannot reach"), "{out}");

    // A token file that cannot be read.
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    tokenFile: /nonexistent/token\n"
    );
    std::fs::write(&kubeconfig, kc).unwrap();
    let (code, out) = doctor_nad(&nad);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        findings(&out, "FAIL", "kubeconfig")[0].contains("/nonexistent/token"),
        "{out}"
    );

    std::fs::remove_file(&kubeconfig).unwrap();
    let (code, out) = doctor_nad(&nad);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        findings(&out, "FAIL", "kubeconfig")[0].contains("does not exist"),
        "{out}"
    );
}

/// Issue 36 (guards): doctor compares the config with the cluster's NADs and names the NAD whose
/// range overlaps it in another fabric on the same master; a config overlapping nothing gets an OK
/// line, and a NAD object given as the config stands in for its own cluster copy. `validate
/// --cluster` says the same as a warning.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn item94_doctor_and_validate_compare_the_config_with_the_clusters_nads() {
    let env = Env::real("kdoctor-overlap");
    nad_crd(&env);
    let ns = env.name("ns");
    let (net, rail) = (env.name("mgmt"), env.name("rail"));
    // Ranges no other test uses (master lo is everyone's).
    let conf = |name: &str, range: &str| {
        json!({"cniVersion": "1.0.0", "name": name, "type": "tether-ipvlan", "master": "lo",
               "ipam": {"type": "tether-ipam", "range": range, "probe": false, "store": "kubernetes",
                        "isolated_fabric": fabric_of(name), "kubernetes": {"kubeconfig": env.kubeconfig}}})
    };
    let rail_conf = conf(rail, "10.232.0.0/24");
    let _rail = cluster_nad(&env, ns, "rail", &rail_conf);
    let write = |file: &str, v: &serde_json::Value| {
        let p = env.dir.join(file);
        std::fs::write(&p, v.to_string()).unwrap();
        p
    };

    let overlapping = write("mgmt.json", &conf(net, "10.232.0.128/25"));
    let (code, out) = doctor_nad(&overlapping);
    assert_eq!(code, Some(1), "{out}");
    let f = findings(&out, "FAIL", "overlap");
    assert_eq!(f.len(), 1, "{out}");
    assert!(
        f[0].contains(&format!("{ns}/rail (network {rail}, range 10.232.0.0/24)"))
            && f[0].contains(&overlapping.display().to_string())
            && f[0].contains("126 addresses (10.232.0.129-10.232.0.254) on master lo"),
        "{out}"
    );
    let o = tether(&[
        "validate",
        "--cluster",
        "--kubeconfig",
        env.kubeconfig.to_str().unwrap(),
        "--config",
        overlapping.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "a warning: {}", stderr(&o));
    assert!(
        stderr(&o).contains("tether: warning:") && stderr(&o).contains(&format!("{ns}/rail")),
        "{}",
        stderr(&o)
    );

    let apart = write("apart.json", &conf(net, "10.232.1.0/24"));
    let (_, out) = doctor_nad(&apart);
    let ok = findings(&out, "OK", "overlap");
    assert!(
        ok.len() == 1 && ok[0].contains(&format!("overlaps network {net}'s")),
        "{out}"
    );
    assert!(findings(&out, "FAIL", "overlap").is_empty(), "{out}");

    // The rail NAD itself, about to get a /16: compared with the others, not with its old self.
    let mut wider = rail_conf.clone();
    wider["ipam"]["range"] = json!("10.232.0.0/16");
    let object = write(
        "rail-object.json",
        &json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                "metadata": {"name": "rail", "namespace": ns}, "spec": {"config": wider.to_string()}}),
    );
    let (_, out) = doctor_nad(&object);
    assert!(
        findings(&out, "FAIL", "overlap").is_empty() && findings(&out, "OK", "overlap").len() == 1,
        "{out}"
    );
}
