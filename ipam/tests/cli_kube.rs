//! The command line over the Kubernetes store, against the API double: leases, release (with pod
//! checks), doctor (happy path, missing CRD, 403 on verbs, unreachable API, bad kubeconfig).

mod reconcile_support;

use reconcile_support::*;
use serde_json::json;
use tether_leases::{FileStore, LeaseState, LeaseStore};

const NET: &str = "gpu-net";

fn setup(tag: &str) -> Env {
    let env = Env::new(tag);
    let t = now() - 600;
    env.pod("ml", "trainer-0", "u-live", "n1");
    env.pod("ml", "sts-0", "u-new", "n1");
    env.put(lease(NET, "10.77.0.10", Some(("ml", "trainer-0", "u-live")), "n1", t));
    env.put(lease(NET, "10.77.0.11", Some(("ml", "gone", "u-gone")), "n1", t));
    env.put(lease(NET, "10.77.0.12", Some(("ml", "sts-0", "u-old")), "n1", t));
    env.put(lease(NET, "10.77.0.13", None, "n1", t));
    let mut rel = lease("other-net", "10.88.0.1", Some(("ml", "x", "u-x")), "n2", t);
    rel.state = LeaseState::Released { at: t };
    env.put(rel);
    env
}

#[test]
fn leases_table_and_json_for_all_networks_or_one() {
    let env = setup("kleases");
    let kc = env.kubeconfig.to_str().unwrap();
    let o = ipam(&["leases", "--kubeconfig", kc]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "header + every network's records: {out}");
    assert!(lines[0].starts_with("NETWORK"));
    assert!(lines[1].starts_with(NET) && lines[1].contains("10.77.0.10/24") && lines[1].contains("ml/trainer-0") && lines[1].contains("n1"), "{out}");
    assert!(lines[5].starts_with("other-net") && lines[5].contains("released") && lines[5].contains("n2"), "{out}");

    let o = ipam(&["leases", "--kubeconfig", kc, "--network", NET, "-o", "json"]);
    assert_eq!(o.status.code(), Some(0));
    let v = json_out(&o);
    assert_eq!(v.as_array().unwrap().len(), 4);
    assert_eq!(v[0]["pod"], json!({"namespace": "ml", "name": "trainer-0", "uid": "u-live"}));
    assert_eq!(v[0]["state"], "leased");

    // The store from a NAD (its ipam.kubernetes.kubeconfig): that network by default.
    let nad = env.nad(NET);
    let o = ipam(&["leases", "--config", nad.to_str().unwrap(), "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(json_out(&o).as_array().unwrap().len(), 4);
}

#[test]
fn release_checks_the_pod() {
    let env = setup("krelease");
    let kc = env.kubeconfig.to_str().unwrap();
    let rel = |addr: &str, extra: &[&str]| {
        let mut a = vec!["release", addr, "--network", NET, "--kubeconfig", kc];
        a.extend_from_slice(extra);
        ipam(&a)
    };
    // Live pod with the lease's uid: refused, exit 3, lease untouched.
    let o = rel("10.77.0.10", &[]);
    assert_eq!(o.status.code(), Some(3));
    assert!(stderr(&o).contains("ml/trainer-0") && stderr(&o).contains("exists") && stderr(&o).contains("--force"), "{}", stderr(&o));
    let o = rel("10.77.0.10", &["-o", "json"]);
    assert_eq!(o.status.code(), Some(3));
    assert_eq!(json_out(&o)["refused"], "10.77.0.10");
    assert!(matches!(env.state(NET, "10.77.0.10"), Some(LeaseState::Leased)));
    // A lease naming no pod: cannot tell, refused.
    assert_eq!(rel("10.77.0.13", &[]).status.code(), Some(3));
    // Pod gone, or replaced by another uid: released without --force.
    let o = rel("10.77.0.11", &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("no longer exists"), "{}", stdout(&o));
    assert_eq!(env.state(NET, "10.77.0.11"), None);
    let o = rel("10.77.0.12", &["-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(json_out(&o)["reason"].as_str().unwrap().contains("another pod"));
    // --force releases a live one.
    let o = rel("10.77.0.10", &["--force"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(env.state(NET, "10.77.0.10"), None);
    // A released record: removed (cooldown ends), exit 0.
    let o = ipam(&["release", "10.88.0.1", "--network", "other-net", "--kubeconfig", kc]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(env.state("other-net", "10.88.0.1"), None);
    // No such record: exit 1.
    assert_eq!(rel("10.77.0.99", &[]).status.code(), Some(1));
    // The API unreachable: the live check cannot be made, refused.
    let env2 = setup("krelease-down");
    let kc2 = env2.kubeconfig.to_str().unwrap().to_string();
    env2.double.forbid("get", "pods");
    let o = ipam(&["release", "10.77.0.11", "--network", NET, "--kubeconfig", &kc2]);
    assert_eq!(o.status.code(), Some(3), "checking the pod failed: refuse");
    assert!(stderr(&o).contains("pods"), "{}", stderr(&o));
}

#[test]
fn file_store_with_a_kubeconfig_checks_pods_too() {
    let env = Env::new("kfile");
    env.pod("ml", "alive", "u-a", "n1");
    let data = env.dir.join("data");
    let fs = FileStore::new(&data);
    let t = now() - 600;
    fs.claim(lease("fnet", "10.9.0.1", Some(("ml", "alive", "u-a")), "n1", t), None).unwrap().unwrap();
    fs.claim(lease("fnet", "10.9.0.2", Some(("ml", "gone", "u-g")), "n1", t), None).unwrap().unwrap();
    let (d, kc) = (data.to_str().unwrap(), env.kubeconfig.to_str().unwrap());
    assert_eq!(ipam(&["release", "10.9.0.1", "--network", "fnet", "--data-dir", d, "--kubeconfig", kc]).status.code(), Some(3));
    assert_eq!(ipam(&["release", "10.9.0.2", "--network", "fnet", "--data-dir", d]).status.code(), Some(3), "no API: refused");
    let o = ipam(&["release", "10.9.0.2", "--network", "fnet", "--data-dir", d, "--kubeconfig", kc]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let left: Vec<String> = fs.list("fnet").unwrap().iter().map(|l| l.address.to_string()).collect();
    assert_eq!(left, vec!["10.9.0.1".to_string()]);
    let o = ipam(&["leases", "--data-dir", d, "-o", "json"]);
    assert_eq!(json_out(&o).as_array().unwrap().len(), 1);
}

fn doctor(env: &Env) -> (Option<i32>, String) {
    let nad = env.nad(NET);
    let o = ipam(&["doctor", "--config", nad.to_str().unwrap()]);
    (o.status.code(), stdout(&o))
}

#[test]
fn doctor_happy_path_against_the_double() {
    let env = setup("kdoctor-ok");
    let (code, out) = doctor(&env);
    assert_eq!(code, Some(0), "{out}");
    for check in ["config", "master", "kubeconfig", "api", "crd", "rbac", "store", "pool", "conflicts"] {
        assert!(!findings(&out, "OK", check).is_empty(), "OK {check}: {out}");
    }
    let rbac = findings(&out, "OK", "rbac");
    assert_eq!(rbac.len(), 2, "exactly the leases' verbs and pods get/list/watch: {out}");
    assert!(rbac[0].contains("get, list, watch, create, update, delete on ipleases.ipam.tether.dev"), "{out}");
    assert!(rbac[1].contains("get, list, watch on pods"), "{out}");
    assert!(!out.contains("nodes"), "no access to nodes is needed: {out}");
    assert!(findings(&out, "OK", "store")[0].contains("4 record(s)"), "{out}");
    assert!(out.lines().skip(1).all(|l| l.starts_with("OK ")), "{out}");
}

#[test]
fn doctor_without_the_crd_says_how_to_install_it() {
    let env = Env::new("kdoctor-nocrd");
    env.double.set_crd_installed(false);
    let (code, out) = doctor(&env);
    assert_eq!(code, Some(1), "{out}");
    let f = findings(&out, "FAIL", "crd");
    assert_eq!(f.len(), 1, "{out}");
    assert!(f[0].contains("kubectl apply -f deploy/crds/ipleases.yaml"), "{out}");
    assert!(!findings(&out, "OK", "api").is_empty(), "the API itself answers: {out}");
    assert!(findings(&out, "OK", "store").is_empty(), "no store line repeating the failure: {out}");

    // RBAC may forbid reading CRDs: doctor says so and falls back to listing the leases.
    env.double.set_crd_installed(true);
    env.double.forbid("get", "customresourcedefinitions");
    let (code, out) = doctor(&env);
    assert_eq!(code, Some(0), "{out}");
    assert!(findings(&out, "OK", "crd")[0].contains("listing ipleases works"), "{out}");
}

#[test]
fn doctor_names_forbidden_verbs_and_what_to_grant() {
    let env = setup("kdoctor-403");
    env.double.forbid("create", "ipleases");
    env.double.forbid("delete", "ipleases");
    env.double.forbid("watch", "pods");
    let (code, out) = doctor(&env);
    assert_eq!(code, Some(1), "{out}");
    let f = findings(&out, "FAIL", "rbac");
    assert_eq!(f.len(), 2, "{out}");
    assert!(f[0].contains("create") && f[0].contains("delete") && f[0].contains("ipleases.ipam.tether.dev") && f[0].contains("grant"), "{out}");
    assert!(f[0].contains("deploy/base/rbac.yaml"), "{out}");
    assert!(f[1].contains("watch") && f[1].contains("pods"), "{out}");
    assert!(findings(&out, "OK", "rbac").is_empty(), "only two rbac lines, both failing: {out}");

    // The access reviews themselves forbidden: one FAIL saying how to check by hand.
    env.double.allow_all();
    env.double.forbid("create", "selfsubjectaccessreviews");
    let (code, out) = doctor(&env);
    assert_eq!(code, Some(1), "{out}");
    assert!(findings(&out, "FAIL", "rbac")[0].contains("kubectl auth can-i"), "{out}");
}

#[test]
fn doctor_with_an_unreachable_api_or_a_bad_kubeconfig() {
    let env = Env::new("kdoctor-down");
    // Point the kubeconfig at a closed port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    std::fs::write(&env.kubeconfig, tether_apiserver_double::kubeconfig_for(&url)).unwrap();
    let (code, out) = doctor(&env);
    assert_eq!(code, Some(1), "{out}");
    let f = findings(&out, "FAIL", "api");
    assert_eq!(f.len(), 1, "{out}");
    assert!(f[0].contains("cannot reach"), "{out}");

    // A token file that cannot be read.
    let kc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    tokenFile: /nonexistent/token\n",
        env.double.url()
    );
    std::fs::write(&env.kubeconfig, kc).unwrap();
    let (code, out) = doctor(&env);
    assert_eq!(code, Some(1), "{out}");
    assert!(findings(&out, "FAIL", "kubeconfig")[0].contains("/nonexistent/token"), "{out}");

    std::fs::remove_file(&env.kubeconfig).unwrap();
    let (code, out) = doctor(&env);
    assert_eq!(code, Some(1), "{out}");
    assert!(findings(&out, "FAIL", "kubeconfig")[0].contains("does not exist"), "{out}");
}
