//! `Lease` ↔ `IPLease`, and lease LISTs decoded object by object.
//!
//! An object's name says what it is ([`Naming`]): `<address>[.<fabric>]` is a record of a
//! uniqueness domain, the only kind this tether writes for an allocation; `<network>.<address>`
//! is a record a tether before uniqueness domains wrote, or the mirror this one writes beside a
//! domain's record while such a tether may still run ([`MIRROR_LABEL`]). A lease read from a
//! network-named object carries that in its version (`<uid>/<rv>/by-network` or
//! `<uid>/<rv>/mirror`), so a write through the store goes to the object it was read from.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;
use serde_json::Value;

use tether_leases::{Lease, LeaseState, PodRef};

use crate::crd::{
    IPLease, IPLeaseSpec, LeasePhase, MIRROR_LABEL, NETWORK_LABEL, NODE_LABEL, POD_LABEL, PodInfo,
    Quarantine, label_value, network_object_name, object_name, pod_label_value,
};
use crate::error::KubeStoreError;

/// Unix seconds → RFC 3339 (`2023-11-14T22:13:20Z`).
pub fn time_text(secs: u64) -> Result<String, String> {
    let s = i64::try_from(secs).map_err(|_| format!("time {secs} is out of range"))?;
    jiff::Timestamp::from_second(s)
        .map(|t| t.to_string())
        .map_err(|e| format!("time {secs} is out of range: {e}"))
}

/// The labels of a lease's object (its network, node and pod), which label selectors match: the
/// operator matches file-store leases against them too.
pub fn lease_labels(lease: &Lease) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    labels.insert(NETWORK_LABEL.to_string(), label_value(&lease.network));
    if let Some(n) = &lease.node {
        labels.insert(NODE_LABEL.to_string(), label_value(n));
    }
    if let (Some(ns), Some(name)) = (&lease.pod.namespace, &lease.pod.name) {
        labels.insert(POD_LABEL.to_string(), pod_label_value(ns, name));
    }
    labels
}

/// RFC 3339 → unix seconds (fractions dropped; times before 1970 are an error).
pub fn parse_time(text: &str) -> Result<u64, String> {
    let t: jiff::Timestamp = text
        .parse()
        .map_err(|e| format!("{text:?} is not an RFC 3339 time: {e}"))?;
    u64::try_from(t.as_second()).map_err(|_| format!("{text:?} is before 1970"))
}

/// What an object's name makes it (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// `<address>[.<fabric>]`: a record of a uniqueness domain.
    Domain,
    /// `<network>.<address>`, written by a tether before uniqueness domains: a lease of its own
    /// until the node-agent or the controller moves it into its domain.
    ByNetwork,
    /// `<network>.<address>` with [`MIRROR_LABEL`]: the copy of a domain's record kept for a
    /// tether of that time.
    Mirror,
}

impl Naming {
    fn suffix(self) -> Option<&'static str> {
        match self {
            Naming::Domain => None,
            Naming::ByNetwork => Some("by-network"),
            Naming::Mirror => Some("mirror"),
        }
    }
}

/// Which objects of a list or watch to keep, by what their names make them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kinds {
    /// The records of the uniqueness domains: what an allocation reads.
    Domain,
    /// Those and the leases named by network not yet moved: every lease someone holds, for the
    /// reconciler, the controller, the monitor and the CLI (mirrors would count each twice).
    Leases,
    /// Everything, mirrors included (moving records named by network into their domains).
    All,
}

impl Kinds {
    fn keeps(self, n: Naming) -> bool {
        match self {
            Kinds::Domain => n == Naming::Domain,
            Kinds::Leases => n != Naming::Mirror,
            Kinds::All => true,
        }
    }
}

/// The opaque `Lease::version`: `<uid>/<resourceVersion>`, and what named the object when it is
/// not a domain's record.
pub fn version_of(uid: &str, rv: &str, naming: Naming) -> String {
    match naming.suffix() {
        None => format!("{uid}/{rv}"),
        Some(s) => format!("{uid}/{rv}/{s}"),
    }
}

