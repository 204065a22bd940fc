//! ADD/DEL semantics through the binary (checklist H 73–79, 83) and the Result layout per version.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tether_pool::IpRange;

/// The address a fresh pool walk of range `index` tries first for (container, ifname): what an empty
/// store hands out.
fn first_candidate(
    range: &str,
    container_id: &str,
    ifname: &str,
    index: usize,
) -> std::net::IpAddr {
    let r: IpRange = range.parse().unwrap();
    r.candidates(tether_leases::start_offset(container_id, ifname, index))
        .next()
        .unwrap()
}

/// 73: a second ADD for the same attachment without DEL → the same addresses, still one lease each.
#[test]
fn h73_idempotent_re_add() {
    let net = Net::new(json!({"range": "10.1.2.0/24", "ipRanges": [{"range": "fd00:1:2::/64"}]}));
    let att = Att::new("c1");
    let first = net.add(&att).addresses();
    for _ in 0..3 {
        assert_eq!(net.add(&att).addresses(), first);
    }
    assert_eq!(net.records().len(), 2, "{:?}", net.records());
    assert_eq!(net.leased_by(&att).len(), 2);
    // Re-ADD naming the address it holds is fine too; naming another is an error and changes nothing.
    let held = host(&first[0]).to_string();
    assert_eq!(
        net.add_with(&att, json!({"runtimeConfig": {"ips": [held]}}))
            .addresses(),
        first
    );
    let msg = net
        .add_with(&att, json!({"runtimeConfig": {"ips": ["10.1.2.200"]}}))
        .expect_err(104);
    assert!(msg.contains("10.1.2.200") && msg.contains(&held), "{msg}");
    assert_eq!(net.records().len(), 2);
}

/// 74: DEL releases exactly its own lease: (c1,net1), (c1,net2), (c2,net1) held; DEL (c1,net1).
#[test]
fn h74_del_releases_only_its_own_lease() {
    let net = Net::new(json!({"range": "10.1.2.0/24"}));
    let a = Att::new("c1").ifname("net1");
    let b = Att::new("c1").ifname("net2");
    let c = Att::new("c2").ifname("net1");
    let (ia, ib, ic) = (net.add(&a).ip(), net.add(&b).ip(), net.add(&c).ip());
    assert_eq!(net.del(&a).expect_ok(), Value::Null, "DEL prints nothing");
    let leased = net.leased();
    assert_eq!(leased.len(), 2, "{leased:?}");
    assert_eq!(leased[&ib], ("c1".into(), "net2".into()));
    assert_eq!(leased[&ic], ("c2".into(), "net1".into()));
    assert_eq!(net.record(ia).unwrap()["state"]["kind"], "released");
    net.check(&b).expect_ok();
    net.check(&c).expect_ok();
    net.check(&a).expect_err(106);
    // DEL is idempotent, also for never-added attachments and without CNI_NETNS.
    net.del(&a).expect_ok();
    net.del(&Att::new("never")).expect_ok();
    assert_eq!(net.leased().len(), 2);
}

/// 75: exhaustion names the range and the counts; nothing new is leased.
#[test]
fn h75_exhaustion_names_range_and_counts() {
    let net = Net::new(json!({"range": "10.1.2.10-10.1.2.11/24"}));
    net.add(&Att::new("c1")).expect_ok();
    net.add(&Att::new("c2")).expect_ok();
    let before = net.records();
    let msg = net.add(&Att::new("c3")).expect_err(102);
    assert!(
        msg.contains("10.1.2.10-10.1.2.11/24"),
        "names the range: {msg}"
    );
    assert!(
        msg.contains("2 usable") && msg.contains("2 leased"),
        "counts: {msg}"
    );
    assert!(msg.contains(&net.name), "names the network: {msg}");
    assert_eq!(net.records(), before, "nothing changed");
}

