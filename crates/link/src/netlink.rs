//! rtnetlink operations, each bound to one network namespace.
//!
//! A netlink socket belongs to the netns of the thread that opened it, so a handle for the pod netns is
//! opened on a thread that entered it (see [`NetNs::run`]) and then used from anywhere. All calls are
//! synchronous on a shared current-thread tokio runtime: a CNI plugin does a handful of round trips and
//! exits, so there is nothing to overlap.

use std::net::IpAddr;
use std::rc::Rc;

use futures_util::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};
use netlink_packet_route::link::{InfoData, InfoIpVlan, InfoKind, IpVlanFlags, IpVlanMode, LinkAttribute, LinkFlags, LinkInfo as NlLinkInfo, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteScope};
use rtnetlink::{Handle, LinkIpVlan, LinkUnspec, RouteMessageBuilder};
use tokio::runtime::Runtime;

use crate::netns::{NetNs, NetnsError};

pub const ENODEV: i32 = libc::ENODEV;
pub const EEXIST: i32 = libc::EEXIST;

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("cannot start the netlink runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot open a netlink socket: {0}")]
    Socket(std::io::Error),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// The kernel refused `op`; `errno` is positive (e.g. libc::EEXIST).
    #[error("{op}: {}", std::io::Error::from_raw_os_error(*errno))]
    Kernel { op: String, errno: i32 },
    #[error("{op}: {msg}")]
    Protocol { op: String, msg: String },
}

impl NetlinkError {
    /// The errno the kernel answered with, if it answered with one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    fn from_rt(op: impl Into<String>, e: rtnetlink::Error) -> Self {
        match e {
            rtnetlink::Error::NetlinkError(m) => NetlinkError::Kernel { op: op.into(), errno: m.raw_code().abs() },
            other => NetlinkError::Protocol { op: op.into(), msg: other.to_string() },
        }
    }
}

/// The ipvlan modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpvlanMode {
    L2,
    L3,
    L3s,
}

/// ipvlan flags: bridge (the default, no flag bit), private, vepa.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IpvlanFlag {
    #[default]
    Bridge,
    Private,
    Vepa,
}

/// What tether needs to know about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: Option<Vec<u8>>,
    pub mtu: Option<u32>,
    pub up: bool,
    /// `IFLA_INFO_KIND`, e.g. "ipvlan", "veth", "macvlan".
    pub kind: Option<String>,
    pub ipvlan_mode: Option<IpvlanMode>,
    pub ipvlan_flag: Option<IpvlanFlag>,
    /// `IFLA_LINK`: the parent's index (in the parent's netns).
    pub parent_index: Option<u32>,
}

impl Link {
    /// MAC as `aa:bb:cc:dd:ee:ff`.
    pub fn mac_string(&self) -> Option<String> {
        self.mac.as_ref().map(|m| format_mac(m))
    }
}

pub fn format_mac(m: &[u8]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// An address on a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub index: u32,
    pub address: IpNet,
    pub tentative: bool,
    pub dad_failed: bool,
}

/// A route as tether sets and checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    pub priority: Option<u32>,
    pub table: Option<u32>,
}

/// A netlink handle bound to one netns.
pub struct Netlink {
    rt: Rc<Runtime>,
    handle: Handle,
}

impl Netlink {
    /// A runtime to share between the handles of one invocation.
    pub fn runtime() -> Result<Rc<Runtime>, NetlinkError> {
        tokio::runtime::Builder::new_current_thread().enable_io().build().map(Rc::new).map_err(NetlinkError::Runtime)
    }

    /// A handle in the caller's netns.
    pub fn current(rt: &Rc<Runtime>) -> Result<Netlink, NetlinkError> {
        let _guard = rt.enter();
        let (conn, handle, _) = rtnetlink::new_connection().map_err(NetlinkError::Socket)?;
        rt.spawn(conn);
        Ok(Netlink { rt: rt.clone(), handle })
    }