/// Split a `Lease::version` into (uid, resourceVersion).
pub fn split_version(v: &str) -> Option<(&str, &str)> {
    let (uid, rest) = v.split_once('/')?;
    let rv = rest.split_once('/').map_or(rest, |(rv, _)| rv);
    (!uid.is_empty() && !rv.is_empty()).then_some((uid, rv))
}

/// What named the object `lease` was read from (a lease never stored counts as a domain's).
pub fn naming_of(lease: &Lease) -> Naming {
    match lease
        .version
        .as_deref()
        .and_then(|v| v.splitn(3, '/').nth(2))
    {
        Some("by-network") => Naming::ByNetwork,
        Some("mirror") => Naming::Mirror,
        _ => Naming::Domain,
    }
}

/// The name of the object `lease` was read from, or that a new record of it gets.
pub fn name_of(lease: &Lease) -> String {
    match naming_of(lease) {
        Naming::Domain => object_name(lease.domain.as_deref(), lease.address),
        Naming::ByNetwork | Naming::Mirror => network_object_name(&lease.network, lease.address),
    }
}

/// The domain's object for `lease`; `meta` = (uid, resourceVersion) makes it a conditional
/// replace.
pub fn to_object(lease: &Lease, meta: Option<(&str, &str)>) -> Result<IPLease, KubeStoreError> {
    to_named_object(lease, meta, Naming::Domain)
}

/// The object for `lease` under the name `naming` gives it: the domain's, or the one named by
/// network (a mirror carries [`MIRROR_LABEL`]; neither carries the fabric, which that name
/// cannot hold).
pub fn to_named_object(
    lease: &Lease,
    meta: Option<(&str, &str)>,
    naming: Naming,
) -> Result<IPLease, KubeStoreError> {
    let err = |detail: String| KubeStoreError::Unrepresentable {
        network: lease.network.clone(),
        address: lease.address.to_string(),
        detail,
    };
    let (state, released_at, quarantine) = match &lease.state {
        LeaseState::Leased => (LeasePhase::Leased, None, None),
        LeaseState::Released { at } => (
            LeasePhase::Released,
            Some(time_text(*at).map_err(err)?),
            None,
        ),
        LeaseState::Quarantined { mac, at } => (
            LeasePhase::Quarantined,
            None,
            Some(Quarantine {
                mac: mac.clone(),
                at: time_text(*at).map_err(err)?,
            }),
        ),
    };
    let range_index = match lease.range_index {
        None => None,
        Some(i) => {
            Some(u32::try_from(i).map_err(|_| err(format!("range index {i} is too large")))?)
        }
    };
    let pod = (lease.pod != PodRef::default()).then(|| PodInfo {
        namespace: lease.pod.namespace.clone(),
        name: lease.pod.name.clone(),
        uid: lease.pod.uid.clone(),
    });
    let (name, fabric) = match naming {
        Naming::Domain => (
            object_name(lease.domain.as_deref(), lease.address),
            lease.domain.clone(),
        ),
        Naming::ByNetwork | Naming::Mirror => {
            (network_object_name(&lease.network, lease.address), None)
        }
    };
    let spec = IPLeaseSpec {
        network: lease.network.clone(),
        isolated_fabric: fabric,
        address: lease.address.to_string(),
        prefix_length: lease.prefix_len,
        range_index,
        container_id: lease.container_id.clone(),
        ifname: lease.ifname.clone(),
        pod,
        node: lease.node.clone(),
        state,
        since: time_text(lease.since).map_err(err)?,
        released_at,
        quarantine,
    };
    let mut obj = IPLease::new(&name, spec);
    let mut labels = lease_labels(lease);
    if naming == Naming::Mirror {
        labels.insert(MIRROR_LABEL.to_string(), "true".to_string());
    }
    obj.metadata.labels = Some(labels);
    if let Some((uid, rv)) = meta {
        obj.metadata.uid = Some(uid.to_string());
        obj.metadata.resource_version = Some(rv.to_string());
    }
    Ok(obj)
}

