//! Ethernet frames for ARP and NDP: built and parsed here, without sockets, so they are unit-tested.

use std::net::{Ipv4Addr, Ipv6Addr};

pub type Mac = [u8; 6];

pub const BROADCAST: Mac = [0xff; 6];
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
const ARP_REQUEST: u16 = 1;
const ARP_REPLY: u16 = 2;
const ICMPV6: u8 = 58;
pub const NDP_NS: u8 = 135;
pub const NDP_NA: u8 = 136;
/// Override flag of a Neighbor Advertisement.
const NA_OVERRIDE: u8 = 0x20;

fn ethernet(dst: Mac, src: Mac, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn arp(op: u16, sha: Mac, spa: Ipv4Addr, tha: Mac, tpa: Ipv4Addr) -> Vec<u8> {
    let mut p = Vec::with_capacity(28);
    p.extend_from_slice(&1u16.to_be_bytes()); // Ethernet
    p.extend_from_slice(&0x0800u16.to_be_bytes()); // IPv4
    p.extend_from_slice(&[6, 4]);
    p.extend_from_slice(&op.to_be_bytes());
    p.extend_from_slice(&sha);
    p.extend_from_slice(&spa.octets());
    p.extend_from_slice(&tha);
    p.extend_from_slice(&tpa.octets());
    p
}

/// RFC 5227 §2.1.1 probe: sender IP 0.0.0.0 so no neighbour caches the candidate against our MAC.
pub fn arp_probe(mac: Mac, candidate: Ipv4Addr) -> Vec<u8> {
    ethernet(
        BROADCAST,
        mac,
        ETHERTYPE_ARP,
        &arp(ARP_REQUEST, mac, Ipv4Addr::UNSPECIFIED, [0; 6], candidate),
    )
}

/// RFC 5227 §2.3 announcement (gratuitous ARP): sender and target IP are the address.
pub fn arp_announce(mac: Mac, ip: Ipv4Addr) -> Vec<u8> {
    ethernet(
        BROADCAST,
        mac,
        ETHERTYPE_ARP,
        &arp(ARP_REQUEST, mac, ip, [0; 6], ip),
    )
}

/// A received ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arp {
    pub is_reply: bool,
    pub sha: Mac,
    pub spa: Ipv4Addr,
    pub tpa: Ipv4Addr,
}

pub fn parse_arp(frame: &[u8]) -> Option<Arp> {
    if frame.len() < 14 + 28 || u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE_ARP {
        return None;
    }
    let p = &frame[14..];
    // Ethernet/IPv4 ARP only.
    if p[0..2] != [0, 1] || p[2..4] != [8, 0] || p[4] != 6 || p[5] != 4 {
        return None;
    }
    let op = u16::from_be_bytes([p[6], p[7]]);
    if op != ARP_REQUEST && op != ARP_REPLY {
        return None;
    }
    let ip = |o: usize| Ipv4Addr::new(p[o], p[o + 1], p[o + 2], p[o + 3]);
    Some(Arp {
        is_reply: op == ARP_REPLY,
        sha: p[8..14].try_into().ok()?,
        spa: ip(14),
        tpa: ip(24),
    })
}

pub fn solicited_node(ip: Ipv6Addr) -> Ipv6Addr {
    let o = ip.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

fn multicast_mac(group: Ipv6Addr) -> Mac {
    let o = group.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for c in bytes.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&(msg.len() as u32).to_be_bytes());
    add(&[0, 0, 0, ICMPV6]);
    add(msg);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn ipv6_icmp(
    src_mac: Mac,
    dst_mac: Mac,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    mut msg: Vec<u8>,
) -> Vec<u8> {
    let ck = icmpv6_checksum(src, dst, &msg);
    msg[2..4].copy_from_slice(&ck.to_be_bytes());
    let mut ip = Vec::with_capacity(40 + msg.len());
    ip.extend_from_slice(&[0x60, 0, 0, 0]);
    ip.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[ICMPV6, 255]); // NDP requires hop limit 255
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&dst.octets());
    ip.extend_from_slice(&msg);
    ethernet(dst_mac, src_mac, ETHERTYPE_IPV6, &ip)
}

/// RFC 4862 §5.4.2 DAD probe: a Neighbor Solicitation from `::` to the target's solicited-node group,
/// without a source link-layer option (forbidden with an unspecified source).
pub fn ndp_probe(mac: Mac, candidate: Ipv6Addr) -> Vec<u8> {
    let group = solicited_node(candidate);
    let mut msg = vec![NDP_NS, 0, 0, 0, 0, 0, 0, 0];
    msg.extend_from_slice(&candidate.octets());
    ipv6_icmp(mac, multicast_mac(group), Ipv6Addr::UNSPECIFIED, group, msg)
}

