//! The `ipam` object of a network configuration, whereabouts-compatible.
//!
//! Parsing walks the JSON by hand so every error names the exact key path
//! (`ipam.ipRanges[1].range_start`) and the offending value. Unknown keys are ignored.

use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use serde_json::{Map, Value};

use crate::range::{self, IpRange};

mod ranges;
mod sections;
mod store;
use ranges::parse_ranges;
use sections::{
    parse_data_dir, parse_dns, parse_isolated_fabric, parse_kubernetes, parse_probe, parse_routes,
};
pub use store::{
    KubeconfigSource, NODE_KUBECONFIG, NodeAgent, StoreSource, is_whereabouts_kubeconfig,
};

/// Default state directory of the node-local file store.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/tether";
/// Default cooldown before a released address goes to another pod, in seconds.
pub const DEFAULT_COOLDOWN_S: u64 = 60;
/// Default quarantine of an address a probe found in use, in seconds.
pub const DEFAULT_QUARANTINE_S: u64 = 600;
/// Default probe timeout in milliseconds.
pub const DEFAULT_PROBE_TIMEOUT_MS: u64 = 100;
/// Default number of probe attempts.
pub const DEFAULT_PROBE_ATTEMPTS: u32 = 1;

/// Errors in the network configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration bytes are not JSON.
    #[error("network configuration is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The configuration is not an object or lacks an `ipam` object.
    #[error("network configuration has no \"ipam\" object")]
    MissingIpam,
    /// A key has a value tether cannot use. `value` is the JSON text of the value.
    #[error("{key} {value}: {reason}")]
    Invalid {
        /// Key path, e.g. `ipam.ipRanges[0].range`.
        key: String,
        /// The offending value as JSON text (strings quoted).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Neither `range` nor `ipRanges` gave a range.
    #[error("ipam: no address range configured: set \"range\" or \"ipRanges\"")]
    NoRanges,
    /// Neither `ipam.network_name` nor the top-level `name` is set.
    #[error("no network name: set the top-level \"name\" or \"ipam.network_name\"")]
    NoNetworkName,
}

impl ConfigError {
    fn invalid(key: &str, value: &Value, reason: impl ToString) -> ConfigError {
        // A message quotes the value: never all of a huge one.
        let mut value = value.to_string();
        if value.len() > MAX_QUOTED {
            let mut cut = MAX_QUOTED;
            while !value.is_char_boundary(cut) {
                cut -= 1;
            }
            value.truncate(cut);
            value.push('…');
        }
        ConfigError::Invalid {
            key: key.to_string(),
            value,
            reason: reason.to_string(),
        }
    }
}

/// At most this much of a bad value is quoted in an error.
const MAX_QUOTED: usize = 120;
/// Range entries (`range` plus `ipRanges`) one network may have. Real networks have a handful;
/// every entry costs each ADD and DEL a walk, so thousands would make every pod's ADD slow.
pub const MAX_RANGES: usize = 64;
/// `exclude` entries of one range.
pub const MAX_EXCLUDES: usize = 1024;

/// Blocks that can never be a pod's address: a range touching one is refused.
const NEVER_POD_ADDRESSES: &[(&str, &str)] = &[
    ("0.0.0.0/8", "\"this network\" (0.0.0.0/8)"),
    ("127.0.0.0/8", "loopback (127.0.0.0/8)"),
    ("224.0.0.0/4", "multicast (224.0.0.0/4)"),
    ("255.255.255.255/32", "the limited broadcast address"),
    ("::/128", "the unspecified address (::)"),
    ("::1/128", "loopback (::1)"),
    ("ff00::/8", "multicast (ff00::/8)"),
];

/// Refuse a subnet that covers everything or touches a block no pod address can be in.
pub(super) fn check_pod_subnet(subnet: &IpNet) -> Result<(), String> {
    if subnet.prefix_len() == 0 {
        return Err("a /0 range covers every address; give the subnet of the segment".into());
    }
    for (block, what) in NEVER_POD_ADDRESSES {
        let b: IpNet = block.parse().expect("valid block");
        if b.contains(&subnet.network()) || subnet.contains(&b.network()) {
            return Err(format!(
                "it overlaps {what}, which can never be a pod's address"
            ));
        }
    }
    Ok(())
}