/// The lease an object stands for. Errors when the object is malformed or its name is none its
/// spec maps to (such an object is ignored: the store never writes it).
pub fn from_object(obj: &IPLease) -> Result<Lease, String> {
    read_object(obj).map(|(l, _)| l)
}

/// What the name of `obj` (`name`, for `address`) makes it; an error when its spec maps to
/// another name.
fn naming_by_name(obj: &IPLease, name: &str, address: IpAddr) -> Result<Naming, String> {
    let s = &obj.spec;
    let fabric = s.isolated_fabric.as_deref();
    if name == object_name(fabric, address) {
        return Ok(Naming::Domain);
    }
    if fabric.is_none() && name == network_object_name(&s.network, address) {
        let mirror = obj
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.get(MIRROR_LABEL).is_some_and(|v| v == "true"));
        return Ok(if mirror {
            Naming::Mirror
        } else {
            Naming::ByNetwork
        });
    }
    Err(format!(
        "IPLease {name} is for {} in {}, which tether names {}; ignoring it",
        s.address,
        tether_leases::domain_text(fabric),
        object_name(fabric, address)
    ))
}

/// The lease an object stands for, and what its name makes it.
pub fn read_object(obj: &IPLease) -> Result<(Lease, Naming), String> {
    let s = &obj.spec;
    let name = obj.metadata.name.as_deref().unwrap_or("");
    let address: IpAddr = s.address.parse().map_err(|_| {
        format!(
            "IPLease {name}: spec.address {:?} is not an IP address",
            s.address
        )
    })?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    if s.prefix_length > max {
        return Err(format!(
            "IPLease {name}: spec.prefixLength {} does not fit {} (at most {max})",
            s.prefix_length, s.address
        ));
    }
    let naming = naming_by_name(obj, name, address)?;
    let (Some(uid), Some(rv)) = (
        obj.metadata.uid.as_deref(),
        obj.metadata.resource_version.as_deref(),
    ) else {
        return Err(format!("IPLease {name} has no uid or resourceVersion"));
    };
    let t = |v: &str| parse_time(v).map_err(|e| format!("IPLease {name}: {e}"));
    let state = match s.state {
        LeasePhase::Leased => LeaseState::Leased,
        LeasePhase::Released => LeaseState::Released {
            at: t(s
                .released_at
                .as_deref()
                .ok_or_else(|| format!("IPLease {name}: Released without releasedAt"))?)?,
        },
        LeasePhase::Quarantined => {
            let q = s
                .quarantine
                .as_ref()
                .ok_or_else(|| format!("IPLease {name}: Quarantined without quarantine"))?;
            LeaseState::Quarantined {
                mac: q.mac.clone(),
                at: t(&q.at)?,
            }
        }
    };
    let pod = s
        .pod
        .as_ref()
        .map(|p| PodRef {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid: p.uid.clone(),
        })
        .unwrap_or_default();
    let lease = Lease {
        network: s.network.clone(),
        domain: s.isolated_fabric.clone(),
        address,
        prefix_len: s.prefix_length,
        range_index: s.range_index.map(|i| i as usize),
        container_id: s.container_id.clone(),
        ifname: s.ifname.clone(),
        pod,
        node: s.node.clone(),
        state,
        since: t(&s.since)?,
        version: Some(version_of(uid, rv, naming)),
    };
    Ok((lease, naming))
}

/// A list's `items`, `null` read as empty: a real API server answers an empty metadata-only list
/// with `"items": null`.
pub fn null_as_empty<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// One object of a lease LIST or WATCH. Each is parsed by itself, so a malformed one (someone
/// else's write) is skipped rather than failing the list, and its managedFields are dropped as it
/// is parsed: nothing here reads them, and they are a third of an object (the node-agent lists
/// whole networks).
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Lenient {
    Ok(IPLease),
    Bad {
        name: Option<String>,
        resource_version: Option<String>,
    },
}

