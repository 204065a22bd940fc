//! The lease store's lists across networks and nodes, for the reconciler, the CLI, the monitor
//! and the node-agent's lease service, and the per-pod path's lookup by pod label (a LIST on every
//! new ADD not answered by the lease service; else the per-pod path lists only to rebuild a node's
//! journal once; see the crate docs):
//!
//! | call | request |
//! |---|---|
//! | [`KubeStore::list_all`] | LIST ipleases (every network) |
//! | [`KubeStore::list_node`] | LIST ipleases `labelSelector=ipam.tether.dev/node=<node>` |
//! | [`KubeStore::list_node_label`] | LIST ipleases by a node label value |
//! | [`KubeStore::lease_node_labels`] | metadata-only LIST ipleases: node label → count |
//! | [`KubeStore::list_network_at`], [`KubeStore::watch_network`] | a network's records and their changes (the node-agent's lease service keeps them) |
//! | `by_pod_label` (the store's `LeaseStore::by_pod`) | LIST ipleases of a network naming a pod (the pod label), from the cache |
//!
//! With `list_from_cache` (the default; etcd 3.4 cannot serve consistent lists from the cache, so
//! a consistent one reads every IPLease of the cluster) each list is one request served from the
//! API server's watch cache: `resourceVersion=0` until the store has seen a resourceVersion, then
//! "not older than" the newest it has seen, so it reads its own writes
//! ([`KubeStore::lease_node_labels`] always at `resourceVersion=0`); else consistent pages of
//! `page_size`.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::core::Request;
use kube::core::params::WatchParams;
use serde::Deserialize;
use tether_leases::{Lease, PodRef};

use crate::convert::{Kinds, Lenient, collect_leases, lease_of};
use crate::crd::{
    IPLease, MIRROR_LABEL, NODE_LABEL, POD_LABEL, label_value, network_selector, pod_label_value,
};
use crate::error::KubeStoreError;
use crate::listing::ListRequest;
use crate::store::KubeStore;
use crate::watching::{Change, WatchEnd, WatchRequest};

/// A lease object reduced to its labels (a metadata-only list).
#[derive(Deserialize, Default)]
struct Labels {
    #[serde(default)]
    metadata: LabelsMeta,
}

#[derive(Deserialize, Default)]
struct LabelsMeta {
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

impl KubeStore {
    /// Every lease of every network, for `tether leases` without `--network` (records named by
    /// network not moved yet included, their mirrors not). Malformed objects are skipped with a
    /// warning.
    pub fn list_all(&self) -> Result<Vec<Lease>, KubeStoreError> {
        self.list_every(Kinds::Leases)
    }

    /// The leases whose objects match the label `selector` (`tether leases -l`), mirrors not
    /// included; the API server checks the selector.
    pub fn list_matching(&self, selector: &str) -> Result<Vec<Lease>, KubeStoreError> {
        self.list_selected(
            Some(selector),
            "LIST of ipleases by label",
            Kinds::Leases,
            |_| true,
        )
    }

    /// Every record of the `kinds` wanted.
    pub fn list_every(&self, kinds: Kinds) -> Result<Vec<Lease>, KubeStoreError> {
        self.list_selected(None, "LIST of ipleases of every network", kinds, |_| true)
    }

    /// The mirrors kept under network names (label [`MIRROR_LABEL`]): what is left to delete
    /// once no tether from before uniqueness domains runs, without reading every lease.
    pub fn list_mirrors(&self) -> Result<Vec<Lease>, KubeStoreError> {
        let sel = format!("{MIRROR_LABEL}=true");
        self.list_selected(Some(&sel), "LIST of mirrored ipleases", Kinds::All, |_| {
            true
        })
    }

    /// The leases recorded for `node` (label selector on the node label, then `spec.node ==
    /// node`), as [`KubeStore::list_all`] has them.
    pub fn list_node(&self, node: &str) -> Result<Vec<Lease>, KubeStoreError> {
        self.list_node_of(node, Kinds::Leases)
    }

    /// The records of the `kinds` wanted recorded for `node`.
    pub fn list_node_of(&self, node: &str, kinds: Kinds) -> Result<Vec<Lease>, KubeStoreError> {
        let sel = format!("{NODE_LABEL}={}", label_value(node));
        self.list_selected(
            Some(&sel),
            &format!("LIST of ipleases of node {node:?}"),
            kinds,
            |o| o.spec.node.as_deref() == Some(node),
        )
    }

    /// Every domain record of `network` (its label, then `spec.network`) with the list's
    /// resourceVersion, to watch from. An answer (a page) longer than `max_bytes` is
    /// [`KubeStoreError::TooLarge`], read no further.
    pub fn list_network_at(
        &self,
        network: &str,
        max_bytes: usize,
    ) -> Result<(Vec<Lease>, String), KubeStoreError> {
        self.list_network(network, Some(max_bytes))
    }

    /// Every domain record of `network` (its label, then `spec.network`) with the list's
    /// resourceVersion; no answer (page) longer than `max_bytes`.
    pub(crate) fn list_network(
        &self,
        network: &str,
        max_bytes: Option<usize>,
    ) -> Result<(Vec<Lease>, String), KubeStoreError> {
        self.list_selected_at(
            Some(&network_selector(network)),
            &format!("LIST of ipleases of network {network:?}"),
            Kinds::Domain,
            |o| o.spec.network == network,
            max_bytes,
        )
    }

