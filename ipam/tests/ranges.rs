//! Range parsing through the binary (checklist H 61–69): every whereabouts form, allocated until
//! exhaustion so the whole set of addresses ever handed out is checked, not just the first one.

mod common;

use common::*;
use serde_json::json;

/// Exhaust `ipam` and compare the handed-out set with `want`; every address carries `prefix`.
#[track_caller]
fn exhausts_to(
    ipam: serde_json::Value,
    want: std::collections::BTreeSet<std::net::IpAddr>,
    prefix: u8,
) -> String {
    let net = Net::new(ipam);
    let (got, msg) = net.exhaust("c");
    assert_eq!(got, want, "handed-out set");
    for r in net.records() {
        assert_eq!(r["prefix_len"].as_u64(), Some(prefix as u64), "{r}");
    }
    msg
}

/// 61: a CIDR range hands out only the hosts, never network or broadcast.
#[test]
fn h61_cidr_range_hands_out_only_hosts() {
    exhausts_to(
        json!({"range": "10.1.2.0/29"}),
        span("10.1.2.1", "10.1.2.6"),
        29,
    );
    // Host bits in the CIDR are ignored, as whereabouts does.
    exhausts_to(
        json!({"range": "10.1.2.5/29"}),
        span("10.1.2.1", "10.1.2.6"),
        29,
    );
}

/// 62: `first-last/prefix` hands out exactly first..=last, each with the range's prefix.
#[test]
fn h62_first_last_range() {
    let net = Net::new(json!({"range": "10.1.2.241-10.1.2.250/24"}));
    let out = net.add(&Att::new("one"));
    assert!(out.addresses()[0].ends_with("/24"), "{out}");
    exhausts_to(
        json!({"range": "10.1.2.241-10.1.2.250/24"}),
        span("10.1.2.241", "10.1.2.250"),
        24,
    );
}

/// 63: `range_start`/`range_end` bound a CIDR range inclusively; either alone works too.
#[test]
fn h63_range_start_and_end() {
    exhausts_to(
        json!({"range": "10.1.2.0/24", "range_start": "10.1.2.20", "range_end": "10.1.2.27"}),
        span("10.1.2.20", "10.1.2.27"),
        24,
    );
    exhausts_to(
        json!({"range": "10.1.2.0/24", "range_start": "10.1.2.250"}),
        span("10.1.2.250", "10.1.2.254"),
        24,
    );
    exhausts_to(
        json!({"range": "10.1.2.0/24", "range_end": "10.1.2.4"}),
        span("10.1.2.1", "10.1.2.4"),
        24,
    );
}

/// 64: `ipRanges` with two entries → one address from each, in order; a top-level `range` comes first.
#[test]
fn h64_ip_ranges_one_address_each_in_order() {
    let net = Net::new(json!({"ipRanges": [{"range": "10.1.3.0/29"}, {"range": "10.1.2.0/29"}]}));
    let a = net.add(&Att::new("c1")).addresses();
    assert_eq!(a.len(), 2, "{a:?}");
    assert!(
        a[0].starts_with("10.1.3.") && a[1].starts_with("10.1.2."),
        "order follows ipRanges: {a:?}"
    );

    let net = Net::new(
        json!({"range": "10.1.4.0/29", "ipRanges": [{"range": "10.1.3.0/29"}, {"range": "10.1.2.0/29"}]}),
    );
    let a = net.add(&Att::new("c1")).addresses();
    assert_eq!(a.len(), 3, "{a:?}");
    assert!(
        a[0].starts_with("10.1.4.") && a[1].starts_with("10.1.3.") && a[2].starts_with("10.1.2."),
        "{a:?}"
    );
    // Each range is exhausted separately: the /29s give six attachments, the seventh fails naming a range.
    let (got, msg) = net.exhaust("x");
    assert_eq!(
        got.len(),
        3 * 5,
        "five more attachments with three addresses each: {got:?}"
    );
    assert!(msg.contains("10.1."), "{msg}");
}

