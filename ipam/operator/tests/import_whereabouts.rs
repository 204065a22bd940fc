//! `tether import-whereabouts` against the real peers: the whereabouts CNI binary allocating on
//! the real API server (TETHER_TEST_KUBECONFIG; whereabouts' CRDs from ../shared/peers applied to
//! it), then the import, tether-ipam ADDs through node-bound credentials, and the reconciler.
//!
//! Every test keeps whereabouts' objects in a namespace of its own (whereabouts takes the one of
//! its kubeconfig's context) and uses a range no other test uses (10.203.0.0/16): the addresses
//! are in the cluster-wide domain, which every test on the server shares. Its IPLeases (networks
//! named after the test) are deleted by `Env`, whereabouts' objects by [`WhereaboutsNs`].

mod reconcile_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reconcile_support::*;
use serde_json::{Value, json};
use tether_leases::{Lease, LeaseState, PodRef};

const IPLEASES: &str = "/apis/ipam.tether.dev/v1alpha1/ipleases";

/// The whereabouts binary built with the other peers.
fn whereabouts_bin() -> PathBuf {
    let p = Path::new(
        &std::env::var("PEERS_BIN_DIR").unwrap_or_else(|_| "/var/cache/tether-peers/bin".into()),
    )
    .join("whereabouts");
    assert!(
        p.is_file(),
        "NOT RUN: {} is missing: build the peers first (.ci/deps.sh)",
        p.display()
    );
    p
}

/// Create namespace `ns` (there already: fine).
fn namespace(env: &Env, ns: &str) {
    match env.post_json(
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    ) {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create namespace {ns}: {e}"),
    }
}

/// whereabouts on this server, keeping its objects in a namespace of the test's. Dropped, it
/// deletes its objects and election Lease, the NADs made with [`WhereaboutsNs::nad`], and every
/// IPLease of the test's range (whichever network a failed run left them under).
struct WhereaboutsNs {
    ns: &'static str,
    /// The IPAM section of the NAD (`type` whereabouts).
    ipam: Value,
    /// The start of the names of the IPLeases of the range (`10.203.0.`).
    lease_names: &'static str,
    /// NADs made: (namespace, name).
    nads: Vec<(String, String)>,
}

