//! Every way the attacher fails, and where each becomes a CNI error code, STATUS's not-ready
//! answers included.

use std::path::PathBuf;

use tether_cni::{CniError, code};
use tether_link::{NetlinkError, NetnsError};

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// Already a CNI error: a config problem found by the protocol core, or the IPAM plugin's own error,
    /// which must reach the runtime unchanged.
    #[error("{0}")]
    Cni(CniError),
    #[error("{0}")]
    Config(String),
    /// STATUS: the attacher could not serve an ADD now, for this reason.
    #[error("{0}")]
    NotReady(String),
    /// A field the runtime asked for that an ipvlan slave cannot honour.
    #[error(
        "{field} {value:?} cannot be honoured: an ipvlan interface always has its master's MAC address; remove the MAC from the pod's network selection"
    )]
    Unsupported { field: &'static str, value: String },
    #[error("master interface {name:?} does not exist {place}")]
    MasterMissing { name: String, place: &'static str },
    /// The master exists but cannot carry traffic: a pod attached now would start with a dead
    /// interface (and an address no probe could vouch for), so ADD waits for the link instead.
    #[error(
        "master interface {name:?} {place} is {state}: a pod attached to it would have no network; \
         {remedy}. The kubelet retries the pod by itself once the link is up"
    )]
    MasterDown {
        name: String,
        place: &'static str,
        state: &'static str,
        remedy: String,
    },
    #[error(
        "no master: \"master\" is not set and {place} has no IPv4 default route to take it from; set \"master\" in the network config"
    )]
    NoDefaultRoute { place: &'static str },
    #[error(
        "mtu {mtu} is larger than the MTU {master_mtu} of master {master:?}; use at most {master_mtu} or leave mtu out to inherit it"
    )]
    MtuTooLarge {
        mtu: u32,
        master: String,
        master_mtu: u32,
    },
    #[error("an interface named {ifname:?} already exists in the pod network namespace {netns}")]
    IfnameExists { ifname: String, netns: PathBuf },
    #[error("CNI_NETNS {path} does not exist")]
    NetnsMissing { path: PathBuf },
    #[error("CNI_NETNS: {0}")]
    NetnsInvalid(NetnsError),
    #[error("{0}")]
    Netns(NetnsError),
    #[error("{0}")]
    Kernel(#[from] NetlinkError),
    #[error("IPAM plugin {plugin:?} returned no addresses")]
    NoAddresses { plugin: String },
    #[error(
        "no \"ipam\" section and no prevResult with addresses: ipam is required unless tether-ipvlan is chained after a plugin that assigns addresses"
    )]
    IpamRequired,
    #[error(
        "IPv6 address {address} failed duplicate address detection on {ifname}: another host on the segment uses it"
    )]
    DadFailed { address: String, ifname: String },
    #[error(
        "IPv6 address {address} on {ifname} is still tentative after {waited_ms} ms of duplicate address detection"
    )]
    DadTimeout {
        address: String,
        ifname: String,
        waited_ms: u64,
    },
    #[error("CHECK: {0}")]
    Check(String),
}

impl From<NetnsError> for AttachError {
    fn from(e: NetnsError) -> Self {
        AttachError::Netns(e)
    }
}

impl AttachError {
    pub fn code(&self) -> u32 {
        match self {
            AttachError::Cni(e) => e.code,
            AttachError::Config(_)
            | AttachError::MasterMissing { .. }
            | AttachError::NoDefaultRoute { .. }
            | AttachError::MtuTooLarge { .. }
            | AttachError::IpamRequired => code::INVALID_CONFIG,
            AttachError::Unsupported { .. } => code::UNSUPPORTED_FIELD,
            AttachError::IfnameExists { .. } | AttachError::NetnsInvalid(_) => code::INVALID_ENV,
            AttachError::NetnsMissing { .. } => code::UNKNOWN_CONTAINER,
            AttachError::Netns(_) | AttachError::Kernel(_) | AttachError::DadTimeout { .. } => {
                code::KERNEL
            }
            AttachError::NoAddresses { .. } => code::DELEGATE_FAILED,
            AttachError::MasterDown { .. } => code::TRY_AGAIN_LATER,
            AttachError::NotReady(_) => code::NOT_AVAILABLE,
            AttachError::DadFailed { .. } => code::ADDRESS_IN_USE,
            AttachError::Check(_) => code::CHECK_FAILED,
        }
    }
}

impl From<AttachError> for CniError {
    fn from(e: AttachError) -> CniError {
        match e {
            AttachError::Cni(c) => c,
            other => CniError::new(other.code(), other.to_string()),
        }
    }
}

/// STATUS: the IPAM plugin's own not-ready answer (50, 51) goes through as it is; any other failure
/// of it means this network cannot serve an ADD now (50).
pub fn ipam_not_ready(plugin: &str, e: CniError) -> CniError {
    match e.code {
        code::NOT_AVAILABLE | code::NOT_AVAILABLE_LIMITED => e,
        _ => CniError::new(
            code::NOT_AVAILABLE,
            format!("IPAM {plugin} is not ready: {}", e.msg),
        )
        .with_details(e.details),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_answers_are_not_ready_codes() {
        let limited = CniError::new(code::NOT_AVAILABLE_LIMITED, "range full");
        assert_eq!(
            ipam_not_ready("tether-ipam", limited).code,
            code::NOT_AVAILABLE_LIMITED
        );
        let store = ipam_not_ready("tether-ipam", CniError::new(code::STORE, "unreachable"));
        assert_eq!(store.code, code::NOT_AVAILABLE);
        assert_eq!(store.msg, "IPAM tether-ipam is not ready: unreachable");
        let ours = CniError::from(AttachError::NotReady("no master".into()));
        assert_eq!(
            (ours.code, ours.msg.as_str()),
            (code::NOT_AVAILABLE, "no master")
        );
    }
}