/// 64: one IPv4 and one IPv6 entry → a dual-stack result, IPv4 first as configured (and the reverse).
#[test]
fn h64_dual_stack_v4_and_v6() {
    let net = Net::new(json!({"ipRanges": [{"range": "10.1.2.0/24"}, {"range": "fd00:1:2::/64"}]}));
    let a = net.add(&Att::new("c1")).addresses();
    assert_eq!(a.len(), 2, "{a:?}");
    assert!(host(&a[0]).is_ipv4() && a[0].ends_with("/24"), "{a:?}");
    assert!(
        host(&a[1]).is_ipv6() && a[1].ends_with("/64") && a[1].starts_with("fd00:1:2:"),
        "{a:?}"
    );
    let net = Net::new(json!({"range": "fd00:1:2::/64", "ipRanges": [{"range": "10.1.2.0/24"}]}));
    let a = net.add(&Att::new("c1")).addresses();
    assert!(host(&a[0]).is_ipv6() && host(&a[1]).is_ipv4(), "{a:?}");
}

/// 65: IPv6 CIDR and first-last ranges behave like IPv4 (the subnet-router anycast `::` is never
/// handed out; IPv6 has no broadcast, so the last address is usable).
#[test]
fn h65_ipv6_cidr_and_first_last() {
    exhausts_to(
        json!({"range": "fd00:1:2::/125"}),
        span("fd00:1:2::1", "fd00:1:2::7"),
        125,
    );
    exhausts_to(
        json!({"range": "fd00:1:2::10-fd00:1:2::1a/64"}),
        span("fd00:1:2::10", "fd00:1:2::1a"),
        64,
    );
    exhausts_to(
        json!({"range": "fd00:1:2::/64", "range_start": "fd00:1:2::ff:fff0", "range_end": "fd00:1:2::ff:ffff"}),
        span("fd00:1:2::ff:fff0", "fd00:1:2::ff:ffff"),
        64,
    );
    // A wide range works without enumerating it.
    let net = Net::new(json!({"range": "fd00::/8"}));
    let a = net.add(&Att::new("wide")).addresses();
    assert!(a[0].ends_with("/8"), "{a:?}");
}

/// /31 and /32 (IPv6 /127 and /128) have no network or broadcast address: every address is a host.
#[test]
fn h61_point_to_point_and_host_prefixes() {
    exhausts_to(
        json!({"range": "10.1.2.4/31"}),
        span("10.1.2.4", "10.1.2.5"),
        31,
    );
    exhausts_to(
        json!({"range": "10.1.2.9/32"}),
        span("10.1.2.9", "10.1.2.9"),
        32,
    );
    exhausts_to(
        json!({"range": "fd00:1:2::4/127"}),
        span("fd00:1:2::4", "fd00:1:2::5"),
        127,
    );
    exhausts_to(
        json!({"range": "fd00:1:2::9/128"}),
        span("fd00:1:2::9", "fd00:1:2::9"),
        128,
    );
}

