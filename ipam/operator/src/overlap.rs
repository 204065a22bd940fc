//! Guards over the tether-ipam networks of several NADs (or config files): where two of them would
//! hand out one address twice, or disagree about the subnet of the addresses they share.
//!
//! - **Two domains on one master** ([`Kind::DomainsOnOneMaster`]): networks in different
//!   uniqueness domains (`isolated_fabric`) whose ranges share an address, attached to the same
//!   `master`. Each domain leases the address once, so one segment can see it twice. A network
//!   without `master` uses the interface of the node's default route: two of those count as one
//!   master.
//! - **One domain, two subnets** ([`Kind::InconsistentSubnet`]): networks in the same domain
//!   whose ranges share an address but not the prefix length or the gateway: pods holding
//!   neighbouring addresses disagree about the subnet, and one NAD may hand out the other's
//!   gateway.
//!
//! "Share an address" means an address both ranges may hand out (bounds, exclusions, gateway and
//! network/broadcast addresses applied), computed from spans, never by walking addresses: a
//! subnet split between NADs by `exclude` or `range_start`/`range_end` is no finding. Every pair
//! of ranges of different configurations is compared once: O(n²) over the ranges, fine for
//! hundreds of NADs. `tether validate`, `tether doctor` and the controller report these.

use std::net::IpAddr;

use tether_leases::domain_text;
use tether_pool::{IpRange, SharedAddresses};

use crate::nads::NadNetwork;

/// What is wrong with a pair of ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Two uniqueness domains hand out the same addresses on one master.
    DomainsOnOneMaster,
    /// One domain, overlapping ranges, another prefix length or gateway.
    InconsistentSubnet,
}

impl Kind {
    /// Every kind, in the order the metric lists them.
    pub const ALL: [Kind; 2] = [Kind::DomainsOnOneMaster, Kind::InconsistentSubnet];

    /// The `kind` label of `tether_nad_overlaps`.
    pub fn label(self) -> &'static str {
        match self {
            Kind::DomainsOnOneMaster => "domains_on_one_master",
            Kind::InconsistentSubnet => "inconsistent_subnet",
        }
    }

    /// The reason of the Warning Event on each NAD of a finding.
    pub fn reason(self) -> &'static str {
        match self {
            Kind::DomainsOnOneMaster => "AddressDomainsOverlap",
            Kind::InconsistentSubnet => "InconsistentSubnet",
        }
    }
}

/// One range of one network of a finding, and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    /// `namespace/name` of the NAD (or the file `tether validate` read it from).
    pub nad: String,
    /// `ipam.network_name`.
    pub network: String,
    /// `ipam.isolated_fabric` (`None`: the cluster-wide domain).
    pub domain: Option<String>,
    /// The attacher's `master` (`None`: the default route's interface).
    pub master: Option<String>,
    /// The range.
    pub range: IpRange,
    /// The gateway reported for the range's addresses.
    pub gateway: Option<IpAddr>,
}

impl Side {
    fn of(n: &NadNetwork, index: usize) -> Side {
        Side {
            nad: n.nad.clone(),
            network: n.cfg.network_name.clone(),
            domain: n.cfg.domain.clone(),
            master: n.master.clone(),
            range: n.cfg.ranges[index].clone(),
            gateway: n.cfg.gateway_for(index),
        }
    }

    /// `ns/name (network x, range 10.0.0.0/24)`.
    fn describe(&self) -> String {
        format!(
            "{} (network {}, range {})",
            self.nad, self.network, self.range
        )
    }

    /// Everything that makes this side what it is, for [`Finding::identity`].
    fn identity(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}",
            self.nad,
            self.network,
            self.domain.as_deref().unwrap_or_default(),
            self.master.as_deref().unwrap_or_default(),
            self.range,
            self.gateway.map(|g| g.to_string()).unwrap_or_default(),
        )
    }
}

/// Two ranges that should not be configured the way they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What is wrong.
    pub kind: Kind,
    /// The range of the configuration listed first.
    pub a: Side,
    /// The other range.
    pub b: Side,
    /// The addresses both may hand out.
    pub shared: SharedAddresses,
}

impl Finding {
    /// The NADs of the finding: two, or one when both ranges are in one NAD.
    pub fn nads(&self) -> Vec<&str> {
        let mut out = vec![self.a.nad.as_str()];
        if self.b.nad != self.a.nad {
            out.push(&self.b.nad);
        }
        out
    }