    /// A handle whose socket lives in `ns`.
    pub fn in_netns(rt: &Rc<Runtime>, ns: &NetNs) -> Result<Netlink, NetlinkError> {
        let rt_handle = rt.handle().clone();
        let (conn, handle) = ns.run(move || {
            let _guard = rt_handle.enter();
            rtnetlink::new_connection().map(|(c, h, _)| (c, h))
        })?
        .map_err(NetlinkError::Socket)?;
        rt.spawn(conn);
        Ok(Netlink { rt: rt.clone(), handle })
    }

    fn block<T>(&self, f: impl Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    /// The link called `name`, or None.
    pub fn link_by_name(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        let mut req = std::pin::pin!(self.handle.link().get().match_name(name.to_string()).execute());
        match self.block(req.try_next()) {
            Ok(Some(m)) => Ok(Some(parse_link(&m))),
            Ok(None) => Ok(None),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code().abs() == ENODEV => Ok(None),
            Err(e) => Err(NetlinkError::from_rt(format!("looking up link {name:?}"), e)),
        }
    }

    pub fn link_by_index(&self, index: u32) -> Result<Option<Link>, NetlinkError> {
        let mut req = std::pin::pin!(self.handle.link().get().match_index(index).execute());
        match self.block(req.try_next()) {
            Ok(Some(m)) => Ok(Some(parse_link(&m))),
            Ok(None) => Ok(None),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code().abs() == ENODEV => Ok(None),
            Err(e) => Err(NetlinkError::from_rt(format!("looking up link #{index}"), e)),
        }
    }

    /// Every link in this netns.
    pub fn links(&self) -> Result<Vec<Link>, NetlinkError> {
        let msgs: Vec<LinkMessage> = self
            .block(self.handle.link().get().execute().try_collect())
            .map_err(|e| NetlinkError::from_rt("listing links", e))?;
        Ok(msgs.iter().map(parse_link).collect())
    }

    /// Create an ipvlan on `parent` (an index in this handle's netns), straight into `target` when given.
    pub fn create_ipvlan(
        &self,
        name: &str,
        parent: u32,
        mode: IpvlanMode,
        flag: IpvlanFlag,
        mtu: Option<u32>,
        target: Option<&NetNs>,
    ) -> Result<(), NetlinkError> {
        let mode = match mode {
            IpvlanMode::L2 => IpVlanMode::L2,
            IpvlanMode::L3 => IpVlanMode::L3,
            IpvlanMode::L3s => IpVlanMode::L3S,
        };
        let mut b = LinkIpVlan::new(name, parent, mode);
        b = match flag {
            IpvlanFlag::Bridge => b,
            IpvlanFlag::Private => b.flag(IpVlanFlags::Private),
            IpvlanFlag::Vepa => b.flag(IpVlanFlags::Vepa),
        };
        if let Some(m) = mtu {
            b = b.mtu(m);
        }
        if let Some(ns) = target {
            b = b.setns_by_fd(ns.raw_fd());
        }
        self.block(self.handle.link().add(b.build()).execute())
            .map_err(|e| NetlinkError::from_rt(format!("creating ipvlan {name:?} on link #{parent}"), e))
    }

    pub fn rename(&self, index: u32, name: &str) -> Result<(), NetlinkError> {
        let msg = LinkUnspec::new_with_index(index).name(name.to_string()).build();
        self.block(self.handle.link().set(msg).execute())
            .map_err(|e| NetlinkError::from_rt(format!("renaming link #{index} to {name:?}"), e))
    }

    pub fn set_up(&self, index: u32) -> Result<(), NetlinkError> {
        let msg = LinkUnspec::new_with_index(index).up().build();
        self.block(self.handle.link().set(msg).execute())
            .map_err(|e| NetlinkError::from_rt(format!("setting link #{index} up"), e))
    }

    pub fn set_down(&self, index: u32) -> Result<(), NetlinkError> {
        let msg = LinkUnspec::new_with_index(index).down().build();
        self.block(self.handle.link().set(msg).execute())
            .map_err(|e| NetlinkError::from_rt(format!("setting link #{index} down"), e))
    }

    /// Delete a link; Ok(false) when it was already gone.
    pub fn delete_link(&self, index: u32) -> Result<bool, NetlinkError> {
        match self.block(self.handle.link().del(index).execute()) {
            Ok(()) => Ok(true),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code().abs() == ENODEV => Ok(false),
            Err(e) => Err(NetlinkError::from_rt(format!("deleting link #{index}"), e)),
        }
    }

    pub fn add_address(&self, index: u32, addr: IpNet) -> Result<(), NetlinkError> {
        self.block(self.handle.address().add(index, addr.addr(), addr.prefix_len()).execute())
            .map_err(|e| NetlinkError::from_rt(format!("adding address {addr} to link #{index}"), e))
    }

    /// Addresses on link `index` (both families).
    pub fn addresses(&self, index: u32) -> Result<Vec<Address>, NetlinkError> {
        let msgs: Vec<_> = self
            .block(self.handle.address().get().set_link_index_filter(index).execute().try_collect())
            .map_err(|e| NetlinkError::from_rt(format!("listing addresses of link #{index}"), e))?;
        Ok(msgs
            .iter()
            .filter(|m| m.header.index == index)
            .filter_map(|m| {
                let ip = m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Address(ip) => Some(*ip),
                    _ => None,
                })?;
                // The 32-bit IFA_FLAGS attribute supersedes the 8-bit header field when present.
                let (tentative, dad_failed) = match m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Flags(f) => Some(*f),
                    _ => None,
                }) {
                    Some(f) => (f.contains(AddressFlags::Tentative), f.contains(AddressFlags::Dadfailed)),
                    None => (
                        m.header.flags.contains(AddressHeaderFlags::Tentative),
                        m.header.flags.contains(AddressHeaderFlags::Dadfailed),
                    ),
                };
                Some(Address { index, address: IpNet::new(ip, m.header.prefix_len).ok()?, tentative, dad_failed })
            })
            .collect())
    }

    pub fn add_route(&self, route: &Route) -> Result<(), NetlinkError> {
        let op = || format!("adding route to {}{}", route.dst, route.gateway.map(|g| format!(" via {g}")).unwrap_or_default());
        // The builder's error type is not exported; only its text matters here.
        fn bad<E: std::fmt::Display>(op: String) -> impl FnOnce(E) -> NetlinkError {
            move |e| NetlinkError::Protocol { op, msg: e.to_string() }
        }
        let mut b = RouteMessageBuilder::<IpAddr>::new().destination_prefix(route.dst.addr(), route.dst.prefix_len()).map_err(bad(op()))?;
        match route.gateway {
            Some(gw) => b = b.gateway(gw).map_err(bad(op()))?,
            // A route without a gateway is on-link.
            None => b = b.scope(RouteScope::Link),
        }
        if let Some(oif) = route.oif {
            b = b.output_interface(oif);
        }
        if let Some(p) = route.priority {
            b = b.priority(p);
        }
        if let Some(t) = route.table {
            b = b.table_id(t);
        }
        self.block(self.handle.route().add(b.build()).execute()).map_err(|e| NetlinkError::from_rt(op(), e))
    }

    /// Routes of one family in every table.
    pub fn routes(&self, family: AddressFamily) -> Result<Vec<Route>, NetlinkError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family;
        let msgs: Vec<RouteMessage> = self
            .block(self.handle.route().get(msg).execute().try_collect())
            .map_err(|e| NetlinkError::from_rt("listing routes", e))?;
        Ok(msgs.iter().filter_map(parse_route).collect())
    }

    /// Routes of both families.
    pub fn all_routes(&self) -> Result<Vec<Route>, NetlinkError> {
        let mut r = self.routes(AddressFamily::Inet)?;
        r.extend(self.routes(AddressFamily::Inet6)?);
        Ok(r)
    }

    /// The interface of the first main-table IPv4 default route, as the reference plugin picks it.
    pub fn default_route_link(&self) -> Result<Option<Link>, NetlinkError> {
        let routes = self.routes(AddressFamily::Inet)?;
        let main = libc::RT_TABLE_MAIN as u32;
        let Some(oif) = routes.iter().filter(|r| r.dst.prefix_len() == 0 && r.table.unwrap_or(main) == main).find_map(|r| r.oif) else {
            return Ok(None);
        };
        self.link_by_index(oif)
    }
}

