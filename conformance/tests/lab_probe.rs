//! Conflict probing under real ipvlan L2 (checklist I 87, 91): `tether-ipvlan` delegating to
//! `tether-ipam`, driven through the real libcni in the "host" netns, on a kernel with ipvlan.
//!
//! Run with `conformance/lab/run-tests.sh lab_probe`. Ignored by a plain `cargo test`; when run, every
//! test FAILS (never skips) if ipvlan is unavailable.
//!
//! ```text
//!   [rogue ns] r0 ==veth== m0 [host ns] (ipvlan master; libcni runs here) --ipvlan l2--> net1 [pod ns]
//! ```
//!
//! Why the probe must run on the master (87): Linux answers an ARP probe (sender IP 0.0.0.0) with a
//! unicast reply whose target IP is 0.0.0.0, and ipvlan L2 delivers unicast frames to a slave by
//! destination IP, so the reply never reaches the slave in the pod netns.
//! [`i87_a_probe_from_the_slave_would_miss_the_reply`] shows that on this kernel; the other tests
//! show tether-ipam probing on the master and catching the rogue.

use std::net::IpAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tether_conformance::segment::{hold, mac, raw_arp_probe, result_ips};
use tether_conformance::{
    LeaseState, Libcni, NetNs, TempDir, eventually, first_candidates, lab, multus_cni_args,
    reference_plugins_dir, tether_bin_dir, tether_binary, veth_pair,
};

const NET: &str = "labprobe";

struct Lab {
    host: NetNs,
    rogue: NetNs,
    pod: NetNs,
    data: TempDir,
    ipam: Value,
}

fn link_names(ns: &NetNs) -> Vec<String> {
    let mut v: Vec<String> = ns
        .ip_json(&["link", "show"])
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect();
    v.sort();
    v
}

impl Lab {
    /// `range`: the ipam `range`; probing 200 ms, cooldown 0.
    fn new(tag: &str, range: &str) -> Lab {
        lab::require_ipvlan();
        tether_binary("tether-ipvlan");
        tether_binary("tether-ipam");
        let host = NetNs::new(&format!("{tag}-h"));
        let rogue = NetNs::new(&format!("{tag}-r"));
        let pod = NetNs::new(&format!("{tag}-p"));
        veth_pair(&host, "m0", &rogue, "r0");
        let data = TempDir::new("labprobe");
        let ipam = json!({
            "type": "tether-ipam",
            "range": range,
            "dataDir": data.path(),
            "cooldown_s": 0,
            "probe": {"timeout_ms": 200, "attempts": 1},
        });
        Lab {
            host,
            rogue,
            pod,
            data,
            ipam,
        }
    }

    fn libcni(&self, cid: &str, caps: Option<Value>) -> Libcni {
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": NET,
            "plugins": [{"type": "tether-ipvlan", "master": "m0", "mode": "l2", "capabilities": {"ips": true}, "ipam": self.ipam}]
        });
        let cni_path = format!(
            "{}:{}",
            tether_bin_dir().display(),
            reference_plugins_dir().display()
        );
        let l = Libcni::new(&conflist)
            .cni_path(cni_path)
            .run_in(&self.host)
            .ifname("net1")
            .container_id(cid)
            .cni_args(multus_cni_args("ns", cid, cid, &format!("uid-{cid}")));
        match caps {
            Some(c) => l.cap_args(c),
            None => l,
        }
    }

    fn state(&self) -> LeaseState {
        LeaseState::new(self.data.path(), NET)
    }

    fn rogue_mac(&self) -> String {
        mac(&self.rogue, "r0")
    }
}

