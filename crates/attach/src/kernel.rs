//! The seam between the attacher's logic and the kernel: the link operations ADD, DEL, CHECK and
//! STATUS make on one netns's netlink socket. Production passes a [`Netlink`]; the unit tests pass
//! a recording fake (`fake_kernel.rs`), so ADD, rollback, DEL's cleanup, CHECK's comparisons and
//! the DAD wait are tested without root. Sysctls and announcements go through `PodSide`
//! (`configure.rs`); opening netns and IPAM delegation stay outside both seams.

use ipnet::IpNet;
use tether_link::{Address, IpvlanFlag, IpvlanMode, Link, NetNs, Netlink, NetlinkError, Route};

/// The link operations on one netns, with [`Netlink`]'s signatures and meaning.
pub(crate) trait LinkOps {
    fn link_by_name(&self, name: &str) -> Result<Option<Link>, NetlinkError>;
    fn link_by_index(&self, index: u32) -> Result<Option<Link>, NetlinkError>;
    /// The interface of the first main-table IPv4 default route.
    fn default_route_link(&self) -> Result<Option<Link>, NetlinkError>;
    /// Create an ipvlan on `parent` (an index in this netns), straight into `target` when given.
    fn create_ipvlan(
        &self,
        name: &str,
        parent: u32,
        mode: IpvlanMode,
        flag: IpvlanFlag,
        mtu: Option<u32>,
        target: Option<&NetNs>,
    ) -> Result<(), NetlinkError>;
    fn rename(&self, index: u32, name: &str) -> Result<(), NetlinkError>;
    fn set_up(&self, index: u32) -> Result<(), NetlinkError>;
    /// Ok(false) when the link was already gone.
    fn delete_link(&self, index: u32) -> Result<bool, NetlinkError>;
    fn add_address(&self, index: u32, addr: IpNet, nodad: bool) -> Result<(), NetlinkError>;
    fn addresses(&self, index: u32) -> Result<Vec<Address>, NetlinkError>;
    fn add_route(&self, route: &Route) -> Result<(), NetlinkError>;
    /// Routes of both families in every table.
    fn all_routes(&self) -> Result<Vec<Route>, NetlinkError>;
}

// Each method calls the inherent one of the same name (inherent methods win the path lookup).
impl LinkOps for Netlink {
    fn link_by_name(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        Netlink::link_by_name(self, name)
    }

    fn link_by_index(&self, index: u32) -> Result<Option<Link>, NetlinkError> {
        Netlink::link_by_index(self, index)
    }

    fn default_route_link(&self) -> Result<Option<Link>, NetlinkError> {
        Netlink::default_route_link(self)
    }

    fn create_ipvlan(
        &self,
        name: &str,
        parent: u32,
        mode: IpvlanMode,
        flag: IpvlanFlag,
        mtu: Option<u32>,
        target: Option<&NetNs>,
    ) -> Result<(), NetlinkError> {
        Netlink::create_ipvlan(self, name, parent, mode, flag, mtu, target)
    }

    fn rename(&self, index: u32, name: &str) -> Result<(), NetlinkError> {
        Netlink::rename(self, index, name)
    }

    fn set_up(&self, index: u32) -> Result<(), NetlinkError> {
        Netlink::set_up(self, index)
    }

    fn delete_link(&self, index: u32) -> Result<bool, NetlinkError> {
        Netlink::delete_link(self, index)
    }

    fn add_address(&self, index: u32, addr: IpNet, nodad: bool) -> Result<(), NetlinkError> {
        Netlink::add_address(self, index, addr, nodad)
    }

    fn addresses(&self, index: u32) -> Result<Vec<Address>, NetlinkError> {
        Netlink::addresses(self, index)
    }

    fn add_route(&self, route: &Route) -> Result<(), NetlinkError> {
        Netlink::add_route(self, route)
    }

    fn all_routes(&self) -> Result<Vec<Route>, NetlinkError> {
        Netlink::all_routes(self)
    }
}
