//! rtnetlink operations, each bound to one network namespace.
//!
//! A netlink socket belongs to the netns of the thread that opened it, so a handle for the pod netns is
//! opened on a thread that entered it (see [`NetNs::run`], [`NetNs::thread`]) and then used from
//! anywhere. Every call is one synchronous round trip on that socket (see `socket.rs`).

use std::net::IpAddr;

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::link::{
    InfoData, InfoIpVlan, InfoKind, IpVlanFlags, IpVlanMode, LinkAttribute, LinkExtentMask,
    LinkFlags, LinkInfo as NlLinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use crate::netns::{NetNs, NetnsError};
use crate::socket::{Failure, Socket};

pub const ENODEV: i32 = libc::ENODEV;
pub const EEXIST: i32 = libc::EEXIST;

#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
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

    fn new(op: impl Into<String>, f: Failure) -> Self {
        match f {
            Failure::Errno(errno) => NetlinkError::Kernel {
                op: op.into(),
                errno,
            },
            Failure::Io(e) => NetlinkError::Protocol {
                op: op.into(),
                msg: e.to_string(),
            },
            Failure::Protocol(msg) => NetlinkError::Protocol { op: op.into(), msg },
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
    /// `IFF_LOWER_UP`: the link has a carrier (a cable, a peer, a bond member that is up).
    pub carrier: bool,
    /// `IFLA_INFO_KIND`, e.g. "ipvlan", "veth", "macvlan".
    pub kind: Option<String>,
    pub ipvlan_mode: Option<IpvlanMode>,
    pub ipvlan_flag: Option<IpvlanFlag>,
    /// `IFLA_LINK`: the parent's index (in the parent's netns).
    pub parent_index: Option<u32>,
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
    sock: Socket,
}

impl Netlink {
    /// A handle in the calling thread's netns.
    pub fn current() -> Result<Netlink, NetlinkError> {
        Socket::open()
            .map(|sock| Netlink { sock })
            .map_err(NetlinkError::Socket)
    }

    /// A handle whose socket lives in `ns`, opened from a short-lived thread inside it.
    pub fn in_netns(ns: &NetNs) -> Result<Netlink, NetlinkError> {
        ns.run(Netlink::current)?
    }

    fn link_get(
        &self,
        msg: LinkMessage,
        what: impl FnOnce() -> String,
    ) -> Result<Option<Link>, NetlinkError> {
        match self.sock.request(RouteNetlinkMessage::GetLink(msg), 0) {
            Ok(v) => Ok(v.iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(parse_link(l)),
                _ => None,
            })),
            Err(Failure::Errno(ENODEV)) => Ok(None),
            Err(f) => Err(NetlinkError::new(what(), f)),
        }
    }

    /// The link called `name`, or None.
    pub fn link_by_name(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        // Counters are most of a link message and nobody here reads them.
        msg.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        self.link_get(msg, || format!("looking up link {name:?}"))
    }

    pub fn link_by_index(&self, index: u32) -> Result<Option<Link>, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        self.link_get(msg, || format!("looking up link #{index}"))
    }

    /// Every link in this netns.
    pub fn links(&self) -> Result<Vec<Link>, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.attributes
            .push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        let msgs = self
            .sock
            .dump(RouteNetlinkMessage::GetLink(msg))
            .map_err(|f| NetlinkError::new("listing links", f))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(parse_link(l)),
                _ => None,
            })
            .collect())
    }

    fn change(
        &self,
        msg: RouteNetlinkMessage,
        flags: u16,
        op: impl FnOnce() -> String,
    ) -> Result<(), NetlinkError> {
        self.sock
            .request(msg, flags)
            .map(|_| ())
            .map_err(|f| NetlinkError::new(op(), f))
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
        let mut data = vec![InfoIpVlan::Mode(match mode {
            IpvlanMode::L2 => IpVlanMode::L2,
            IpvlanMode::L3 => IpVlanMode::L3,
            IpvlanMode::L3s => IpVlanMode::L3S,
        })];
        match flag {
            IpvlanFlag::Bridge => {}
            IpvlanFlag::Private => data.push(InfoIpVlan::Flags(IpVlanFlags::Private)),
            IpvlanFlag::Vepa => data.push(InfoIpVlan::Flags(IpVlanFlags::Vepa)),
        }
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::Link(parent));
        if let Some(m) = mtu {
            msg.attributes.push(LinkAttribute::Mtu(m));
        }
        if let Some(ns) = target {
            msg.attributes.push(LinkAttribute::NetNsFd(ns.raw_fd()));
        }
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            NlLinkInfo::Kind(InfoKind::IpVlan),
            NlLinkInfo::Data(InfoData::IpVlan(data)),
        ]));
        self.change(
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            || format!("creating ipvlan {name:?} on link #{parent}"),
        )
    }

    pub fn rename(&self, index: u32, name: &str) -> Result<(), NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.change(RouteNetlinkMessage::SetLink(msg), 0, || {
            format!("renaming link #{index} to {name:?}")
        })
    }

    fn set_flag_up(&self, index: u32, up: bool) -> Result<(), NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.change_mask = LinkFlags::Up;
        if up {
            msg.header.flags = LinkFlags::Up;
        }
        self.change(RouteNetlinkMessage::SetLink(msg), 0, || {
            format!("setting link #{index} {}", if up { "up" } else { "down" })
        })
    }

    pub fn set_up(&self, index: u32) -> Result<(), NetlinkError> {
        self.set_flag_up(index, true)
    }

    pub fn set_down(&self, index: u32) -> Result<(), NetlinkError> {
        self.set_flag_up(index, false)
    }

    /// Delete a link; Ok(false) when it was already gone.
    pub fn delete_link(&self, index: u32) -> Result<bool, NetlinkError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        match self.sock.request(RouteNetlinkMessage::DelLink(msg), 0) {
            Ok(_) => Ok(true),
            Err(Failure::Errno(ENODEV)) => Ok(false),
            Err(f) => Err(NetlinkError::new(format!("deleting link #{index}"), f)),
        }
    }

    /// Add `addr` to link `index`. `nodad`: the address is known to be unique on the segment (tether-ipam
    /// probed it), so the kernel's duplicate address detection is skipped and it is usable at once.
    pub fn add_address(&self, index: u32, addr: IpNet, nodad: bool) -> Result<(), NetlinkError> {
        let mut msg = AddressMessage::default();
        msg.header.index = index;
        msg.header.prefix_len = addr.prefix_len();
        match addr.addr() {
            IpAddr::V4(v4) => {
                msg.header.family = AddressFamily::Inet;
                msg.attributes.push(AddressAttribute::Address(v4.into()));
                msg.attributes.push(AddressAttribute::Local(v4.into()));
                if let IpNet::V4(n) = addr
                    && n.prefix_len() < 31
                {
                    msg.attributes
                        .push(AddressAttribute::Broadcast(n.broadcast()));
                }
            }
            IpAddr::V6(v6) => {
                msg.header.family = AddressFamily::Inet6;
                msg.attributes.push(AddressAttribute::Address(v6.into()));
                msg.attributes.push(AddressAttribute::Local(v6.into()));
            }
        }
        if nodad {
            msg.attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        self.change(
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            || format!("adding address {addr} to link #{index}"),
        )
    }

    /// Addresses on link `index` (both families).
    pub fn addresses(&self, index: u32) -> Result<Vec<Address>, NetlinkError> {
        let mut req = AddressMessage::default();
        req.header.index = index;
        let msgs = self
            .sock
            .dump(RouteNetlinkMessage::GetAddress(req))
            .map_err(|f| NetlinkError::new(format!("listing addresses of link #{index}"), f))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) if a.header.index == index => Some(a),
                _ => None,
            })
            .filter_map(|m| {
                // IFA_LOCAL is the address itself; IFA_ADDRESS is the peer on point-to-point links.
                let ip = m
                    .attributes
                    .iter()
                    .find_map(|a| match a {
                        AddressAttribute::Local(ip) => Some(*ip),
                        _ => None,
                    })
                    .or_else(|| {
                        m.attributes.iter().find_map(|a| match a {
                            AddressAttribute::Address(ip) => Some(*ip),
                            _ => None,
                        })
                    })?;
                // The 32-bit IFA_FLAGS attribute supersedes the 8-bit header field when present.
                let (tentative, dad_failed) = match m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Flags(f) => Some(*f),
                    _ => None,
                }) {
                    Some(f) => (
                        f.contains(AddressFlags::Tentative),
                        f.contains(AddressFlags::Dadfailed),
                    ),
                    None => (
                        m.header.flags.contains(AddressHeaderFlags::Tentative),
                        m.header.flags.contains(AddressHeaderFlags::Dadfailed),
                    ),
                };
                Some(Address {
                    index,
                    address: IpNet::new(ip, m.header.prefix_len).ok()?,
                    tentative,
                    dad_failed,
                })
            })
            .collect())
    }

    pub fn add_route(&self, route: &Route) -> Result<(), NetlinkError> {
        let op = || {
            format!(
                "adding route to {}{}",
                route.dst,
                route
                    .gateway
                    .map(|g| format!(" via {g}"))
                    .unwrap_or_default()
            )
        };
        let family = match route.dst {
            IpNet::V4(_) => AddressFamily::Inet,
            IpNet::V6(_) => AddressFamily::Inet6,
        };
        if route
            .gateway
            .is_some_and(|g| g.is_ipv4() != route.dst.addr().is_ipv4())
        {
            return Err(NetlinkError::Protocol {
                op: op(),
                msg: "the gateway is not of the destination's family".into(),
            });
        }
        let mut msg = RouteMessage::default();
        msg.header.address_family = family;
        msg.header.destination_prefix_length = route.dst.prefix_len();
        msg.header.table = RouteHeader::RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::Static;
        msg.header.kind = RouteType::Unicast;
        // A route without a gateway is on-link.
        msg.header.scope = if route.gateway.is_some() {
            RouteScope::Universe
        } else {
            RouteScope::Link
        };
        msg.attributes
            .push(RouteAttribute::Destination(route_addr(route.dst.addr())));
        if let Some(gw) = route.gateway {
            msg.attributes.push(RouteAttribute::Gateway(route_addr(gw)));
        }
        if let Some(oif) = route.oif {
            msg.attributes.push(RouteAttribute::Oif(oif));
        }
        if let Some(p) = route.priority {
            msg.attributes.push(RouteAttribute::Priority(p));
        }
        if let Some(t) = route.table {
            match u8::try_from(t) {
                Ok(small) => msg.header.table = small,
                Err(_) => {
                    msg.header.table = RouteHeader::RT_TABLE_UNSPEC;
                    msg.attributes.push(RouteAttribute::Table(t));
                }
            }
        }
        self.change(
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            op,
        )
    }

    /// Routes of one family: in every table, or only in `table` (filtered by the kernel).
    fn routes_in(
        &self,
        family: AddressFamily,
        table: Option<u8>,
    ) -> Result<Vec<Route>, NetlinkError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family;
        if let Some(t) = table {
            msg.header.table = t;
        }
        let msgs = self
            .sock
            .dump(RouteNetlinkMessage::GetRoute(msg))
            .map_err(|f| NetlinkError::new("listing routes", f))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => parse_route(r),
                _ => None,
            })
            .collect())
    }

    /// Routes of one family in every table.
    pub fn routes(&self, family: AddressFamily) -> Result<Vec<Route>, NetlinkError> {
        self.routes_in(family, None)
    }

    /// Routes of both families.
    pub fn all_routes(&self) -> Result<Vec<Route>, NetlinkError> {
        let mut r = self.routes(AddressFamily::Inet)?;
        r.extend(self.routes(AddressFamily::Inet6)?);
        Ok(r)
    }

    /// The interface of the first main-table IPv4 default route, as the reference plugin picks it.
    pub fn default_route_link(&self) -> Result<Option<Link>, NetlinkError> {
        let main = RouteHeader::RT_TABLE_MAIN;
        let routes = self.routes_in(AddressFamily::Inet, Some(main))?;
        let Some(oif) = routes
            .iter()
            .filter(|r| {
                r.dst.prefix_len() == 0 && r.table.unwrap_or(u32::from(main)) == u32::from(main)
            })
            .find_map(|r| r.oif)
        else {
            return Ok(None);
        };
        self.link_by_index(oif)
    }
}

