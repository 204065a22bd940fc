//! The attacher's logic against the recording fake kernel: ADD as a whole (`attach`), rollback, the
//! leftover temporary link, DEL's cleanup, CHECK's comparisons, the DAD wait and the master's
//! resolution.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use serde_json::json;
use tether_cni::{CniResult, Command, Env, NetConf, Request};
use tether_link::netlink::EEXIST;
use tether_link::{IpvlanFlag, IpvlanMode, Link, NetNs, Route};

use crate::check::{check_contents, check_link};
use crate::configure::{DadTiming, PodSide, add_routes, raise};
use crate::fake_kernel::{Dad, FakeKernel, HOST, POD};
use crate::kernel::LinkOps;
use crate::undo::Undo;
use crate::{
    AttachError, IpamStart, IpvlanConfig, Kernel, attach, make_link, remove_pod_links,
    resolve_master, temporary_name,
};

const CID: &str = "c";
const NETNS: &str = "/var/run/netns/pod";

fn request(command: Command) -> Request {
    let vars: HashMap<String, String> = [
        ("CNI_COMMAND", command.as_str()),
        ("CNI_CONTAINERID", CID),
        ("CNI_NETNS", NETNS),
        ("CNI_IFNAME", "net1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let conf = json!({"cniVersion": "1.0.0", "name": "n", "type": "tether-ipvlan"});
    Request {
        env: Env::from_vars(command, &vars).unwrap(),
        conf: NetConf::parse(conf.to_string().as_bytes()).unwrap(),
        vars,
    }
}

fn cfg(master: Option<&str>) -> IpvlanConfig {
    IpvlanConfig {
        master: master.map(str::to_string),
        mode: IpvlanMode::L2,
        flag: IpvlanFlag::Bridge,
        mtu: None,
        link_in_container: false,
        ipam_type: None,
        ipam_start: IpamStart::AfterLink,
        dns: None,
    }
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn result(v: serde_json::Value) -> CniResult {
    CniResult::from_value(&v).unwrap()
}

fn default_route(oif: u32) -> Route {
    Route {
        dst: net("0.0.0.0/0"),
        gateway: Some("192.0.2.1".parse().unwrap()),
        oif: Some(oif),
        priority: None,
        table: None,
    }
}

/// A host with its NIC `enp5s0`, and an empty pod.
fn node() -> (FakeKernel, u32) {
    let k = FakeKernel::new();
    let nic = k.add_link(HOST, "enp5s0", None);
    (k, nic)
}

/// ADD's link steps on the host path (created on the host, moved into the pod), under `undo`.
fn make(k: &FakeKernel, req: &Request, disarm: bool) -> Result<tether_link::Link, AttachError> {
    let ns = NetNs::current().unwrap();
    let host = k.socket(HOST);
    let pod = k.socket(POD);
    let mut undo = Undo::new(req, &pod);
    let master = k.link(HOST, "enp5s0").unwrap();
    let r = make_link(
        &mut undo,
        &host,
        Some(&ns),
        &cfg(None),
        &master,
        NETNS.as_ref(),
    );
    undo.finish(!disarm);
    r
}

#[test]
fn add_creates_under_the_temporary_name_then_renames_in_the_pod() {
    let (k, nic) = node();
    let req = request(Command::Add);
    let link = make(&k, &req, true).unwrap();
    let tmp = temporary_name(CID, "net1");
    assert_eq!(
        k.calls(),
        [
            format!("host create_ipvlan {tmp} on #{nic} into pod"),
            format!("pod link_by_name {tmp}"),
            format!("pod rename #{} net1", link.index),
        ]
    );
    assert_eq!(k.link_names(POD), ["net1"]);
    assert_eq!(k.link(POD, "net1").unwrap().parent_index, Some(nic));
}

#[test]
fn a_taken_ifname_is_ifname_exists_and_the_new_link_is_removed() {
    let (k, _) = node();
    k.add_link(POD, "net1", Some("veth"));
    let req = request(Command::Add);
    let e = make(&k, &req, false).unwrap_err();
    assert!(
        matches!(&e, AttachError::IfnameExists { ifname, netns } if ifname == "net1" && netns.to_str() == Some(NETNS)),
        "{e:?}"
    );
    assert_eq!(e.code(), tether_cni::code::INVALID_ENV);
    let calls = k.calls();
    let tmp = temporary_name(CID, "net1");
    let index = k.link(POD, "net1").unwrap().index + 1;
    assert_eq!(
        calls[1..],
        [
            format!("pod link_by_name {tmp}"),
            format!("pod rename #{index} net1"),
            format!("pod delete_link #{index}"),
        ]
    );
    assert_eq!(k.link_names(POD), ["net1"], "the pod's own net1 stays");
}

#[test]
fn an_injected_rename_eexist_is_ifname_exists_too() {
    let (k, _) = node();
    k.fail("rename", 1, EEXIST);
    let req = request(Command::Add);
    let e = make(&k, &req, false).unwrap_err();
    assert!(matches!(e, AttachError::IfnameExists { .. }), "{e:?}");
    assert!(k.calls().last().unwrap().starts_with("pod delete_link #"));
    assert!(k.link_names(POD).is_empty());
}

#[test]
fn a_failure_after_the_rename_removes_the_renamed_link() {
    let (k, _) = node();
    k.fail("add_address", 1, libc::EADDRNOTAVAIL);
    let req = request(Command::Add);
    let ns = NetNs::current().unwrap();
    let (host, pod) = (k.socket(HOST), k.socket(POD));
    let master = k.link(HOST, "enp5s0").unwrap();
    let r = result(json!({"ips": [{"address": "192.0.2.10/24"}]}));
    {
        let mut undo = Undo::new(&req, &pod);
        let link = make_link(
            &mut undo,
            &host,
            Some(&ns),
            &cfg(None),
            &master,
            NETNS.as_ref(),
        )
        .unwrap();
        let e = raise(&pod, link.index, "net1", &r, &[], Duration::ZERO).unwrap_err();
        assert_eq!(e.code(), tether_cni::code::KERNEL, "{e}");
        undo.finish(true);
    }
    let calls = k.calls();
    let n = calls.len();
    assert!(calls[n - 2].starts_with("pod add_address #"), "{calls:?}");
    assert!(calls[n - 1].starts_with("pod delete_link #"), "{calls:?}");
    assert!(k.link_names(POD).is_empty());
}

#[test]
fn a_leftover_temporary_ipvlan_is_removed_and_made_again() {
    let (k, nic) = node();
    let tmp = temporary_name(CID, "net1");
    let old = k.add_ipvlan(POD, &tmp, nic, IpvlanMode::L2);
    let req = request(Command::Add);
    let link = make(&k, &req, true).unwrap();
    assert_ne!(link.index, old);
    assert_eq!(
        k.calls(),
        [
            format!("host create_ipvlan {tmp} on #{nic} into pod"),
            format!("pod link_by_name {tmp}"),
            format!("pod delete_link #{old}"),
            format!("host create_ipvlan {tmp} on #{nic} into pod"),
            format!("pod link_by_name {tmp}"),
            format!("pod rename #{} net1", link.index),
        ]
    );
    assert_eq!(k.link_names(POD), ["net1"]);
}

#[test]
fn a_non_ipvlan_under_the_temporary_name_is_not_removed() {
    let (k, nic) = node();
    let tmp = temporary_name(CID, "net1");
    k.add_link(POD, &tmp, Some("veth"));
    let req = request(Command::Add);
    let e = make(&k, &req, false).unwrap_err();
    assert!(
        matches!(&e, AttachError::Kernel(n) if n.errno() == Some(EEXIST)),
        "{e:?}"
    );
    assert_eq!(
        k.calls(),
        [
            format!("host create_ipvlan {tmp} on #{nic} into pod"),
            format!("pod link_by_name {tmp}"),
        ]
    );
    assert_eq!(k.link_names(POD), [tmp]);
}

#[test]
fn del_removes_the_temporary_link_and_an_ipvlan_ifname() {
    let (k, nic) = node();
    let tmp = temporary_name(CID, "net1");
    let left = k.add_ipvlan(POD, &tmp, nic, IpvlanMode::L2);
    let pod_link = k.add_ipvlan(POD, "net1", nic, IpvlanMode::L2);
    k.add_link(POD, "net2", Some("ipvlan"));
    remove_pod_links(&k.socket(POD), CID, "net1").unwrap();
    assert_eq!(
        k.calls(),
        [
            format!("pod link_by_name {tmp}"),
            format!("pod delete_link #{left}"),
            "pod link_by_name net1".to_string(),
            format!("pod delete_link #{pod_link}"),
        ]
    );
    assert_eq!(k.link_names(POD), ["net2"]);
}

#[test]
fn del_leaves_a_non_ipvlan_ifname_alone_and_succeeds_when_all_is_gone() {
    let (k, _) = node();
    k.add_link(POD, "net1", Some("macvlan"));
    remove_pod_links(&k.socket(POD), CID, "net1").unwrap();
    assert!(!k.calls().iter().any(|c| c.contains("delete_link")));
    assert_eq!(k.link_names(POD), ["net1"]);

    let (k, _) = node();
    remove_pod_links(&k.socket(POD), CID, "net1").unwrap();
    assert_eq!(k.calls().len(), 2);
}

#[test]
fn del_reports_a_failed_removal() {
    let (k, nic) = node();
    k.add_ipvlan(POD, "net1", nic, IpvlanMode::L2);
    k.fail("delete_link", 1, libc::EBUSY);
    let e = remove_pod_links(&k.socket(POD), CID, "net1").unwrap_err();
    assert!(matches!(&e, AttachError::Kernel(n) if n.errno() == Some(libc::EBUSY)));
}

/// A pod with `net1`, an l2 ipvlan on the host's NIC, as ADD leaves it.
fn attached() -> (FakeKernel, u32, u32) {
    let (k, nic) = node();
    let link = k.add_ipvlan(POD, "net1", nic, IpvlanMode::L2);
    (k, nic, link)
}

/// CHECK's link comparison of `net1` against the fake's host and pod.
fn check_net1(k: &FakeKernel, cfg: &IpvlanConfig) -> Result<Link, AttachError> {
    check_link(cfg, "net1", NETNS, &k.socket(HOST), &k.socket(POD))
}

fn check_err(k: &FakeKernel, cfg: &IpvlanConfig) -> String {
    check_net1(k, cfg).unwrap_err().to_string()
}

#[test]
fn check_without_master_needs_only_the_parent_to_exist() {
    let (k, nic, _) = attached();
    let link = check_net1(&k, &cfg(None)).unwrap();
    assert_eq!(link.parent_index, Some(nic));
    assert!(k.calls().contains(&format!("host link_by_index #{nic}")));

    let k = FakeKernel::new();
    k.add_ipvlan(POD, "net1", 7, IpvlanMode::L2);
    assert_eq!(
        check_err(&k, &cfg(None)),
        "CHECK: net1's master (link #7) no longer exists on the host"
    );
    let mut in_pod = cfg(None);
    in_pod.link_in_container = true;
    assert_eq!(
        check_err(&k, &in_pod),
        "CHECK: net1's master (link #7) no longer exists on the pod netns"
    );
}

#[test]
fn check_with_master_compares_the_parent() {
    let (k, nic, _) = attached();
    check_net1(&k, &cfg(Some("enp5s0"))).unwrap();
    let other = k.add_link(HOST, "enp6s0", None);
    assert_eq!(
        check_err(&k, &cfg(Some("enp6s0"))),
        format!("CHECK: net1's master is link #{nic}, not enp6s0 (#{other})")
    );
    let e = check_net1(&k, &cfg(Some("gone0"))).unwrap_err();
    assert!(matches!(e, AttachError::MasterMissing { .. }), "{e:?}");
}

#[test]
fn check_refuses_another_mode_kind_or_a_missing_link() {
    let (k, _, _) = attached();
    let mut l3 = cfg(None);
    l3.mode = IpvlanMode::L3;
    assert_eq!(
        check_err(&k, &l3),
        "CHECK: net1 is in ipvlan mode l2, the config says l3"
    );
    let k = FakeKernel::new();
    k.add_link(POD, "net1", Some("veth"));
    assert_eq!(
        check_err(&k, &cfg(None)),
        "CHECK: net1 is a veth link, not ipvlan"
    );
    let k = FakeKernel::new();
    assert_eq!(
        check_err(&k, &cfg(None)),
        format!("CHECK: net1 does not exist in {NETNS}")
    );
}

fn prev() -> CniResult {
    result(json!({
        "interfaces": [{"name": "net1", "mac": "02:00:00:00:00:01", "sandbox": NETNS}],
        "ips": [{"address": "192.0.2.10/24", "gateway": "192.0.2.1", "interface": 0}],
        "routes": [{"dst": "198.51.100.0/24"}],
    }))
}

fn contents_err(k: &FakeKernel, link: u32) -> Option<String> {
    let l = k.socket(POD);
    let link = l.link_by_index(link).unwrap().unwrap();
    check_contents(&prev(), 0, &link, "net1", &l)
        .err()
        .map(|e| e.to_string())
}

#[test]
fn check_finds_a_missing_address_or_route_or_another_mac() {
    let (k, _, link) = attached();
    assert_eq!(
        contents_err(&k, link).as_deref(),
        Some("CHECK: net1 lacks address 192.0.2.10/24")
    );
    k.put_address(POD, link, net("192.0.2.10/24"));
    assert_eq!(
        contents_err(&k, link).as_deref(),
        Some("CHECK: route to 198.51.100.0/24 via 192.0.2.1 is missing")
    );
    // The route must go through the gateway of its family, not just exist.
    let mut r = default_route(link);
    r.dst = net("198.51.100.0/24");
    r.gateway = Some("192.0.2.254".parse().unwrap());
    k.put_route(POD, r.clone());
    assert!(contents_err(&k, link).unwrap().contains("is missing"));
    let (k, _, link) = attached();
    k.put_address(POD, link, net("192.0.2.10/24"));
    r.gateway = Some("192.0.2.1".parse().unwrap());
    k.put_route(POD, r);
    assert_eq!(contents_err(&k, link), None);

    let k = FakeKernel::new();
    k.add_ipvlan(POD, "net1", 2, IpvlanMode::L2);
    let l = k.socket(POD);
    let mut pod_link = k.link(POD, "net1").unwrap();
    pod_link.mac = Some(vec![2, 0, 0, 0, 0, 2]);
    let e = check_contents(&prev(), 0, &pod_link, "net1", &l).unwrap_err();
    assert_eq!(
        e.to_string(),
        "CHECK: net1 has MAC 02:00:00:00:00:02, prevResult says 02:00:00:00:00:01"
    );
}

fn v6(address: &str) -> CniResult {
    result(json!({"ips": [{"address": address}]}))
}

/// Raise `link` in the pod with the one IPv6 address fd00::10/64, not probed, waiting `wait` for DAD.
fn raise_fd00_10(k: &FakeKernel, link: u32, wait: Duration) -> Result<(), AttachError> {
    raise(&k.socket(POD), link, "net1", &v6("fd00::10/64"), &[], wait)
}

#[test]
fn dad_that_clears_is_waited_for() {
    let (k, _, link) = attached();
    k.dad(net("fd00::10/64"), Dad::TentativeFor(3));
    raise_fd00_10(&k, link, Duration::from_secs(5)).unwrap();
    let polls = k.calls().iter().filter(|c| c.contains("addresses")).count();
    assert_eq!(polls, 4, "three tentative answers, then a clear one");
    assert!(k.link(POD, "net1").unwrap().up);
    assert_eq!(
        k.calls()[..2],
        [
            format!("pod add_address #{link} fd00::10/64"),
            format!("pod set_up #{link}")
        ]
    );
}

#[test]
fn dad_that_never_clears_times_out_after_the_wait() {
    let (k, _, link) = attached();
    k.dad(net("fd00::10/64"), Dad::Stuck);
    let start = Instant::now();
    let e = raise_fd00_10(&k, link, Duration::from_millis(60)).unwrap_err();
    // The wait passed in, not DAD_WAIT's 5 s.
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(60) && waited < Duration::from_secs(2));
    assert!(
        matches!(&e, AttachError::DadTimeout { address, ifname, waited_ms: 60 }
            if address == "fd00::10/64" && ifname == "net1"),
        "{e:?}"
    );
}

#[test]
fn a_defended_address_is_dad_failed() {
    let (k, _, link) = attached();
    k.dad(net("fd00::10/64"), Dad::Failed);
    let e = raise_fd00_10(&k, link, Duration::from_secs(5)).unwrap_err();
    assert!(matches!(e, AttachError::DadFailed { .. }), "{e:?}");
    assert_eq!(e.code(), tether_cni::code::ADDRESS_IN_USE);
}

#[test]
fn probed_and_ipv4_addresses_skip_dad() {
    let (k, _, link) = attached();
    // Stuck would time out, were these waited for.
    k.dad(net("fd00::10/64"), Dad::Stuck);
    let r = result(json!({"ips": [{"address": "192.0.2.10/24"}, {"address": "fd00::10/64"}]}));
    let probed = ["fd00::10".parse().unwrap()];
    raise(&k.socket(POD), link, "net1", &r, &probed, Duration::ZERO).unwrap();
    assert_eq!(
        k.calls(),
        [
            format!("pod add_address #{link} 192.0.2.10/24"),
            format!("pod add_address #{link} fd00::10/64 nodad"),
            format!("pod set_up #{link}"),
        ]
    );
}

#[test]
fn routes_take_their_familys_gateway_and_an_existing_one_is_no_error() {
    let (k, _, link) = attached();
    let r = result(json!({
        "ips": [{"address": "192.0.2.10/24", "gateway": "192.0.2.1"},
                {"address": "fd00::10/64", "gateway": "fd00::1"}],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}, {"dst": "198.51.100.0/24", "gw": "192.0.2.9"}],
    }));
    let mut there = default_route(link);
    there.dst = net("198.51.100.0/24");
    k.put_route(POD, there);
    add_routes(&k.socket(POD), link, &r).unwrap();
    assert_eq!(
        k.calls(),
        [
            format!("pod add_route 0.0.0.0/0 via 192.0.2.1 dev #{link}"),
            format!("pod add_route ::/0 via fd00::1 dev #{link}"),
            format!("pod add_route 198.51.100.0/24 via 192.0.2.9 dev #{link}"),
        ]
    );
    assert_eq!(k.routes(POD).len(), 3);
    k.fail("add_route", 4, libc::ENETUNREACH);
    let e = add_routes(&k.socket(POD), link, &r).unwrap_err();
    assert!(matches!(&e, AttachError::Kernel(n) if n.errno() == Some(libc::ENETUNREACH)));
}