impl<'de> Deserialize<'de> for Lenient {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Lenient, D::Error> {
        let mut v = Value::deserialize(d)?;
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
        let text = |v: &Value, at: &str| v.pointer(at).and_then(Value::as_str).map(str::to_string);
        Ok(match IPLease::deserialize(&v) {
            Ok(o) => Lenient::Ok(o),
            Err(_) => Lenient::Bad {
                name: text(&v, "/metadata/name"),
                resource_version: text(&v, "/metadata/resourceVersion"),
            },
        })
    }
}

impl crate::watching::Versioned for Lenient {
    fn resource_version(&self) -> Option<String> {
        match self {
            Lenient::Ok(o) => o.metadata.resource_version.clone(),
            Lenient::Bad {
                resource_version, ..
            } => resource_version.clone(),
        }
    }
}

/// Decode one page of a lease LIST into `out`: objects `keep` accepts, of the `kinds` wanted,
/// become leases; malformed objects (someone else's writes) are logged and skipped rather than
/// failing the whole call.
pub(crate) fn collect_leases(
    items: Vec<Lenient>,
    kinds: Kinds,
    keep: impl Fn(&IPLease) -> bool,
    out: &mut Vec<Lease>,
) {
    out.extend(
        items
            .into_iter()
            .filter_map(|item| lease_of(item, kinds, &keep)),
    );
}

