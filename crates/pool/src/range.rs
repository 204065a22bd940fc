//! Address ranges: bounds, exclusions and candidate walks over `u128` offsets.
//!
//! An [`IpRange`] is one entry of `ipRanges` (or the top-level `range`): a subnet, inclusive
//! bounds inside it, an optional gateway and a list of excluded blocks. Every computation works
//! on `u128` address values and a sorted list of merged "holes", so a range of any width
//! (`fd00::/64`, even `::/8`) costs only O(number of exclusions) memory, and walking candidates
//! costs O(log holes) per step.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

mod shared;
pub use shared::SharedAddresses;

/// Errors building or parsing an [`IpRange`]. The messages are phrased as the reason part of a
/// config error (`ipam.range "<value>": <reason>`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// The text is neither `a.b.c.d/p` nor `first-last/p` (or an address where one is expected).
    #[error("cannot parse: {detail}")]
    Syntax {
        /// What was wrong with the text.
        detail: String,
    },
    /// The start bound is after the end bound.
    #[error("start is after end ({start} > {end})")]
    StartAfterEnd {
        /// First address of the range.
        start: IpAddr,
        /// Last address of the range.
        end: IpAddr,
    },
    /// A bound lies outside the range's subnet.
    #[error("{bound} {addr} is outside the prefix {subnet}")]
    Outside {
        /// Which bound: `start` or `end`.
        bound: Bound,
        /// The offending address.
        addr: IpAddr,
        /// The subnet it should be in.
        subnet: IpNet,
    },
    /// A bound has the other address family than the subnet.
    #[error("mixes IPv4 and IPv6: {bound} {addr} is not the same family as {subnet}")]
    MixedFamily {
        /// Which bound: `start` or `end`.
        bound: Bound,
        /// The offending address.
        addr: IpAddr,
        /// The subnet.
        subnet: IpNet,
    },
}

/// Which bound of a range an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// `range_start`, or the first address of a `first-last/prefix` range.
    Start,
    /// `range_end`, or the last address of a `first-last/prefix` range.
    End,
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Bound::Start => "start",
            Bound::End => "end",
        })
    }
}

/// Why an address cannot be handed out from a range (see [`IpRange::unusable_reason`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    /// IPv4 address in an IPv6 range or vice versa.
    OtherFamily,
    /// Not inside the range's subnet.
    OutsideSubnet,
    /// Inside the subnet but outside `range_start`..`range_end`.
    OutsideBounds,
    /// The network address (IPv4) or subnet-router anycast address (IPv6).
    NetworkAddress,
    /// The IPv4 broadcast address.
    BroadcastAddress,
    /// The configured gateway.
    Gateway,
    /// Inside an `exclude` entry.
    Excluded(IpNet),
}

impl fmt::Display for Unusable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unusable::OtherFamily => f.write_str("it is of the other address family"),
            Unusable::OutsideSubnet => f.write_str("it is outside the subnet"),
            Unusable::OutsideBounds => f.write_str("it is outside range_start..range_end"),
            Unusable::NetworkAddress => f.write_str("it is the network address"),
            Unusable::BroadcastAddress => f.write_str("it is the broadcast address"),
            Unusable::Gateway => f.write_str("it is the gateway"),
            Unusable::Excluded(net) => write!(f, "it is excluded by {net}"),
        }
    }
}

/// Address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// Address width in bits (32 or 128).
    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

/// `ip` as an integer (IPv4 in the low 32 bits).
pub fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address of family `family` whose integer value is `v` (IPv4 uses the low 32 bits).
pub fn u128_to_ip(family: Family, v: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

/// A single address as a host prefix (`/32` or `/128`).
pub fn host_net(ip: IpAddr) -> IpNet {
    match ip {
        IpAddr::V4(a) => IpNet::V4(Ipv4Net::new(a, 32).expect("/32 is valid")),
        IpAddr::V6(a) => IpNet::V6(Ipv6Net::new(a, 128).expect("/128 is valid")),
    }
}

/// One allocatable range.
///
/// Usable addresses are those in `[start, end]` minus: the network address (IPv4 prefixes up to
/// /30; IPv6 subnet-router anycast for prefixes up to /126), the IPv4 broadcast address (prefixes
/// up to /30), the gateway, and every `exclude` block. /31 and /32 (IPv6 /127 and /128) have no
/// network or broadcast address (RFC 3021).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpRange {
    subnet: IpNet,
    start: IpAddr,
    end: IpAddr,
    gateway: Option<IpAddr>,
    excludes: Vec<IpNet>,
    /// Effective first usable bound (after dropping the network address).
    first: u128,
    /// Effective last usable bound (after dropping the broadcast address).
    last: u128,
    /// Sorted, merged, disjoint, non-adjacent inclusive holes inside `[first, last]`.
    holes: Vec<(u128, u128)>,
    usable: u128,
}

