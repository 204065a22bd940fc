//! Kernel plumbing for the attacher: network namespaces, rtnetlink, and per-interface sysctls.

pub mod netlink;
pub mod netns;
mod socket;
pub mod sysctl;

pub use netlink::{Address, IpvlanFlag, IpvlanMode, Link, Netlink, NetlinkError, Route};
pub use netns::{NetNs, NetnsError, NsThread};
