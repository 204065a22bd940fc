//! The node-agent's lease service: the plugins' lease-store requests, served over a root-only
//! unix socket on one kept API connection ([`server`]), with the records of each network this
//! node's pods use kept by a watch ([`network_cache`]), so most of an ADD is answered without a
//! request. The plugin's side and the protocol are the tether-lease-client crate
//! ([`tether_lease_client`]); the plugin links only that one, and falls back to the direct path by
//! itself whenever this service is absent, slow, stopping or breaks mid-call.

pub mod network_cache;
pub mod server;

pub use network_cache::NetworkGauge;
pub use server::{LeaseService, ServiceGauges, ServiceOptions, ServiceStats};
