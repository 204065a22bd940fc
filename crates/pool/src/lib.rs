//! tether IPAM pool configuration and range arithmetic.
//!
//! No CNI protocol and no I/O here: this crate turns the `ipam` object of a network
//! configuration into a typed [`PoolConfig`] and answers questions about address ranges.
//!
//! # Configuration ([`config`])
//!
//! [`PoolConfig::from_slice`] / [`PoolConfig::from_value`] take the *whole* network config (the
//! `ipam` object is under `"ipam"`, the top-level `name` is the default network name) and whether
//! tether's node-agent is installed where it is read ([`NodeAgent`]: the only input besides the
//! config, since a NAD must not choose a root credential).
//! whereabouts NADs are accepted unchanged:
//!
//! | key | meaning |
//! |---|---|
//! | `range` | CIDR (`10.20.30.0/24`, host bits ignored) or `first-last/prefix` (`10.20.30.241-10.20.30.250/24`) |
//! | `range_start`, `range_end` | inclusive bounds inside the CIDR (ignored, with a warning, for `first-last` ranges, as whereabouts does) |
//! | `exclude` | CIDRs or single addresses; other-family entries are ignored |
//! | `ipRanges` | `[{range, range_start, range_end, exclude, gateway?}]`, one address per entry; a top-level `range` (with the top-level `range_start`/`range_end`/`exclude`) is prepended |
//! | `gateway` | attached to every range whose subnet contains it, and never handed out |
//! | `routes`, `dns` | static-plugin syntax, carried |
//! | `network_name` | default: top-level `name` |
//! | `store` | `"file"` or `"kubernetes"`; absent: `datastore`, else kubernetes when `kubernetes.kubeconfig` is set or tether's node-agent is installed ([`NodeAgent`]), else file ([`StoreSource`]) |
//! | `datastore` | whereabouts' key: `"kubernetes"` is the cluster store; any other value (`"etcd"`) is refused |
//! | `dataDir` | default `/var/lib/cni/tether`; must be absolute |
//! | `cooldown_s`, `quarantine_s` | default 60 and 600 |
//! | `probe` | `false`, `true`, or `{"timeout_ms": N, "attempts": N}` (default on, 100 ms, 1) |
//! | `defend` | `true` or `false` (default): the node-agent's conflict guard answers a claim on a leased address (read by the agent only) |
//! | `kubernetes` | `kubeconfig` path plus the other keys as JSON; whereabouts' kubeconfig is replaced by the node-agent's, or refused without one ([`KubeconfigSource`]) |
//!
//! Unknown keys are ignored; `""` and `null` count as absent (as Go's JSON decoding does).
//! Invalid values give [`ConfigError::Invalid`], whose message is
//! `<key path> <JSON value>: <reason>`, e.g. `ipam.range "10.1.2.9-10.1.2.3/24": start is after end (...)`.
//!
//! # Ranges ([`range`])
//!
//! [`IpRange`] never hands out the network address, the IPv4 broadcast address, the gateway or
//! anything excluded; /31 and /32 (IPv6 /127, /128) have no network/broadcast address. All
//! arithmetic is on `u128` values with a sorted list of merged holes, so any IPv6 width works:
//!
//! - [`IpRange::contains`]`(ip)` — usable in this range; [`IpRange::unusable_reason`] says why not;
//!   [`IpRange::subnet_contains`] ignores bounds and holes.
//! - [`IpRange::prefix_len`], [`IpRange::network`], [`IpRange::subnet`], [`IpRange::gateway`].
//! - [`IpRange::usable_count`] — `u128`.
//! - [`IpRange::nth`]`(n)` — the n-th usable address, O(holes).
//! - [`IpRange::candidates`]`(start_offset)` — iterator over every usable address once, starting
//!   at usable index `start_offset % usable_count()` and wrapping around; holes are jumped over.
//! - [`IpRange::shared_with`]`(other)` — the addresses two ranges may both hand out (first, last,
//!   count), from their spans, O(holes).
//!
//! # Requested addresses ([`request`])
//!
//! [`RequestedIp::parse`] takes `10.1.2.9` or `10.1.2.9/24`; [`find_range`] / [`locate`] find
//! the index of the range that may hand it out, or a [`RequestError`] naming the address and the
//! ranges (or the reason, e.g. "it is the gateway").

pub mod config;
pub mod range;
pub mod request;

pub use config::{
    ConfigError, Dns, KubeconfigSource, KubernetesConfig, NODE_KUBECONFIG, NodeAgent, PoolConfig,
    ProbeConfig, Route, StoreKind, StoreSource, is_whereabouts_kubeconfig,
};
pub use range::{Bound, Candidates, Family, IpRange, RangeError, SharedAddresses, Unusable};
pub use request::{RequestError, RequestedIp, describe_ranges, find_range, locate};
