//! The `IPLease` custom resource: one cluster-scoped object per address of a uniqueness domain
//! (the cluster, or an isolated fabric), its CRD (generated from this type into
//! `deploy/crds/ipleases.yaml`) and the object naming rules.

use std::net::IpAddr;

use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group.
pub const GROUP: &str = "ipam.tether.dev";
/// API version.
pub const VERSION: &str = "v1alpha1";
/// Resource (plural) name.
pub const PLURAL: &str = "ipleases";
/// Name of the CRD object, `ipleases.ipam.tether.dev`.
pub const CRD_NAME: &str = "ipleases.ipam.tether.dev";
/// Where the CRD manifest lives in the repository.
pub const CRD_MANIFEST: &str = "deploy/crds/ipleases.yaml";
/// Label carrying the (label-safe form of the) network name, for listing one network.
pub const NETWORK_LABEL: &str = "ipam.tether.dev/network";
/// Label carrying the (label-safe form of the) holder's node name, when known.
pub const NODE_LABEL: &str = "ipam.tether.dev/node";
/// Label carrying the (label-safe form of the) holder pod's `namespace.name`, when known: the
/// index by pod identity that finds a re-created pod's sticky address in one LIST.
pub const POD_LABEL: &str = "ipam.tether.dev/pod";
/// Label (value `"true"`) of a mirror: a copy of a lease under the name tether gave it before
/// uniqueness domains (`<network>.<address>`, see [`network_object_name`]), written beside it
/// while a tether-ipam of that time may still run somewhere, so that it sees the address as
/// taken. An older tether rewrites the labels of what it writes, so a mirror it took over loses
/// the label and is its lease again.
pub const MIRROR_LABEL: &str = "ipam.tether.dev/mirror";

/// State of a lease record.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum LeasePhase {
    /// Held by its attachment.
    Leased,
    /// Released at `releasedAt`; kept for the cooldown and for sticky re-use by the same pod name.
    Released,
    /// A conflict probe found `quarantine.mac` answering for the address at `quarantine.at`.
    Quarantined,
}

/// The pod behind the attachment (from the CNI arguments `K8S_POD_*`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
pub struct PodInfo {
    /// Namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub namespace: Option<String>,
    /// Pod name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub name: Option<String>,
    /// Pod UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub uid: Option<String>,
}

/// Evidence of an address conflict.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct Quarantine {
    /// Link-layer address that answered the conflict probe.
    #[schemars(length(min = 1, max = 128))]
    pub mac: String,
    /// When the conflict was seen (RFC 3339).
    #[schemars(extend("format" = "date-time"))]
    pub at: String,
}

/// One leased (or released, or quarantined) address of a uniqueness domain, whichever network
/// (NAD) handed it out. The object is named <address> (IPv6 with '-' for ':'), or
/// <address>.<fabric> in an isolated fabric, so creating it is the allocation: a second claimant,
/// of any network, gets 409 AlreadyExists. Written only by tether-ipam.
// kube's `printcolumn(...)` repeats keys by design.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ipam.tether.dev",
    version = "v1alpha1",
    kind = "IPLease",
    plural = "ipleases",
    singular = "iplease",
    shortname = "iplease",
    category = "tether",
    derive = "PartialEq",
    doc = "One address of a uniqueness domain (the cluster, or an isolated fabric): which network's pod leases it, \
           or since when it is released or quarantined. Named <address> (or <address>.<fabric>); written by the \
           tether-ipam CNI plugin, one create per allocation.",
    selectable = ".spec.network",
    selectable = ".spec.node",
    printcolumn(name = "Network", type_ = "string", json_path = ".spec.network"),
    printcolumn(
        name = "Fabric",
        type_ = "string",
        json_path = ".spec.isolatedFabric",
        priority = "1"
    ),
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.address"),
    printcolumn(name = "Pod", type_ = "string", json_path = ".spec.pod.name"),
    printcolumn(
        name = "Namespace",
        type_ = "string",
        json_path = ".spec.pod.namespace",
        priority = "1"
    ),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.node"),
    printcolumn(name = "State", type_ = "string", json_path = ".spec.state"),
    printcolumn(
        name = "Since",
        type_ = "date",
        json_path = ".spec.since",
        priority = "1"
    ),
    printcolumn(
        name = "Container",
        type_ = "string",
        json_path = ".spec.containerID",
        priority = "1"
    ),
    printcolumn(
        name = "Interface",
        type_ = "string",
        json_path = ".spec.ifname",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("self.state != 'Quarantined' || has(self.quarantine)").message("a Quarantined lease needs quarantine.mac and quarantine.at"))]
