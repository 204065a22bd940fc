use std::net::IpAddr;

use tether_pool::{IpRange, RangeError, RequestError, RequestedIp, Unusable, find_range, locate};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn all(r: &IpRange) -> Vec<String> {
    r.candidates(0).map(|a| a.to_string()).collect()
}

fn range(
    text: &str,
    start: Option<&str>,
    end: Option<&str>,
    gw: Option<&str>,
    excl: &[&str],
) -> IpRange {
    IpRange::parse(text)
        .unwrap()
        .with_bounds(
            start.map(ip),
            end.map(ip),
            gw.map(ip),
            excl.iter()
                .map(|e| tether_pool::range::parse_exclude(e).unwrap())
                .collect(),
        )
        .unwrap()
}

#[test]
fn cidr_skips_network_and_broadcast() {
    let r = IpRange::parse("192.168.2.224/29").unwrap();
    assert_eq!(r.prefix_len(), 29);
    assert_eq!(r.network(), ip("192.168.2.224"));
    assert_eq!(r.usable_count(), 6);
    assert_eq!(
        all(&r),
        [
            "192.168.2.225",
            "192.168.2.226",
            "192.168.2.227",
            "192.168.2.228",
            "192.168.2.229",
            "192.168.2.230"
        ]
    );
    assert!(!r.contains(ip("192.168.2.224")));
    assert!(!r.contains(ip("192.168.2.231")));
    assert_eq!(
        r.unusable_reason(ip("192.168.2.224")),
        Some(Unusable::NetworkAddress)
    );
    assert_eq!(
        r.unusable_reason(ip("192.168.2.231")),
        Some(Unusable::BroadcastAddress)
    );
    assert_eq!(
        r.unusable_reason(ip("192.168.2.232")),
        Some(Unusable::OutsideSubnet)
    );
    assert_eq!(
        r.unusable_reason(ip("fd00::1")),
        Some(Unusable::OtherFamily)
    );
    assert_eq!(r.to_string(), "192.168.2.224/29");
}

#[test]
fn cidr_with_host_bits_means_whole_subnet() {
    let r = IpRange::parse("10.1.2.77/24").unwrap();
    assert_eq!(r.network(), ip("10.1.2.0"));
    assert_eq!(r.usable_count(), 254);
}

#[test]
fn first_last_form() {
    let r = IpRange::parse("10.20.30.241-10.20.30.250/24").unwrap();
    assert_eq!(r.usable_count(), 10);
    assert_eq!(r.prefix_len(), 24);
    assert_eq!(r.network(), ip("10.20.30.0"));
    assert_eq!(all(&r).first().unwrap(), "10.20.30.241");
    assert_eq!(all(&r).last().unwrap(), "10.20.30.250");
    assert_eq!(r.to_string(), "10.20.30.241-10.20.30.250/24");
    assert_eq!(
        r.unusable_reason(ip("10.20.30.240")),
        Some(Unusable::OutsideBounds)
    );
}

#[test]
fn first_last_spanning_network_broadcast_and_gateway() {
    // Spans the network and broadcast of the /29 and contains the gateway.
    let r = range("10.0.0.0-10.0.0.7/29", None, None, Some("10.0.0.1"), &[]);
    assert_eq!(
        all(&r),
        ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]
    );
    assert_eq!(r.usable_count(), 5);
    assert_eq!(r.unusable_reason(ip("10.0.0.1")), Some(Unusable::Gateway));
    // Spanning the network address of a v6 /120 too.
    let r6 = IpRange::parse("fd00::-fd00::3/120").unwrap();
    assert_eq!(all(&r6), ["fd00::1", "fd00::2", "fd00::3"]);
}

