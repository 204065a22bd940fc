//! tether-ipam as a CNI plugin over the Kubernetes store: one IPLease object per address created
//! by ADD, on a real API server (TETHER_TEST_KUBECONFIG; `make test` starts one), and the CNI
//! codes a runtime sees when the API is away (no server at all) (checklist 80, 82).

mod reconcile_support;

use std::io::Write;
use std::process::{Command, Stdio};

use reconcile_support::*;
use serde_json::{Value, json};

fn call(verb: &str, cid: &str, conf: &Value) -> (i32, Value) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tether-ipam"))
        .env_clear()
        .env("CNI_COMMAND", verb)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", "/run/netns/unused")
        .env("CNI_IFNAME", "net1")
        .env("CNI_ARGS", format!("IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-{cid};K8S_POD_UID=uid-{cid}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(conf.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let v = if out.stdout.is_empty() { Value::Null } else { serde_json::from_slice(&out.stdout).unwrap() };
    (out.status.code().unwrap_or(-1), v)
}

fn conf(kubeconfig: &std::path::Path, timeout_s: u64, network: &str) -> Value {
    json!({"cniVersion": "1.1.0", "name": network, "type": "tether-ipvlan",
           "ipam": {"type": "tether-ipam", "range": "10.20.30.241-10.20.30.250/24", "probe": false,
                    "kubernetes": {"kubeconfig": kubeconfig, "timeout_s": timeout_s}}})
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn item80_add_creates_one_object_per_address_and_del_releases_it() {
    let env = Env::real("kcni");
    let net = env.name("mgmt");
    let c = conf(&env.kubeconfig, 10, net);
    let mut addrs = Vec::new();
    for cid in ["c1", "c2", "c3"] {
        let (code, r) = call("ADD", cid, &c);
        assert_eq!(code, 0, "{r}");
        addrs.push(r["ips"][0]["address"].as_str().unwrap().to_string());
    }
    // The objects, as the API server has them.
    let objs = env.lease_objects(net);
    assert_eq!(objs.len(), 3, "one object per leased address: {objs:?}");
    for a in &addrs {
        let ip = a.split('/').next().unwrap();
        assert!(objs.iter().any(|o| o["spec"]["address"] == ip && o["spec"]["network"] == net), "{a} has no object: {objs:?}");
    }
    assert_eq!(call("DEL", "c1", &c).0, 0);
    let ip1 = addrs[0].split('/').next().unwrap();
    let o = env.lease_objects(net).into_iter().find(|o| o["spec"]["address"] == ip1).expect("record kept for cooldown/sticky");
    assert_eq!(o["spec"]["state"], "Released", "{o}");
    assert_eq!(call("CHECK", "c1", &c).0, 1, "CHECK fails once released");
}

/// No server: a port where nothing listens.
#[test]
fn item82_unreachable_api_is_code_11_and_nothing_is_leased() {
    let dir = TempDir::new("kcni-down");
    let kc = dir.join("kubeconfig");
    std::fs::write(&kc, tether_apiserver_double::kubeconfig_for(&closed_url())).unwrap();
    let t = std::time::Instant::now();
    let (code, e) = call("ADD", "c9", &conf(&kc, 2, "mgmt"));
    assert_eq!(code, 1);
    assert_eq!(e["code"], 11, "{e}");
    assert!(t.elapsed() < std::time::Duration::from_secs(5), "bounded by the budget: {:?}", t.elapsed());
    let (code, e) = call("STATUS", "c9", &conf(&kc, 2, "mgmt"));
    assert_eq!((code, e["code"].as_u64()), (1, Some(50)), "{e}");
}