/// Which lease store to use (see [`StoreSource`] for how it is chosen).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// Node-local JSON state files under `data_dir`.
    File,
    /// One custom resource per leased address in the cluster.
    Kubernetes,
}

/// Conflict-probe settings (`probe`). The IPAM core only carries them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeConfig {
    /// `"probe": false`.
    Disabled,
    /// Probe each candidate before handing it out (default).
    Enabled {
        /// Wait per attempt, in milliseconds (default 100).
        timeout_ms: u64,
        /// Attempts per address (default 1).
        attempts: u32,
    },
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig::Enabled {
            timeout_ms: DEFAULT_PROBE_TIMEOUT_MS,
            attempts: DEFAULT_PROBE_ATTEMPTS,
        }
    }
}

/// `kubernetes` object: the kubeconfig path, everything else kept as JSON.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KubernetesConfig {
    /// The kubeconfig the cluster store uses: `kubernetes.kubeconfig`, or tether's node-agent's
    /// (see `source`).
    pub kubeconfig: Option<PathBuf>,
    /// Where `kubeconfig` came from.
    pub source: KubeconfigSource,
    /// The other keys of the object (e.g. whereabouts' `k8s_api_root`).
    pub extra: Map<String, Value>,
}

/// A static route (`routes` entry) and the `dns` object: the Result's own types (tether-cni), so
/// what the config says is what the Result carries, CNI 1.1 route fields included.
pub use tether_cni::result::{Dns, Route};

/// The typed `ipam` configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    /// `ipam.network_name`, default the top-level `name`: names the network on its leases, its
    /// node journal and its metrics. It does not separate address spaces: see `domain`.
    pub network_name: String,
    /// `ipam.isolated_fabric`: the uniqueness domain of this network's addresses when it is not
    /// the cluster. An address is handed out once per domain, whichever network (NAD) asks; only
    /// networks on fabrics that share no segment and reuse address space name one.
    pub domain: Option<String>,
    /// One entry per address handed out per attachment: the top-level `range` first (if set),
    /// then each `ipRanges` entry.
    pub ranges: Vec<IpRange>,
    /// `gateway` as configured (each range also knows it when of the same family).
    pub gateway: Option<IpAddr>,
    /// `routes`.
    pub routes: Vec<Route>,
    /// `dns`.
    pub dns: Dns,
    /// `store`; without it whereabouts' `datastore`, else `kubernetes` when a kubeconfig is given
    /// or tether's node-agent is installed, else `file` (see `store_source`).
    pub store: StoreKind,
    /// Why `store` is what it is.
    pub store_source: StoreSource,
    /// `dataDir` (default `/var/lib/cni/tether`), absolute.
    pub data_dir: PathBuf,
    /// `cooldown_s` (default 60).
    pub cooldown_s: u64,
    /// `quarantine_s` (default 600).
    pub quarantine_s: u64,
    /// `probe` (default enabled, 100 ms, 1 attempt).
    pub probe: ProbeConfig,
    /// `kubernetes` object, if present.
    pub kubernetes: Option<KubernetesConfig>,
    /// `defend` (default false): the node-agent's conflict guard answers another host's claim on
    /// a leased address with an announcement (RFC 5227 §2.4), at most one per 10 s. Read by the
    /// agent only; the guard reports claims whether or not it defends.
    pub defend: bool,
}

impl PoolConfig {
    /// Parse the whole network configuration (stdin bytes), read where `agent` says whether
    /// tether's node-agent is installed (it decides the store of a configuration naming none).
    pub fn from_slice(config: &[u8], agent: &NodeAgent) -> Result<PoolConfig, ConfigError> {
        let v: Value = serde_json::from_slice(config)?;
        PoolConfig::from_value(&v, agent)
    }

