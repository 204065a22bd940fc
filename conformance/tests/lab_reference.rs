//! Lab proof: the Debian reference `ipvlan` + `host-local` plugins driven
//! through the real libcni (target/libcni-driver) with Multus-shaped
//! CNI_ARGS, on a real kernel with ipvlan.
//!
//! Run with `conformance/lab/run-tests.sh lab_reference`. Ignored by a plain
//! `cargo test`; when run, it FAILS (never skips) if ipvlan is unavailable.
//!
//! Topology (all in namespaces created here, parallel-safe):
//!
//!   [peer ns] p0 10.1.2.1/24 ==veth== m0 [host ns] (ipvlan master; the
//!   driver runs here) --ipvlan l2--> net1 [pod ns]

use serde_json::json;
use tether_conformance::{Libcni, NetNs, lab, multus_cni_args, reference_plugin, veth_pair};

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_reference"]
fn reference_ipvlan_host_local_through_libcni() {
    lab::require_ipvlan();
    reference_plugin("ipvlan");
    reference_plugin("host-local");

    let host = NetNs::new("ref-host");
    let peer = NetNs::new("ref-peer");
    let pod = NetNs::new("ref-pod");
    veth_pair(&host, "m0", &peer, "p0");
    peer.addr_add("p0", "10.1.2.1/24");

    let conflist = |data_dir: &str| {
        json!({
            "cniVersion": "1.0.0",
            "name": "labref",
            "plugins": [{
                "type": "ipvlan",
                "master": "m0",
                "mode": "l2",
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": "10.1.2.0/24",
                                 "rangeStart": "10.1.2.10", "rangeEnd": "10.1.2.50"}]],
                    "dataDir": data_dir
                }
            }]
        })
    };
    // host-local's lease dir lives in a scratch dir (parallel-safe).
    let data_dir = tether_conformance::TempDir::new("hostlocal");
    let uid = "6f1c1a5e-0000-4000-8000-000000000001";
    let infra = format!("{:0>64}", "abc123");
    let net = Libcni::new(&conflist(data_dir.path().to_str().unwrap()))
        .ifname("net1")
        .container_id(infra.clone())
        .cni_args(multus_cni_args("ns", "pod", &infra, uid))
        .run_in(&host);

    // ADD
    let out = net.add(&pod.path());
    out.assert_success();
    let res = out.json();
    assert_eq!(res["cniVersion"], "1.0.0", "{out}");
    let addr = res["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no ips[0].address: {out}"));
    assert!(
        addr.starts_with("10.1.2.") && addr.ends_with("/24"),
        "{addr}"
    );
    let ip = addr.split('/').next().unwrap();
    let ifaces = res["interfaces"].as_array().expect("interfaces");
    assert!(
        ifaces
            .iter()
            .any(|i| i["name"] == "net1" && i["sandbox"] == pod.path().to_str().unwrap()),
        "result lacks net1 in the pod sandbox: {out}"
    );
    assert!(
        net.cache_file().is_file(),
        "libcni cache {} missing",
        net.cache_file().display()
    );
    assert!(
        data_dir.join("labref").join(ip).is_file(),
        "host-local lease for {ip} missing"
    );

    // The pod sees an ipvlan net1 whose parent is the host's m0.
    let link = pod.link("net1").expect("net1 missing in the pod netns");
    assert_eq!(link["linkinfo"]["info_kind"], "ipvlan", "{link:#}");
    assert_eq!(link["linkinfo"]["info_data"]["mode"], "l2", "{link:#}");
    let m0 = host.link("m0").unwrap();
    assert_eq!(
        link["link_index"], m0["ifindex"],
        "parent is not m0: {link:#}"
    );
    assert!(
        link.get("link_netnsid").is_some(),
        "parent should be in another netns: {link:#}"
    );
    assert_eq!(
        link["address"], m0["address"],
        "ipvlan shares the master's MAC"
    );
    assert_eq!(pod.addrs("net1"), vec![addr.to_string()]);
    assert!(!host.has_link("net1"), "net1 left behind in the host netns");

    // Traffic: pod -> peer across the master.
    pod.ping("10.1.2.1", 3).assert_success();
    peer.ping(ip, 1).assert_success();

    // CHECK
    net.check(&pod.path()).assert_success();

    // DEL
    net.del(&pod.path()).assert_success();
    assert!(!pod.has_link("net1"), "net1 still in the pod after DEL");
    assert!(
        !net.cache_file().exists(),
        "libcni cache file not removed by DEL"
    );
    assert!(
        !data_dir.join("labref").join(ip).exists(),
        "host-local lease for {ip} not released"
    );
    assert!(host.has_link("m0"), "DEL removed the master");

    // DEL is idempotent.
    net.del(&pod.path()).assert_success();
}