impl WhereaboutsNs {
    /// whereabouts' kubeconfig (the admin's, its context's namespace this test's) and the flat
    /// configuration file it needs beside the NAD.
    fn new(env: &Env, range: &str, lease_names: &'static str, extra: Value) -> WhereaboutsNs {
        whereabouts_crds(env);
        nad_crd(env);
        let ns = env.name("wb");
        namespace(env, ns);
        let mut kc: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(&env.kubeconfig).unwrap()).unwrap();
        for c in kc["contexts"].as_array_mut().unwrap() {
            c["context"]["namespace"] = json!(ns);
        }
        let kc_path = env.dir.join("whereabouts.kubeconfig");
        std::fs::write(&kc_path, kc.to_string()).unwrap();
        let flat = env.dir.join("whereabouts.conf");
        std::fs::write(
            &flat,
            json!({"datastore": "kubernetes", "kubernetes": {"kubeconfig": kc_path}}).to_string(),
        )
        .unwrap();
        let mut ipam = json!({"type": "whereabouts", "range": range, "log_level": "error",
                              "configuration_path": flat});
        for (k, v) in extra.as_object().unwrap() {
            ipam[k] = v.clone();
        }
        WhereaboutsNs {
            ns,
            ipam,
            lease_names,
            nads: Vec::new(),
        }
    }

    /// The same, with whereabouts' objects in `ns` (one other tests do not use).
    fn in_namespace(
        env: &Env,
        ns: &'static str,
        range: &str,
        lease_names: &'static str,
    ) -> WhereaboutsNs {
        let mut wb = WhereaboutsNs::new(env, range, lease_names, json!({}));
        let kc_path = env.dir.join("whereabouts.kubeconfig");
        let mut kc: Value =
            serde_saphyr::from_str(&std::fs::read_to_string(&kc_path).unwrap()).unwrap();
        for c in kc["contexts"].as_array_mut().unwrap() {
            c["context"]["namespace"] = json!(ns);
        }
        std::fs::write(&kc_path, kc.to_string()).unwrap();
        wb.ns = ns;
        wb
    }

    /// A NAD `ns/name` of network `net` with this IPAM.
    fn nad(&mut self, env: &Env, ns: &str, name: &str, net: &str) {
        namespace(env, ns);
        let nad = json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                         "metadata": {"name": name, "namespace": ns},
                         "spec": {"config": self.conf(net).to_string()}});
        env.post_json(
            &format!("/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions"),
            &nad,
        )
        .expect("create the NAD");
        self.nads.push((ns.to_string(), name.to_string()));
    }

    /// The network configuration of network `net` (as a NAD carries it).
    fn conf(&self, net: &str) -> Value {
        json!({"cniVersion": "0.3.1", "name": net, "type": "ipvlan", "master": "lo", "ipam": self.ipam})
    }

    /// whereabouts ADD for pod `ns/pod` (uid), sandbox `ctr`, interface net1, as Multus calls it;
    /// the address handed out.
    fn add(&self, net: &str, ns: &str, pod: &str, uid: &str, ctr: &str) -> String {
        let (code, r) = run_ipam(
            &whereabouts_bin(),
            &[
                ("CNI_COMMAND", "ADD".into()),
                ("CNI_CONTAINERID", ctr.into()),
                ("CNI_NETNS", "/var/run/netns/unused".into()),
                ("CNI_IFNAME", "net1".into()),
                ("CNI_PATH", "/opt/cni/bin".into()),
                (
                    "CNI_ARGS",
                    format!(
                        "IgnoreUnknown=true;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod};\
                         K8S_POD_INFRA_CONTAINER_ID={ctr};K8S_POD_UID={uid}"
                    ),
                ),
            ],
            &self.conf(net),
        );
        assert_eq!(code, 0, "whereabouts ADD for {ns}/{pod}: {r}");
        first_address(&r)
    }
}

impl Drop for WhereaboutsNs {
    fn drop(&mut self) {
        // Best effort: the server is shared by the whole run.
        let kubectl = |args: &[&str]| {
            Command::new(kubectl())
                .args(["--kubeconfig", real_cluster().unwrap().to_str().unwrap()])
                .args(args)
                .output()
        };
        let ns = self.ns;
        let _ = kubectl(&[
            "-n",
            ns,
            "delete",
            "ippools,overlappingrangeipreservations",
            "--all",
        ]);
        let _ = kubectl(&[
            "-n",
            ns,
            "delete",
            "lease",
            "whereabouts",
            "--ignore-not-found",
        ]);
        for (ns, name) in &self.nads {
            let _ = kubectl(&[
                "-n",
                ns,
                "delete",
                "net-attach-def",
                name,
                "--ignore-not-found",
            ]);
        }
        let prefix = format!("iplease.ipam.tether.dev/{}", self.lease_names);
        if let Ok(o) = kubectl(&["get", "ipleases", "-o", "name"]) {
            let ours: Vec<&str> = std::str::from_utf8(&o.stdout)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with(&prefix))
                .collect();
            if !ours.is_empty() {
                let _ = kubectl(&[&["delete", "--ignore-not-found"][..], &ours].concat());
            }
        }
    }
}

/// `tether import-whereabouts -n <ns> -o json` plus `extra`, as the admin unless `extra` names
/// a kubeconfig: its exit code and report.
fn import(env: &Env, ns: &str, extra: &[&str]) -> (i32, Value) {
    let mut args = vec!["import-whereabouts", "-n", ns, "-o", "json"];
    args.extend_from_slice(extra);
    if !extra.contains(&"--kubeconfig") {
        args.extend(["--kubeconfig", env.kubeconfig.to_str().unwrap()]);
    }
    let o = tether(&args);
    (o.status.code().unwrap_or(-1), json_out(&o))
}