#[x_kube(validation = Rule::new("self.state != 'Released' || has(self.releasedAt)").message("a Released lease needs releasedAt"))]
#[serde(rename_all = "camelCase")]
pub struct IPLeaseSpec {
    /// Network name of the (last) holder (`ipam.network_name`, default the network
    /// configuration's `name`). It changes when a released address goes to a pod of another
    /// network of the domain.
    #[schemars(length(min = 1, max = 253))]
    pub network: String,
    /// The isolated fabric (`ipam.isolated_fabric`) this address is unique in; absent: the
    /// cluster, shared by every network that names none. Absent also on records named
    /// <network>.<address> (written before uniqueness domains, and their mirrors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 40),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("isolatedFabric is immutable"))]
    pub isolated_fabric: Option<String>,
    /// The address, in canonical text form.
    #[schemars(length(min = 2, max = 45), regex(pattern = r"^[0-9a-f:.]+$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("address is immutable"))]
    pub address: String,
    /// Prefix length handed out with the address.
    #[schemars(range(min = 0, max = 128), extend("format" = "int32"))]
    pub prefix_length: u8,
    /// Index of the range entry (`range`, then `ipRanges`) the address was allocated from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1024), extend("format" = "int32"))]
    pub range_index: Option<u32>,
    /// `CNI_CONTAINERID` of the (last) holder.
    #[serde(rename = "containerID")]
    #[schemars(length(max = 1024))]
    pub container_id: String,
    /// `CNI_IFNAME` of the (last) holder.
    #[schemars(length(max = 64))]
    pub ifname: String,
    /// The (last) holder's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodInfo>,
    /// Node of the (last) holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub node: Option<String>,
    /// `Leased`, `Released` or `Quarantined`.
    pub state: LeasePhase,
    /// When the record entered its current state (RFC 3339).
    #[schemars(extend("format" = "date-time"))]
    pub since: String,
    /// When a `Released` lease was released (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub released_at: Option<String>,
    /// Conflict evidence of a `Quarantined` lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<Quarantine>,
}

/// The CRD manifest as committed in `deploy/crds/ipleases.yaml`.
pub fn crd_yaml() -> String {
    let crd = IPLease::crd();
    let body = serde_saphyr::to_string(&crd).expect("a CRD serialises to YAML");
    format!(
        "# Generated from crates/kube-store/src/crd.rs by `cargo run -p tether-kube-store --bin tether-gen-crd`.\n\
         # Do not edit: a test fails when this file and the Rust type differ.\n\
         # Install: kubectl apply -f {CRD_MANIFEST}\n\
         ---\n{body}"
    )
}

// ----- names ------------------------------------------------------------------------------------

