//! tether-ipam as the IPAM of the reference macvlan plugin (/usr/lib/cni, spec ≤ 1.0.0), driven through
//! the real libcni on this kernel: the end-to-end view of checklist H (requested addresses from
//! Multus-shaped CNI_ARGS and from the `ips` capability, CHECK forwarded to the IPAM, DEL releasing,
//! parallel pods). The black-box tests of tether-ipam alone are in ipam/tests/.
//!
//! Topology: [`Segment`] (bridge `br0` in a node netns as the master); one pod netns per attachment.
//! Probing is off here (conformance/tests/host_probe.rs covers it).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tether_conformance::segment::result_ips;
use tether_conformance::{
    LeaseState, Libcni, NetNs, PluginExec, Segment, TempDir, eventually, multus_cni_args,
    reference_plugin, reference_plugins_dir, tether_bin_dir, tether_binary,
};

const NET: &str = "hostipam";

fn conflist(seg: &Segment, data: &TempDir) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NET,
        "plugins": [{
            "type": "macvlan", "master": seg.master, "mode": "bridge",
            "capabilities": {"ips": true},
            "ipam": {
                "type": "tether-ipam",
                "range": "10.1.2.10-10.1.2.200/24",
                "ipRanges": [{"range": "fd00:1:2::10-fd00:1:2::200/64"}],
                "gateway": "10.1.2.1",
                "routes": [{"dst": "192.168.0.0/16", "gw": "10.1.2.1"}],
                "dataDir": data.path(),
                "cooldown_s": 0,
                "probe": false
            }
        }]
    })
}

fn cni_path() -> String {
    format!(
        "{}:{}",
        reference_plugins_dir().display(),
        tether_bin_dir().display()
    )
}

fn pod_has(pod: &NetNs, ips: &[IpAddr]) -> bool {
    let have = pod.addrs("net1");
    ips.iter().all(|a| {
        have.iter()
            .any(|h| h.split('/').next() == Some(&a.to_string()))
    })
}

fn setup() {
    reference_plugin("macvlan");
    tether_binary("tether-ipam");
}