/// The import's totals: imported, already, pod gone, conflicts, skipped, failed.
fn counts(r: &Value) -> [u64; 6] {
    [
        "imported",
        "already",
        "podGone",
        "conflicts",
        "skipped",
        "failed",
    ]
    .map(|k| {
        r["counts"][k]
            .as_u64()
            .unwrap_or_else(|| panic!("no {k} in {r}"))
    })
}

/// The IPLease of `address` in the cluster-wide domain, if any.
fn iplease(env: &Env, address: &str) -> Option<Value> {
    match env.get_json(IPLEASES, Some(address)) {
        Ok(v) => Some(v),
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(e) => panic!("GET iplease {address}: {e}"),
    }
}

/// tether-ipam `verb` on `node` for pod `ns/pod` (uid), sandbox `ctr`, interface net1, straight
/// to the API server with the node's credential.
fn tether_ipam(
    node: &Node,
    verb: &str,
    conf: &Value,
    pod: (&str, &str, &str),
    ctr: &str,
) -> (i32, Value) {
    let (ns, name, uid) = pod;
    let mut conf = conf.clone();
    conf["ipam"]["kubernetes"] = json!({"kubeconfig": node.kubeconfig, "timeout_s": 10});
    conf["ipam"]["dataDir"] = json!(node.dir);
    run_ipam(
        &ipam_bin(),
        &[
            ("CNI_COMMAND", verb.to_string()),
            ("CNI_CONTAINERID", ctr.to_string()),
            ("CNI_NETNS", "/run/netns/unused".to_string()),
            ("CNI_IFNAME", "net1".to_string()),
            (
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=true;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID={uid}"
                ),
            ),
            ("TETHER_LEASE_SOCKET", String::new()),
        ],
        &conf,
    )
}

/// The whereabouts network configuration with only its `type` changed (what the migration does
/// to a NAD), plus what a test on a shared server needs: no probe on lo, no cooldown.
fn moved_over(wb: &Value) -> Value {
    let mut c = wb.clone();
    c["type"] = json!("tether-ipvlan");
    c["ipam"]["type"] = json!("tether-ipam");
    c["ipam"]["probe"] = json!(false);
    c["ipam"]["cooldown_s"] = json!(0);
    c
}