    /// Text that changes whenever the finding does (either side's NAD, network, domain, master,
    /// range or gateway, or the shared addresses): a stable name for its Events.
    pub fn identity(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}|{}",
            self.kind.label(),
            self.a.identity(),
            self.b.identity(),
            self.shared.first,
            self.shared.last,
            self.shared.count
        )
    }

    /// What a person reads: both NADs, networks, ranges and domains, the shared addresses, and
    /// what to change.
    pub fn message(&self) -> String {
        let (a, b) = (&self.a, &self.b);
        let shared = shared_text(&self.shared);
        match self.kind {
            Kind::DomainsOnOneMaster => format!(
                "{} in {} and {} in {} both hand out {shared} on {}: two uniqueness domains on one segment, so \
                 the same address can go to a pod of each. Put both NADs in one domain (the same \
                 \"isolated_fabric\" on both, or none on either), or give them different masters or ranges that \
                 do not overlap.",
                a.describe(),
                domain_text(a.domain.as_deref()),
                b.describe(),
                domain_text(b.domain.as_deref()),
                master_text(a.master.as_deref()),
            ),
            Kind::InconsistentSubnet => {
                let mut differences = Vec::new();
                if a.range.prefix_len() != b.range.prefix_len() {
                    differences.push(format!(
                        "prefix /{} against /{}",
                        a.range.prefix_len(),
                        b.range.prefix_len()
                    ));
                }
                if a.gateway != b.gateway {
                    differences.push(format!(
                        "gateway {} against {}",
                        gateway_text(a.gateway),
                        gateway_text(b.gateway)
                    ));
                }
                let mut consequences = vec![
                    "pods of one NAD get another subnet or gateway than their neighbours of the other".to_string(),
                ];
                for (giver, owner) in [(a, b), (b, a)] {
                    if let Some(g) = owner.gateway.filter(|g| giver.range.contains(*g)) {
                        consequences.push(format!(
                            "{} can hand out {g}, the gateway of {}",
                            giver.nad, owner.nad
                        ));
                    }
                }
                let on = if a.master == b.master {
                    master_text(a.master.as_deref())
                } else {
                    format!(
                        "masters {} and {}",
                        a.master
                            .as_deref()
                            .unwrap_or("(none: the default route's interface)"),
                        b.master
                            .as_deref()
                            .unwrap_or("(none: the default route's interface)")
                    )
                };
                format!(
                    "{} and {} share {shared} in {} on {on} but not their subnet ({}): {}. Give both the same \
                     prefix and gateway for these addresses (\"range\"/\"ipRanges\" and \"gateway\"), or ranges \
                     that do not overlap.",
                    a.describe(),
                    b.describe(),
                    domain_text(a.domain.as_deref()),
                    differences.join("; "),
                    consequences.join("; "),
                )
            }
        }
    }
}

/// The findings among `nets`: every pair of ranges of two different configurations, in the
/// order of `nets`.
pub fn findings(nets: &[NadNetwork]) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, x) in nets.iter().enumerate() {
        for y in &nets[i + 1..] {
            for ix in 0..x.cfg.ranges.len() {
                for iy in 0..y.cfg.ranges.len() {
                    if let Some(f) = compare(x, ix, y, iy) {
                        out.push(f);
                    }
                }
            }
        }
    }
    out
}

/// The finding about range `ix` of `x` and range `iy` of `y`, if any.
fn compare(x: &NadNetwork, ix: usize, y: &NadNetwork, iy: usize) -> Option<Finding> {
    let (rx, ry) = (&x.cfg.ranges[ix], &y.cfg.ranges[iy]);
    let shared = rx.shared_with(ry)?;
    let kind = if x.cfg.domain != y.cfg.domain {
        // Different masters are different segments: reusing addresses there is what domains are for.
        if x.master != y.master {
            return None;
        }
        Kind::DomainsOnOneMaster
    } else if rx.prefix_len() != ry.prefix_len() || x.cfg.gateway_for(ix) != y.cfg.gateway_for(iy) {
        Kind::InconsistentSubnet
    } else {
        return None;
    };
    Some(Finding {
        kind,
        a: Side::of(x, ix),
        b: Side::of(y, iy),
        shared,
    })
}

/// `address 10.0.0.5`, or `126 addresses (10.0.0.129-10.0.0.254)`.
fn shared_text(s: &SharedAddresses) -> String {
    if s.count == 1 {
        format!("address {}", s.first)
    } else {
        format!("{} addresses ({}-{})", s.count, s.first, s.last)
    }
}

fn master_text(master: Option<&str>) -> String {
    match master {
        Some(m) => format!("master {m}"),
        None => "the default route's interface (neither names a \"master\", so both take the same interface \
                 on a node)"
            .to_string(),
    }
}

