//! Real-kernel tests of the netlink layer on this machine's kernel (root; netns and veth only).
//! ipvlan creation itself is covered by the lab tests (conformance/tests/lab_*).

use std::path::PathBuf;
use std::process::Command;

use tether_link::{NetNs, Netlink, Route};

/// A named netns removed on drop.
struct TempNs(String);

impl TempNs {
    fn new(tag: &str) -> TempNs {
        let name = format!("tl-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(std::process::Stdio::null())
            .status();
        assert!(
            Command::new("ip")
                .args(["netns", "add", &name])
                .status()
                .unwrap()
                .success()
        );
        TempNs(name)
    }
    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.0))
    }
    fn ip(&self, args: &str) {
        let st = Command::new("ip")
            .args(["-n", &self.0])
            .args(args.split_whitespace())
            .status()
            .unwrap();
        assert!(st.success(), "ip -n {} {args}", self.0);
    }
}

impl Drop for TempNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn handle_in_netns_sees_only_that_netns() {
    let ns = TempNs::new("see");
    ns.ip("link add va type veth peer name vb");
    let pod = Netlink::in_netns(&NetNs::open(&ns.path()).unwrap()).unwrap();
    let va = pod.link_by_name("va").unwrap().expect("va inside");
    assert_eq!(va.kind.as_deref(), Some("veth"));
    assert!(pod.link_by_name("nosuch").unwrap().is_none());
    // The host handle does not see the pod's links (unless the host happens to have a "va").
    let host = Netlink::current().unwrap();
    if let Some(l) = host.link_by_name("va").unwrap() {
        assert_ne!(l.mac, va.mac);
    }
}

#[test]
fn rename_up_address_route_delete() {
    let ns = TempNs::new("ops");
    ns.ip("link add va type veth peer name vb");
    let nl = Netlink::in_netns(&NetNs::open(&ns.path()).unwrap()).unwrap();
    let va = nl.link_by_name("va").unwrap().unwrap();
    nl.rename(va.index, "net1").unwrap();
    // Renaming onto an existing name is EEXIST.
    let vb = nl.link_by_name("vb").unwrap().unwrap();
    assert_eq!(
        nl.rename(vb.index, "net1").unwrap_err().errno(),
        Some(libc::EEXIST)
    );
    nl.add_address(va.index, "10.9.8.7/24".parse().unwrap(), false)
        .unwrap();
    nl.add_address(va.index, "fd00:9::7/64".parse().unwrap(), false)
        .unwrap();
    assert_eq!(
        nl.add_address(va.index, "10.9.8.7/24".parse().unwrap(), false)
            .unwrap_err()
            .errno(),
        Some(libc::EEXIST)
    );
    nl.set_up(vb.index).unwrap();
    nl.set_up(va.index).unwrap();
    assert!(nl.link_by_name("net1").unwrap().unwrap().up);
    let addrs: Vec<String> = nl
        .addresses(va.index)
        .unwrap()
        .iter()
        .map(|a| a.address.to_string())
        .collect();
    assert!(
        addrs.contains(&"10.9.8.7/24".to_string()) && addrs.contains(&"fd00:9::7/64".to_string()),
        "{addrs:?}"
    );
    let r = Route {
        dst: "10.50.0.0/16".parse().unwrap(),
        gateway: Some("10.9.8.1".parse().unwrap()),
        oif: Some(va.index),
        priority: None,
        table: None,
    };
    nl.add_route(&r).unwrap();
    let onlink = Route {
        dst: "10.60.0.0/16".parse().unwrap(),
        gateway: None,
        oif: Some(va.index),
        priority: Some(7),
        table: None,
    };
    nl.add_route(&onlink).unwrap();
    let routes = nl.all_routes().unwrap();
    assert!(
        routes
            .iter()
            .any(|x| x.dst == r.dst && x.gateway == r.gateway && x.oif == Some(va.index)),
        "{routes:?}"
    );
    assert!(
        routes
            .iter()
            .any(|x| x.dst == onlink.dst && x.priority == Some(7))
    );
    assert!(nl.delete_link(va.index).unwrap());
    assert!(
        !nl.delete_link(va.index).unwrap(),
        "second delete reports already gone"
    );
}

#[test]
fn default_route_link_found_and_absent() {
    let ns = TempNs::new("dflt");
    ns.ip("link add va type veth peer name vb");
    ns.ip("addr add 10.7.0.2/24 dev va");
    ns.ip("link set va up");
    ns.ip("link set vb up");
    let nl = Netlink::in_netns(&NetNs::open(&ns.path()).unwrap()).unwrap();
    assert!(nl.default_route_link().unwrap().is_none());
    ns.ip("route add default via 10.7.0.1 dev va");
    assert_eq!(nl.default_route_link().unwrap().unwrap().name, "va");
}

