//! tether-ipam's two programs and what they share.
//!
//! - [`plugin`]: the CNI plugin `tether-ipam` (src/main.rs), exec'd by the runtime for every pod.
//!   It holds the CNI verbs and nothing else.
//! - [`operator`]: the operator and node-agent program `tether` (src/bin/tether.rs): `leases`,
//!   `release`, `doctor`, `validate`, `reconcile`, and `node-agent`, which the DaemonSet runs (it
//!   installs the plugins, keeps their kubeconfig fresh, reconciles leases, serves metrics).
//!
//! The engine and the stores live in tether-leases and tether-kube-store, ranges and config in
//! tether-pool, probing in tether-wire; the operator uses the plugin's store opening and prober.

pub mod operator;
pub mod plugin;