#[test]
fn the_master_is_the_named_link_else_the_default_routes() {
    let (k, nic) = node();
    let (host, pod) = (k.socket(HOST), k.socket(POD));
    let e = resolve_master(&cfg(Some("enp6s0")), None, &host, &pod).unwrap_err();
    assert!(
        matches!(&e, AttachError::MasterMissing { name, place: "on the host" } if name == "enp6s0"),
        "{e:?}"
    );
    let e = resolve_master(&cfg(None), None, &host, &pod).unwrap_err();
    assert!(
        matches!(e, AttachError::NoDefaultRoute { place: "the host" }),
        "{e:?}"
    );
    k.put_route(HOST, default_route(nic));
    let m = resolve_master(&cfg(None), None, &host, &pod).unwrap();
    assert_eq!(m.index, nic);
    assert_eq!(
        resolve_master(&cfg(Some("enp5s0")), None, &host, &pod)
            .unwrap()
            .index,
        nic
    );
    // Under linkInContainer the pod netns is searched, not the host's.
    let mut in_pod = cfg(Some("enp5s0"));
    in_pod.link_in_container = true;
    let e = resolve_master(&in_pod, None, &host, &pod).unwrap_err();
    assert!(
        matches!(
            e,
            AttachError::MasterMissing {
                place: "in the pod network namespace",
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(k.calls().last().unwrap(), "pod link_by_name enp5s0");
}

#[test]
fn a_chained_masters_name_comes_from_prev_result() {
    let (k, nic) = node();
    let prev = result(json!({"interfaces": [{"name": "enp5s0"}]}));
    let m = resolve_master(&cfg(None), Some(&prev), &k.socket(HOST), &k.socket(POD)).unwrap();
    assert_eq!(m.index, nic);
}

// ---------------------------------------------------------------------------
// ADD as a whole (`attach`), with the fake kernel and a recording pod side.
// ---------------------------------------------------------------------------

/// What ADD asked of the pod netns beside its links, in order.
#[derive(Default)]
struct RecordedPod(std::cell::RefCell<Vec<String>>);

impl PodSide for RecordedPod {
    fn notify_on_change(&self, ifname: &str) -> Result<(), AttachError> {
        self.0.borrow_mut().push(format!("notify {ifname}"));
        Ok(())
    }
    fn short_dad_window(&self, ifname: &str) -> Result<Option<DadTiming>, AttachError> {
        self.0.borrow_mut().push(format!("short dad {ifname}"));
        Ok(None)
    }
    fn restore_dad_timing(&self, _: DadTiming, ifname: &str) -> Result<(), AttachError> {
        self.0.borrow_mut().push(format!("restore dad {ifname}"));
        Ok(())
    }
    fn announce(&self, link: &Link, result: &CniResult) {
        let addrs: Vec<String> = result.ips.iter().map(|i| i.address.to_string()).collect();
        self.0
            .borrow_mut()
            .push(format!("announce #{} {}", link.index, addrs.join(",")));
    }
}

/// An ADD chained after a plugin that gave `prev` (no IPAM of its own: nothing is exec'd).
fn chained_add(prev: serde_json::Value) -> Request {
    let mut req = request(Command::Add);
    let conf =
        json!({"cniVersion": "1.0.0", "name": "n", "type": "tether-ipvlan", "prevResult": prev});
    req.conf = NetConf::parse(conf.to_string().as_bytes()).unwrap();
    req
}

fn attach_on(
    k: &FakeKernel,
    cfg: &IpvlanConfig,
    req: &Request,
    pod: &RecordedPod,
) -> Result<CniResult, AttachError> {
    let ns = NetNs::current().unwrap();
    let (host, pod_links) = (k.socket(HOST), k.socket(POD));
    let kernel = Kernel {
        host: &host,
        pod: &pod_links,
        in_pod: pod,
        netns: &ns,
    };
    attach(req, cfg, &kernel)
}

#[test]
fn attach_makes_configures_announces_and_describes_the_link() {
    let (k, _) = node();
    let req = chained_add(json!({"cniVersion": "1.0.0",
        "ips": [{"address": "192.0.2.10/24", "gateway": "192.0.2.1"}],
        "routes": [{"dst": "198.51.100.0/24"}]}));
    let pod = RecordedPod::default();
    let r = attach_on(&k, &cfg(Some("enp5s0")), &req, &pod).unwrap();
    assert_eq!(k.link_names(POD), vec!["net1".to_string()]);
    let net1 = k.link(POD, "net1").unwrap();
    assert_eq!(r.interfaces.len(), 1);
    assert_eq!(r.interfaces[0].name, "net1");
    assert_eq!(r.interfaces[0].sandbox.as_deref(), Some(NETNS));
    assert_eq!(r.ips[0].interface, Some(0));
    // Sysctls before anything is addressed, the announcement last; no IPv6: no DAD window.
    assert_eq!(
        *pod.0.borrow(),
        vec![
            "notify net1".to_string(),
            format!("announce #{} 192.0.2.10/24", net1.index)
        ]
    );
    let routes = k.routes(POD);
    assert!(
        routes
            .iter()
            .any(|r| r.dst == net("198.51.100.0/24")
                && r.gateway == Some("192.0.2.1".parse().unwrap())),
        "{routes:?}"
    );
}

#[test]
fn attach_to_a_master_that_is_down_makes_nothing() {
    let (k, nic) = node();
    k.set_state(HOST, nic, false, false);
    let req = chained_add(json!({"cniVersion": "1.0.0", "ips": [{"address": "192.0.2.10/24"}]}));
    let pod = RecordedPod::default();
    let e = attach_on(&k, &cfg(Some("enp5s0")), &req, &pod).unwrap_err();
    assert_eq!(e.code(), tether_cni::code::TRY_AGAIN_LATER, "{e}");
    assert!(
        !k.calls().iter().any(|c| c.contains("create_ipvlan")),
        "{:?}",
        k.calls()
    );
    assert!(pod.0.borrow().is_empty());
}

#[test]
fn attach_failing_to_configure_takes_the_link_back() {
    let (k, _) = node();
    k.fail("add_route", 1, libc::ENETUNREACH);
    let req = chained_add(json!({"cniVersion": "1.0.0",
        "ips": [{"address": "192.0.2.10/24", "gateway": "192.0.2.1"}],
        "routes": [{"dst": "198.51.100.0/24"}]}));
    let pod = RecordedPod::default();
    let e = attach_on(&k, &cfg(Some("enp5s0")), &req, &pod).unwrap_err();
    assert_eq!(e.code(), tether_cni::code::KERNEL, "{e}");
    assert!(k.link_names(POD).is_empty(), "{:?}", k.calls());
    let calls = k.calls();
    assert!(
        calls.last().unwrap().starts_with("pod delete_link #"),
        "{calls:?}"
    );
    assert!(!pod.0.borrow().iter().any(|c| c.starts_with("announce")));
}

#[test]
fn attach_refuses_an_mtu_above_the_masters_before_making_anything() {
    let (k, _) = node();
    let req = chained_add(json!({"cniVersion": "1.0.0", "ips": [{"address": "192.0.2.10/24"}]}));
    let mut c = cfg(Some("enp5s0"));
    c.mtu = Some(9000);
    let e = attach_on(&k, &c, &req, &RecordedPod::default()).unwrap_err();
    assert!(matches!(e, AttachError::MtuTooLarge { .. }), "{e}");
    assert!(k.link_names(POD).is_empty());
    assert!(!k.calls().iter().any(|c| c.contains("create_ipvlan")));
}