#[test]
fn netns_open_rejects_non_netns() {
    let dir = std::env::temp_dir();
    let e = NetNs::open(&dir).unwrap_err();
    assert!(e.to_string().contains("not a network namespace"), "{e}");
    let e = NetNs::open(&PathBuf::from("/run/netns/definitely-missing")).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
}

/// One thread enters the netns once and runs every job there: a socket it opens sees the pod's links
/// from the caller's thread, and sysctls it writes land in the pod.
#[test]
fn netns_thread_runs_every_job_inside() {
    let ns = TempNs::new("thr");
    ns.ip("link add va type veth peer name vb");
    let netns = NetNs::open(&ns.path()).unwrap();
    let t = netns.thread().unwrap();
    let nl = t.run(Netlink::current).unwrap().unwrap();
    let va = nl.link_by_name("va").unwrap().expect("va is in the pod");
    assert_eq!(
        t.run(|| tether_link::sysctl::set_interface("ipv4", "va", "arp_notify", "1"))
            .unwrap()
            .ok(),
        Some(())
    );
    let inside = t
        .run(|| tether_link::sysctl::get_interface("ipv4", "va", "arp_notify").unwrap())
        .unwrap();
    assert_eq!(inside, "1");
    // Same thread for both jobs: one setns per ADD.
    let (a, b) = (
        t.run(|| std::thread::current().id()).unwrap(),
        t.run(|| std::thread::current().id()).unwrap(),
    );
    assert_eq!(a, b);
    assert_ne!(a, std::thread::current().id());
    assert_eq!(nl.link_by_index(va.index).unwrap().unwrap().name, "va");
    // A job that panics ends the thread; later calls fail instead of hanging.
    assert!(t.run(|| panic!("boom")).is_err());
    assert!(t.run(|| 1).is_err());
}

/// An IPv6 address added with `nodad` is usable at once on a link that is up and doing DAD; without it,
/// the same kind of address starts tentative.
#[test]
fn nodad_address_is_never_tentative() {
    let ns = TempNs::new("dad");
    ns.ip("link add va type veth peer name vb");
    ns.ip("link set vb up");
    ns.ip("link set va up");
    let nl = Netlink::in_netns(&NetNs::open(&ns.path()).unwrap()).unwrap();
    let va = nl.link_by_name("va").unwrap().unwrap();
    nl.add_address(va.index, "fd00:9::1/64".parse().unwrap(), true)
        .unwrap();
    nl.add_address(va.index, "fd00:9::2/64".parse().unwrap(), false)
        .unwrap();
    let addrs = nl.addresses(va.index).unwrap();
    let find = |s: &str| {
        addrs
            .iter()
            .find(|a| a.address.to_string() == s)
            .unwrap_or_else(|| panic!("{s} in {addrs:?}"))
            .clone()
    };
    assert!(!find("fd00:9::1/64").tentative, "{addrs:?}");
    assert!(find("fd00:9::2/64").tentative, "{addrs:?}");
}

/// Address dumps are filtered to the link asked for; links() lists them all; set_down lowers.
#[test]
fn addresses_of_one_link_links_and_down() {
    let ns = TempNs::new("dump");
    ns.ip("link add va type veth peer name vb");
    ns.ip("addr add 10.9.1.1/24 dev va");
    ns.ip("addr add 10.9.2.1/24 dev vb");
    let nl = Netlink::in_netns(&NetNs::open(&ns.path()).unwrap()).unwrap();
    let va = nl.link_by_name("va").unwrap().unwrap();
    let got: Vec<String> = nl
        .addresses(va.index)
        .unwrap()
        .iter()
        .map(|a| a.address.to_string())
        .collect();
    assert_eq!(got, ["10.9.1.1/24"]);
    let names: Vec<String> = nl.links().unwrap().into_iter().map(|l| l.name).collect();
    for n in ["lo", "va", "vb"] {
        assert!(names.contains(&n.to_string()), "{names:?}");
    }
    nl.set_up(va.index).unwrap();
    assert!(nl.link_by_index(va.index).unwrap().unwrap().up);
    nl.set_down(va.index).unwrap();
    assert!(!nl.link_by_index(va.index).unwrap().unwrap().up);
    assert!(nl.link_by_index(999_999).unwrap().is_none());
    assert_eq!(nl.set_up(999_999).unwrap_err().errno(), Some(libc::ENODEV));
}
