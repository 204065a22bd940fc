//! `tether`, the operator and node-agent program: inspect and repair leases, diagnose a network,
//! validate a NAD, run the reconciler, import whereabouts' allocations, or run as the DaemonSet's
//! node-agent ([`cli`] parses the command line and dispatches).

pub mod agent;
pub mod cli;
pub mod conflict_guard;
pub mod doctor;
pub mod find_cluster;
pub mod installed;
pub mod kube;
pub mod leader;
pub mod lease_names;
pub mod manifests;
pub mod metrics;
pub mod monitor;
pub mod nads;
pub mod node_files;
pub mod observers;
pub mod options;
pub mod output;
pub mod overlap;
pub mod plugin_token;
pub mod pool_usage;
pub mod reconcile;
pub mod report;
pub mod store_access;
pub mod termination;
pub mod whereabouts_import;