/// One object of a lease LIST or WATCH as a lease, if `keep` accepts it and it is of the
/// `kinds` wanted; a malformed one is logged and `None`.
pub(crate) fn lease_of(
    item: Lenient,
    kinds: Kinds,
    keep: impl Fn(&IPLease) -> bool,
) -> Option<Lease> {
    match item {
        Lenient::Ok(o) if keep(&o) => match read_object(&o) {
            Ok((l, n)) => kinds.keeps(n).then_some(l),
            Err(e) => {
                log::warn!("{e}");
                None
            }
        },
        Lenient::Ok(_) => None,
        Lenient::Bad { name, .. } => {
            log::warn!(
                "ignoring malformed IPLease {}",
                name.as_deref().unwrap_or("?")
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(state: LeaseState) -> Lease {
        Lease {
            network: "Net_1".into(),
            domain: None,
            address: "fd00::7".parse().unwrap(),
            prefix_len: 64,
            range_index: Some(1),
            container_id: "c1".into(),
            ifname: "net1".into(),
            pod: PodRef::new("ns", "p", "u"),
            node: Some("node-a".into()),
            state,
            since: 1_700_000_000,
            version: None,
        }
    }

    #[test]
    fn round_trip() {
        for st in [
            LeaseState::Leased,
            LeaseState::Released { at: 1_700_000_100 },
            LeaseState::Quarantined {
                mac: "02:00:00:00:00:01".into(),
                at: 5,
            },
        ] {
            let l = lease(st);
            let mut o = to_object(&l, None).unwrap();
            assert_eq!(
                o.metadata.name.as_deref(),
                Some(object_name(None, l.address).as_str())
            );
            o.metadata.uid = Some("u1".into());
            o.metadata.resource_version = Some("42".into());
            let back = from_object(&o).unwrap();
            assert_eq!(back.version.as_deref(), Some("u1/42"));
            assert_eq!(
                Lease {
                    version: None,
                    ..back
                },
                l
            );
        }
        let mut bare = lease(LeaseState::Leased);
        bare.pod = PodRef::default();
        bare.node = None;
        bare.range_index = None;
        let mut o = to_object(&bare, Some(("u", "1"))).unwrap();
        assert!(o.spec.pod.is_none());
        o.metadata.name = Some("other".into());
        assert!(from_object(&o).unwrap_err().contains("ignoring"));
    }

    /// The name says what an object is, the version carries it, and a write goes back to the
    /// object read.
    #[test]
    fn names_of_domains_networks_and_mirrors() {
        let mut l = lease(LeaseState::Leased);
        l.domain = Some("rail-3".into());
        let o = to_object(&l, Some(("u", "7"))).unwrap();
        assert_eq!(o.metadata.name.as_deref(), Some("fd00--7.rail-3"));
        assert_eq!(o.spec.isolated_fabric.as_deref(), Some("rail-3"));
        let (back, n) = read_object(&o).unwrap();
        assert_eq!((n, back.version.as_deref()), (Naming::Domain, Some("u/7")));
        assert_eq!(back.domain.as_deref(), Some("rail-3"));
        assert_eq!(name_of(&back), "fd00--7.rail-3");

        l.domain = None;
        for (naming, suffix) in [
            (Naming::ByNetwork, "by-network"),
            (Naming::Mirror, "mirror"),
        ] {
            let o = to_named_object(&l, Some(("u", "8")), naming).unwrap();
            let name = network_object_name("Net_1", l.address);
            assert_eq!(o.metadata.name.as_deref(), Some(name.as_str()));
            assert!(o.spec.isolated_fabric.is_none());
            let labels = o.metadata.labels.clone().unwrap();
            assert_eq!(labels.contains_key(MIRROR_LABEL), naming == Naming::Mirror);
            let (back, n) = read_object(&o).unwrap();
            assert_eq!(n, naming);
            assert_eq!(
                back.version.as_deref(),
                Some(format!("u/8/{suffix}").as_str())
            );
            assert_eq!(naming_of(&back), naming);
            assert_eq!(name_of(&back), name);
            assert_eq!(
                split_version(back.version.as_deref().unwrap()),
                Some(("u", "8"))
            );
        }
        // A fabric under a name by network is no record of either kind.
        let mut o = to_named_object(&l, Some(("u", "9")), Naming::ByNetwork).unwrap();
        o.spec.isolated_fabric = Some("rail-3".into());
        assert!(read_object(&o).is_err());
        assert!(Kinds::Leases.keeps(Naming::ByNetwork) && !Kinds::Leases.keeps(Naming::Mirror));
        assert!(!Kinds::Domain.keeps(Naming::ByNetwork) && Kinds::All.keeps(Naming::Mirror));
    }

    /// A hand-edited object whose prefix cannot fit its family (seen: `prefixLength: 99` on IPv4
    /// made every ADD of that attachment fail with code 999) is refused as malformed.
    #[test]
    fn a_prefix_length_beyond_the_family_is_malformed() {
        let mut v4 = lease(LeaseState::Leased);
        v4.address = "10.1.2.9".parse().unwrap();
        v4.prefix_len = 24;
        for (l, bad) in [(v4, 33u8), (lease(LeaseState::Leased), 129)] {
            let mut o = to_object(&l, Some(("u", "1"))).unwrap();
            o.spec.prefix_length = bad;
            let e = from_object(&o).unwrap_err();
            assert!(
                e.contains("prefixLength") && e.contains("does not fit"),
                "{e}"
            );
            o.spec.prefix_length = l.prefix_len;
            assert_eq!(from_object(&o).unwrap().prefix_len, l.prefix_len);
        }
    }

    #[test]
    fn times() {
        assert_eq!(time_text(0).unwrap(), "1970-01-01T00:00:00Z");
        assert_eq!(parse_time("2023-11-14T22:13:20Z").unwrap(), 1_700_000_000);
        assert_eq!(
            parse_time("2023-11-14T23:13:20.5+01:00").unwrap(),
            1_700_000_000
        );
        assert!(time_text(u64::MAX).is_err());
        assert!(parse_time("1969-12-31T23:59:59Z").is_err());
        assert_eq!(split_version("a/1"), Some(("a", "1")));
        assert_eq!(split_version("a"), None);
    }
}