/// AddNetworkList → CheckNetworkList → DelNetworkList: addresses from tether-ipam land on the pod's
/// macvlan, the lease belongs to (containerID, net1), CHECK is forwarded to tether-ipam (it fails
/// once the lease is gone), DEL releases and removes libcni's cache.
#[test]
fn macvlan_with_tether_ipam_lifecycle_through_libcni() {
    setup();
    let seg = Segment::new("hi-life");
    let data = TempDir::new("hostipam");
    let pod = NetNs::new("hi-life-pod");
    let cid = "hostipam-life";
    let net = Libcni::new(&conflist(&seg, &data))
        .cni_path(cni_path())
        .ifname("net1")
        .container_id(cid)
        .cni_args(multus_cni_args("ns", "web-0", cid, "uid-1"))
        .run_in(&seg.node);
    let out = net.add(&pod.path());
    out.assert_success();
    let res = out.json();
    assert_eq!(res["cniVersion"], "1.0.0");
    let ips = result_ips(&out);
    assert_eq!(ips.len(), 2, "{out}");
    assert_eq!(res["ips"][0]["gateway"], "10.1.2.1", "{out}");
    assert!(
        res["routes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["dst"] == "192.168.0.0/16"),
        "{out}"
    );
    assert!(
        pod_has(&pod, &ips),
        "pod addresses {:?} vs {ips:?}",
        pod.addrs("net1")
    );
    let state = LeaseState::new(data.path(), NET);
    let mut leased = state.leased();
    leased.sort();
    let mut want = ips.clone();
    want.sort();
    assert_eq!(leased, want);
    let rec = state.record(ips[0]).unwrap();
    assert_eq!(
        (rec["container_id"].as_str(), rec["ifname"].as_str()),
        (Some(cid), Some("net1"))
    );
    assert_eq!(rec["pod"]["name"], "web-0");
    assert!(net.cache_file().is_file());
    // The pod reaches another host on the segment (a macvlan slave cannot reach its own master).
    seg.rogue_holds("10.1.2.5".parse().unwrap());
    assert!(
        eventually(Duration::from_secs(3), || pod.ping("10.1.2.5", 1).success()),
        "no connectivity"
    );

    net.check(&pod.path()).assert_success();
    // Lease released behind the runtime's back: CHECK (forwarded to tether-ipam) fails.
    PluginExec::new(tether_binary("tether-ipam"))
        .var("CNI_CONTAINERID", cid)
        .var("CNI_IFNAME", "net1")
        .call_json("DEL", &json!({"cniVersion": "1.0.0", "name": NET, "ipam": conflist(&seg, &data)["plugins"][0]["ipam"]}))
        .assert_success();
    let chk = net.check(&pod.path());
    assert!(!chk.success(), "CHECK passed without a lease: {chk}");
    assert!(
        chk.stdout.contains(cid) || chk.stderr.contains(cid),
        "{chk}"
    );

    net.del(&pod.path()).assert_success();
    assert!(!net.cache_file().exists());
    assert!(!pod.has_link("net1"));
    assert!(state.leased().is_empty());
    net.del(&pod.path()).assert_success();
}

/// Requested addresses through the runtime: Multus-shaped CNI_ARGS `IP=` and the `ips` capability
/// (runtimeConfig.ips, which wins over `IP=`), exactly those on the pod and in the store.
#[test]
fn requested_addresses_through_libcni() {
    setup();
    let seg = Segment::new("hi-req");
    let data = TempDir::new("hostipam");
    let state = LeaseState::new(data.path(), NET);

    let pod = NetNs::new("hi-req-pod1");
    let cid = "hostipam-ip-args";
    let args = format!(
        "{};IP=10.1.2.99/24,fd00:1:2::99/64",
        multus_cni_args("ns", "p1", cid, "u1")
    );
    let net = Libcni::new(&conflist(&seg, &data))
        .cni_path(cni_path())
        .ifname("net1")
        .container_id(cid)
        .cni_args(args)
        .run_in(&seg.node);
    let out = net.add(&pod.path());
    out.assert_success();
    let want: Vec<IpAddr> = vec![
        "10.1.2.99".parse().unwrap(),
        "fd00:1:2::99".parse().unwrap(),
    ];
    assert_eq!(result_ips(&out), want);
    assert!(pod_has(&pod, &want));

    let pod2 = NetNs::new("hi-req-pod2");
    let cid2 = "hostipam-caps";
    let args2 = format!(
        "{};IP=10.1.2.98/24",
        multus_cni_args("ns", "p2", cid2, "u2")
    );
    let net2 = Libcni::new(&conflist(&seg, &data))
        .cni_path(cni_path())
        .ifname("net1")
        .container_id(cid2)
        .cni_args(args2)
        .cap_args(json!({"ips": ["10.1.2.97/24"]}))
        .run_in(&seg.node);
    let out = net2.add(&pod2.path());
    out.assert_success();
    let got = result_ips(&out);
    assert_eq!(
        got[0],
        "10.1.2.97".parse::<IpAddr>().unwrap(),
        "runtimeConfig.ips wins: {out}"
    );
    assert!(!state.leased().contains(&"10.1.2.98".parse().unwrap()));

    // Held by the first pod: the runtime sees an error naming address and holder; nothing leased.
    let pod3 = NetNs::new("hi-req-pod3");
    let net3 = Libcni::new(&conflist(&seg, &data))
        .cni_path(cni_path())
        .ifname("net1")
        .container_id("hostipam-thief")
        .cap_args(json!({"ips": ["10.1.2.99/24"]}))
        .run_in(&seg.node);
    let before = state.leased().len();
    let out = net3.add(&pod3.path());
    assert!(!out.success(), "{out}");
    assert!(
        out.stdout.contains("10.1.2.99") && out.stdout.contains("ns/p1"),
        "{out}"
    );
    assert_eq!(state.leased().len(), before);
    net3.del(&pod3.path()).assert_success();
    net2.del(&pod2.path()).assert_success();
    net.del(&pod.path()).assert_success();
    assert!(state.leased().is_empty());
}

/// 16 pods added in parallel through libcni (macvlan → tether-ipam, each its own process tree) get
/// distinct addresses, each configured on its pod; 16 parallel DELs leave nothing leased.
#[test]
fn parallel_pods_through_libcni_get_distinct_addresses() {
    setup();
    let seg = Segment::new("hi-par");
    let data = TempDir::new("hostipam");
    let state = LeaseState::new(data.path(), NET);
    let pods: Vec<NetNs> = (0..16)
        .map(|i| NetNs::new(&format!("hi-par-{i}")))
        .collect();
    let nets: Vec<Libcni> = (0..16)
        .map(|i| {
            let cid = format!("hostipam-par-{i}");
            Libcni::new(&conflist(&seg, &data))
                .cni_path(cni_path())
                .ifname("net1")
                .container_id(&cid)
                .cni_args(multus_cni_args(
                    "ns",
                    &format!("p{i}"),
                    &cid,
                    &format!("u{i}"),
                ))
                .run_in(&seg.node)
        })
        .collect();
    let outs: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = nets
            .iter()
            .zip(&pods)
            .map(|(n, p)| s.spawn(move || n.add(&p.path())))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = BTreeSet::new();
    for (o, p) in outs.iter().zip(&pods) {
        o.assert_success();
        let ips = result_ips(o);
        assert!(pod_has(p, &ips), "{o}");
        for a in ips {
            assert!(all.insert(a), "{a} handed out twice");
        }
    }
    assert_eq!(all.len(), 32);
    assert_eq!(state.leased().len(), 32);
    std::thread::scope(|s| {
        for (n, p) in nets.iter().zip(&pods) {
            s.spawn(move || {
                n.del(&p.path()).assert_success();
            });
        }
    });
    assert!(state.leased().is_empty(), "{:?}", state.records());
}
