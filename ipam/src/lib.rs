//! tether-ipam, the CNI plugin (src/main.rs) exec'd by the runtime for every pod: the CNI verbs
//! and nothing else ([`plugin`]). The engine and the stores live in tether-leases,
//! tether-kube-store and tether-lease-client (the cluster store through the node-agent), ranges
//! and config in tether-pool, probing in tether-wire. The operator and
//! node-agent program `tether` is the package beside it (ipam/operator, tether_operator).

pub mod plugin;
