//! Which tether network, and which uniqueness domain, a pool's allocations are imported into: the
//! scope tether-ipam gives the NAD the pool belongs to, so that the imported leases are the ones
//! that NAD's pods would hold had tether handed them out.
//!
//! The NADs considered are those whose IPAM is whereabouts or tether-ipam (a NAD already moved
//! over keeps its whereabouts keys, so it names the same pool). A pool belongs to
//!
//! 1. a NAD range whose whereabouts pool name is the pool's (`[<network_name>-]<range>`, as
//!    whereabouts names them), else
//! 2. a NAD range that contains the pool's range (a node-slice pool, a NAD whose range changed);
//!
//! among several, a tether-ipam NAD before a whereabouts one (its scope, isolated fabric included,
//! is how tether hands the range out now), then by namespace and name. The network is tether's
//! name for that configuration (`ipam.network_name`, else the configuration's `name`), the domain
//! its `ipam.isolated_fabric` (none on a whereabouts NAD: the cluster). A pool no NAD names is
//! imported into the cluster-wide domain under the network `whereabouts-<pool name>`, and
//! reported: the addresses are kept from every NAD of the cluster domain all the same.

use std::collections::BTreeSet;

use serde_json::Value;
use tether_cluster::NadConfig;
use tether_leases::Scope;
use tether_pool::{IpRange, NodeAgent, PoolConfig};

use super::entries::{PoolRange, pool_name};
use crate::nads::ipam_configs;

/// The IPAM plugin of a NAD configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Plugin {
    /// tether-ipam (a NAD already moved over).
    Tether,
    /// whereabouts.
    Whereabouts,
}

/// One whereabouts or tether-ipam configuration of a NAD.
#[derive(Debug, Clone)]
pub struct NadIpam {
    /// `namespace/name` of the NAD.
    pub nad: String,
    /// Its IPAM plugin.
    pub plugin: Plugin,
    /// `ipam.network_name` as written: whereabouts prefixes its object names with it.
    pub wb_network_name: Option<String>,
    /// tether's network and domain for it.
    pub scope: Scope,
    /// Its ranges (`range`, then `ipRanges`).
    pub ranges: Vec<IpRange>,
}

/// How a pool was matched with a NAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matched {
    /// By the pool's name.
    Name,
    /// By a NAD range containing the pool's.
    Range,
    /// No NAD: the fallback network.
    None,
}

impl Matched {
    /// For tables and JSON.
    pub fn text(self) -> &'static str {
        match self {
            Matched::Name => "name",
            Matched::Range => "range",
            Matched::None => "none",
        }
    }
}

/// Where a pool's allocations are imported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Network and domain of the leases.
    pub scope: Scope,
    /// The NAD (`namespace/name`) it belongs to, if one was found.
    pub nad: Option<String>,
    /// How.
    pub matched: Matched,
    /// Index of the NAD's range (`range`, then `ipRanges`), recorded on the leases.
    pub range_index: Option<usize>,
    /// Other NADs that match as well but give another network or domain (`ns/name (network
    /// N)`): the operator is told which one was taken.
    pub others: Vec<String>,
}

/// The whereabouts and tether-ipam configurations of the cluster's NADs.
#[derive(Debug, Clone, Default)]
pub struct Networks {
    configs: Vec<NadIpam>,
    /// Configurations tether could not read, for the operator (tether-ipam would refuse them too
    /// once their type changes).
    pub unreadable: Vec<String>,
}

impl Networks {
    /// Read every whereabouts and tether-ipam configuration of `nads`.
    pub fn from_nads(nads: &[NadConfig]) -> Networks {
        let mut n = Networks::default();
        for nad in nads {
            let name = format!("{}/{}", nad.namespace, nad.name);
            for (plugin, ty) in [
                (Plugin::Tether, "tether-ipam"),
                (Plugin::Whereabouts, "whereabouts"),
            ] {
                for raw in ipam_configs(&nad.config, &nad.name, ty) {
                    match PoolConfig::from_value(&raw, &NodeAgent::on_every_node()) {
                        Ok(cfg) => n.configs.push(NadIpam {
                            nad: name.clone(),
                            plugin,
                            wb_network_name: raw
                                .pointer("/ipam/network_name")
                                .and_then(Value::as_str)
                                .map(str::to_string),
                            scope: Scope::new(cfg.network_name, cfg.domain),
                            ranges: cfg.ranges,
                        }),
                        Err(e) => n.unreadable.push(format!(
                            "NAD {name}: its {ty} configuration does not read as tether-ipam would read it: {e}"
                        )),
                    }
                }
            }
        }
        n.configs
            .sort_by(|a, b| (a.plugin, &a.nad).cmp(&(b.plugin, &b.nad)));
        n
    }

    /// The `network_name`s whereabouts may have prefixed names with.
    pub fn wb_network_names(&self) -> impl Iterator<Item = &str> {
        self.configs
            .iter()
            .filter_map(|c| c.wb_network_name.as_deref())
            .filter(|n| !n.is_empty())
    }

