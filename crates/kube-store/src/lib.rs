//! tether's cluster-wide lease store: one `IPLease` custom resource per leased address.
//!
//! When several nodes allocate from one range, the leases must live in the cluster. Following
//! the KEP-1880 `IPAddress` model, every address of a uniqueness domain (the cluster, or an
//! isolated fabric) is one small cluster-scoped object named after it ([`crd::object_name`]:
//! `10.20.30.6`, `10.20.30.6.rail-3`), whichever network (NAD) hands it out, so allocating is a
//! single CREATE that either wins or gets `409 AlreadyExists`: no shared object rewritten by
//! every allocation, no read-modify-write, no leader election, and two NADs whose ranges overlap
//! never give one address twice. [`KubeStore`] implements [`tether_leases::LeaseStore`], so the
//! same engine (idempotent ADD, sticky, cooldown, quarantine, requested addresses, GC, rollback)
//! runs over it:
//!
//! | store call | API request |
//! |---|---|
//! | `get(scope, address)` | GET `ipleases/<address>[.<fabric>]` |
//! | `list(scope)` | LIST `ipleases?labelSelector=ipam.tether.dev/network=<net>` from the watch cache (`resourceVersion=0`, or not older than the newest resourceVersion this store has seen; paginated and consistent without `list_from_cache`), objects of other networks and domains dropped: the other networks of the domain are found by the conditional CREATE, not listed |
//! | `list_mine(scope)` | the same, narrowed to this node's label, then `spec.node` |
//! | `by_pod(scope, pod)` | LIST `ipleases?labelSelector=<the network's label>,ipam.tether.dev/pod=<namespace.name>` from the watch cache, then the spec |
//! | `claim(new, None)` | CREATE; `409 AlreadyExists` → `Taken` (plus one GET for the current record) |
//! | `claim(new, Some(expected))` | UPDATE carrying the expected `uid` and `resourceVersion`; `409 Conflict` / `404` → `Taken` |
//! | `remove(expected)` | DELETE with preconditions `{uid, resourceVersion}`; `409` / `404` → `Taken` |
//!
//! A lease's opaque `version` is `<uid>/<resourceVersion>`, so a release or delete can never hit
//! an object re-created for another attachment since it was read. Objects named
//! `<network>.<address>`, as tether named them before uniqueness domains, are moved into their
//! domains and mirrored while a tether of that time may still run ([`by_network`]). With a node name and a journal
//! directory in its settings the store also serves the engine's node journal
//! ([`tether_leases::journal`]; a missing one is rebuilt from one LIST of this node's leases),
//! and DEL and CHECK never list: a DEL costs one UPDATE, whatever the number of leases in the
//! cluster. A new ADD first lists the pod's records by its label (`by_pod`), then walks by point
//! reads: uncontended, that LIST and one CREATE (through the node-agent's lease service, which
//! answers `by_pod` from its watch of the network, the CREATE alone).

//! Errors ([`KubeStoreError`]) say what to do — the CRD is missing (names
//! [`crd::CRD_MANIFEST`] and the `kubectl apply` command), RBAC forbids a verb (names verb and
//! resource), the API server is unreachable or too slow, TLS failed, the kubeconfig is missing
//! or invalid — and convert into [`tether_leases::StoreError::Backend`], transient for
//! unreachable, timed-out and 429/5xx answers. Every call is bounded by one budget per store
//! ([`KubeSettings::timeout`], default 10 s), so a pod sandbox never hangs on the IPAM.

//! [`lease_lists`] are the store's lists across networks and nodes for the reconciler, the CLI
//! and the monitor. The store sits on [`ApiClient`] ([`api`]; lists in [`listing`], watches in
//! [`watching`]), the client every request goes through (credentials, time budget, request
//! counters, error mapping); the operator's reader of pods, nodes, NADs, Events, tokens and access
//! reviews (`Cluster`, the tether-cluster crate, which no plugin links) builds on the same client
//! and may share it. [`traffic`] holds the counters of what the clients sent and read, a value the
//! node-agent shares among its clients and its metrics. [`node_agent()`] says whether tether's
//! node-agent is installed on this node (its kubeconfig for the plugins), which decides the store
//! of a configuration that names none.

// Errors carry the server, verb, identity and message for the operator; they are the cold path
// of a short-lived process, so their size does not matter.
#![allow(clippy::result_large_err)]

pub mod api;
pub mod backoff;
pub mod by_network;
pub mod claim_marks;
pub mod convert;
pub mod crd;
pub mod credentials;
pub mod error;
pub mod lease_lists;
pub mod listing;
pub mod node_agent;
pub mod settings;
pub mod store;
pub mod token_claims;
pub mod traffic;
pub mod watching;

pub use api::{ApiClient, RequestCounts};
pub use backoff::jittered;
pub use claim_marks::{CLAIMED_LABEL, ClaimMark, Marked};
pub use convert::{Kinds, Naming, lease_labels, time_text};
pub use crd::{
    IPLease, IPLeaseSpec, LeasePhase, PodInfo, Quarantine, crd_yaml, network_object_name,
    object_name,
};
pub use credentials::check_credentials;
pub use error::{CredentialSource, KubeStoreError};
pub use node_agent::{NODE_KUBECONFIG_ENV, node_agent};
pub use settings::{DEFAULT_PAGE_SIZE, DEFAULT_TIMEOUT, KubeSettings, LegacyMirrors};
pub use store::KubeStore;
pub use traffic::ApiTraffic;
pub use watching::{Change, WatchEnd};