    /// Watch the domain records of `network` from `resource_version` (of
    /// [`KubeStore::list_network_at`]), calling `f` per change, for at most `timeout` or until
    /// `keep_going()` turns false. Malformed objects, objects of another network under its
    /// label, and records named by network are skipped.
    pub fn watch_network(
        &self,
        network: &str,
        resource_version: &str,
        timeout: Duration,
        keep_going: &dyn Fn() -> bool,
        mut f: impl FnMut(Change<Lease>),
    ) -> Result<WatchEnd, KubeStoreError> {
        let what = format!("WATCH of ipleases of network {network:?}");
        let wp = WatchParams::default()
            .timeout(timeout.as_secs().clamp(1, 3600) as u32)
            .labels(&network_selector(network));
        let req = Request::new(&self.path)
            .watch(&wp, resource_version)
            .map_err(|e| self.api.protocol(&what, e.to_string()))?;
        let w = WatchRequest {
            req,
            what: &what,
            resource: None,
        };
        self.api.watch_each(
            w,
            resource_version,
            timeout,
            keep_going,
            |c: Change<Lenient>| {
                let (item, deleted) = match c {
                    Change::Upsert(i) => (i, false),
                    Change::Deleted(i) => (i, true),
                };
                if let Some(l) = lease_of(item, Kinds::Domain, |o| o.spec.network == network) {
                    let l = self.seen(l);
                    f(if deleted {
                        Change::Deleted(l)
                    } else {
                        Change::Upsert(l)
                    });
                }
            },
        )
    }

    /// The records of `network` naming `pod` (namespace and name; a pod without both names
    /// nothing): one LIST with the network's label and the pod's label, from the watch cache (see
    /// [`POD_LABEL`]). The API server scans every record of the group for it, so the node-agent
    /// answers it from the network's kept records instead. Records written before the label
    /// existed are not in it; the engine's walk still finds those.
    pub(crate) fn by_pod_label(
        &self,
        network: &str,
        pod: &PodRef,
    ) -> Result<Vec<Lease>, KubeStoreError> {
        let (Some(ns), Some(name)) = (pod.namespace.as_deref(), pod.name.as_deref()) else {
            return Ok(Vec::new());
        };
        let sel = format!(
            "{},{POD_LABEL}={}",
            network_selector(network),
            pod_label_value(ns, name)
        );
        let what = format!("LIST of ipleases of network {network:?} naming pod {ns}/{name}");
        self.list_selected(Some(&sel), &what, Kinds::Domain, |o| {
            o.spec.network == network
                && o.spec.pod.as_ref().is_some_and(|p| {
                    p.namespace.as_deref() == Some(ns) && p.name.as_deref() == Some(name)
                })
        })
    }

    /// The leases whose node label is `label` (a value from [`KubeStore::lease_node_labels`]),
    /// whatever their `spec.node`, as [`KubeStore::list_all`] has them.
    pub fn list_node_label(&self, label: &str) -> Result<Vec<Lease>, KubeStoreError> {
        let sel = format!("{NODE_LABEL}={label}");
        self.list_selected(
            Some(&sel),
            &format!("LIST of ipleases with node label {label:?}"),
            Kinds::Leases,
            |_| true,
        )
    }

    /// One LIST of leases (label `selector`, then `keep`, then the `kinds` wanted), from the
    /// watch cache not older than what this store has seen (so it reads its own writes), or in
    /// consistent pages.
    pub(crate) fn list_selected(
        &self,
        selector: Option<&str>,
        what: &str,
        kinds: Kinds,
        keep: impl Fn(&IPLease) -> bool,
    ) -> Result<Vec<Lease>, KubeStoreError> {
        self.list_selected_at(selector, what, kinds, keep, None)
            .map(|(l, _)| l)
    }

    /// [`KubeStore::list_selected`] and the list's resourceVersion; no answer (page) longer than
    /// `max_bytes`.
    fn list_selected_at(
        &self,
        selector: Option<&str>,
        what: &str,
        kinds: Kinds,
        keep: impl Fn(&IPLease) -> bool,
        max_bytes: Option<usize>,
    ) -> Result<(Vec<Lease>, String), KubeStoreError> {
        let mut out = Vec::new();
        let req = ListRequest {
            path: &self.path,
            what,
            resource: None,
            labels: selector,
            fields: None,
            metadata_only: false,
            cache: self.api.list_from_cache.then(|| self.cache_list_params()),
            max_bytes,
        };
        let rv = self.api.list_each(&req, |items: Vec<Lenient>, fresh| {
            if fresh {
                out.clear();
            }
            collect_leases(items, kinds, &keep, &mut out);
        })?;
        Ok((out, rv))
    }

    /// Node label values of every lease (metadata-only) with their lease counts. Leases
    /// without a node label are counted under `""`.
    pub fn lease_node_labels(&self) -> Result<BTreeMap<String, usize>, KubeStoreError> {
        let mut out = BTreeMap::new();
        let req = ListRequest {
            path: &self.path,
            what: "metadata-only LIST of ipleases",
            resource: None,
            labels: None,
            fields: None,
            metadata_only: true,
            cache: self.api.any_cached(),
            max_bytes: None,
        };
        self.api.list_each(&req, |items: Vec<Labels>, fresh| {
            if fresh {
                out.clear();
            }
            for item in items {
                let label = item
                    .metadata
                    .labels
                    .and_then(|mut l| l.remove(NODE_LABEL))
                    .unwrap_or_default();
                *out.entry(label).or_insert(0) += 1;
            }
        })?;
        Ok(out)
    }
}