/// The 20 pods' addresses stay theirs through the import and tether's ADDs, and return to tether
/// once the pods are gone and the reconciler of their nodes has run.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn twenty_running_pods_keep_their_addresses_until_they_are_gone() {
    let env = Env::real("wbimport");
    let (n1, n2) = (node(&env, "n1"), node(&env, "n2"));
    let (ns, net) = (env.name("ml"), env.name("mgmt"));
    // 61 addresses: 21 from whereabouts, then 40 from tether use them all.
    let mut wb = WhereaboutsNs::new(
        &env,
        "10.203.0.0/26",
        "10.203.0.",
        json!({"range_end": "10.203.0.61"}),
    );
    wb.nad(&env, ns, "mgmt", net);

    // 21 pods on two nodes get their addresses from whereabouts; the last one is deleted
    // without a DEL (whereabouts' leak: its allocation stays).
    let mut held = Vec::new(); // (pod, uid, node, address)
    for i in 0..21_usize {
        let n = if i.is_multiple_of(2) { &n1 } else { &n2 };
        let pod = format!("wb-{i}");
        let uid = env.pod(ns, &pod, "", n.name);
        let address = wb.add(net, ns, &pod, &uid, &format!("ctr-wb-{i}"));
        held.push((pod, uid, n.name, address));
    }
    let (_, _, _, leaked) = held.pop().unwrap();
    assert!(env.delete_pod(ns, "wb-20"));
    let wb_addresses: BTreeSet<String> = held.iter().map(|h| h.3.clone()).collect();
    assert_eq!(wb_addresses.len(), 20);

    // A dry run judges all and writes nothing.
    let (code, r) = import(&env, wb.ns, &["--dry-run"]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(counts(&r), [20, 0, 1, 0, 0, 0], "{r}");
    assert!(held.iter().all(|h| iplease(&env, &h.3).is_none()));

    let t = Instant::now();
    let (code, r) = import(&env, wb.ns, &[]);
    eprintln!("import of 21 allocations: {:?}", t.elapsed());
    assert_eq!(code, 0, "{r}");
    assert_eq!(counts(&r), [20, 0, 1, 0, 0, 0], "{r}");
    let pool = &r["pools"][0];
    assert_eq!(pool["pool"], format!("{}/10.203.0.0-26", wb.ns));
    assert_eq!(
        (&pool["network"], &pool["nad"], &pool["matchedBy"]),
        (&json!(net), &json!(format!("{ns}/mgmt")), &json!("name"))
    );
    for (pod, uid, node, address) in &held {
        let o = iplease(&env, address).unwrap_or_else(|| panic!("no IPLease of {address}"));
        let s = &o["spec"];
        assert_eq!(
            (&s["state"], &s["network"], &s["node"], &s["prefixLength"]),
            (&json!("Leased"), &json!(net), &json!(node), &json!(26)),
            "{o}"
        );
        assert_eq!(
            s["pod"],
            json!({"namespace": ns, "name": pod, "uid": uid}),
            "{o}"
        );
        assert_eq!(
            (&s["containerID"], &s["ifname"]),
            (&json!(format!("ctr-{pod}")), &json!("net1"))
        );
        assert!(
            s.get("isolatedFabric").is_none(),
            "the cluster-wide domain: {o}"
        );
    }
    assert!(
        iplease(&env, &leaked).is_none(),
        "a gone pod's address is free"
    );
    let (code, r) = import(&env, wb.ns, &[]);
    assert_eq!((code, counts(&r)), (0, [0, 20, 1, 0, 0, 0]), "{r}");

    // The NAD moves over: 41 tether-ipam ADDs (the 20 addresses kept, the leaked one free) use
    // the range up; none gets one of the 20.
    let conf = moved_over(&wb.conf(net));
    let add = |i: usize| {
        let n = if i.is_multiple_of(2) { &n1 } else { &n2 };
        let pod = format!("t-{i}");
        let uid = env.pod(ns, &pod, "", n.name);
        tether_ipam(n, "ADD", &conf, (ns, &pod, &uid), &format!("ctr-t-{i}"))
    };
    let mut tether_addresses = BTreeSet::new();
    for i in 0..41 {
        let (code, r) = add(i);
        assert_eq!(code, 0, "tether ADD {i}: {r}");
        let a = first_address(&r);
        assert!(
            !wb_addresses.contains(&a),
            "tether handed out {a}, which pod {} holds",
            held.iter().find(|h| h.3 == a).unwrap().0
        );
        assert!(tether_addresses.insert(a));
    }
    assert!(tether_addresses.contains(&leaked));
    let (code, r) = add(100);
    assert!(code != 0 && r["code"] == 102, "the range is used up: {r}");

    // The 20 pods go; each node's reconciler (the node's own credential, as its agent runs it)
    // releases their leases.
    for h in &held {
        assert!(env.delete_pod(ns, &h.0));
    }
    let mut released = BTreeSet::new();
    for n in [&n1, &n2] {
        let o = tether(&[
            "reconcile",
            "--once",
            "--grace-s",
            "0",
            "--no-sweep",
            "--node",
            n.name,
            "--agent-namespace",
            AGENT_NS,
            "--kubeconfig",
            n.kubeconfig.to_str().unwrap(),
            "-o",
            "json",
        ]);
        assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
        let r = json_out(&o);
        let mine: Vec<String> = r["released"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["address"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(mine.len(), 10, "node {}: {r}", n.name);
        released.extend(mine);
    }
    assert_eq!(released, wb_addresses);

    // The 20 addresses are tether's again: 20 more ADDs get exactly them, the next finds none.
    let mut again = BTreeSet::new();
    for i in 41..61 {
        let (code, r) = add(i);
        assert_eq!(code, 0, "tether ADD {i}: {r}");
        again.insert(first_address(&r));
    }
    assert_eq!(again, wb_addresses);
    let (code, r) = add(101);
    assert!(
        code != 0 && r["code"] == 102,
        "the range is used up again: {r}"
    );
}

/// A record of `address` in the cluster-wide domain, held by `pod` (namespace, name, uid).
fn record(network: &str, address: &str, pod: (&str, &str, &str), state: LeaseState) -> Lease {
    Lease {
        network: network.into(),
        domain: None,
        address: address.parse().unwrap(),
        prefix_len: 28,
        range_index: Some(0),
        container_id: format!("ctr-{}", pod.1),
        ifname: "net1".into(),
        pod: PodRef::new(pod.0, pod.1, pod.2),
        node: Some("elsewhere".into()),
        state,
        since: now() - 600,
        version: None,
    }
}

/// A ClusterRole and its binding, deleted when dropped.
struct Rbac(&'static str);

impl Drop for Rbac {
    fn drop(&mut self) {
        let _ = Command::new(kubectl())
            .args(["--kubeconfig", real_cluster().unwrap().to_str().unwrap()])
            .args([
                "delete",
                "--ignore-not-found",
                "clusterrolebinding,clusterrole",
                self.0,
            ])
            .output();
    }
}

/// A kubeconfig for a user bound to exactly the shipped deploy/import-whereabouts/rbac.yaml
/// (the admin's, impersonating that user), once the authorizer has it.
fn importer_kubeconfig(env: &Env) -> (PathBuf, Rbac) {
    let shipped =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/import-whereabouts/rbac.yaml");
    let mut role: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(shipped).unwrap()).unwrap();
    let user = env.name("importer");
    role["metadata"]["name"] = json!(user);
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    env.post_json(&format!("{rbac}/clusterroles"), &role)
        .expect("create the ClusterRole");
    let guard = Rbac(user);
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]});
    env.post_json(&format!("{rbac}/clusterrolebindings"), &binding)
        .expect("create the binding");
    let mut kc: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&env.kubeconfig).unwrap()).unwrap();
    for u in kc["users"].as_array_mut().unwrap() {
        u["user"]["as"] = json!(user);
    }
    let path = env.dir.join("importer.kubeconfig");
    std::fs::write(&path, kc.to_string()).unwrap();
    let cluster =
        tether_cluster::Cluster::connect(&tether_kube_store::KubeSettings::with_kubeconfig(&path))
            .unwrap();
    let in_force = wait_until(Duration::from_secs(10), || {
        cluster.restart_budget();
        cluster
            .can_i("update", "ipam.tether.dev", "ipleases")
            .is_ok_and(|a| a.allowed)
    });
    assert!(
        in_force.is_some(),
        "RBAC for {user} not in force after 10 s"
    );
    (path, guard)
}

