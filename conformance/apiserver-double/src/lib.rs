//! **A test double of the Kubernetes API — not an API server.**
//!
//! It serves, over plain HTTP on 127.0.0.1, only the subset of the API that tether's Kubernetes
//! lease store (and a later pod reconciler) uses, from memory, with the behaviour those clients
//! rely on:
//!
//! - `IPLease` custom resources, cluster-scoped, at `/apis/ipam.tether.dev/v1alpha1/ipleases[/NAME]`:
//!   create (POST), get, list, watch, replace (PUT) and delete, with
//!   - a monotonically increasing `resourceVersion` shared by every object (like etcd's revision)
//!     and a fresh `uid` per created object;
//!   - `409 AlreadyExists` on a create of an existing name, `409 Conflict` on a replace carrying a
//!     stale `resourceVersion` or another `uid`, and on a delete whose preconditions
//!     (`uid`, `resourceVersion`) fail; `404 NotFound` for a missing object; each with a real
//!     `Status` body (`reason`, `message`, `details`, `code`);
//!   - list with equality label selectors (`k=v`, `k==v`, `k!=v`, `k`, `!k`), the
//!     `metadata.name` field selector, `limit`/`continue` pagination and `resourceVersion` /
//!     `resourceVersionMatch` handling good enough for a client (a too-new version gives 504, an
//!     `Exact` version other than the current one 410);
//!   - a light imitation of the CRD's validation (required fields, `network` and `address`
//!     immutable) answering `422 Invalid`.
//! - `GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions/ipleases.ipam.tether.dev` (an
//!   `Established` CRD) and `GET /version`.
//! - Pods, read-only: `GET /api/v1/namespaces/NS/pods/NAME`, list and watch of `/api/v1/pods` and
//!   `/api/v1/namespaces/NS/pods` (label selectors; field selectors on `spec.nodeName`,
//!   `metadata.name`, `metadata.namespace`, `status.phase`, `status.podIP`), from an in-memory set
//!   the test controls ([`ApiServerDouble::upsert_pod`], [`ApiServerDouble::delete_pod`]). Watches
//!   stream chunked JSON lines (`{"type":"ADDED","object":{...}}`), start with synthetic `ADDED`
//!   events when no `resourceVersion` (or `0`) is given, and replay the recent history otherwise.
//! - Nodes, read-only, the same way ([`ApiServerDouble::upsert_node`],
//!   [`ApiServerDouble::delete_node`]).
//! - `SelfSubjectAccessReview` (create): allowed unless the (verb, resource) pair is forbidden.
//! - Metadata-only answers (`Accept: ...;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`) for
//!   every get, list and watch.
//!
//! Test knobs: injectable latency per request, `403 Forbidden` on demand per (verb, resource) or
//! per (verb, resource, namespace), "CRD not installed" mode (the group answers 404 like a real
//! server without the CRD), and request counters per verb and resource (`"create ipleases"`), so
//! benchmarks can report API requests per allocation.
//!
//! Not modelled: authentication, admission, field managers, patch, finalizers, namespaces as
//! objects, and snapshot-consistent pagination (pages after the first reflect the current state;
//! a real server serves every page from the first page's resourceVersion).
//!
//! Start it in-process with [`ApiServerDouble::start`], or run the `tether-apiserver-double`
//! binary, which prints `listening http://127.0.0.1:PORT` and is controlled over HTTP under
//! `/_double/` (see below).
//!
//! # Control endpoints
//!
//! Not part of the Kubernetes API; neither counted nor delayed:
//!
//! - `GET /_double/stats` → `{"requests": {"list ipleases": 3, ...}, "resourceVersion": "17", "ipleases": 5, "pods": 2}`
//! - `POST /_double/reset` → zero the request counters
//! - `POST /_double/config` with any of `{"latencyMs": 2, "crdInstalled": false, "forbid": [["create", "ipleases"], ["list", "pods", "kube-system"]], "allowAll": true}`
//!   (a third element limits a forbid to that namespace)
//! - `PUT /_double/pods` with a pod object → stored pod; `DELETE /_double/pods/NS/NAME`
//! - `PUT /_double/nodes` with a node object; `DELETE /_double/nodes/NAME`
//! - `POST /_double/expire` → every open watch ends with a `410 Expired` ERROR event

// Handlers return an early HTTP response as their error; its size does not matter here.
#![allow(clippy::result_large_err)]

mod access_review; // SelfSubjectAccessReview
mod control; // the /_double/ endpoints
mod crd; // the IPLease CRD object
mod double; // ApiServerDouble: start, address, kubeconfig, every test-control method
mod knobs; // latency, 403 checks and message, request counters (as requests read them)
mod kubeconfig; // kubeconfig_for
mod leases; // IPLease create, replace, delete and validation
pub mod object_meta; // uids, timestamps, the object-name rule
mod objects; // kinds, stored objects, resourceVersion, event history
mod pods_nodes; // pods and nodes the test writes
pub mod query; // query-string decoding, continue-token encoding
mod read; // GET and LIST (selectors, pages, resourceVersion)
mod response; // JSON bodies, Status errors, request bodies as JSON objects
mod routing; // request → verb, resource, knobs → handler
pub mod selector; // label and field selectors
mod server; // Options, the accept loop
mod shared; // the state every connection shares
mod target; // path → target
mod watch; // WATCH streams, expiring them

pub use double::ApiServerDouble;
pub use kubeconfig::{PLACEHOLDER_CA_PEM_BASE64, kubeconfig_for};
pub use server::Options;

/// API group of the lease resource.
pub const GROUP: &str = "ipam.tether.dev";
/// API version of the lease resource.
pub const VERSION: &str = "v1alpha1";
/// Plural (resource) name.
pub const PLURAL: &str = "ipleases";
/// Kind.
pub const KIND: &str = "IPLease";
/// Name of the CRD object.
pub const CRD_NAME: &str = "ipleases.ipam.tether.dev";
/// Kubernetes version the double claims to be.
pub const FAKE_VERSION: &str = "v1.33.0-tether-double";
