//! What whereabouts holds, address by address, read from its objects: each IPPool allocation
//! (key = decimal offset from the address of the pool's `spec.range`, as whereabouts'
//! `IPAddOffset` adds it), and each OverlappingRangeIPReservation that no pool allocation
//! covers (whereabouts' two records drift: a reservation kept, its pool entry lost). What cannot
//! be read is [`Skipped`], with the reason.

use std::collections::{BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tether_cluster::{WhereaboutsPool, WhereaboutsReservation};
use tether_pool::{Family, range::ip_to_u128, range::u128_to_ip};

/// An IPPool's `spec.range`: the address as written (allocation offsets count from it) and the
/// prefix length every address of the pool is handed out with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolRange {
    /// The address of `spec.range` (whereabouts writes the network address).
    pub first: IpAddr,
    /// The prefix length.
    pub prefix_len: u8,
}

impl PoolRange {
    /// Parse `address/prefix`.
    pub fn parse(text: &str) -> Result<PoolRange, String> {
        let bad = |why: &str| format!("spec.range {text:?} is not a CIDR: {why}");
        let (addr, prefix) = text.trim().split_once('/').ok_or_else(|| bad("no '/'"))?;
        let first: IpAddr = addr.parse().map_err(|_| bad("no address before '/'"))?;
        let prefix_len: u8 = prefix.parse().map_err(|_| bad("no prefix length"))?;
        if prefix_len > Family::of(first).bits() {
            return Err(bad("the prefix length is too long"));
        }
        Ok(PoolRange { first, prefix_len })
    }

    fn bits(&self) -> u32 {
        u32::from(Family::of(self.first).bits())
    }

    /// Does the pool's subnet hold `ip`?
    pub fn contains(&self, ip: IpAddr) -> bool {
        let host_bits = self.bits() - u32::from(self.prefix_len);
        Family::of(ip) == Family::of(self.first)
            && ip_to_u128(ip).checked_shr(host_bits).unwrap_or(0)
                == ip_to_u128(self.first).checked_shr(host_bits).unwrap_or(0)
    }

    /// The address an allocation key stands for: `first` plus the decimal offset `key`, which
    /// must land in the pool's subnet.
    pub fn address_at(&self, key: &str) -> Result<IpAddr, String> {
        let offset: u64 = key
            .parse()
            .map_err(|_| format!("allocation key {key:?} is not a decimal offset"))?;
        let max = u128::MAX >> (128 - self.bits());
        let ip = ip_to_u128(self.first)
            .checked_add(u128::from(offset))
            .filter(|v| *v <= max)
            .map(|v| u128_to_ip(Family::of(self.first), v))
            .filter(|ip| self.contains(*ip))
            .ok_or_else(|| format!("allocation key {key} lies outside the pool's range"))?;
        Ok(ip)
    }
}

/// One address whereabouts holds for a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Index of its pool in the list read.
    pub pool: usize,
    /// The address.
    pub address: IpAddr,
    /// The pool's prefix length.
    pub prefix_len: u8,
    /// The holder's `CNI_CONTAINERID` (empty from a reservation: whereabouts does not write it).
    pub container_id: String,
    /// The holder's `CNI_IFNAME` (empty when whereabouts did not record it).
    pub ifname: String,
    /// The pod's namespace.
    pub pod_namespace: String,
    /// The pod's name.
    pub pod_name: String,
    /// Where whereabouts recorded it, for the operator.
    pub source: String,
}

impl Entry {
    /// `namespace/name` of the pod.
    pub fn podref(&self) -> String {
        format!("{}/{}", self.pod_namespace, self.pod_name)
    }
}

/// A record of whereabouts that is not imported, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Skipped {
    /// The object and key (`IPPool kube-system/10.1.0.0-24 key 7`).
    pub source: String,
    /// Why it was skipped.
    pub reason: String,
}

/// A pool as read, with its parsed range and its whereabouts `network_name` (the prefix of its
/// name and of its reservations' names), when its name says.
pub struct ReadPool {
    /// The object.
    pub pool: WhereaboutsPool,
    /// Its range, or why it does not parse (its entries are skipped).
    pub range: Result<PoolRange, String>,
    /// The `network_name` its name carries (`""`: none); `None` when the name is not
    /// whereabouts' usual `[<network_name>-]<range>` (a node-slice pool, say).
    pub prefix: Option<String>,
}