/// 76: dual-stack with the IPv6 range exhausted → ADD fails and the IPv4 lease of that ADD is
/// released too (the record disappears: it never existed before).
#[test]
fn h76_dual_stack_rollback() {
    let net = Net::new(
        json!({"ipRanges": [{"range": "10.1.2.0/24"}, {"range": "fd00:1:2::1-fd00:1:2::1/64"}]}),
    );
    let c1 = Att::new("c1");
    net.add(&c1).expect_ok();
    let before = net.records();
    let c2 = Att::new("c2");
    let msg = net.add(&c2).expect_err(102);
    assert!(msg.contains("fd00:1:2::1-fd00:1:2::1/64"), "{msg}");
    assert_eq!(
        net.records(),
        before,
        "the IPv4 lease taken during the failed ADD is gone"
    );
    assert!(net.leased_by(&c2).is_empty());
    // After c1 leaves, c2 gets both.
    net.del(&c1).expect_ok();
    let ncool = Net {
        ipam: {
            let mut i = net.ipam.clone();
            i["cooldown_s"] = json!(0);
            i
        },
        ..net
    };
    assert_eq!(ncool.add(&c2).addresses().len(), 2);
}

/// 77: the same pod (namespace, name, uid) re-creates its sandbox without DEL → the same address,
/// one lease, now owned by the new container ID.
#[test]
fn h77_sandbox_re_create() {
    let net = Net::new(json!({"range": "10.1.2.0/24", "ipRanges": [{"range": "fd00:1:2::/64"}]}));
    let old = Att::new("sandbox-1").pod("ns", "pod", "uid-1");
    let new = Att::new("sandbox-2").pod("ns", "pod", "uid-1");
    let a = net.add(&old).addresses();
    let b = net.add(&new).addresses();
    assert_eq!(a, b);
    assert_eq!(
        net.records().len(),
        2,
        "still one record per address: {:?}",
        net.records()
    );
    assert_eq!(net.leased_by(&new).len(), 2);
    assert!(net.leased_by(&old).is_empty());
    net.check(&old).expect_err(106);
    // The old sandbox's late DEL must not release what the new one holds.
    net.del(&old).expect_ok();
    assert_eq!(net.leased_by(&new).len(), 2);
    // Another pod with the same name but another UID is not the same pod: it gets other addresses.
    let other = Att::new("sandbox-3").pod("ns", "pod", "uid-2");
    let c = net.add(&other).addresses();
    assert!(c.iter().all(|x| !a.contains(x)), "{a:?} vs {c:?}");
}

/// 78: after DEL, the same pod name (new container, new UID) gets its previous address back, as long as
/// nobody else holds it. cooldown 0, so only stickiness can explain getting it back.
#[test]
fn h78_sticky_by_pod_name() {
    let net = Net::new(json!({"range": "10.1.0.0/16", "cooldown_s": 0}));
    let first = Att::new("c-1").pod("ns", "sts-0", "uid-1");
    let a = net.add(&first).ip();
    net.del(&first).expect_ok();
    let second = Att::new("c-2").pod("ns", "sts-0", "uid-2");
    assert_ne!(
        first_candidate("10.1.0.0/16", "c-2", "net1", 0),
        a,
        "pick other IDs: the walk itself would land on it"
    );
    assert_eq!(net.add(&second).ip(), a, "sticky");
    net.del(&second).expect_ok();
    // Someone else takes it meanwhile: the pod gets another address, the holder keeps it.
    let squatter = Att::new("squat").pod("ns", "other", "uid-9");
    net.add_with(
        &squatter,
        json!({"runtimeConfig": {"ips": [a.to_string()]}}),
    )
    .expect_ok();
    let third = Att::new("c-3").pod("ns", "sts-0", "uid-3");
    assert_ne!(net.add(&third).ip(), a);
    assert_eq!(net.leased_by(&squatter), vec![a]);
}