/// An address leased to another pod is a conflict (reported with both holders, left as it is,
/// exit 1); a released record is taken over; the same holder's is already imported; a
/// reservation whose pool entry was lost is imported. As a user holding only the shipped
/// ClusterRole; a node's credential is refused.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn conflicts_stay_and_are_reported_released_records_are_taken_over() {
    let env = Env::real("wbconflict");
    let (ns, net, other, on) = (
        env.name("ml"),
        env.name("rail"),
        env.name("other"),
        env.name("n1"),
    );
    let mut wb = WhereaboutsNs::new(&env, "10.203.1.0/28", "10.203.1.", json!({}));
    wb.nad(&env, ns, "rail", net);
    let mut pods = Vec::new(); // (name, uid, address)
    for i in 0..4 {
        let name = format!("q-{i}");
        let uid = env.pod(ns, &name, "", on);
        let address = wb.add(net, ns, &name, &uid, &format!("ctr-{name}"));
        pods.push((name, uid, address));
    }
    // 4: a pod bound to no node (a replica re-created under the name of the one whereabouts
    // gave the address, not yet scheduled): no node's reconciler would judge its lease.
    let unbound = env.pod_object(json!({"metadata": {"namespace": ns, "name": "q-4"}, "spec": {}}));
    let unbound_address = wb.add(net, ns, "q-4", &unbound, "ctr-q-4");
    let a = |i: usize| pods[i].2.as_str();
    // 0: leased to a pod of another network, which is gone; 1: released by another pod;
    // 2: leased to q-2's own attachment; 3: whereabouts' pool lost its entry, the reservation
    // stayed (its records drift, #712).
    env.put(record(
        other,
        a(0),
        ("elsewhere", "x", "u-x"),
        LeaseState::Leased,
    ));
    env.put(record(
        other,
        a(1),
        ("elsewhere", "y", "u-y"),
        LeaseState::Released { at: now() - 600 },
    ));
    env.put(record(
        net,
        a(2),
        (ns, "q-2", &pods[2].1),
        LeaseState::Leased,
    ));
    let offset = a(3).rsplit('.').next().unwrap();
    kubectl_ok(&[
        "-n",
        wb.ns,
        "patch",
        "ippool",
        "10.203.1.0-28",
        "--type=json",
        "-p",
        &format!(r#"[{{"op":"remove","path":"/spec/allocations/{offset}"}}]"#),
    ]);

    let (kc, _rbac) = importer_kubeconfig(&env);
    let (code, r) = import(&env, wb.ns, &["--kubeconfig", kc.to_str().unwrap()]);
    assert_eq!(code, 1, "a conflict is left: {r}");
    assert_eq!(counts(&r), [2, 1, 0, 1, 1, 0], "{r}");
    assert!(
        r["skipped"][0]["reason"].as_str().unwrap().contains("pod ")
            && r["skipped"][0]["reason"]
                .as_str()
                .unwrap()
                .contains("is bound to no node"),
        "{r}"
    );
    assert!(iplease(&env, &unbound_address).is_none());
    let c = &r["conflicts"][0];
    assert_eq!(c["address"], a(0));
    assert_eq!(c["whereabouts"]["pod"]["name"], "q-0", "{c}");
    assert_eq!(c["whereabouts"]["containerID"], "ctr-q-0", "{c}");
    assert_eq!(
        (
            &c["tether"]["pod"]["name"],
            &c["tether"]["network"],
            &c["tether"]["podState"]
        ),
        (&json!("x"), &json!(other), &json!("gone")),
        "{c}"
    );
    let advice = c["advice"].as_str().unwrap();
    assert!(
        advice.contains(&format!("tether release {} --network {other}", a(0)))
            && advice.contains("isolated_fabric"),
        "{advice}"
    );
    let spec = |i: usize| iplease(&env, a(i)).unwrap()["spec"].clone();
    assert_eq!(
        (&spec(0)["pod"]["name"], &spec(0)["network"]),
        (&json!("x"), &json!(other)),
        "never overwritten"
    );
    let s1 = spec(1);
    assert_eq!(
        (
            &s1["state"],
            &s1["pod"]["name"],
            &s1["node"],
            &s1["network"]
        ),
        (&json!("Leased"), &json!("q-1"), &json!(on), &json!(net)),
        "taken over: {s1}"
    );
    let s3 = spec(3);
    assert_eq!(
        (
            &s3["state"],
            &s3["pod"]["uid"],
            &s3["containerID"],
            &s3["ifname"]
        ),
        (
            &json!("Leased"),
            &json!(pods[3].1),
            &json!(""),
            &json!("net1")
        ),
        "from the reservation: {s3}"
    );

    // A node's credential may not write other nodes' leases: refused before any request.
    let n = node(&env, "n2");
    let o = tether(&[
        "import-whereabouts",
        "-n",
        wb.ns,
        "--kubeconfig",
        n.kubeconfig.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(&format!("bound to node {}", n.name)),
        "{}",
        stderr(&o)
    );
}

/// `--follow` imports what whereabouts allocates while it runs, and on SIGTERM prints its
/// account and exits 0.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn follow_imports_new_allocations_until_sigterm() {
    let env = Env::real("wbfollow");
    let (ns, net, on) = (env.name("ml"), env.name("pool"), env.name("n1"));
    let mut wb = WhereaboutsNs::new(&env, "10.203.2.0/28", "10.203.2.", json!({}));
    wb.nad(&env, ns, "pool", net);
    let alloc = |name: &str| {
        let uid = env.pod(ns, name, "", on);
        wb.add(net, ns, name, &uid, &format!("ctr-{name}"))
    };
    let first = alloc("r-0");
    let mut follower = Kill(
        Command::new(env!("CARGO_BIN_EXE_tether"))
            .args([
                "import-whereabouts",
                "-n",
                wb.ns,
                "--follow",
                "--interval-s",
                "1",
                "-o",
                "json",
            ])
            .args(["--kubeconfig", env.kubeconfig.to_str().unwrap()])
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("KUBECONFIG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_until(Duration::from_secs(20), || iplease(&env, &first).is_some()).is_some(),
        "the first pass imports {first}"
    );
    let second = alloc("r-1");
    let took = wait_until(Duration::from_secs(20), || iplease(&env, &second).is_some())
        .unwrap_or_else(|| panic!("{second}, allocated while --follow runs, is not imported"));
    eprintln!("imported {took:?} after whereabouts' ADD returned");

    // SAFETY: a signal to our own child.
    unsafe { libc::kill(follower.0.id() as i32, libc::SIGTERM) };
    let exited = wait_until(Duration::from_secs(25), || {
        follower.0.try_wait().unwrap().is_some()
    });
    assert!(exited.is_some(), "--follow stops on SIGTERM");
    let status = follower.0.wait().unwrap();
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    follower
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    follower
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    let r: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(counts(&r), [2, 0, 0, 0, 0, 0], "{r}");
    assert!(
        err.contains(&format!("imported {second} of pod {ns}/r-1")),
        "{err}"
    );
}

/// docs/operations.md's import commands, run as written: no `-n`, so whereabouts' objects are in
/// `kube-system` (its default, which no other test uses for them); then the page's RBAC for the
/// person running them, bound to whoever `kubectl auth whoami` says they are.
#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn the_operations_page_imports_as_written() {
    let env = Env::real("wbdocs");
    let n1 = node(&env, "n1");
    let (ns, net) = (env.name("ml"), env.name("mgmt"));
    let mut wb = WhereaboutsNs::in_namespace(&env, "kube-system", "10.204.0.0/28", "10.204.0.");
    wb.nad(&env, ns, "mgmt", net);
    let uid = env.pod(ns, "wb-0", "", n1.name);
    let address = wb.add(net, ns, "wb-0", &uid, "ctr-wb-0");
    let kc = env.kubeconfig.to_str().unwrap();
    let o = doc_block(
        "docs/operations.md",
        "import-whereabouts",
        &[("KUBECONFIG", kc)],
    );
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let lease = iplease(&env, &address).unwrap_or_else(|| panic!("no IPLease of {address}"));
    assert_eq!(
        (&lease["spec"]["state"], &lease["spec"]["pod"]["name"]),
        (&json!("Leased"), &json!("wb-0")),
        "{lease}"
    );

    let kubectl_as_admin = |args: &[&str]| {
        Command::new(kubectl())
            .args(["--kubeconfig", kc])
            .args(args)
            .output()
            .unwrap()
    };
    let binding = "tether-import-whereabouts";
    kubectl_as_admin(&[
        "delete",
        "clusterrolebinding",
        binding,
        "--ignore-not-found",
    ]);
    let o = doc_block(
        "docs/operations.md",
        "import-whereabouts-rbac",
        &[("KUBECONFIG", kc)],
    );
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let me = kubectl_as_admin(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    let got: Value = serde_json::from_slice(
        &kubectl_as_admin(&["get", "clusterrolebinding", binding, "-o", "json"]).stdout,
    )
    .unwrap();
    assert_eq!(
        (&got["roleRef"]["name"], &got["subjects"][0]["name"]),
        (&json!(binding), &json!(stdout(&me))),
        "{got}"
    );
    kubectl_as_admin(&[
        "delete",
        "clusterrolebinding",
        binding,
        "--ignore-not-found",
    ]);
}
