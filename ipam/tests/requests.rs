//! Requested addresses (checklist H 70–72): the three sources, their precedence, and the errors.

mod common;

use common::*;
use serde_json::json;

fn dual() -> Net {
    Net::new(json!({"range": "10.1.2.0/24", "ipRanges": [{"range": "fd00:1:2::/64"}]}))
}

/// 70: `runtimeConfig.ips` (capability `ips`) → exactly those addresses, leased and returned.
#[test]
fn h70_runtime_config_ips() {
    let net = dual();
    let att = Att::new("c1");
    let out = net.add_with(&att, json!({"capabilities": {"ips": true}, "runtimeConfig": {"ips": ["10.1.2.9/24", "fd00:1:2::9/64"]}}));
    assert_eq!(
        out.addresses(),
        vec!["10.1.2.9/24", "fd00:1:2::9/64"],
        "{out}"
    );
    assert_eq!(net.leased_by(&att), vec![ip("10.1.2.9"), ip("fd00:1:2::9")]);
    // Listed in the other order, results still follow the range order.
    let att = Att::new("c2");
    let out = net.add_with(
        &att,
        json!({"runtimeConfig": {"ips": ["fd00:1:2::a", "10.1.2.10"]}}),
    );
    assert_eq!(
        out.addresses(),
        vec!["10.1.2.10/24", "fd00:1:2::a/64"],
        "{out}"
    );
}

/// 70: `args.cni.ips`; an entry without a prefix gets the range's prefix.
#[test]
fn h70_args_cni_ips() {
    let net = dual();
    let att = Att::new("c1");
    let out = net.add_with(
        &att,
        json!({"args": {"cni": {"ips": ["10.1.2.10", "fd00:1:2::10"]}}}),
    );
    assert_eq!(
        out.addresses(),
        vec!["10.1.2.10/24", "fd00:1:2::10/64"],
        "{out}"
    );
    assert_eq!(
        net.leased_by(&att),
        vec![ip("10.1.2.10"), ip("fd00:1:2::10")]
    );
}

/// 70: CNI_ARGS `IP=a,b` as Multus sends it, entries with and without prefix.
#[test]
fn h70_cni_args_ip_list() {
    let net = dual();
    let att = Att::new("c1").args("IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u;IP=10.1.2.11/24,fd00:1:2::11");
    let out = net.add(&att);
    assert_eq!(
        out.addresses(),
        vec!["10.1.2.11/24", "fd00:1:2::11/64"],
        "{out}"
    );
    assert_eq!(
        net.leased_by(&att),
        vec![ip("10.1.2.11"), ip("fd00:1:2::11")]
    );
    // One address for a single-range network.
    let net = Net::new(json!({"range": "10.1.2.0/24"}));
    let out = net.add(&Att::new("c2").args("IP=10.1.2.12"));
    assert_eq!(out.addresses(), vec!["10.1.2.12/24"], "{out}");
}

/// 71: `runtimeConfig.ips` wins over `args.cni.ips`; CNI_ARGS `IP=` is ignored when either is present.
#[test]
fn h71_precedence() {
    let net = Net::new(json!({"range": "10.1.2.0/24"}));
    let all =
        json!({"runtimeConfig": {"ips": ["10.1.2.20"]}, "args": {"cni": {"ips": ["10.1.2.21"]}}});
    let out = net.add_with(&Att::new("c1").args("IP=10.1.2.22"), all);
    assert_eq!(out.addresses(), vec!["10.1.2.20/24"], "{out}");
    let out = net.add_with(
        &Att::new("c2").args("IP=10.1.2.22"),
        json!({"args": {"cni": {"ips": ["10.1.2.21"]}}}),
    );
    assert_eq!(out.addresses(), vec!["10.1.2.21/24"], "{out}");
    let out = net.add(&Att::new("c3").args("IP=10.1.2.22"));
    assert_eq!(out.addresses(), vec!["10.1.2.22/24"], "{out}");
    let leased: Vec<_> = net.leased().keys().copied().collect();
    assert_eq!(
        leased,
        vec![ip("10.1.2.20"), ip("10.1.2.21"), ip("10.1.2.22")]
    );
}

/// 72: a requested address outside every range → error naming it; nothing leased (also not the
/// dual-stack partner that was fine).
#[test]
fn h72_outside_every_range() {
    let net = dual();
    for src in [
        json!({"runtimeConfig": {"ips": ["10.9.9.9/24"]}}),
        json!({"args": {"cni": {"ips": ["10.9.9.9"]}}}),
    ] {
        let msg = net.add_with(&Att::new("c1"), src).expect_err(7);
        assert!(
            msg.contains("10.9.9.9") && msg.contains("10.1.2.0/24"),
            "names the address and the ranges: {msg}"
        );
    }
    let msg = net
        .add(&Att::new("c1").args("IP=10.1.2.9,fd99::9"))
        .expect_err(7);
    assert!(msg.contains("fd99::9"), "{msg}");
    let msg = net.add(&Att::new("c1").args("IP=banana")).expect_err(7);
    assert!(msg.contains("banana"), "{msg}");
    assert!(
        net.records().is_empty(),
        "nothing leased: {:?}",
        net.records()
    );
}

/// 72: a requested address leased to another attachment → error naming the address and the holder;
/// the requester gets nothing, the holder keeps it.
#[test]
fn h72_held_by_another_attachment() {
    let net = dual();
    let holder = Att::new("holder").pod("team", "db-0", "uid-1");
    net.add_with(&holder, json!({"runtimeConfig": {"ips": ["10.1.2.30"]}}))
        .expect_ok();
    let want = Att::new("thief").pod("team", "web-0", "uid-2");
    let out = net.add_with(
        &want,
        json!({"runtimeConfig": {"ips": ["fd00:1:2::30", "10.1.2.30"]}}),
    );
    let msg = out.expect_err(104);
    assert!(
        msg.contains("10.1.2.30") && msg.contains("team/db-0") && msg.contains("holder"),
        "{msg}"
    );
    assert!(
        net.leased_by(&want).is_empty(),
        "the v6 address taken first is rolled back"
    );
    assert!(
        net.record(ip("fd00:1:2::30")).is_none(),
        "{:?}",
        net.records()
    );
    assert_eq!(net.leased_by(&holder).len(), 2);
    assert!(net.leased_by(&holder).contains(&ip("10.1.2.30")));
    // Two requests in one range is a config error, also nothing leased.
    let msg = net
        .add_with(
            &Att::new("two"),
            json!({"runtimeConfig": {"ips": ["10.1.2.40", "10.1.2.41"]}}),
        )
        .expect_err(7);
    assert!(
        msg.contains("10.1.2.40") && msg.contains("10.1.2.41"),
        "{msg}"
    );
    assert!(net.leased_by(&Att::new("two")).is_empty());
}