impl ReadPool {
    /// Read `pool`'s range and name.
    pub fn new(pool: WhereaboutsPool) -> ReadPool {
        let range = PoolRange::parse(&pool.range);
        let normalized = normalize_range(&pool.range);
        let prefix = if pool.name == normalized {
            Some(String::new())
        } else {
            pool.name
                .strip_suffix(&normalized)
                .and_then(|p| p.strip_suffix('-'))
                .map(str::to_string)
        };
        ReadPool {
            pool,
            range,
            prefix,
        }
    }

    /// `IPPool <namespace>/<name>`.
    pub fn label(&self) -> String {
        format!("IPPool {}/{}", self.pool.namespace, self.pool.name)
    }
}

/// whereabouts' `normalizeRange`: a range as part of an object name (`fd00::/64` → `fd00---64`,
/// a trailing `:` gets a `0` first).
pub fn normalize_range(range: &str) -> String {
    let mut s = range.to_string();
    if s.ends_with(':') {
        s.push('0');
    }
    s.replace([':', '/'], "-")
}

/// whereabouts' IPPool name for `network`/`prefix_len` under `network_name` (`IPPoolName`).
pub fn pool_name(network_name: Option<&str>, network: IpAddr, prefix_len: u8) -> String {
    let range = normalize_range(&format!("{network}/{prefix_len}"));
    match network_name.filter(|n| !n.is_empty()) {
        Some(n) => format!("{n}-{range}"),
        None => range,
    }
}

/// `namespace/name` of a podref.
fn split_podref(podref: &str) -> Option<(&str, &str)> {
    podref
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
}

/// The allocations of every pool, then the reservations no allocation covers.
pub fn entries(
    pools: &[ReadPool],
    reservations: &[WhereaboutsReservation],
    prefixes: &BTreeSet<String>,
) -> (Vec<Entry>, Vec<Skipped>) {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for (i, p) in pools.iter().enumerate() {
        pool_entries(i, p, &mut out, &mut skipped);
    }
    let held: HashSet<(usize, IpAddr)> = out.iter().map(|e| (e.pool, e.address)).collect();
    for r in reservations {
        let source = format!("OverlappingRangeIPReservation {}/{}", r.namespace, r.name);
        match reservation_entry(r, pools, prefixes, &source) {
            Ok(e) if held.contains(&(e.pool, e.address)) => {}
            Ok(e) => out.push(e),
            Err(reason) => skipped.push(Skipped { source, reason }),
        }
    }
    (out, skipped)
}

fn pool_entries(i: usize, p: &ReadPool, out: &mut Vec<Entry>, skipped: &mut Vec<Skipped>) {
    let range = match &p.range {
        Ok(r) => *r,
        Err(reason) => {
            skipped.push(Skipped {
                source: p.label(),
                reason: reason.clone(),
            });
            return;
        }
    };
    for (key, a) in &p.pool.allocations {
        let source = format!("{} key {key}", p.label());
        let podref = split_podref(&a.podref)
            .ok_or_else(|| format!("podref {:?} is not namespace/name", a.podref));
        match range
            .address_at(key)
            .and_then(|ip| podref.map(|pr| (ip, pr)))
        {
            Ok((address, (ns, name))) => out.push(Entry {
                pool: i,
                address,
                prefix_len: range.prefix_len,
                container_id: a.id.clone(),
                ifname: a.ifname.clone(),
                pod_namespace: ns.to_string(),
                pod_name: name.to_string(),
                source,
            }),
            Err(reason) => skipped.push(Skipped { source, reason }),
        }
    }
}

