//! A simulated cluster for scale and fault runs of the lease reconciler on a real API server:
//! nodes as processes (each a `tether node-agent` with its own node's credential), their kubelets'
//! heartbeats, the `tether controller`, and the faults (pod, node and heartbeat loss, an outage
//! of the API server). ipam/operator/tests/agents_faults.rs (in `make test`) and
//! src/bin/bench-agents.rs (`make bench-agents`) run the same [`scenario`].
//!
//! - [`api`]: the harness's admin client, a timestamping watch of a network's IPLeases, the
//!   server's own list metrics;
//! - [`nodes`]: Node objects, heartbeats, agent pods and their bound tokens (the node
//!   credential);
//! - [`procs`]: the agent and controller processes, their metrics, and the API server process
//!   for a real outage;
//! - [`proxy`]: a TCP proxy to cut the agents off a server that must stay up;
//! - [`scenario`]: the scenario and its [`scenario::Report`].

pub mod api;
pub mod nodes;
pub mod procs;
pub mod proxy;
pub mod scenario;
