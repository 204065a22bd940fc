//! Checklist G: tether-ipvlan + tether-ipam driven end to end through the real libcni (Debian's
//! 1.1.2, via target/libcni-driver), and what the next plugin of a chain receives. Real ipvlan:
//! run in the lab (conformance/lab/run-tests.sh lab_libcni).

use std::os::unix::fs::PermissionsExt;

use serde_json::{Value, json};
use tether_conformance::lab::require_ipvlan;
use tether_conformance::{Libcni, NetNs, TempDir, multus_cni_args, tether_bin_dir, veth_pair};

struct Segment {
    host: NetNs,
    _peer: NetNs,
    pod: NetNs,
    dir: TempDir,
}

fn segment(tag: &str) -> Segment {
    require_ipvlan();
    let (host, peer, pod) = (
        NetNs::new(&format!("{tag}-host")),
        NetNs::new(&format!("{tag}-peer")),
        NetNs::new(&format!("{tag}-pod")),
    );
    veth_pair(&host, "m0", &peer, "p0");
    peer.addr_add("p0", "10.1.2.1/24");
    Segment {
        host,
        _peer: peer,
        pod,
        dir: TempDir::new(tag),
    }
}

fn plugin(seg: &Segment) -> Value {
    json!({"type": "tether-ipvlan", "master": "m0", "capabilities": {"ips": true},
           "ipam": {"type": "tether-ipam", "range": "10.1.2.0/24", "gateway": "10.1.2.1",
                    "dataDir": seg.dir.join("leases"), "routes": [{"dst": "10.9.0.0/16"}]}})
}

fn cni_path(extra: &str) -> String {
    format!("{extra}{}:/usr/lib/cni", tether_bin_dir().display())
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_libcni"]
fn item59_libcni_lifecycle_with_ips_capability_and_result_cache() {
    let seg = segment("g59");
    let net =
        Libcni::new(&json!({"cniVersion": "1.0.0", "name": "mgmt", "plugins": [plugin(&seg)]}))
            .run_in(&seg.host)
            .cni_path(cni_path(""))
            .ifname("net1")
            .cni_args(multus_cni_args("ns", "pod", "infra-59", "uid-59"))
            .cap_args(json!({"ips": ["10.1.2.9/24"]}));
    let out = net.add(&seg.pod.path());
    out.assert_success();
    let res = out.json();
    assert_eq!(res["ips"][0]["address"], "10.1.2.9/24", "{res}");
    assert!(
        net.cache_file().is_file(),
        "ADD writes libcni's cache {}",
        net.cache_file().display()
    );
    assert_eq!(seg.pod.addrs("net1"), vec!["10.1.2.9/24"]);
    net.check(&seg.pod.path()).assert_success();
    net.del(&seg.pod.path()).assert_success();
    assert!(!net.cache_file().exists(), "DEL removes the cache");
    assert!(!seg.pod.has_link("net1"));
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_libcni"]
fn item60_chained_recorder_sees_the_result_and_multus_env() {
    let seg = segment("g60");
    // A recorder: logs its environment and stdin, passes prevResult on as its own Result.
    let rec = seg.dir.join("recorder");
    std::fs::write(
        &rec,
        format!(
            "#!/bin/sh\nd={}\nin=$(cat)\nenv | grep '^CNI_' | sort > $d/env.$CNI_COMMAND\nprintf %s \"$in\" > $d/stdin.$CNI_COMMAND\n\
             [ \"$CNI_COMMAND\" = ADD ] && printf %s \"$in\" | jq -c '.prevResult + {{cniVersion: .cniVersion}}'\nexit 0\n",
            seg.dir.path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o755)).unwrap();
    let args = multus_cni_args("ns", "trainer-0", "infra-60", "uid-60");
    let net = Libcni::new(&json!({"cniVersion": "1.0.0", "name": "compute", "plugins": [plugin(&seg), {"type": "recorder"}]}))
        .run_in(&seg.host)
        .cni_path(cni_path(&format!("{}:", seg.dir.path().display())))
        .ifname("net2")
        .cni_args(&args);
    let out = net.add(&seg.pod.path());
    out.assert_success();
    let stdin: Value =
        serde_json::from_str(&std::fs::read_to_string(seg.dir.join("stdin.ADD")).unwrap()).unwrap();
    let prev = &stdin["prevResult"];
    // Item 11's shape, as the next plugin (and Multus) sees it.
    let ifaces = prev["interfaces"].as_array().unwrap();
    assert_eq!(ifaces.len(), 1, "{prev}");
    assert_eq!(ifaces[0]["name"], "net2");
    assert_eq!(ifaces[0]["sandbox"], seg.pod.path().display().to_string());
    let master_mac = seg.host.link("m0").unwrap()["address"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(ifaces[0]["mac"], master_mac);
    assert!(
        prev["ips"]
            .as_array()
            .unwrap()
            .iter()
            .all(|ip| ip["interface"] == 0),
        "{prev}"
    );
    assert!(
        prev["ips"][0].get("version").is_none(),
        "1.0.0 layout: {prev}"
    );
    assert_eq!(prev["routes"], json!([{"dst": "10.9.0.0/16"}]));
    // Item 27's environment reached the chain unchanged.
    let env = std::fs::read_to_string(seg.dir.join("env.ADD")).unwrap();
    assert!(env.contains(&format!("CNI_ARGS={args}")), "{env}");
    assert!(
        env.contains("CNI_IFNAME=net2")
            && env.contains(&format!("CNI_NETNS={}", seg.pod.path().display())),
        "{env}"
    );
    // The Result the runtime got is the recorder's pass-through.
    assert_eq!(out.json()["interfaces"], prev["interfaces"]);
    net.del(&seg.pod.path()).assert_success();
    assert!(!seg.pod.has_link("net2"));
}
