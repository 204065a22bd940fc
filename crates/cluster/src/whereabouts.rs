//! whereabouts' own records of what it handed out, read for `tether import-whereabouts`: its
//! `IPPool` objects (one per range, every allocation of the range in `spec.allocations`) and its
//! `OverlappingRangeIPReservation` objects (one per address), both namespaced in
//! `whereabouts.cni.cncf.io/v1alpha1`. Only the fields the import needs are kept.
//!
//! | call | request |
//! |---|---|
//! | [`Cluster::whereabouts_pools`] | LIST ippools, of one namespace or all, consistent pages |
//! | [`Cluster::whereabouts_reservations`] | LIST overlappingrangeipreservations, the same way |
//!
//! Consistent pages (never the watch cache): an allocation whereabouts made a moment ago must be
//! seen, or tether could hand its address out. A page holds at most the client's `page_size`
//! objects, and an IPPool can be as large as etcd's request limit (1.5 MB), so the import asks
//! for small pages. An object that does not parse (someone else's write) is returned as
//! [`Unreadable`] instead of failing the list.

// KubeStoreError is large by design (it carries what the operator needs); this is not a hot path.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::cluster::Cluster;
use tether_kube_store::KubeStoreError;
use tether_kube_store::listing::ListRequest;

/// The API group and version of whereabouts' resources.
pub const WHEREABOUTS_API: &str = "/apis/whereabouts.cni.cncf.io/v1alpha1";
/// whereabouts' namespace when its kubeconfig's context names none (`kube-system`).
pub const WHEREABOUTS_DEFAULT_NAMESPACE: &str = "kube-system";

/// One entry of an IPPool's `spec.allocations`: who holds the address at that offset.
#[derive(Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolAllocation {
    /// `id`: the holder's `CNI_CONTAINERID`.
    #[serde(default)]
    pub id: String,
    /// `podref`: `namespace/name` of the holder's pod.
    #[serde(default)]
    pub podref: String,
    /// `ifname`: the holder's `CNI_IFNAME`; empty on entries older than whereabouts PR #471.
    #[serde(default)]
    pub ifname: String,
}

/// An IPPool: a range and its allocations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhereaboutsPool {
    /// Namespace (whereabouts': its kubeconfig context's, default `kube-system`).
    pub namespace: String,
    /// Name: `[<network_name>-]<range with ':' and '/' as '-'>`.
    pub name: String,
    /// `spec.range`: a CIDR; allocation keys are offsets from its address.
    pub range: String,
    /// `spec.allocations`: decimal offset → holder, as stored (keys not checked here).
    pub allocations: BTreeMap<String, PoolAllocation>,
}

/// An OverlappingRangeIPReservation: one address, named after it, and its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhereaboutsReservation {
    /// Namespace.
    pub namespace: String,
    /// Name: `[<network_name>-]<address with ':' as '-'>`.
    pub name: String,
    /// `spec.podref`: `namespace/name`.
    pub podref: String,
    /// `spec.ifname` (may be empty).
    pub ifname: String,
    /// `spec.containerid` (whereabouts does not write it: usually empty).
    pub container_id: String,
}

/// An object of a whereabouts list that did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// `namespace/name`, or what is known of it.
    pub object: String,
    /// Why.
    pub reason: String,
}

/// What a whereabouts list gave: the objects, and those that did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhereaboutsList<T> {
    /// The objects read.
    pub items: Vec<T>,
    /// The objects skipped.
    pub unreadable: Vec<Unreadable>,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct PoolSpec {
    range: String,
    #[serde(default)]
    allocations: Option<BTreeMap<String, PoolAllocation>>,
}

#[derive(Deserialize)]
struct PoolObject {
    #[serde(default)]
    metadata: Meta,
    spec: PoolSpec,
}

#[derive(Deserialize)]
struct ReservationSpec {
    #[serde(default)]
    podref: String,
    #[serde(default)]
    ifname: String,
    #[serde(default)]
    containerid: String,
}

#[derive(Deserialize)]
struct ReservationObject {
    #[serde(default)]
    metadata: Meta,
    spec: ReservationSpec,
}

impl From<PoolObject> for WhereaboutsPool {
    fn from(o: PoolObject) -> WhereaboutsPool {
        WhereaboutsPool {
            namespace: o.metadata.namespace,
            name: o.metadata.name,
            range: o.spec.range,
            allocations: o.spec.allocations.unwrap_or_default(),
        }
    }
}