/// A reservation's address: its name is `[<network_name>-]<address, ':' as '-'>`, and
/// `network_name` may itself hold `-`, so each known prefix is tried; the address must lie in
/// a pool of that prefix (in the reservation's namespace), which gives its prefix length.
fn reservation_entry(
    r: &WhereaboutsReservation,
    pools: &[ReadPool],
    prefixes: &BTreeSet<String>,
    source: &str,
) -> Result<Entry, String> {
    let (ns, name) = split_podref(&r.podref)
        .ok_or_else(|| format!("podref {:?} is not namespace/name", r.podref))?;
    let mut found: Vec<(usize, IpAddr)> = Vec::new();
    for prefix in prefixes.iter().chain(std::iter::once(&String::new())) {
        let rest = if prefix.is_empty() {
            Some(r.name.as_str())
        } else {
            r.name
                .strip_prefix(prefix.as_str())
                .and_then(|s| s.strip_prefix('-'))
        };
        let Some(address) = rest.and_then(reservation_address) else {
            continue;
        };
        found.extend(pools.iter().enumerate().filter_map(|(i, p)| {
            let fits = p.pool.namespace == r.namespace
                && p.prefix.as_deref() == Some(prefix.as_str())
                && p.range.as_ref().is_ok_and(|range| range.contains(address));
            fits.then_some((i, address))
        }));
    }
    match found.as_slice() {
        [(pool, address)] => Ok(Entry {
            pool: *pool,
            address: *address,
            prefix_len: pools[*pool].range.as_ref().map_or(0, |r| r.prefix_len),
            container_id: r.container_id.clone(),
            ifname: r.ifname.clone(),
            pod_namespace: ns.to_string(),
            pod_name: name.to_string(),
            source: source.to_string(),
        }),
        [] => Err(
            "its name is no address of a pool in its namespace (its pool is gone, or its network_name is unknown)"
                .to_string(),
        ),
        several => Err(format!(
            "its name reads as an address of {} pools: {}",
            several.len(),
            several
                .iter()
                .map(|(i, a)| format!("{a} in {}", pools[*i].label()))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The address in a reservation's name (without its prefix): IPv4 as is, IPv6 with `-` for `:`.
fn reservation_address(s: &str) -> Option<IpAddr> {
    if let Ok(a) = s.parse::<Ipv4Addr>() {
        return Some(IpAddr::V4(a));
    }
    s.replace('-', ":").parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tether_cluster::PoolAllocation;

    fn alloc(id: &str, podref: &str, ifname: &str) -> PoolAllocation {
        PoolAllocation {
            id: id.into(),
            podref: podref.into(),
            ifname: ifname.into(),
        }
    }

    fn pool(name: &str, range: &str, allocs: &[(&str, PoolAllocation)]) -> ReadPool {
        ReadPool::new(WhereaboutsPool {
            namespace: "kube-system".into(),
            name: name.into(),
            range: range.into(),
            allocations: allocs
                .iter()
                .map(|(k, a)| (k.to_string(), a.clone()))
                .collect::<BTreeMap<_, _>>(),
        })
    }

    fn reservation(name: &str, podref: &str) -> WhereaboutsReservation {
        WhereaboutsReservation {
            namespace: "kube-system".into(),
            name: name.into(),
            podref: podref.into(),
            ifname: "net1".into(),
            container_id: String::new(),
        }
    }

    #[test]
    fn offsets_become_addresses_in_v4_and_v6() {
        let v4 = PoolRange::parse("10.203.0.0/26").unwrap();
        assert_eq!(v4.address_at("1").unwrap().to_string(), "10.203.0.1");
        assert_eq!(v4.address_at("63").unwrap().to_string(), "10.203.0.63");
        assert_eq!(v4.address_at("+7").unwrap().to_string(), "10.203.0.7");
        assert!(v4.address_at("64").unwrap_err().contains("outside"));
        let v6 = PoolRange::parse("fd00:203::/125").unwrap();
        assert_eq!(v6.address_at("5").unwrap().to_string(), "fd00:203::5");
        assert!(v6.address_at("8").is_err());
        // A /64 (whereabouts uses only its first /65: offsets fit in an int64).
        let wide = PoolRange::parse("fd00:1::/64").unwrap();
        assert_eq!(
            wide.address_at("9223372036854775807").unwrap().to_string(),
            "fd00:1::7fff:ffff:ffff:ffff"
        );
        // The end of the address space.
        let top = PoolRange::parse("255.255.255.254/31").unwrap();
        assert_eq!(top.address_at("1").unwrap().to_string(), "255.255.255.255");
        assert!(top.address_at("2").is_err());
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/24", "fd00::/129", ""] {
            assert!(PoolRange::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_keys_and_podrefs_are_skipped_with_the_reason() {
        let p = pool(
            "10.203.0.0-26",
            "10.203.0.0/26",
            &[
                ("1", alloc("c1", "ml/a", "net1")),
                ("x", alloc("c2", "ml/b", "net1")),
                ("-3", alloc("c3", "ml/c", "net1")),
                ("99", alloc("c4", "ml/d", "net1")),
                ("5", alloc("c5", "no-namespace", "net1")),
                ("6", alloc("c6", "ml/e", "")),
            ],
        );
        let (entries, skipped) = entries(&[p], &[], &BTreeSet::new());
        let got: Vec<(String, &str, &str)> = entries
            .iter()
            .map(|e| {
                (
                    e.address.to_string(),
                    e.container_id.as_str(),
                    e.ifname.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("10.203.0.1".to_string(), "c1", "net1"),
                ("10.203.0.6".to_string(), "c6", "")
            ]
        );
        assert_eq!(entries[0].podref(), "ml/a");
        let reasons: Vec<&str> = skipped.iter().map(|s| s.reason.as_str()).collect();
        assert_eq!(skipped.len(), 4, "{skipped:?}");
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("\"x\" is not a decimal offset"))
        );
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("\"-3\" is not a decimal offset"))
        );
        assert!(reasons.iter().any(|r| r.contains("key 99 lies outside")));
        assert!(
            reasons
                .iter()
                .any(|r| r.contains("\"no-namespace\" is not namespace/name"))
        );
        assert!(
            skipped[0]
                .source
                .starts_with("IPPool kube-system/10.203.0.0-26 key ")
        );

        let broken = pool("weird", "10.0.0.0", &[("1", alloc("c", "ml/a", "net1"))]);
        let (entries, skipped) = super::entries(&[broken], &[], &BTreeSet::new());
        assert!(entries.is_empty());
        assert!(skipped[0].reason.contains("not a CIDR"), "{skipped:?}");
    }

    #[test]
    fn pool_names_and_their_network_names() {
        let v6: IpAddr = "fd00:203::".parse().unwrap();
        assert_eq!(pool_name(Some("wbn"), v6, 125), "wbn-fd00-203---125");
        assert_eq!(
            pool_name(None, "10.1.2.0".parse().unwrap(), 24),
            "10.1.2.0-24"
        );
        assert_eq!(
            pool_name(Some(""), "10.1.2.0".parse().unwrap(), 24),
            "10.1.2.0-24"
        );
        assert_eq!(normalize_range("fd00::"), "fd00--0");
        assert_eq!(
            pool("10.1.2.0-24", "10.1.2.0/24", &[]).prefix.as_deref(),
            Some("")
        );
        assert_eq!(
            pool("gpu-a-fd00-203---125", "fd00:203::/125", &[])
                .prefix
                .as_deref(),
            Some("gpu-a")
        );
        assert_eq!(
            pool("gpu-n1-0", "10.1.2.0/28", &[]).prefix,
            None,
            "a node slice"
        );
    }

    #[test]
    fn reservations_without_a_pool_entry_are_entries_of_their_pool() {
        let pools = [
            pool(
                "10.203.0.0-26",
                "10.203.0.0/26",
                &[("1", alloc("c1", "ml/a", "net1"))],
            ),
            pool("a-b-fd00-203---125", "fd00:203::/125", &[]),
        ];
        let prefixes: BTreeSet<String> = ["a-b".to_string(), "a".to_string()].into();
        let (entries, skipped) = entries(
            &pools,
            &[
                reservation("10.203.0.1", "ml/a"), // covered by the pool's entry
                reservation("10.203.0.2", "ml/b"), // drifted: the pool lost its entry
                reservation("a-b-fd00-203--5", "ml/c"), // network_name a-b (not a + b:fd00::…)
                reservation("10.9.9.9", "ml/d"),   // in no pool
                reservation("10.203.0.3", "nobody"),
            ],
            &prefixes,
        );
        let got: Vec<(usize, String, String)> = entries
            .iter()
            .map(|e| (e.pool, e.address.to_string(), e.podref()))
            .collect();
        assert_eq!(
            got,
            [
                (0, "10.203.0.1".into(), "ml/a".into()),
                (0, "10.203.0.2".into(), "ml/b".into()),
                (1, "fd00:203::5".into(), "ml/c".into()),
            ]
        );
        assert_eq!(entries[1].prefix_len, 26);
        assert_eq!(entries[2].prefix_len, 125);
        assert_eq!(entries[1].ifname, "net1");
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped[0].source.contains("10.9.9.9"));
        assert!(skipped[0].reason.contains("no address of a pool"));
        assert!(skipped[1].reason.contains("not namespace/name"));
    }
}