/// 67: `exclude` with a CIDR and a single address: none is ever handed out, even when it is the lowest
/// free address (checked over the whole range until exhaustion).
#[test]
fn h67_exclude_cidr_and_single_ip() {
    let mut want = span("10.1.2.1", "10.1.2.14");
    for x in span("10.1.2.0", "10.1.2.3")
        .into_iter()
        .chain([ip("10.1.2.9")])
    {
        want.remove(&x);
    }
    exhausts_to(
        json!({"range": "10.1.2.0/28", "exclude": ["10.1.2.0/30", "10.1.2.9"]}),
        want,
        28,
    );
    // The lowest usable address excluded, as a single IP and as /32.
    exhausts_to(
        json!({"range": "10.1.2.0/29", "exclude": ["10.1.2.1"]}),
        span("10.1.2.2", "10.1.2.6"),
        29,
    );
    exhausts_to(
        json!({"range": "10.1.2.0/29", "exclude": ["10.1.2.1/32", "10.1.2.6/32"]}),
        span("10.1.2.2", "10.1.2.5"),
        29,
    );
    // IPv6, and exclusions inside ipRanges entries.
    let mut want6 = span("fd00:1:2::1", "fd00:1:2::f");
    for x in span("fd00:1:2::1", "fd00:1:2::3")
        .into_iter()
        .chain([ip("fd00:1:2::8")])
    {
        want6.remove(&x);
    }
    exhausts_to(
        json!({"ipRanges": [{"range": "fd00:1:2::/124", "exclude": ["fd00:1:2::/126", "fd00:1:2::8"]}]}),
        want6,
        124,
    );
    // An excluded address cannot be requested either.
    let net = Net::new(json!({"range": "10.1.2.0/29", "exclude": ["10.1.2.1"]}));
    let msg = net
        .add_with(
            &Att::new("r"),
            json!({"args": {"cni": {"ips": ["10.1.2.1"]}}}),
        )
        .expect_err(7);
    assert!(
        msg.contains("10.1.2.1") && msg.contains("excluded"),
        "{msg}"
    );
    assert!(net.leased().is_empty());
}

/// 68: a gateway inside the range is never handed out and is every IP's `gateway`.
#[test]
fn h68_gateway_never_handed_out() {
    for gw in ["10.1.2.1", "10.1.2.3", "10.1.2.6"] {
        let mut want = span("10.1.2.1", "10.1.2.6");
        want.remove(&ip(gw));
        let net = Net::new(json!({"range": "10.1.2.0/29", "gateway": gw}));
        let out = net.add(&Att::new("first"));
        let v = out.expect_ok();
        assert_eq!(v["ips"][0]["gateway"], gw, "{out}");
        let (mut got, _) = net.exhaust("c");
        got.insert(out.ip());
        assert_eq!(got, want, "gateway {gw}");
    }
    // IPv6 gateway inside the range, and a per-entry gateway in ipRanges.
    let net =
        Net::new(json!({"ipRanges": [{"range": "fd00:1:2::/126", "gateway": "fd00:1:2::1"}]}));
    let (got, _) = net.exhaust("c");
    assert_eq!(got, span("fd00:1:2::2", "fd00:1:2::3"));
}

/// 69: network and IPv4 broadcast addresses are never handed out, also when a first-last range spans
/// them; inside a wider prefix, x.x.x.255 and x.x.x.0 are ordinary hosts.
#[test]
fn h69_network_and_broadcast_never_handed_out() {
    exhausts_to(
        json!({"range": "10.1.2.0-10.1.2.5/24"}),
        span("10.1.2.1", "10.1.2.5"),
        24,
    );
    exhausts_to(
        json!({"range": "10.1.2.250-10.1.2.255/24"}),
        span("10.1.2.250", "10.1.2.254"),
        24,
    );
    exhausts_to(
        json!({"range": "10.1.2.0-10.1.2.3/30"}),
        span("10.1.2.1", "10.1.2.2"),
        30,
    );
    exhausts_to(
        json!({"range": "10.1.2.252-10.1.3.3/23"}),
        span("10.1.2.252", "10.1.3.3"),
        23,
    );
    exhausts_to(
        json!({"range": "10.1.2.0/24", "range_start": "10.1.2.0", "range_end": "10.1.2.2"}),
        span("10.1.2.1", "10.1.2.2"),
        24,
    );
    exhausts_to(
        json!({"range": "fd00:1:2::-fd00:1:2::3/64"}),
        span("fd00:1:2::1", "fd00:1:2::3"),
        64,
    );
    // Requesting them names the reason.
    let net = Net::new(json!({"range": "10.1.2.0/24"}));
    for (a, why) in [
        ("10.1.2.0", "network address"),
        ("10.1.2.255", "broadcast address"),
    ] {
        let msg = net
            .add_with(&Att::new("r"), json!({"args": {"cni": {"ips": [a]}}}))
            .expect_err(7);
        assert!(msg.contains(a) && msg.contains(why), "{msg}");
    }
    assert!(net.leased().is_empty());
}