impl IpRange {
    /// Build a range. `subnet` may carry host bits (they are dropped). `start`/`end` default to
    /// the subnet's first and last address and must lie inside it, in order. `gateway` is
    /// skipped when it lies inside the bounds. `excludes` of the other family are ignored (with a
    /// debug log): whereabouts does not validate them either.
    pub fn new(
        subnet: IpNet,
        start: Option<IpAddr>,
        end: Option<IpAddr>,
        gateway: Option<IpAddr>,
        excludes: Vec<IpNet>,
    ) -> Result<IpRange, RangeError> {
        let subnet = subnet.trunc();
        let family = Family::of(subnet.addr());
        let check = |bound: Bound, addr: IpAddr| -> Result<IpAddr, RangeError> {
            if Family::of(addr) != family {
                return Err(RangeError::MixedFamily {
                    bound,
                    addr,
                    subnet,
                });
            }
            if !subnet.contains(&addr) {
                return Err(RangeError::Outside {
                    bound,
                    addr,
                    subnet,
                });
            }
            Ok(addr)
        };
        let start = check(Bound::Start, start.unwrap_or(subnet.network()))?;
        let end = check(Bound::End, end.unwrap_or(subnet.broadcast()))?;
        if ip_to_u128(start) > ip_to_u128(end) {
            return Err(RangeError::StartAfterEnd { start, end });
        }
        let gateway = gateway.filter(|g| Family::of(*g) == family);
        let excludes: Vec<IpNet> = excludes
            .into_iter()
            .filter(|e| {
                let same = Family::of(e.addr()) == family;
                if !same {
                    log::debug!("range {subnet}: ignoring exclude {e} of the other address family");
                }
                same
            })
            .map(|e| e.trunc())
            .collect();

        let (first, last) = usable_bounds(subnet, start, end);
        let mut range = IpRange {
            subnet,
            start,
            end,
            gateway,
            excludes,
            first,
            last,
            holes: Vec::new(),
            usable: 0,
        };
        if first > last {
            return Ok(range); // empty: reported at allocation time
        }
        range.holes = merged_holes(&range.excludes, gateway, first, last);
        // span fits in u128 except for the impossible ::/0 with both ends kept; saturate anyway.
        let span = (last - first).saturating_add(1);
        let hole_total: u128 = range.holes.iter().map(|(lo, hi)| hi - lo + 1).sum();
        range.usable = span - hole_total;
        Ok(range)
    }

    /// Parse `a.b.c.d/p` (host bits ignored: the whole subnet) or `first-last/p` (IPv4 or IPv6).
    /// No gateway, no exclusions; see [`IpRange::with_bounds`] for the rest.
    pub fn parse(text: &str) -> Result<IpRange, RangeError> {
        let (subnet, start, end) = parse_range_text(text)?;
        IpRange::new(subnet, start, end, None, Vec::new())
    }

    /// Rebuild this range with other bounds, gateway and exclusions.
    pub fn with_bounds(
        &self,
        start: Option<IpAddr>,
        end: Option<IpAddr>,
        gateway: Option<IpAddr>,
        excludes: Vec<IpNet>,
    ) -> Result<IpRange, RangeError> {
        IpRange::new(self.subnet, start, end, gateway, excludes)
    }

    /// The subnet (host bits cleared).
    pub fn subnet(&self) -> IpNet {
        self.subnet
    }

    /// The network address of the subnet.
    pub fn network(&self) -> IpAddr {
        self.subnet.network()
    }

    /// Prefix length of the subnet; leases get this prefix.
    pub fn prefix_len(&self) -> u8 {
        self.subnet.prefix_len()
    }

    /// Address family.
    pub fn family(&self) -> Family {
        Family::of(self.subnet.addr())
    }

    /// Configured first address (inclusive), before dropping the network address.
    pub fn start(&self) -> IpAddr {
        self.start
    }

    /// Configured last address (inclusive), before dropping the broadcast address.
    pub fn end(&self) -> IpAddr {
        self.end
    }