impl From<ReservationObject> for WhereaboutsReservation {
    fn from(o: ReservationObject) -> WhereaboutsReservation {
        WhereaboutsReservation {
            namespace: o.metadata.namespace,
            name: o.metadata.name,
            podref: o.spec.podref,
            ifname: o.spec.ifname,
            container_id: o.spec.containerid,
        }
    }
}

/// The collection path of whereabouts' `plural` in `namespace` (`None`: every namespace).
fn collection(plural: &str, namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) => format!("{WHEREABOUTS_API}/namespaces/{ns}/{plural}"),
        None => format!("{WHEREABOUTS_API}/{plural}"),
    }
}

impl Cluster {
    /// The IPPools of `namespace` (`None`: every namespace). `Ok(None)`: the resource is not
    /// served (whereabouts' CRDs are not installed).
    pub fn whereabouts_pools(
        &self,
        namespace: Option<&str>,
    ) -> Result<Option<WhereaboutsList<WhereaboutsPool>>, KubeStoreError> {
        self.whereabouts_list::<PoolObject, _>("ippools", namespace)
    }

    /// The OverlappingRangeIPReservations of `namespace` (`None`: every namespace). `Ok(None)`:
    /// the resource is not served.
    pub fn whereabouts_reservations(
        &self,
        namespace: Option<&str>,
    ) -> Result<Option<WhereaboutsList<WhereaboutsReservation>>, KubeStoreError> {
        self.whereabouts_list::<ReservationObject, _>("overlappingrangeipreservations", namespace)
    }

    /// Every object of whereabouts' `plural`, each parsed on its own (`O`), kept as `T`.
    fn whereabouts_list<O: DeserializeOwned, T: From<O>>(
        &self,
        plural: &str,
        namespace: Option<&str>,
    ) -> Result<Option<WhereaboutsList<T>>, KubeStoreError> {
        let path = collection(plural, namespace);
        let what = match namespace {
            Some(ns) => format!("LIST of {plural} in namespace {ns}"),
            None => format!("LIST of {plural} in every namespace"),
        };
        let resource = format!("{plural}.whereabouts.cni.cncf.io");
        let req = ListRequest {
            path: &path,
            what: &what,
            resource: Some(&resource),
            labels: None,
            fields: None,
            metadata_only: false,
            cache: None,
            max_bytes: None,
        };
        let mut out = WhereaboutsList {
            items: Vec::new(),
            unreadable: Vec::new(),
        };
        let listed = self.api().list_each(&req, |items: Vec<Value>, fresh| {
            if fresh {
                out.items.clear();
                out.unreadable.clear();
            }
            for v in items {
                match read_one::<O>(v) {
                    Ok(o) => out.items.push(T::from(o)),
                    Err(u) => out.unreadable.push(u),
                }
            }
        });
        match listed {
            Ok(_) => Ok(Some(out)),
            Err(KubeStoreError::Api { code: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Parse one listed object, or say which one did not parse and why.
fn read_one<O: DeserializeOwned>(v: Value) -> Result<O, Unreadable> {
    let text = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("?");
    let object = format!("{}/{}", text("/metadata/namespace"), text("/metadata/name"));
    serde_json::from_value(v).map_err(|e| Unreadable {
        object,
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_read_as_whereabouts_writes_them_and_bad_ones_are_named() {
        let pool = json!({"metadata": {"namespace": "kube-system", "name": "wbn-fd00-203---125"},
            "spec": {"range": "fd00:203::/125",
                     "allocations": {"1": {"id": "ctr1", "ifname": "net2", "podref": "ml/p1"},
                                     "2": {"id": "ctr2", "podref": "ml/p2"}}}});
        let p = WhereaboutsPool::from(read_one::<PoolObject>(pool).unwrap());
        assert_eq!(
            (p.name.as_str(), p.range.as_str()),
            ("wbn-fd00-203---125", "fd00:203::/125")
        );
        assert_eq!(p.allocations["1"].ifname, "net2");
        assert_eq!(
            p.allocations["2"].ifname, "",
            "entries before PR #471 have none"
        );
        let r = json!({"metadata": {"namespace": "kube-system", "name": "10.203.9.1"},
                       "spec": {"ifname": "net1", "podref": "ml/p1"}});
        let r = WhereaboutsReservation::from(read_one::<ReservationObject>(r).unwrap());
        assert_eq!((r.podref.as_str(), r.container_id.as_str()), ("ml/p1", ""));
        let bad = json!({"metadata": {"namespace": "x", "name": "broken"}, "spec": {"range": 5}});
        let u = read_one::<PoolObject>(bad).err().unwrap();
        assert_eq!(u.object, "x/broken");
        assert_eq!(
            collection("ippools", Some("kube-system")),
            "/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/kube-system/ippools"
        );
    }
}