#[test]
fn slash31_32_127_128() {
    let r = IpRange::parse("10.0.0.4/31").unwrap();
    assert_eq!(all(&r), ["10.0.0.4", "10.0.0.5"]);
    let r = IpRange::parse("10.0.0.9/32").unwrap();
    assert_eq!(all(&r), ["10.0.0.9"]);
    assert_eq!(r.usable_count(), 1);
    let r = IpRange::parse("fd00::4/127").unwrap();
    assert_eq!(all(&r), ["fd00::4", "fd00::5"]);
    let r = IpRange::parse("fd00::9/128").unwrap();
    assert_eq!(all(&r), ["fd00::9"]);
    // /30 still drops both ends; /126 drops only the anycast address.
    assert_eq!(
        all(&IpRange::parse("10.0.0.0/30").unwrap()),
        ["10.0.0.1", "10.0.0.2"]
    );
    assert_eq!(
        all(&IpRange::parse("fd00::/126").unwrap()),
        ["fd00::1", "fd00::2", "fd00::3"]
    );
}

#[test]
fn ipv6_cidr_and_first_last() {
    let r = IpRange::parse("fd00:10::/64").unwrap();
    assert_eq!(r.usable_count(), (1u128 << 64) - 1);
    assert_eq!(r.candidates(0).next(), Some(ip("fd00:10::1")));
    assert!(!r.contains(ip("fd00:10::")));
    assert!(r.contains(ip("fd00:10::ffff:ffff:ffff:ffff"))); // no broadcast in v6
    // wide IPv6 prefixes: only the anycast address is dropped, the top address is usable
    let r = IpRange::parse("fd00::/16").unwrap();
    assert_eq!(r.usable_count(), (1u128 << 112) - 1);
    assert!(r.contains(ip("fd00:ffff:ffff:ffff:ffff:ffff:ffff:ffff")));
    assert_eq!(
        r.nth((1u128 << 112) - 2),
        Some(ip("fd00:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))
    );
    let r = IpRange::parse("2001:db8::10-2001:db8::1f/64").unwrap();
    assert_eq!(r.usable_count(), 16);
    assert_eq!(r.candidates(0).next(), Some(ip("2001:db8::10")));
}

#[test]
fn huge_ipv6_offsets_do_not_enumerate() {
    let r = IpRange::parse("fd00::/64").unwrap();
    let n = r.usable_count();
    // The offset wraps: n-1 is the last address, n is the first.
    let mut it = r.candidates(n - 1);
    assert_eq!(it.next(), Some(ip("fd00::ffff:ffff:ffff:ffff")));
    assert_eq!(it.next(), Some(ip("fd00::1")));
    assert_eq!(r.candidates(n).next(), Some(ip("fd00::1")));
    assert_eq!(r.candidates(u128::MAX).count_hint_safe(), ());

    // An /8-wide IPv6 range with an exclusion in the middle of the walk.
    let r = range("fd00::/8", None, None, None, &["fd80::/9"]);
    let total = (1u128 << 120) - 1 - (1u128 << 119);
    assert_eq!(r.usable_count(), total);
    // index of fd7f:ffff:...:ffff is (2^119 - 1) - 1 (anycast fd00:: skipped)
    let before = (1u128 << 119) - 2;
    assert_eq!(
        r.nth(before),
        Some(ip("fd7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))
    );
    let mut it = r.candidates(before);
    assert_eq!(
        it.next(),
        Some(ip("fd7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff"))
    );
    // jumps over the excluded upper half straight to the wrap-around
    assert_eq!(it.next(), Some(ip("fd00::1")));
    assert_eq!(r.nth(total), None);
    // Large offsets land where expected.
    assert_eq!(r.nth(u64::MAX as u128), Some(ip("fd00::1:0:0:0:0")));
}

trait CountHintSafe {
    fn count_hint_safe(self);
}
impl CountHintSafe for tether_pool::Candidates<'_> {
    /// Takes a few items from an astronomically long iterator: must be instant.
    fn count_hint_safe(mut self) {
        for _ in 0..1000 {
            assert!(self.next().is_some());
        }
    }
}

#[test]
fn exclusions_cidr_and_single() {
    let r = range(
        "10.0.0.0/28",
        None,
        None,
        None,
        &[
            "10.0.0.1",
            "10.0.0.4/31",
            "10.0.0.8/30",
            "192.168.0.0/16",
            "fd00::/8",
        ],
    );
    assert_eq!(
        all(&r),
        [
            "10.0.0.2",
            "10.0.0.3",
            "10.0.0.6",
            "10.0.0.7",
            "10.0.0.12",
            "10.0.0.13",
            "10.0.0.14"
        ]
    );
    assert_eq!(r.usable_count(), 7);
    assert_eq!(
        r.unusable_reason(ip("10.0.0.9")),
        Some(Unusable::Excluded("10.0.0.8/30".parse().unwrap()))
    );
    // Exclusion of the lowest free address: the walk from offset 0 starts after it.
    assert_eq!(r.candidates(0).next(), Some(ip("10.0.0.2")));
    // Exclusion covering the top wraps to the bottom.
    let r = range("10.0.0.0/29", None, None, None, &["10.0.0.4/30"]);
    let mut it = r.candidates(2);
    assert_eq!(it.next(), Some(ip("10.0.0.3")));
    assert_eq!(it.next(), Some(ip("10.0.0.1")));
    assert_eq!(it.next(), Some(ip("10.0.0.2")));
    assert_eq!(it.next(), None);
}

#[test]
fn candidates_wrap_once_from_any_offset() {
    let r = range(
        "10.0.0.0/28",
        Some("10.0.0.2"),
        Some("10.0.0.12"),
        Some("10.0.0.5"),
        &["10.0.0.7"],
    );
    let base = all(&r);
    assert_eq!(base.len() as u128, r.usable_count());
    for off in 0..30u128 {
        let walk: Vec<String> = r.candidates(off).map(|a| a.to_string()).collect();
        let k = (off % r.usable_count()) as usize;
        let mut expect = base[k..].to_vec();
        expect.extend_from_slice(&base[..k]);
        assert_eq!(walk, expect, "offset {off}");
    }
}

#[test]
fn empty_range_after_exclusions() {
    let r = range("10.0.0.0/30", None, None, Some("10.0.0.1"), &["10.0.0.2"]);
    assert_eq!(r.usable_count(), 0);
    assert_eq!(r.candidates(7).next(), None);
    assert_eq!(r.nth(0), None);
}

#[test]
fn invalid_ranges() {
    assert!(matches!(
        IpRange::parse("10.1.2.9-10.1.2.3/24"),
        Err(RangeError::StartAfterEnd { .. })
    ));
    assert!(matches!(
        IpRange::parse("10.1.3.9-10.1.2.3/24"),
        Err(RangeError::Outside { .. })
    ));
    assert!(matches!(
        IpRange::parse("fd00::1-10.1.2.3/24"),
        Err(RangeError::MixedFamily { .. })
    ));
    assert!(matches!(
        IpRange::parse("10.1.2.0"),
        Err(RangeError::Syntax { .. })
    ));
    assert!(matches!(
        IpRange::parse("banana/24"),
        Err(RangeError::Syntax { .. })
    ));
    assert!(matches!(
        IpRange::parse("10.1.2.0/33"),
        Err(RangeError::Syntax { .. })
    ));
    let e = IpRange::parse("10.1.2.9-10.1.2.3/24")
        .unwrap_err()
        .to_string();
    assert!(e.contains("start is after end"), "{e}");
}

#[test]
fn requested_addresses() {
    let ranges = vec![
        range(
            "10.1.2.0/24",
            None,
            None,
            Some("10.1.2.1"),
            &["10.1.2.128/25"],
        ),
        IpRange::parse("fd00::/64").unwrap(),
    ];
    assert_eq!(
        RequestedIp::parse("10.1.2.9").unwrap(),
        RequestedIp {
            address: ip("10.1.2.9"),
            prefix_len: None
        }
    );
    assert_eq!(
        RequestedIp::parse(" 10.1.2.9/24 ").unwrap().prefix_len,
        Some(24)
    );
    assert!(matches!(
        RequestedIp::parse("10.1.2.9/40"),
        Err(RequestError::BadPrefix { .. })
    ));
    assert!(matches!(
        RequestedIp::parse("nope"),
        Err(RequestError::Unparsable { .. })
    ));
    assert_eq!(locate(&ranges, "10.1.2.9/24").unwrap().0, 0);
    assert_eq!(locate(&ranges, "fd00::abcd").unwrap().0, 1);
    let e = find_range(&ranges, ip("10.9.9.9")).unwrap_err().to_string();
    assert!(
        e.contains("10.9.9.9") && e.contains("10.1.2.0/24") && e.contains("fd00::/64"),
        "{e}"
    );
    let e = find_range(&ranges, ip("10.1.2.1")).unwrap_err().to_string();
    assert!(e.contains("gateway"), "{e}");
    let e = find_range(&ranges, ip("10.1.2.200"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("excluded by 10.1.2.128/25"), "{e}");
}

#[test]
fn usable_spans_are_the_bounds_minus_the_holes() {
    let r = range(
        "10.0.0.0/24",
        None,
        None,
        Some("10.0.0.1"),
        &["10.0.0.16/28", "10.0.0.254"],
    );
    let v = |s: &str| tether_pool::range::ip_to_u128(ip(s));
    assert_eq!(
        r.usable_spans(),
        vec![
            (v("10.0.0.2"), v("10.0.0.15")),
            (v("10.0.0.32"), v("10.0.0.253"))
        ]
    );
    let total: u128 = r.usable_spans().iter().map(|(lo, hi)| hi - lo + 1).sum();
    assert_eq!(total, r.usable_count());
    // Nothing usable, no span.
    assert!(
        range("10.0.0.0/30", None, None, None, &["10.0.0.0/30"])
            .usable_spans()
            .is_empty()
    );
}

#[test]
fn shared_addresses_of_two_ranges() {
    let shared = |a: &IpRange, b: &IpRange| {
        a.shared_with(b)
            .map(|s| (s.first.to_string(), s.last.to_string(), s.count))
    };
    let wide = IpRange::parse("10.1.0.0/16").unwrap();
    let part = IpRange::parse("10.1.2.0/24").unwrap();
    assert_eq!(
        shared(&wide, &part),
        Some(("10.1.2.1".into(), "10.1.2.254".into(), 254))
    );
    assert_eq!(shared(&part, &wide), shared(&wide, &part));
    // Disjoint bounds in one subnet: nothing shared.
    let low = range(
        "10.2.0.0/24",
        Some("10.2.0.10"),
        Some("10.2.0.99"),
        None,
        &[],
    );
    let high = range("10.2.0.0/24", Some("10.2.0.100"), None, None, &[]);
    assert_eq!(shared(&low, &high), None);
    // A subnet split by exclusions (the whereabouts way): nothing shared.
    let first_half = range("10.3.0.0/24", None, None, None, &["10.3.0.128/25"]);
    let second_half = range("10.3.0.0/24", None, None, None, &["10.3.0.0/25"]);
    assert_eq!(shared(&first_half, &second_half), None);
    // Holes on either side leave several pieces: first, last and the count of them all.
    let holed = range("10.4.0.0/24", None, None, None, &["10.4.0.64/26"]);
    let other = range(
        "10.4.0.0/24",
        Some("10.4.0.60"),
        Some("10.4.0.140"),
        None,
        &["10.4.0.135"],
    );
    assert_eq!(
        shared(&holed, &other),
        Some(("10.4.0.60".into(), "10.4.0.140".into(), 4 + 12))
    );
    // One address each, the same one; other families never share.
    let one = IpRange::parse("10.5.0.7/32").unwrap();
    assert_eq!(
        shared(&one, &IpRange::parse("10.5.0.0/24").unwrap()),
        Some(("10.5.0.7".into(), "10.5.0.7".into(), 1))
    );
    assert_eq!(shared(&one, &IpRange::parse("fd00::/64").unwrap()), None);
    // IPv6: a /64 inside a /48, without walking it.
    let v6 = shared(
        &IpRange::parse("fd00:1::/48").unwrap(),
        &IpRange::parse("fd00:1:0:5::/64").unwrap(),
    )
    .unwrap();
    assert_eq!(v6.0, "fd00:1:0:5::1");
    assert_eq!(v6.2, (1u128 << 64) - 1);
}