/// 66: invalid ranges → code 7 naming the key and the value; nothing is written.
#[test]
fn h66_invalid_ranges_name_key_and_value() {
    let cases = [
        (
            json!({"range": "10.1.2.9-10.1.2.3/24"}),
            "ipam.range",
            "10.1.2.9-10.1.2.3/24",
            "after",
        ),
        (
            json!({"range": "10.1.3.1-10.1.2.9/24"}),
            "ipam.range",
            "10.1.3.1-10.1.2.9/24",
            "outside",
        ),
        (
            json!({"range": "10.1.2.1-10.1.3.9/24"}),
            "ipam.range",
            "10.1.2.1-10.1.3.9/24",
            "outside",
        ),
        (
            json!({"range": "10.1.2.1-fd00::9/64"}),
            "ipam.range",
            "10.1.2.1-fd00::9/64",
            "IPv4 and IPv6",
        ),
        (json!({"range": "garbage"}), "ipam.range", "garbage", ""),
        (
            json!({"range": "10.1.2.0/33"}),
            "ipam.range",
            "10.1.2.0/33",
            "",
        ),
        (json!({"range": "10.1.2.0"}), "ipam.range", "10.1.2.0", ""),
        (
            json!({"range": "10.1.2.0/24", "range_start": "10.1.3.5"}),
            "ipam.range_start",
            "10.1.3.5",
            "outside",
        ),
        (
            json!({"range": "10.1.2.0/24", "range_end": "fd00::5"}),
            "ipam.range_end",
            "fd00::5",
            "IPv4 and IPv6",
        ),
        (
            json!({"range": "10.1.2.0/24", "range_start": "10.1.2.50", "range_end": "10.1.2.40"}),
            "ipam.range_end",
            "10.1.2.40",
            "after",
        ),
        (
            json!({"range": "10.1.2.0/24", "range_start": "not-an-ip"}),
            "ipam.range_start",
            "not-an-ip",
            "",
        ),
        (
            json!({"range": "10.1.2.0/24", "exclude": ["10.1.2.x"]}),
            "ipam.exclude[0]",
            "10.1.2.x",
            "",
        ),
        (
            json!({"ipRanges": [{"range": "10.1.2.0/24"}, {"range": "fd00::9-fd00::1/64"}]}),
            "ipam.ipRanges[1].range",
            "fd00::9-fd00::1/64",
            "after",
        ),
        (
            json!({"ipRanges": [{"range": "10.1.2.0/24", "range_start": "10.1.9.1"}]}),
            "ipam.ipRanges[0].range_start",
            "10.1.9.1",
            "outside",
        ),
        (
            json!({"ipRanges": "10.1.2.0/24"}),
            "ipam.ipRanges",
            "10.1.2.0/24",
            "",
        ),
        (
            json!({"gateway": "10.1.2.300", "range": "10.1.2.0/24"}),
            "ipam.gateway",
            "10.1.2.300",
            "",
        ),
    ];
    for (ipam, key, value, reason) in cases {
        let net = Net::new(ipam.clone());
        let msg = net.add(&Att::new("c1")).expect_err(7);
        assert!(
            msg.contains(key) && msg.contains(value) && msg.contains(reason),
            "{ipam}: {msg}"
        );
        assert!(
            !net.state_path().exists(),
            "{ipam}: state written for an invalid config"
        );
        // Every verb validates the config the same way; DEL then has nothing to release and
        // succeeds (a runtime replays the ADD's configuration in every DEL: failing would keep the
        // pod Terminating for ever).
        net.del(&Att::new("c1")).expect_ok();
        net.check(&Att::new("c1")).expect_err(7);
        net.status().expect_err(50);
    }
    let net = Net::new(json!({}));
    let msg = net.add(&Att::new("c1")).expect_err(7);
    assert!(msg.contains("range"), "{msg}");
}
