//! The lease record: one per address of a uniqueness domain ([`Scope`]).

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The Kubernetes pod behind an attachment, from `K8S_POD_NAMESPACE`, `K8S_POD_NAME` and
/// `K8S_POD_UID`. All optional: cnitool and plain runtimes send none of them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct PodRef {
    /// Namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Pod name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Pod UID (changes when a pod of the same name is recreated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

impl PodRef {
    /// A pod reference with all three fields.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
    ) -> PodRef {
        PodRef {
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
        }
    }

    /// Same namespace and name, both known (a StatefulSet pod keeps its name across UIDs).
    pub fn same_name(&self, other: &PodRef) -> bool {
        self.namespace.is_some()
            && self.name.is_some()
            && self.namespace == other.namespace
            && self.name == other.name
    }

    /// Same namespace, name and UID, all known: the very same pod object.
    pub fn same_pod(&self, other: &PodRef) -> bool {
        self.same_name(other) && self.uid.is_some() && self.uid == other.uid
    }
}

impl fmt::Display for PodRef {
    /// `namespace/name`, or `(unknown pod)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.namespace, &self.name) {
            (Some(ns), Some(n)) => write!(f, "{ns}/{n}"),
            (None, Some(n)) => write!(f, "{n}"),
            _ => f.write_str("(unknown pod)"),
        }
    }
}

/// State of a lease record.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LeaseState {
    /// Held by its attachment.
    Leased,
    /// Released at `at` (unix seconds); kept for cooldown and sticky re-use.
    Released {
        /// When it was released.
        at: u64,
    },
    /// A conflict probe found `mac` answering for the address at `at`; not offered before
    /// `at + quarantine_s`.
    Quarantined {
        /// MAC address that answered.
        mac: String,
        /// When the conflict was seen.
        at: u64,
    },
}

/// Where an allocation in one network looks: the network itself, and the uniqueness domain its
/// addresses belong to.
///
/// An address is held by at most one record per domain, whichever network handed it out: two
/// networks (NADs) whose ranges overlap share the record of an address in both. The default domain
/// (`None`) is the cluster, shared by every network that does not name another; a network names
/// one with `ipam.isolated_fabric`, for a fabric that shares no segment with the rest and reuses
/// their address space (a per-rail switch, say).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Scope {
    /// The network (`ipam.network_name`, default the configuration's `name`).
    pub network: String,
    /// The isolated fabric whose addresses are unique among themselves; `None`: the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

impl Scope {
    /// The scope of `network` in `domain`.
    pub fn new(network: impl Into<String>, domain: Option<String>) -> Scope {
        Scope {
            network: network.into(),
            domain,
        }
    }

    /// The scope of `network` in the cluster-wide domain.
    pub fn cluster(network: impl Into<String>) -> Scope {
        Scope::new(network, None)
    }
}

impl fmt::Display for Scope {
    /// `network` or `network (isolated fabric f)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.domain {
            None => f.write_str(&self.network),
            Some(d) => write!(f, "{} (isolated fabric {d})", self.network),
        }
    }
}

/// One record per (domain, address): the store keeps one holder per address of a uniqueness
/// domain, whichever network (NAD) handed it out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Network name (`ipam.network_name`) of the (last) holder's attachment.
    pub network: String,
    /// The uniqueness domain (see [`Scope`]): `None` is the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// The address.
    pub address: IpAddr,
    /// Prefix length handed out with it.
    pub prefix_len: u8,
    /// Index of the range entry it was allocated from, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_index: Option<usize>,
    /// `CNI_CONTAINERID` of the (last) holder.
    pub container_id: String,
    /// `CNI_IFNAME` of the (last) holder.
    pub ifname: String,
    /// The (last) holder's pod.
    #[serde(default)]
    pub pod: PodRef,
    /// Node name of the holder, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// State.
    pub state: LeaseState,
    /// When the record entered its current state (unix seconds).
    pub since: u64,
    /// Opaque version set by the store (file: a counter; Kubernetes: resourceVersion).
    /// `None` on records not yet stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl Lease {
    /// Does this record belong to attachment (`container_id`, `ifname`)?
    pub fn is_attachment(&self, container_id: &str, ifname: &str) -> bool {
        self.container_id == container_id && self.ifname == ifname
    }

    /// Is the record in state [`LeaseState::Leased`]?
    pub fn is_leased(&self) -> bool {
        self.state == LeaseState::Leased
    }

    /// `address/prefix_len`.
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.address, self.prefix_len)
    }

    /// The scope of the record's holder: its network, in its domain.
    pub fn scope(&self) -> Scope {
        Scope::new(self.network.clone(), self.domain.clone())
    }

    /// Is the record in `domain`?
    pub fn in_domain(&self, domain: Option<&str>) -> bool {
        self.domain.as_deref() == domain
    }
}

/// The first 12 characters of a container ID, as people read one (`crictl` does the same). A
/// record's ID is whatever its writer put there, so this cuts on a character boundary.
pub fn short_id(id: &str) -> &str {
    id.char_indices().nth(12).map_or(id, |(i, _)| &id[..i])
}

/// One entry of `cni.dev/valid-attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    /// Container ID.
    #[serde(rename = "containerID")]
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
}

impl Attachment {
    /// Build one.
    pub fn new(container_id: impl Into<String>, ifname: impl Into<String>) -> Attachment {
        Attachment {
            container_id: container_id.into(),
            ifname: ifname.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::short_id;

    #[test]
    fn short_ids_cut_on_a_character_boundary() {
        assert_eq!(short_id("0123456789abcdef"), "0123456789ab");
        assert_eq!(short_id("c1"), "c1");
        // A record written by hand or by a hostile node: never a panic.
        assert_eq!(short_id("ééééééééééééé"), "éééééééééééé");
        assert_eq!(short_id("01234567890é"), "01234567890é");
    }
}