/// Ends in `-` and 16 lowercase hex digits, like our hashed forms do.
fn looks_hashed(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 17
        && b[b.len() - 17] == b'-'
        && b[b.len() - 16..]
            .iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// `s` mapped through `keep` (other characters become `-`), trimmed so it starts and ends
/// alphanumeric, cut to 46 bytes, then `-` and the 16-hex-digit hash of the original: at most 63
/// bytes, a valid DNS label and label value.
fn hashed(s: &str, keep: impl Fn(char) -> Option<char>) -> String {
    let mapped: String = s.chars().map(|c| keep(c).unwrap_or('-')).collect();
    let mut t: &str = mapped.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if t.len() > 46 {
        t = &t[..46]; // ASCII only after mapping
        t = t.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    }
    let base = if t.is_empty() { "x" } else { t };
    format!(
        "{base}-{:016x}",
        tether_stable_hash::fnv1a64(s.as_bytes(), 0)
    )
}

/// The network part of an object name: the network name itself when it is already a DNS label
/// (`[a-z0-9-]`, at most 63 bytes, alphanumeric at both ends) and does not end like a hashed
/// form; otherwise a sanitised prefix plus `-<16 hex digits of a hash of the name>`. Valid names
/// and hashed forms never collide (hashed forms all end like one, valid ones never do).
pub fn network_part(network: &str) -> String {
    let b = network.as_bytes();
    let valid = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric();
    if valid && !looks_hashed(network) {
        return network.to_string();
    }
    hashed(network, |c| {
        let c = c.to_ascii_lowercase();
        (c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-').then_some(c)
    })
}

/// The address part of an object name: IPv4 as is (`10.0.0.5`), IPv6 in canonical form with
/// `:` → `-` and a `0` added where it would start or end with `-` (`::1` → `0--1`,
/// `fd00::` → `fd00--0`). Canonical IPv6 text never starts with `0::` or ends with `::0`, so the
/// mapping stays injective.
pub fn address_part(address: IpAddr) -> String {
    match address {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => {
            let mut s = a.to_string().replace(':', "-");
            if s.starts_with('-') {
                s.insert(0, '0');
            }
            if s.ends_with('-') {
                s.push('0');
            }
            s
        }
    }
}

/// Object name of the lease of `address` in its uniqueness domain: `<address part>` in the
/// cluster-wide domain (`10.20.30.6`, `fd00--5`), `<address part>.<fabric>` in an isolated fabric
/// (`10.20.30.6.rail-3`). A fabric is a DNS label starting with a letter that does not read as
/// IPv6 (tether-pool checks), so these names are distinct from each other and from every
/// [`network_object_name`]: an IPv4 name of the cluster has exactly three dots and ends in a digit,
/// an IPv6 one has no dot (an IPv4-mapped one ends in its IPv4 part), and a fabric's ends in a
/// part that starts with a letter and is no address part.
pub fn object_name(domain: Option<&str>, address: IpAddr) -> String {
    match domain {
        None => address_part(address),
        Some(f) => format!("{}.{}", address_part(address), fabric_part(f)),
    }
}

/// The fabric part of an object name: the fabric as tether-pool admits it (a lowercase DNS label
/// starting with a letter), else a hashed form of the same shape, so a name is always valid.
fn fabric_part(fabric: &str) -> String {
    let b = fabric.as_bytes();
    let valid = !b.is_empty()
        && b.len() <= 40
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1].is_ascii_alphanumeric()
        && fabric
            .replace('-', ":")
            .parse::<std::net::Ipv6Addr>()
            .is_err()
        && !looks_hashed(fabric);
    if valid {
        return fabric.to_string();
    }
    // Ends like a hashed form, which no fabric taken as it is does.
    format!(
        "f-{:016x}",
        tether_stable_hash::fnv1a64(fabric.as_bytes(), 0)
    )
}

/// The name tether gave the lease of `address` in `network` before uniqueness domains:
/// `<network part>.<address part>`. Records of that time, and their mirrors (see
/// [`MIRROR_LABEL`]), carry it. The network part has no dot and every address part contains one
/// (IPv4) or a `-` and no leading dot (IPv6), so distinct (network, address) pairs get distinct
/// names (up to 64-bit hash collisions between sanitised network names, which fail safe: the
/// second network sees the address as taken).
pub fn network_object_name(network: &str, address: IpAddr) -> String {
    format!("{}.{}", network_part(network), address_part(address))
}

/// A label value standing for `s`: `s` itself when it is a valid label value (at most 63 bytes of
/// `[A-Za-z0-9._-]`, alphanumeric at both ends) not ending like a hashed form, else a sanitised
/// prefix plus a hash. Lists filter on the spec as well, so a collision only costs bandwidth.
pub fn label_value(s: &str) -> String {
    let b = s.as_bytes();
    let valid = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric();
    if valid && !looks_hashed(s) {
        return s.to_string();
    }
    hashed(s, |c| {
        (c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')).then_some(c)
    })
}

/// Label selector for the leases of `network`.
pub fn network_selector(network: &str) -> String {
    format!("{NETWORK_LABEL}={}", label_value(network))
}

/// The [`POD_LABEL`] value of the pod `namespace`/`name` (`.` cannot occur in a namespace, so
/// the pair is unambiguous).
pub fn pod_label_value(namespace: &str, name: &str) -> String {
    label_value(&format!("{namespace}.{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn dns_subdomain(name: &str) -> bool {
        !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|l| {
                let b = l.as_bytes();
                !b.is_empty()
                    && b.iter()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                    && b[0].is_ascii_alphanumeric()
                    && b[b.len() - 1].is_ascii_alphanumeric()
            })
    }

    fn label_ok(v: &str) -> bool {
        let b = v.as_bytes();
        b.len() <= 63
            && (b.is_empty()
                || (b
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
                    && b[0].is_ascii_alphanumeric()
                    && b[b.len() - 1].is_ascii_alphanumeric()))
    }

    #[test]
    fn names_are_valid_and_readable() {
        let a: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(
            network_object_name("macvlan-conf", a),
            "macvlan-conf.10.1.2.3"
        );
        assert_eq!(object_name(None, a), "10.1.2.3");
        assert_eq!(object_name(Some("rail-3"), a), "10.1.2.3.rail-3");
        assert_eq!(
            object_name(Some("rail-3"), "fd00::5".parse().unwrap()),
            "fd00--5.rail-3"
        );
        assert!(object_name(Some("Rail_3"), a).starts_with("10.1.2.3.f-"));
        assert!(object_name(Some("fd00--5"), a).starts_with("10.1.2.3.f-"));
        assert_eq!(address_part("::1".parse().unwrap()), "0--1");
        assert_eq!(address_part("fd00::".parse().unwrap()), "fd00--0");
        assert_eq!(address_part("fd00::5".parse().unwrap()), "fd00--5");
        assert_eq!(address_part("::".parse().unwrap()), "0--0");
        assert_eq!(
            address_part("::ffff:1.2.3.4".parse().unwrap()),
            "0--ffff-1.2.3.4"
        );
        let n = network_object_name("GPU_Net.prod/1", "fd00:1:2::a".parse().unwrap());
        assert!(n.starts_with("gpu-net-prod-1-"), "{n}");
        assert!(n.ends_with(".fd00-1-2--a"), "{n}");
        let long = "n".repeat(300);
        for net in [
            "a",
            "A",
            "-a",
            "a-",
            ".",
            "",
            "ñ",
            &long,
            "x-0123456789abcdef",
            "sriov_net",
        ] {
            for addr in [
                "0.0.0.0",
                "255.255.255.255",
                "::",
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                "::ffff:255.255.255.255",
            ] {
                let name = network_object_name(net, addr.parse().unwrap());
                assert!(dns_subdomain(&name), "{net:?} {addr} → {name:?}");
                assert!(name.len() <= 253);
                for fabric in [None, Some(net)] {
                    let name = object_name(fabric, addr.parse().unwrap());
                    assert!(dns_subdomain(&name), "{fabric:?} {addr} → {name:?}");
                }
            }
            let l = label_value(net);
            assert!(label_ok(&l), "{net:?} → {l:?}");
        }
        assert_eq!(label_value("sriov_net.A"), "sriov_net.A");
        assert_eq!(network_selector("n1"), "ipam.tether.dev/network=n1");
    }

    #[test]
    fn names_are_injective() {
        // Networks that sanitise alike, a valid name that looks hashed, IPv4 vs IPv6.
        let nets = [
            "net",
            "NET",
            "Net",
            "net-",
            "net_",
            "n.et",
            "n-et",
            "x",
            "-",
            "",
            "a-b",
            "a_b",
            "a.b",
            "net-0123456789abcdef",
        ];
        let addrs = [
            "10.0.0.1",
            "::a00:1",
            "::ffff:10.0.0.1",
            "::1",
            "1::",
            "0:0:1::1",
            "1:2:3:4:5:6:7:8",
        ];
        let mut names = HashSet::new();
        let mut labels = HashSet::new();
        for n in nets {
            assert!(labels.insert(label_value(n)), "label of {n:?} collides");
            for a in addrs {
                let name = network_object_name(n, a.parse().unwrap());
                assert!(names.insert(name.clone()), "{n:?} {a} collides: {name}");
            }
        }
        // The names of a domain's records are none of those, and distinct across domains.
        let fabrics = [
            None,
            Some("rail-3"),
            Some("a"),
            Some("x"),
            Some("net"),
            Some("fd00--5"),
            Some("a-b"),
        ];
        for f in fabrics {
            for a in addrs {
                let name = object_name(f, a.parse().unwrap());
                assert!(names.insert(name.clone()), "{f:?} {a} collides: {name}");
            }
        }
        // A valid name that happens to end like a hashed form is hashed too.
        assert_ne!(network_part("net-0123456789abcdef"), "net-0123456789abcdef");
    }

    #[test]
    fn crd_shape() {
        let crd = IPLease::crd();
        assert_eq!(crd.metadata.name.as_deref(), Some(CRD_NAME));
        assert_eq!(crd.spec.scope, "Cluster");
        let v = &crd.spec.versions[0];
        let cols: Vec<&str> = v
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        for c in ["Network", "Address", "Pod", "Node", "State", "Age"] {
            assert!(cols.contains(&c), "{cols:?}");
        }
        let yaml = crd_yaml();
        assert!(yaml.contains("x-kubernetes-validations"), "{yaml}");
        assert!(yaml.contains("self == oldSelf"));
    }
}
