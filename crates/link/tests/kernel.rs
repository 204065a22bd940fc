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
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(std::process::Stdio::null()).status();
        assert!(Command::new("ip").args(["netns", "add", &name]).status().unwrap().success());
        TempNs(name)
    }
    fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.0))
    }
    fn ip(&self, args: &str) {
        let st = Command::new("ip").args(["-n", &self.0]).args(args.split_whitespace()).status().unwrap();
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
    let rt = Netlink::runtime().unwrap();
    let pod = Netlink::in_netns(&rt, &NetNs::open(&ns.path()).unwrap()).unwrap();
    let va = pod.link_by_name("va").unwrap().expect("va inside");
    assert_eq!(va.kind.as_deref(), Some("veth"));
    assert!(pod.link_by_name("nosuch").unwrap().is_none());
    // The host handle does not see the pod's links (unless the host happens to have a "va").
    let host = Netlink::current(&rt).unwrap();
    if let Some(l) = host.link_by_name("va").unwrap() {
        assert_ne!(l.mac, va.mac);
    }
}

#[test]
fn rename_up_address_route_delete() {
    let ns = TempNs::new("ops");
    ns.ip("link add va type veth peer name vb");
    let rt = Netlink::runtime().unwrap();
    let nl = Netlink::in_netns(&rt, &NetNs::open(&ns.path()).unwrap()).unwrap();
    let va = nl.link_by_name("va").unwrap().unwrap();
    nl.rename(va.index, "net1").unwrap();
    // Renaming onto an existing name is EEXIST.
    let vb = nl.link_by_name("vb").unwrap().unwrap();
    assert_eq!(nl.rename(vb.index, "net1").unwrap_err().errno(), Some(libc::EEXIST));
    nl.add_address(va.index, "10.9.8.7/24".parse().unwrap()).unwrap();
    nl.add_address(va.index, "fd00:9::7/64".parse().unwrap()).unwrap();
    assert_eq!(nl.add_address(va.index, "10.9.8.7/24".parse().unwrap()).unwrap_err().errno(), Some(libc::EEXIST));
    nl.set_up(vb.index).unwrap();
    nl.set_up(va.index).unwrap();
    assert!(nl.link_by_name("net1").unwrap().unwrap().up);
    let addrs: Vec<String> = nl.addresses(va.index).unwrap().iter().map(|a| a.address.to_string()).collect();
    assert!(addrs.contains(&"10.9.8.7/24".to_string()) && addrs.contains(&"fd00:9::7/64".to_string()), "{addrs:?}");
    let r = Route { dst: "10.50.0.0/16".parse().unwrap(), gateway: Some("10.9.8.1".parse().unwrap()), oif: Some(va.index), priority: None, table: None };
    nl.add_route(&r).unwrap();
    let onlink = Route { dst: "10.60.0.0/16".parse().unwrap(), gateway: None, oif: Some(va.index), priority: Some(7), table: None };
    nl.add_route(&onlink).unwrap();
    let routes = nl.all_routes().unwrap();
    assert!(routes.iter().any(|x| x.dst == r.dst && x.gateway == r.gateway && x.oif == Some(va.index)), "{routes:?}");
    assert!(routes.iter().any(|x| x.dst == onlink.dst && x.priority == Some(7)));
    assert!(nl.delete_link(va.index).unwrap());
    assert!(!nl.delete_link(va.index).unwrap(), "second delete reports already gone");
}

#[test]
fn default_route_link_found_and_absent() {
    let ns = TempNs::new("dflt");
    ns.ip("link add va type veth peer name vb");
    ns.ip("addr add 10.7.0.2/24 dev va");
    ns.ip("link set va up");
    ns.ip("link set vb up");
    let rt = Netlink::runtime().unwrap();
    let nl = Netlink::in_netns(&rt, &NetNs::open(&ns.path()).unwrap()).unwrap();
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