    /// The gateway of this range, if one of the same family was configured.
    pub fn gateway(&self) -> Option<IpAddr> {
        self.gateway
    }

    /// Excluded blocks (same family only, host bits cleared).
    pub fn excludes(&self) -> &[IpNet] {
        &self.excludes
    }

    /// Number of usable addresses (may be 0; may be astronomically large for IPv6).
    pub fn usable_count(&self) -> u128 {
        self.usable
    }

    /// Is `ip` an address this range may hand out?
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.unusable_reason(ip).is_none()
    }

    /// Does the range's subnet contain `ip` (usable or not)?
    pub fn subnet_contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family() && self.subnet.contains(&ip)
    }

    /// `None` when `ip` is usable, else why not.
    pub fn unusable_reason(&self, ip: IpAddr) -> Option<Unusable> {
        if Family::of(ip) != self.family() {
            return Some(Unusable::OtherFamily);
        }
        if !self.subnet.contains(&ip) {
            return Some(Unusable::OutsideSubnet);
        }
        let v = ip_to_u128(ip);
        if v < ip_to_u128(self.start) || v > ip_to_u128(self.end) {
            return Some(Unusable::OutsideBounds);
        }
        if v < self.first {
            return Some(Unusable::NetworkAddress);
        }
        if v > self.last {
            return Some(Unusable::BroadcastAddress);
        }
        if self.hole_containing(v).is_some() {
            if self.gateway == Some(ip) {
                return Some(Unusable::Gateway);
            }
            let net = self
                .excludes
                .iter()
                .find(|e| e.contains(&ip))
                .copied()
                .unwrap_or_else(|| host_net(ip));
            return Some(Unusable::Excluded(net));
        }
        None
    }

    /// The `n`-th usable address (0-based, ascending), or `None` if `n >= usable_count()`.
    /// O(number of holes).
    pub fn nth(&self, n: u128) -> Option<IpAddr> {
        if n >= self.usable {
            return None;
        }
        let mut v = self.first + n;
        for &(lo, hi) in &self.holes {
            if lo <= v {
                v += hi - lo + 1;
            } else {
                break;
            }
        }
        Some(u128_to_ip(self.family(), v))
    }

    /// Walk every usable address exactly once, starting at the usable address with index
    /// `start_offset % usable_count()` and wrapping around once. Excluded blocks, the gateway and
    /// network/broadcast addresses are skipped by jumping, never enumerated.
    pub fn candidates(&self, start_offset: u128) -> Candidates<'_> {
        if self.usable == 0 {
            return Candidates {
                range: self,
                cur: 0,
                remaining: 0,
            };
        }
        let start = self
            .nth(start_offset % self.usable)
            .expect("index below usable count");
        Candidates {
            range: self,
            cur: ip_to_u128(start),
            remaining: self.usable,
        }
    }

    fn hole_containing(&self, v: u128) -> Option<(u128, u128)> {
        let idx = self.holes.partition_point(|h| h.0 <= v);
        if idx > 0 && self.holes[idx - 1].1 >= v {
            Some(self.holes[idx - 1])
        } else {
            None
        }
    }

    /// The first usable value at or after `v` (wrapping to `first`). Requires usable > 0.
    fn next_usable_from(&self, mut v: u128) -> u128 {
        loop {
            if v > self.last || v < self.first {
                v = self.first;
            }
            match self.hole_containing(v) {
                Some((_, hi)) => {
                    v = if hi >= self.last { self.first } else { hi + 1 };
                }
                None => return v,
            }
        }
    }
}

impl fmt::Display for IpRange {
    /// `10.1.2.0/24` when the bounds cover the subnet, else `10.1.2.10-10.1.2.20/24`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start == self.subnet.network() && self.end == self.subnet.broadcast() {
            write!(f, "{}", self.subnet)
        } else {
            write!(
                f,
                "{}-{}/{}",
                self.start,
                self.end,
                self.subnet.prefix_len()
            )
        }
    }
}

impl FromStr for IpRange {
    type Err = RangeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IpRange::parse(s)
    }
}

/// Iterator returned by [`IpRange::candidates`].
#[derive(Debug, Clone)]
pub struct Candidates<'a> {
    range: &'a IpRange,
    cur: u128,
    remaining: u128,
}