/// Unsolicited Neighbor Advertisement to all-nodes with Override set (RFC 4861 §7.2.6).
pub fn ndp_announce(mac: Mac, ip: Ipv6Addr) -> Vec<u8> {
    let all_nodes = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    let mut msg = vec![NDP_NA, 0, 0, 0, NA_OVERRIDE, 0, 0, 0];
    msg.extend_from_slice(&ip.octets());
    msg.extend_from_slice(&[2, 1]); // target link-layer address option, 8 bytes
    msg.extend_from_slice(&mac);
    ipv6_icmp(mac, multicast_mac(all_nodes), ip, all_nodes, msg)
}

/// A received Neighbor Solicitation or Advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ndp {
    pub kind: u8,
    /// Ethernet source of the frame.
    pub eth_src: Mac,
    pub src: Ipv6Addr,
    pub target: Ipv6Addr,
    /// The target link-layer address option of an NA, when present.
    pub tlla: Option<Mac>,
}

pub fn parse_ndp(frame: &[u8]) -> Option<Ndp> {
    if frame.len() < 14 + 40 + 24 || u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE_IPV6 {
        return None;
    }
    let ip = &frame[14..];
    if ip[0] >> 4 != 6 || ip[6] != ICMPV6 || ip[7] != 255 {
        return None;
    }
    let addr = |o: usize| -> Option<Ipv6Addr> {
        Some(Ipv6Addr::from(<[u8; 16]>::try_from(&ip[o..o + 16]).ok()?))
    };
    let src = addr(8)?;
    let msg = &ip[40..];
    let kind = msg[0];
    if (kind != NDP_NS && kind != NDP_NA) || msg[1] != 0 {
        return None;
    }
    let target = Ipv6Addr::from(<[u8; 16]>::try_from(&msg[8..24]).ok()?);
    let mut tlla = None;
    let mut opts = &msg[24..];
    while opts.len() >= 8 {
        let len = usize::from(opts[1]) * 8;
        if len == 0 || len > opts.len() {
            break;
        }
        if opts[0] == 2 && len >= 8 {
            tlla = opts[2..8].try_into().ok();
        }
        opts = &opts[len..];
    }
    Some(Ndp {
        kind,
        eth_src: frame[6..12].try_into().ok()?,
        src,
        target,
        tlla,
    })
}

/// A MAC (or any link-layer address) as `aa:bb:cc:dd:ee:ff`: the one spelling tether prints.
pub fn format_mac(m: &[u8]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: Mac = [0x02, 0, 0, 0, 0, 0x01];

    #[test]
    fn arp_probe_has_zero_sender_ip_and_parses_back() {
        let f = arp_probe(MAC, "10.1.2.9".parse().unwrap());
        assert_eq!(f.len(), 42);
        assert_eq!(&f[0..6], &BROADCAST);
        let a = parse_arp(&f).unwrap();
        assert_eq!(
            (a.is_reply, a.sha, a.spa, a.tpa),
            (
                false,
                MAC,
                Ipv4Addr::UNSPECIFIED,
                "10.1.2.9".parse().unwrap()
            )
        );
        let g = parse_arp(&arp_announce(MAC, "10.1.2.9".parse().unwrap())).unwrap();
        assert_eq!(
            (g.spa, g.tpa),
            ("10.1.2.9".parse().unwrap(), "10.1.2.9".parse().unwrap())
        );
        assert!(parse_arp(&f[..30]).is_none());
    }

    #[test]
    fn solicited_node_group_and_mac() {
        let t: Ipv6Addr = "fd00::12:3456".parse().unwrap();
        assert_eq!(
            solicited_node(t),
            "ff02::1:ff12:3456".parse::<Ipv6Addr>().unwrap()
        );
        let f = ndp_probe(MAC, t);
        assert_eq!(&f[0..6], &[0x33, 0x33, 0xff, 0x12, 0x34, 0x56]);
        let n = parse_ndp(&f).unwrap();
        assert_eq!(
            (n.kind, n.src, n.target, n.tlla),
            (NDP_NS, Ipv6Addr::UNSPECIFIED, t, None)
        );
    }

    #[test]
    fn checksum_verifies_to_zero() {
        // Summing a message with its checksum in place gives 0xffff, i.e. a complemented 0.
        for f in [
            ndp_probe(MAC, "fd00::9".parse().unwrap()),
            ndp_announce(MAC, "fd00::9".parse().unwrap()),
        ] {
            let src = Ipv6Addr::from(<[u8; 16]>::try_from(&f[22..38]).unwrap());
            let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&f[38..54]).unwrap());
            assert_eq!(icmpv6_checksum(src, dst, &f[54..]), 0);
        }
    }

    #[test]
    fn na_carries_override_and_target_lla() {
        let f = ndp_announce(MAC, "fd00::9".parse().unwrap());
        let n = parse_ndp(&f).unwrap();
        assert_eq!((n.kind, n.tlla), (NDP_NA, Some(MAC)));
        assert_eq!(f[14 + 40 + 4] & NA_OVERRIDE, NA_OVERRIDE);
        assert_eq!(&f[0..6], &[0x33, 0x33, 0, 0, 0, 1]);
    }
}