/// 87: the rogue holds the first pool candidate; tether-ipvlan → tether-ipam through libcni skips
/// it, quarantines it with the rogue's MAC, and the pod gets another address it can use; DEL
/// releases the lease and keeps the quarantine.
#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_probe"]
fn i87_ipvlan_pool_candidate_held_is_skipped_and_quarantined() {
    let lab = Lab::new("lp87", "10.1.2.10-10.1.2.50/24");
    let cid = "ipvlan-pool-1";
    let held = first_candidates(&lab.ipam, cid, "net1")[0];
    hold(&lab.rogue, "r0", held);

    let net = lab.libcni(cid, None);
    let out = net.add(&lab.pod.path());
    out.assert_success();
    let got = result_ips(&out)[0];
    assert_ne!(got, held, "handed out the rogue's address: {out}");
    assert_eq!(
        lab.state().quarantined(),
        vec![(held, lab.rogue_mac())],
        "{:?}",
        lab.state().records()
    );
    assert_eq!(lab.state().leased(), vec![got]);
    assert_eq!(lab.pod.addrs("net1"), vec![format!("{got}/24")]);
    // The pod really works next to the rogue.
    lab.pod.ping(&held.to_string(), 2).assert_success();
    net.check(&lab.pod.path()).assert_success();
    net.del(&lab.pod.path()).assert_success();
    assert!(lab.state().leased().is_empty());
    assert_eq!(
        lab.state().quarantined().len(),
        1,
        "DEL keeps the quarantine record"
    );
}

/// 87, the premise: the same RFC 5227 probe (a plain packet socket, not tether) gets no reply when sent
/// from the ipvlan slave in the pod netns, and gets the rogue's reply when sent from the master.
#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_probe"]
fn i87_a_probe_from_the_slave_would_miss_the_reply() {
    let lab = Lab::new("lp87s", "10.1.2.10-10.1.2.50/24");
    let held: IpAddr = "10.1.2.60".parse().unwrap();
    hold(&lab.rogue, "r0", held);
    let net = lab.libcni("ipvlan-premise", None);
    net.add(&lab.pod.path()).assert_success();
    let wait = Duration::from_millis(500);
    assert_eq!(
        raw_arp_probe(&lab.pod, "net1", held, wait),
        None,
        "the slave saw the reply (ipvlan changed?)"
    );
    assert_eq!(
        raw_arp_probe(&lab.host, "m0", held, wait),
        Some(lab.rogue_mac()),
        "the master must see it"
    );
    net.del(&lab.pod.path()).assert_success();
}

/// 87/86: a requested address (runtimeConfig.ips via the `ips` capability) answered by the rogue →
/// ADD fails naming the address and the rogue's MAC; tether-ipvlan leaves no link in either netns and
/// no lease.
#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_probe"]
fn i87_ipvlan_requested_address_held_fails_naming_the_mac() {
    let lab = Lab::new("lp86", "10.1.2.10-10.1.2.50/24");
    let req: IpAddr = "10.1.2.33".parse().unwrap();
    hold(&lab.rogue, "r0", req);
    let (host_before, pod_before) = (link_names(&lab.host), link_names(&lab.pod));
    let net = lab.libcni("ipvlan-static-1", Some(json!({"ips": ["10.1.2.33/24"]})));
    let out = net.add(&lab.pod.path());
    assert!(!out.success(), "{out}");
    let err = out.json();
    let msg = err["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("10.1.2.33") && msg.contains(&lab.rogue_mac()),
        "{out}"
    );
    assert_eq!(err["code"], 103, "{out}");
    assert_eq!(link_names(&lab.host), host_before, "host links changed");
    assert_eq!(link_names(&lab.pod), pod_before, "pod links changed");
    assert!(
        lab.state().leased().is_empty(),
        "{:?}",
        lab.state().records()
    );
    assert!(!net.cache_file().exists());
    net.del(&lab.pod.path()).assert_success();
}