impl Iterator for Candidates<'_> {
    type Item = IpAddr;

    fn next(&mut self) -> Option<IpAddr> {
        if self.remaining == 0 {
            return None;
        }
        let out = self.cur;
        self.remaining -= 1;
        if self.remaining > 0 {
            let next = if out >= self.range.last {
                self.range.first
            } else {
                out + 1
            };
            self.cur = self.range.next_usable_from(next);
        }
        Some(u128_to_ip(self.range.family(), out))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (n, usize::try_from(self.remaining).ok())
    }
}

/// Parse an address, tolerating surrounding whitespace.
pub(crate) fn parse_ip(text: &str) -> Result<IpAddr, RangeError> {
    text.trim()
        .parse::<IpAddr>()
        .map_err(|_| RangeError::Syntax {
            detail: format!("\"{}\" is not an IP address", text.trim()),
        })
}

/// Parse a CIDR that may carry host bits (`10.1.2.3/24`), keeping them.
pub(crate) fn parse_cidr(text: &str) -> Result<IpNet, RangeError> {
    let t = text.trim();
    t.parse::<IpNet>().map_err(|_| RangeError::Syntax {
        detail: format!("\"{t}\" is not a CIDR (address/prefix)"),
    })
}

/// Parse the text of a `range`: returns (subnet with host bits, explicit start, explicit end).
/// A plain CIDR yields no explicit bounds (host bits are ignored, as whereabouts does).
pub fn parse_range_text(text: &str) -> Result<(IpNet, Option<IpAddr>, Option<IpAddr>), RangeError> {
    let t = text.trim();
    if let Some((first, rest)) = t.split_once('-') {
        let first = parse_ip(first)?;
        let last_net = parse_cidr(rest)?;
        let subnet = last_net.trunc();
        let last = last_net.addr();
        // Validate family/containment here so the caller gets errors in the range's own terms.
        IpRange::new(subnet, Some(first), Some(last), None, Vec::new())?;
        Ok((subnet, Some(first), Some(last)))
    } else {
        if !t.contains('/') {
            return Err(RangeError::Syntax {
                detail: format!("\"{t}\" is not a CIDR or first-last/prefix range"),
            });
        }
        Ok((parse_cidr(t)?.trunc(), None, None))
    }
}

/// Parse one `exclude` entry: a CIDR (host bits cleared) or a single address (→ /32 or /128).
pub fn parse_exclude(text: &str) -> Result<IpNet, RangeError> {
    let t = text.trim();
    if t.contains('/') {
        Ok(parse_cidr(t)?.trunc())
    } else {
        Ok(host_net(parse_ip(t)?))
    }
}

/// The first and last allocatable values of `start..=end` in `subnet`: the network address is
/// skipped on IPv4 up to /30 and IPv6 up to /126, the broadcast address on IPv4 up to /30.
fn usable_bounds(subnet: IpNet, start: IpAddr, end: IpAddr) -> (u128, u128) {
    let family = Family::of(subnet.addr());
    let prefix = subnet.prefix_len();
    let skip_network = prefix + 2 <= family.bits(); // v4 <= /30, v6 <= /126
    let skip_broadcast = family == Family::V4 && prefix <= 30;
    let mut first = ip_to_u128(start);
    let mut last = ip_to_u128(end);
    if skip_network && first == ip_to_u128(subnet.network()) {
        first += 1;
    }
    if skip_broadcast && last == ip_to_u128(subnet.broadcast()) {
        // The broadcast is above the network address here, so no underflow.
        last -= 1;
    }
    (first, last)
}

/// The excluded spans and the gateway within `first..=last`, sorted and merged (adjacent or
/// overlapping spans become one).
fn merged_holes(
    excludes: &[IpNet],
    gateway: Option<IpAddr>,
    first: u128,
    last: u128,
) -> Vec<(u128, u128)> {
    let mut holes: Vec<(u128, u128)> = excludes
        .iter()
        .map(|e| {
            (
                ip_to_u128(e.network()).max(first),
                ip_to_u128(e.broadcast()).min(last),
            )
        })
        .filter(|(lo, hi)| lo <= hi)
        .collect();
    if let Some(g) = gateway
        .map(ip_to_u128)
        .filter(|g| (first..=last).contains(g))
    {
        holes.push((g, g));
    }
    holes.sort_unstable();
    let mut merged: Vec<(u128, u128)> = Vec::with_capacity(holes.len());
    for (lo, hi) in holes {
        match merged.last_mut() {
            Some((_, phi)) if lo <= phi.saturating_add(1) => *phi = (*phi).max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}
