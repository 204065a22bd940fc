//! What tether's operator program asks the Kubernetes API beyond the leases, and the loop that
//! keeps a collection current. No CNI call runs any of it: tether-ipam reaches the API through
//! [`tether_kube_store`] (directly, or through the node-agent with tether-lease-client) and never
//! depends on this crate, which sits beside them for `tether` (the CLI, the controller, the
//! node-agent and its lease service).
//!
//! [`Cluster`] reads and writes what the operator needs: pods and the controller's election Lease
//! ([`cluster`]), nodes ([`nodes`]), NAD configurations and Events on pods and NADs
//! ([`monitoring`]), access reviews, the node-scope dry-run, `/version` and the CRD's state
//! ([`access`]), node-bound tokens ([`node_token`]), whereabouts' IPPools and reservations for
//! the import ([`whereabouts`]). It goes through the lease store's client
//! ([`tether_kube_store::ApiClient`]: credentials, time budget, request counters, error mapping),
//! which a [`tether_kube_store::KubeStore`] may share, and its errors are the store's
//! ([`KubeStoreError`]). [`ListWatch`] ([`list_watch`]) is the list-then-watch loop of every kept
//! collection: the reconciler's pods, the lease service's records of a network.
//!
//! [`KubeStoreError`]: tether_kube_store::KubeStoreError

// Errors carry the server, verb, identity and message for the operator; they are the cold path,
// so their size does not matter.
#![allow(clippy::result_large_err)]

pub mod access;
pub mod cluster;
pub mod list_watch;
pub mod monitoring;
pub mod node_token;
pub mod nodes;
pub mod whereabouts;

pub use access::{Access, CrdState, Identity, NodeScope};
pub use cluster::{AgentPod, Cluster, ConfigMapData, ElectionLease, PodEvent, PodKey};
pub use list_watch::{ListWatch, Resume};
pub use monitoring::{NadConfig, NadWarning, PodWarning, Posted};
pub use node_token::IssuedToken;
pub use nodes::{NODE_LEASE_NAMESPACE, NodeHealth, PodPlacement};
pub use whereabouts::{
    PoolAllocation, Unreadable, WhereaboutsList, WhereaboutsPool, WhereaboutsReservation,
};