fn route_addr(ip: IpAddr) -> RouteAddress {
    match ip {
        IpAddr::V4(v4) => RouteAddress::Inet(v4),
        IpAddr::V6(v6) => RouteAddress::Inet6(v6),
    }
}

fn parse_link(m: &LinkMessage) -> Link {
    let mut l = Link {
        index: m.header.index,
        name: String::new(),
        mac: None,
        mtu: None,
        up: m.header.flags.contains(LinkFlags::Up),
        carrier: m.header.flags.contains(LinkFlags::LowerUp),
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
                                    InfoIpVlan::Mode(IpVlanMode::L2) => {
                                        l.ipvlan_mode = Some(IpvlanMode::L2)
                                    }
                                    InfoIpVlan::Mode(IpVlanMode::L3) => {
                                        l.ipvlan_mode = Some(IpvlanMode::L3)
                                    }
                                    InfoIpVlan::Mode(IpVlanMode::L3S) => {
                                        l.ipvlan_mode = Some(IpvlanMode::L3s)
                                    }
                                    InfoIpVlan::Flags(f) if f.contains(IpVlanFlags::Private) => {
                                        l.ipvlan_flag = Some(IpvlanFlag::Private)
                                    }
                                    InfoIpVlan::Flags(f) if f.contains(IpVlanFlags::Vepa) => {
                                        l.ipvlan_flag = Some(IpvlanFlag::Vepa)
                                    }
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
    let mut r = Route {
        dst: IpNet::new(family_zero, 0).ok()?,
        gateway: None,
        oif: None,
        priority: None,
        table: Some(u32::from(m.header.table)),
    };
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