/// 79: a released address does not go to a different pod within `cooldown_s`; afterwards it does; with
/// cooldown 0 it is reusable at once. The second attachment's walk starts exactly at the released
/// address, so without a cooldown it would get it.
#[test]
fn h79_cooldown() {
    let range = "10.1.2.0/24";
    let probe_att = Att::new("next");
    let x = first_candidate(range, &probe_att.container_id, "net1", 0);

    // cooldown 0: reusable at once.
    let net = Net::new(json!({"range": range, "cooldown_s": 0}));
    let holder = Att::new("holder");
    net.add_with(&holder, json!({"runtimeConfig": {"ips": [x.to_string()]}}))
        .expect_ok();
    net.del(&holder).expect_ok();
    assert_eq!(net.add(&probe_att).ip(), x);

    // cooldown 2 s.
    let net = Net::new(json!({"range": range, "cooldown_s": 2}));
    net.add_with(&holder, json!({"runtimeConfig": {"ips": [x.to_string()]}}))
        .expect_ok();
    net.del(&holder).expect_ok();
    let during = net.add(&probe_att).ip();
    assert_ne!(
        during, x,
        "handed to another attachment within the cooldown"
    );
    net.del(&probe_att).expect_ok();
    std::thread::sleep(Duration::from_millis(3100));
    assert_eq!(net.add(&probe_att).ip(), x, "after the cooldown");
}

/// 83: an IPAM Result has no interfaces and no ips[].interface; gateway only when configured; routes
/// and dns passed through.
#[test]
fn h83_ipam_result_shape() {
    let routes = json!([{"dst": "0.0.0.0/0", "gw": "10.1.2.1"}, {"dst": "192.168.0.0/16"}, {"dst": "fd00:9::/48", "gw": "fd00:1:2::1"}]);
    let dns = json!({"nameservers": ["10.1.2.53", "fd00:1:2::53"], "domain": "example.test", "search": ["a.example.test"], "options": ["ndots:2"]});
    let net = Net::new(
        json!({"ipRanges": [{"range": "10.1.2.0/24"}, {"range": "fd00:1:2::/64"}], "gateway": "10.1.2.1", "routes": routes, "dns": dns}),
    );
    let v = net.add(&Att::new("c1")).expect_ok();
    assert_eq!(v["cniVersion"], "1.1.0");
    assert!(v.get("interfaces").is_none(), "{v}");
    let ips = v["ips"].as_array().unwrap();
    assert_eq!(ips.len(), 2);
    for i in ips {
        assert!(
            i.get("interface").is_none() && i.get("version").is_none(),
            "{i}"
        );
    }
    assert_eq!(ips[0]["gateway"], "10.1.2.1");
    assert!(
        ips[1].get("gateway").is_none(),
        "no IPv6 gateway configured: {v}"
    );
    assert_eq!(v["routes"], routes);
    assert_eq!(v["dns"], dns);

    // Nothing configured → no gateway, no routes, empty (or absent) dns.
    let net = Net::new(json!({"range": "10.1.2.0/24"}));
    let v = net.add(&Att::new("c1")).expect_ok();
    assert!(v["ips"][0].get("gateway").is_none(), "{v}");
    assert!(
        v.get("routes")
            .is_none_or(|r| r.as_array().is_some_and(|a| a.is_empty())),
        "{v}"
    );
    assert!(
        v.get("dns")
            .is_none_or(|d| d.as_object().is_some_and(|o| o.is_empty())),
        "{v}"
    );
}

/// Result layout per cniVersion: 0.3.x/0.4.0 carry ips[].version, 1.x do not; cniVersion echoed.
#[test]
fn result_layout_per_version() {
    for v in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let net = Net::new(json!({"ipRanges": [{"range": "10.1.2.0/24"}, {"range": "fd00:1:2::/64"}], "gateway": "10.1.2.1"})).version(v);
        let r = net.add(&Att::new("c1")).expect_ok();
        assert_eq!(r["cniVersion"], v);
        assert!(r.get("interfaces").is_none(), "{v}: {r}");
        let ips = r["ips"].as_array().unwrap();
        if v.starts_with("0.") {
            assert_eq!(ips[0]["version"], "4", "{v}: {r}");
            assert_eq!(ips[1]["version"], "6", "{v}: {r}");
        } else {
            assert!(ips.iter().all(|i| i.get("version").is_none()), "{v}: {r}");
        }
        assert!(ips.iter().all(|i| i.get("interface").is_none()), "{v}: {r}");
        assert_eq!(ips[0]["gateway"], "10.1.2.1");
        // CHECK exists from 0.4.0 on.
        let chk = net.check(&Att::new("c1"));
        if v == "0.4.0" || v.starts_with('1') {
            chk.expect_ok();
        } else {
            chk.expect_err(1);
        }
    }
}