fn parse_link(m: &LinkMessage) -> Link {
    let mut l = Link {
        index: m.header.index,
        name: String::new(),
        mac: None,
        mtu: None,
        up: m.header.flags.contains(LinkFlags::Up),
        kind: None,
        ipvlan_mode: None,
        ipvlan_flag: None,
        parent_index: None,
    };
    for a in &m.attributes {
        match a {
            LinkAttribute::IfName(n) => l.name = n.clone(),
            LinkAttribute::Address(mac) => l.mac = Some(mac.clone()),
            LinkAttribute::Mtu(mtu) => l.mtu = Some(*mtu),
            LinkAttribute::Link(p) => l.parent_index = Some(*p),
            LinkAttribute::LinkInfo(infos) => {
                for i in infos {
                    match i {
                        NlLinkInfo::Kind(k) => l.kind = Some(kind_name(k)),
                        NlLinkInfo::Data(InfoData::IpVlan(d)) => {
                            l.ipvlan_flag = Some(IpvlanFlag::Bridge);
                            for x in d {
                                match x {
                                    InfoIpVlan::Mode(IpVlanMode::L2) => l.ipvlan_mode = Some(IpvlanMode::L2),
                                    InfoIpVlan::Mode(IpVlanMode::L3) => l.ipvlan_mode = Some(IpvlanMode::L3),
                                    InfoIpVlan::Mode(IpVlanMode::L3S) => l.ipvlan_mode = Some(IpvlanMode::L3s),
                                    InfoIpVlan::Flags(f) if f.contains(IpVlanFlags::Private) => l.ipvlan_flag = Some(IpvlanFlag::Private),
                                    InfoIpVlan::Flags(f) if f.contains(IpVlanFlags::Vepa) => l.ipvlan_flag = Some(IpvlanFlag::Vepa),
                                    _ => {}
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    l
}

fn kind_name(k: &InfoKind) -> String {
    match k {
        InfoKind::IpVlan => "ipvlan".into(),
        InfoKind::MacVlan => "macvlan".into(),
        InfoKind::Veth => "veth".into(),
        InfoKind::Bridge => "bridge".into(),
        InfoKind::Dummy => "dummy".into(),
        InfoKind::Vlan => "vlan".into(),
        InfoKind::Other(s) => s.clone(),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

fn parse_route(m: &RouteMessage) -> Option<Route> {
    let family_zero = match m.header.address_family {
        AddressFamily::Inet => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        AddressFamily::Inet6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    let mut dst = family_zero;
    let mut r = Route { dst: IpNet::new(family_zero, 0).ok()?, gateway: None, oif: None, priority: None, table: Some(u32::from(m.header.table)) };
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = route_ip(d)?,
            RouteAttribute::Gateway(g) => r.gateway = route_ip(g),
            RouteAttribute::Oif(i) => r.oif = Some(*i),
            RouteAttribute::Priority(p) => r.priority = Some(*p),
            RouteAttribute::Table(t) => r.table = Some(*t),
            _ => {}
        }
    }
    r.dst = IpNet::new(dst, m.header.destination_prefix_length).ok()?;
    Some(r)
}