fn gateway_text(gateway: Option<IpAddr>) -> String {
    gateway.map_or_else(|| "none".to_string(), |g| g.to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use tether_pool::{NodeAgent, PoolConfig};

    use super::*;

    /// A network of NAD `nad` from its config (master from the top level, as Multus passes it).
    fn net(nad: &str, config: Value) -> NadNetwork {
        NadNetwork {
            nad: nad.into(),
            master: config["master"].as_str().map(str::to_string),
            attacher: None,
            cfg: PoolConfig::from_value(&config, &NodeAgent::on_every_node()).unwrap(),
        }
    }

    fn conf(name: &str, master: Option<&str>, ipam: Value) -> Value {
        let mut ipam = ipam;
        ipam["type"] = json!("tether-ipam");
        let mut c =
            json!({"cniVersion": "1.0.0", "name": name, "type": "tether-ipvlan", "ipam": ipam});
        if let Some(m) = master {
            c["master"] = json!(m);
        }
        c
    }

    #[test]
    fn two_domains_on_one_master_are_a_finding_naming_both_nads() {
        let nets = [
            net(
                "ml/mgmt",
                conf("mgmt", Some("enp6s0"), json!({"range": "10.20.0.0/24"})),
            ),
            net(
                "ml/rail-1",
                conf(
                    "rail-1",
                    Some("enp6s0"),
                    json!({"range": "10.20.0.128/25", "isolated_fabric": "rail-1"}),
                ),
            ),
        ];
        let f = findings(&nets);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].kind, Kind::DomainsOnOneMaster);
        assert_eq!(f[0].nads(), ["ml/mgmt", "ml/rail-1"]);
        assert_eq!(f[0].shared.count, 126);
        let m = f[0].message();
        for part in [
            "ml/mgmt (network mgmt, range 10.20.0.0/24) in the cluster-wide domain",
            "ml/rail-1 (network rail-1, range 10.20.0.128/25) in isolated fabric rail-1",
            "126 addresses (10.20.0.129-10.20.0.254)",
            "on master enp6s0",
            "\"isolated_fabric\"",
        ] {
            assert!(m.contains(part), "{part:?} in {m}");
        }
    }

    #[test]
    fn two_fabrics_overlap_too_and_absent_masters_are_one_master() {
        let nets = [
            net(
                "a/r1",
                conf(
                    "r1",
                    None,
                    json!({"range": "10.21.0.10-10.21.0.10/24", "isolated_fabric": "f1"}),
                ),
            ),
            net(
                "b/r2",
                conf(
                    "r2",
                    None,
                    json!({"range": "10.21.0.0/24", "isolated_fabric": "f2"}),
                ),
            ),
        ];
        let f = findings(&nets);
        assert_eq!(f.len(), 1, "{f:?}");
        let m = f[0].message();
        assert!(
            m.contains("isolated fabric f1")
                && m.contains("isolated fabric f2")
                && m.contains("address 10.21.0.10 on the default route's interface")
                && m.contains("neither names a \"master\""),
            "{m}"
        );
    }

    #[test]
    fn other_masters_disjoint_or_split_ranges_are_no_finding() {
        let fabric = |nad: &str, master: Option<&str>, ipam: Value| {
            let mut ipam = ipam;
            ipam["isolated_fabric"] = json!("rail");
            net(nad, conf(nad.split('/').nth(1).unwrap(), master, ipam))
        };
        let cluster = net(
            "a/wide",
            conf("wide", Some("enp1s0"), json!({"range": "10.22.0.0/24"})),
        );
        // The same addresses on another master (a per-rail switch): what domains are for.
        assert!(
            findings(&[
                cluster.clone(),
                fabric("b/rail", Some("enp2s0"), json!({"range": "10.22.0.0/24"}))
            ])
            .is_empty()
        );
        // A named master and none: not known to be one interface, not reported.
        assert!(
            findings(&[
                cluster.clone(),
                fabric("b/rail", None, json!({"range": "10.22.0.0/24"}))
            ])
            .is_empty()
        );
        // One master, but disjoint: other bounds, or a subnet split by exclusions.
        assert!(
            findings(&[
                cluster.clone(),
                fabric("b/rail", Some("enp1s0"), json!({"range": "10.23.0.0/24"}))
            ])
            .is_empty()
        );
        let low = net(
            "a/low",
            conf(
                "low",
                Some("enp1s0"),
                json!({"range": "10.24.0.0/24", "exclude": ["10.24.0.128/25"]}),
            ),
        );
        let high = fabric(
            "b/high",
            Some("enp1s0"),
            json!({"range": "10.24.0.0/24", "exclude": ["10.24.0.0/25"]}),
        );
        let bounded = fabric(
            "c/bounded",
            Some("enp1s0"),
            json!({"range": "10.24.0.200-10.24.0.210/24"}),
        );
        assert_eq!(findings(&[low.clone(), high]).len(), 0);
        assert_eq!(findings(&[low, bounded]).len(), 0);
    }

    #[test]
    fn one_domain_with_one_subnet_is_no_finding() {
        let c = conf(
            "storage",
            Some("enp1s0"),
            json!({"range": "10.25.0.0/24", "gateway": "10.25.0.1"}),
        );
        // One network's NAD in two namespaces, identical.
        let twins = [net("a/storage", c.clone()), net("b/storage", c)];
        assert!(findings(&twins).is_empty());
        // Two networks on one subnet, split by bounds or not: the domain hands each address once.
        let other = net(
            "c/storage-b",
            conf(
                "storage-b",
                Some("enp9s0"),
                json!({"range": "10.25.0.100-10.25.0.200/24", "gateway": "10.25.0.1"}),
            ),
        );
        assert!(findings(&[twins[0].clone(), other]).is_empty());
    }

    #[test]
    fn one_domain_with_another_prefix_or_gateway_is_a_finding() {
        let nets = [
            net(
                "a/small",
                conf(
                    "small",
                    Some("enp1s0"),
                    json!({"range": "10.26.0.0/24", "gateway": "10.26.0.1"}),
                ),
            ),
            net(
                "b/big",
                conf("big", Some("enp1s0"), json!({"range": "10.26.0.0/16"})),
            ),
        ];
        let f = findings(&nets);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].kind, Kind::InconsistentSubnet);
        let m = f[0].message();
        for part in [
            "a/small (network small, range 10.26.0.0/24) and b/big (network big, range 10.26.0.0/16)",
            "in the cluster-wide domain on master enp1s0 but not their subnet",
            "prefix /24 against /16; gateway 10.26.0.1 against none",
            "b/big can hand out 10.26.0.1, the gateway of a/small",
            "253 addresses (10.26.0.2-10.26.0.254)",
        ] {
            assert!(m.contains(part), "{part:?} in {m}");
        }
        // Only the gateway differs, per range: the ipRanges entry's own gateway counts.
        let nets = [
            net(
                "a/x",
                conf(
                    "x",
                    None,
                    json!({"ipRanges": [{"range": "10.27.0.0/24", "gateway": "10.27.0.254"}], "isolated_fabric": "f"}),
                ),
            ),
            net(
                "b/y",
                conf(
                    "y",
                    None,
                    json!({"range": "10.27.0.0/24", "gateway": "10.27.0.1", "isolated_fabric": "f"}),
                ),
            ),
        ];
        let f = findings(&nets);
        assert_eq!(f.len(), 1, "{f:?}");
        let m = f[0].message();
        assert!(
            m.contains("in isolated fabric f on the default route's interface")
                && m.contains("gateway 10.27.0.254 against 10.27.0.1")
                && !m.contains("prefix /")
                && m.contains("a/x can hand out 10.27.0.1, the gateway of b/y")
                && m.contains("b/y can hand out 10.27.0.254, the gateway of a/x"),
            "{m}"
        );
    }

    #[test]
    fn each_range_of_a_nad_is_compared_and_each_pair_once() {
        let multi = net(
            "a/multi",
            conf(
                "multi",
                Some("enp1s0"),
                json!({"range": "10.28.0.0/24", "ipRanges": [{"range": "10.29.0.0/24"}, {"range": "fd00:28::/64"}]}),
            ),
        );
        let rail = net(
            "b/rail",
            conf(
                "rail",
                Some("enp1s0"),
                json!({"ipRanges": [{"range": "10.28.0.0/25"}, {"range": "10.29.0.0/25"}, {"range": "fd00:28::/64"}],
                       "isolated_fabric": "rail"}),
            ),
        );
        let f = findings(&[multi.clone(), rail.clone()]);
        assert_eq!(f.len(), 3, "{f:?}");
        let ranges: Vec<(String, String)> = f
            .iter()
            .map(|f| (f.a.range.to_string(), f.b.range.to_string()))
            .collect();
        assert_eq!(
            ranges,
            [
                ("10.28.0.0/24".into(), "10.28.0.0/25".into()),
                ("10.29.0.0/24".into(), "10.29.0.0/25".into()),
                ("fd00:28::/64".into(), "fd00:28::/64".into()),
            ]
        );
        // Listed in the other order: the same findings, the sides swapped.
        assert_eq!(findings(&[rail, multi]).len(), 3);
        // Identities differ between findings and stay the same for the same finding.
        let ids: std::collections::BTreeSet<String> = f.iter().map(Finding::identity).collect();
        assert_eq!(ids.len(), 3);
        assert_eq!(f[0].identity(), f[0].clone().identity());
    }
}