    /// Parse the whole network configuration as JSON. The `ipam` object is under `"ipam"`; the
    /// top-level `name` is the default network name.
    pub fn from_value(config: &Value, agent: &NodeAgent) -> Result<PoolConfig, ConfigError> {
        PoolConfig::from_top(config.as_object().ok_or(ConfigError::MissingIpam)?, agent)
    }

    /// [`PoolConfig::from_value`] of a configuration already parsed into its top-level keys.
    pub fn from_top(
        top: &Map<String, Value>,
        agent: &NodeAgent,
    ) -> Result<PoolConfig, ConfigError> {
        let ipam = match top.get("ipam") {
            Some(Value::Object(m)) => m,
            Some(Value::Null) | None => return Err(ConfigError::MissingIpam),
            Some(other) => return Err(ConfigError::invalid("ipam", other, "expected an object")),
        };
        let name = opt_str(top, "name", "name")?;
        PoolConfig::from_ipam(ipam, name, agent)
    }

    /// Parse the `ipam` object itself; `name` is the network's top-level name.
    pub fn from_ipam(
        ipam: &Map<String, Value>,
        name: Option<&str>,
        agent: &NodeAgent,
    ) -> Result<PoolConfig, ConfigError> {
        let network_name = match opt_str(ipam, "network_name", "ipam.network_name")? {
            Some(n) => n.to_string(),
            None => name.ok_or(ConfigError::NoNetworkName)?.to_string(),
        };

        let domain = parse_isolated_fabric(ipam)?;

        let gateway = match opt_str(ipam, "gateway", "ipam.gateway")? {
            Some(g) => Some(ip_value("ipam.gateway", ipam.get("gateway").unwrap(), g)?),
            None => None,
        };

        let ranges = parse_ranges(ipam, gateway)?;
        if ranges.is_empty() {
            return Err(ConfigError::NoRanges);
        }

        let routes = parse_routes(ipam)?;
        let dns = parse_dns(ipam)?;

        let (store, store_source, kubernetes) =
            store::choose_store(ipam, parse_kubernetes(ipam)?, agent)?;
        let data_dir = parse_data_dir(ipam)?;

        let cooldown_s =
            opt_u64(ipam, "cooldown_s", "ipam.cooldown_s")?.unwrap_or(DEFAULT_COOLDOWN_S);
        let quarantine_s =
            opt_u64(ipam, "quarantine_s", "ipam.quarantine_s")?.unwrap_or(DEFAULT_QUARANTINE_S);
        let probe = parse_probe(ipam)?;
        let defend = match ipam.get("defend") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(ConfigError::invalid(
                    "ipam.defend",
                    other,
                    "expected true or false",
                ));
            }
        };

        Ok(PoolConfig {
            network_name,
            domain,
            ranges,
            gateway,
            routes,
            dns,
            store,
            store_source,
            data_dir,
            cooldown_s,
            quarantine_s,
            probe,
            kubernetes,
            defend,
        })
    }

    /// The gateway to report for addresses of range `index`: the range's own gateway, else the
    /// configured `gateway` when it is of the same family (it may lie outside the subnet).
    pub fn gateway_for(&self, index: usize) -> Option<IpAddr> {
        let r = self.ranges.get(index)?;
        r.gateway()
            .or(self.gateway.filter(|g| range::Family::of(*g) == r.family()))
    }
}

pub(super) fn is_blank(v: &Value) -> bool {
    matches!(v, Value::Null) || v.as_str().is_some_and(|s| s.trim().is_empty())
}

/// A string value; `null` and `""` count as absent (Go's encoding/json leaves such fields unset).
pub(super) fn opt_str<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a str>, ConfigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(other) => Err(ConfigError::invalid(path, other, "expected a string")),
    }
}

pub(super) fn opt_u64(
    obj: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<u64>, ConfigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| ConfigError::invalid(path, v, "expected a non-negative whole number")),
    }
}

pub(super) fn ip_value(path: &str, raw: &Value, text: &str) -> Result<IpAddr, ConfigError> {
    text.trim()
        .parse()
        .map_err(|_| ConfigError::invalid(path, raw, "not an IP address"))
}