    /// Where the allocations of the pool `name` of `range` (`None`: unreadable) go.
    pub fn place(&self, name: &str, range: Option<PoolRange>) -> Placement {
        let by_name = |c: &NadIpam, r: &IpRange| {
            pool_name(c.wb_network_name.as_deref(), r.network(), r.prefix_len()) == name
        };
        let by_range = |_: &NadIpam, r: &IpRange| {
            range.is_some_and(|p| r.subnet_contains(p.first) && r.prefix_len() <= p.prefix_len)
        };
        for (matched, test) in [
            (
                Matched::Name,
                &by_name as &dyn Fn(&NadIpam, &IpRange) -> bool,
            ),
            (Matched::Range, &by_range),
        ] {
            let mut found = self.configs.iter().filter_map(|c| {
                let i = c.ranges.iter().position(|r| test(c, r))?;
                Some((c, i))
            });
            if let Some((c, i)) = found.next() {
                let others = found
                    .filter(|(o, _)| o.scope != c.scope)
                    .map(|(o, _)| format!("{} (network {})", o.nad, o.scope))
                    .collect();
                return Placement {
                    scope: c.scope.clone(),
                    nad: Some(c.nad.clone()),
                    matched,
                    range_index: Some(i),
                    others,
                };
            }
        }
        Placement {
            scope: Scope::cluster(fallback_network(name)),
            nad: None,
            matched: Matched::None,
            range_index: None,
            others: Vec::new(),
        }
    }
}

/// The network of a pool no NAD names.
pub fn fallback_network(pool: &str) -> String {
    format!("whereabouts-{pool}")
}

/// The prefixes a reservation name may carry: those of the pools' names, and the NADs'
/// `network_name`s.
pub fn known_prefixes<'a>(
    pools: impl Iterator<Item = Option<&'a str>>,
    networks: &'a Networks,
) -> BTreeSet<String> {
    pools
        .flatten()
        .chain(networks.wb_network_names())
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nad(ns: &str, name: &str, config: &str) -> NadConfig {
        NadConfig {
            namespace: ns.into(),
            name: name.into(),
            uid: String::new(),
            config: config.into(),
        }
    }

    fn range(text: &str) -> Option<PoolRange> {
        Some(PoolRange::parse(text).unwrap())
    }

    #[test]
    fn pools_go_to_the_network_tether_gives_their_nad() {
        let nets = Networks::from_nads(&[
            // Still on whereabouts, no network_name: the network is the configuration's name.
            nad(
                "ml",
                "mgmt",
                r#"{"cniVersion":"0.3.1","name":"mgmt-net","type":"macvlan","ipam":{"type":"whereabouts","range":"10.203.0.0/26","range_start":"10.203.0.1"}}"#,
            ),
            // Moved over, network_name kept; its isolated fabric is the domain.
            nad(
                "ml",
                "rail",
                r#"{"type":"tether-ipvlan","ipam":{"type":"tether-ipam","network_name":"rail-a","range":"fd00:203::/125","isolated_fabric":"rail-1"}}"#,
            ),
            // The same range as rail, still on whereabouts: the tether NAD comes first.
            nad(
                "aa",
                "rail-old",
                r#"{"type":"macvlan","ipam":{"type":"whereabouts","network_name":"rail-a","range":"fd00:203::/125"}}"#,
            ),
            nad(
                "ml",
                "broken",
                r#"{"type":"macvlan","ipam":{"type":"whereabouts","range":"nope"}}"#,
            ),
        ]);
        let p = nets.place("10.203.0.0-26", range("10.203.0.0/26"));
        assert_eq!(p.scope, Scope::cluster("mgmt-net"));
        assert_eq!(
            (p.nad.as_deref(), p.matched),
            (Some("ml/mgmt"), Matched::Name)
        );
        assert_eq!(p.range_index, Some(0));

        let p = nets.place("rail-a-fd00-203---125", range("fd00:203::/125"));
        assert_eq!(p.scope, Scope::new("rail-a", Some("rail-1".into())));
        assert_eq!(p.nad.as_deref(), Some("ml/rail"));

        assert_eq!(p.others, ["aa/rail-old (network rail-a)"]);

        // A node-slice pool inside mgmt's range.
        let p = nets.place("mgmt-net-node1-0", range("10.203.0.16/28"));
        assert_eq!(
            (p.nad.as_deref(), p.matched),
            (Some("ml/mgmt"), Matched::Range)
        );

        let p = nets.place("10.9.0.0-24", range("10.9.0.0/24"));
        assert_eq!(p.scope, Scope::cluster("whereabouts-10.9.0.0-24"));
        assert_eq!((p.nad, p.matched), (None, Matched::None));

        assert_eq!(nets.unreadable.len(), 1);
        assert!(
            nets.unreadable[0].starts_with("NAD ml/broken: its whereabouts"),
            "{:?}",
            nets.unreadable
        );
        let prefixes = known_prefixes([Some(""), Some("gpu")].into_iter(), &nets);
        assert_eq!(
            prefixes.into_iter().collect::<Vec<_>>(),
            ["gpu".to_string(), "rail-a".to_string()]
        );
    }
}