/// 91 under ipvlan: an IPv6 pool candidate held by the rogue is skipped and quarantined with its MAC,
/// the pod's address leaves DAD cleanly (never `dadfailed`); a requested IPv6 address held by the rogue
/// fails naming it, with nothing left behind.
#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_probe"]
fn i91_ipvlan_ipv6_pool_skip_and_requested_error() {
    let lab = Lab::new("lp91", "fd00:1:2::10-fd00:1:2::50/64");
    let cid = "ipvlan-v6-1";
    let held = first_candidates(&lab.ipam, cid, "net1")[0];
    hold(&lab.rogue, "r0", held);
    let net = lab.libcni(cid, None);
    let out = net.add(&lab.pod.path());
    out.assert_success();
    let got = result_ips(&out)[0];
    assert_ne!(got, held);
    assert_eq!(
        lab.state().quarantined(),
        vec![(held, lab.rogue_mac())],
        "{:?}",
        lab.state().records()
    );
    let clean = eventually(Duration::from_secs(5), || {
        let v = lab
            .pod
            .ip_json(&["-6", "addr", "show", "dev", "net1", "scope", "global"]);
        let infos: Vec<Value> = v
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
            .collect();
        infos.iter().any(|a| {
            a["local"] == got.to_string()
                && a.get("tentative").is_none()
                && a.get("dadfailed").is_none()
        })
    });
    assert!(
        clean,
        "{got} not configured cleanly: {}",
        lab.pod.ip(&["-6", "addr", "show", "dev", "net1"])
    );
    lab.pod.ping(&held.to_string(), 2).assert_success();
    net.del(&lab.pod.path()).assert_success();

    let req: IpAddr = "fd00:1:2::33".parse().unwrap();
    hold(&lab.rogue, "r0", req);
    let pod2 = NetNs::new("lp91-p2");
    let net = lab.libcni("ipvlan-v6-2", Some(json!({"ips": ["fd00:1:2::33/64"]})));
    let out = net.add(&pod2.path());
    assert!(!out.success(), "{out}");
    let msg = out.json()["msg"].as_str().unwrap_or_default().to_string();
    assert!(
        msg.contains("fd00:1:2::33") && msg.contains(&lab.rogue_mac()),
        "{out}"
    );
    assert!(!pod2.has_link("net1"));
    assert!(
        lab.state().leased().is_empty(),
        "{:?}",
        lab.state().records()
    );
}

/// The IPv6 address of `pod`'s net1, as `ip -j addr` describes it right now.
fn addr_info(pod: &NetNs, addr: IpAddr) -> Value {
    pod.ip_json(&["-6", "addr", "show", "dev", "net1"])
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .find(|a| a["local"] == addr.to_string())
        .unwrap_or_else(|| panic!("{addr} not on net1: {}", pod.ip(&["-6", "addr"])))
}

/// DAD is not paid twice, and never skipped unprobed: an IPv6 address tether-ipam probed on the wire
/// is added `nodad` and usable the moment ADD returns; with probing off (nobody probed it) the kernel
/// runs DAD and ADD returns only once it is over. tether-ipam's note never reaches the runtime.
#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_probe"]
fn ipv6_skips_dad_only_when_tether_ipam_probed_it() {
    let mut lab = Lab::new("lpnd", "10.1.2.10-10.1.2.50/24");
    lab.ipam["ipRanges"] = json!([{"range": "fd00:1:2::10-fd00:1:2::50/64"}]);
    let out = lab.libcni("nodad-probed", None).add(&lab.pod.path());
    out.assert_success();
    assert!(out.json().get("tetherProbed").is_none(), "{out}");
    let v6 = result_ips(&out)[1];
    let a = addr_info(&lab.pod, v6);
    assert_eq!(a["nodad"], true, "probed, so added nodad: {a}");
    assert!(
        a.get("tentative").is_none() && a.get("dadfailed").is_none(),
        "{a}"
    );

    lab.ipam["probe"] = json!(false);
    let pod2 = NetNs::new("lpnd-p2");
    let out = lab.libcni("nodad-unprobed", None).add(&pod2.path());
    out.assert_success();
    let v6 = result_ips(&out)[1];
    let a = addr_info(&pod2, v6);
    assert!(
        a.get("nodad").is_none(),
        "nobody probed it, yet DAD was skipped: {a}"
    );
    assert!(
        a.get("tentative").is_none(),
        "ADD returned a tentative address: {a}"
    );
    // DAD ran in a short window; the interface's neighbour timing is the kernel's again afterwards.
    let sysctl = |path: &str| pod2.exec_ok("cat", &[path]).stdout.trim().to_string();
    assert_eq!(
        sysctl("/proc/sys/net/ipv6/neigh/net1/retrans_time_ms"),
        "1000"
    );
    assert_eq!(
        sysctl("/proc/sys/net/ipv6/conf/net1/router_solicitation_delay"),
        "1"
    );
}
