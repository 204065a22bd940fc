//! A recording, in-memory kernel for the unit tests: two netns (host and pod) of links with their
//! addresses and routes, a log of every [`LinkOps`] call in order, and injectable failures. It
//! models only what the attacher relies on: names unique per netns (EEXIST), ENODEV for a missing
//! link, a delete of a gone link answering Ok(false), a create with a target netns landing in the
//! pod's, and IPv6 DAD as the attacher observes it (tentative for some polls, or failed).

use std::cell::RefCell;
use std::collections::HashMap;

use ipnet::IpNet;
use tether_link::{Address, IpvlanFlag, IpvlanMode, Link, NetNs, NetlinkError, Route};

use crate::kernel::LinkOps;

pub(crate) const HOST: usize = 0;
pub(crate) const POD: usize = 1;
const NAMES: [&str; 2] = ["host", "pod"];
const MAIN_TABLE: u32 = 254;

/// How the DAD of an IPv6 address added without `nodad` goes, as seen by polling its flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dad {
    /// Tentative for this many `addresses` polls, then usable.
    TentativeFor(u32),
    /// Never leaves the tentative state.
    Stuck,
    /// Another host defends it.
    Failed,
}

struct FakeAddr {
    address: IpNet,
    tentative_polls: Option<u32>,
    dad_failed: bool,
}

struct FakeLink {
    link: Link,
    addrs: Vec<FakeAddr>,
}

#[derive(Default)]
struct State {
    links: [Vec<FakeLink>; 2],
    routes: [Vec<Route>; 2],
    next_index: u32,
    calls: Vec<String>,
    /// (op, nth call of op, errno)
    failures: Vec<(&'static str, usize, i32)>,
    counts: HashMap<&'static str, usize>,
    dad: Vec<(IpNet, Dad)>,
}

impl State {
    fn find(&self, ns: usize, index: u32) -> Option<&FakeLink> {
        self.links[ns].iter().find(|l| l.link.index == index)
    }

    fn find_mut(&mut self, ns: usize, index: u32) -> Result<&mut FakeLink, NetlinkError> {
        self.links[ns]
            .iter_mut()
            .find(|l| l.link.index == index)
            .ok_or_else(|| errno("no such link", libc::ENODEV))
    }

    fn named(&self, ns: usize, name: &str) -> Option<&FakeLink> {
        self.links[ns].iter().find(|l| l.link.name == name)
    }
}

fn errno(op: &str, errno: i32) -> NetlinkError {
    NetlinkError::Kernel {
        op: format!("fake {op}"),
        errno,
    }
}

/// The whole fake; [`FakeKernel::socket`] gives the [`LinkOps`] of one of its netns.
#[derive(Default)]
pub(crate) struct FakeKernel {
    state: RefCell<State>,
}

/// One netns's netlink socket on the fake.
pub(crate) struct Socket<'a> {
    kernel: &'a FakeKernel,
    ns: usize,
}

impl FakeKernel {
    pub(crate) fn new() -> Self {
        let k = FakeKernel::default();
        k.state.borrow_mut().next_index = 1;
        k
    }

    pub(crate) fn socket(&self, ns: usize) -> Socket<'_> {
        Socket { kernel: self, ns }
    }

    /// Set up (unlogged) a link that is up with carrier; `kind` None is a physical NIC.
    pub(crate) fn add_link(&self, ns: usize, name: &str, kind: Option<&str>) -> u32 {
        self.put(
            ns,
            Link {
                index: 0,
                name: name.into(),
                mac: Some(vec![2, 0, 0, 0, 0, 1]),
                mtu: Some(1500),
                up: true,
                carrier: true,
                kind: kind.map(str::to_string),
                ipvlan_mode: None,
                ipvlan_flag: None,
                parent_index: None,
            },
        )
    }

    /// Set up (unlogged) an ipvlan called `name` on `parent`.
    pub(crate) fn add_ipvlan(&self, ns: usize, name: &str, parent: u32, mode: IpvlanMode) -> u32 {
        let index = self.add_link(ns, name, Some("ipvlan"));
        let mut s = self.state.borrow_mut();
        let l = &mut s.find_mut(ns, index).unwrap().link;
        l.ipvlan_mode = Some(mode);
        l.ipvlan_flag = Some(IpvlanFlag::Bridge);
        l.parent_index = Some(parent);
        index
    }

    fn put(&self, ns: usize, mut link: Link) -> u32 {
        let mut s = self.state.borrow_mut();
        link.index = s.next_index;
        s.next_index += 1;
        let index = link.index;
        s.links[ns].push(FakeLink {
            link,
            addrs: Vec::new(),
        });
        index
    }

    /// Set up (unlogged) a route.
    pub(crate) fn put_route(&self, ns: usize, route: Route) {
        self.state.borrow_mut().routes[ns].push(route);
    }

    /// Set up (unlogged) a usable address on link `index`.
    pub(crate) fn put_address(&self, ns: usize, index: u32, address: IpNet) {
        let mut s = self.state.borrow_mut();
        s.find_mut(ns, index).unwrap().addrs.push(FakeAddr {
            address,
            tentative_polls: Some(0),
            dad_failed: false,
        });
    }

    /// Set (unlogged) the admin state and carrier of link `index`.
    pub(crate) fn set_state(&self, ns: usize, index: u32, up: bool, carrier: bool) {
        let mut s = self.state.borrow_mut();
        let l = &mut s.find_mut(ns, index).unwrap().link;
        l.up = up;
        l.carrier = carrier;
    }

    /// The `nth` (from 1) call of `op` (a [`LinkOps`] method name) fails with `errno`, changing nothing.
    pub(crate) fn fail(&self, op: &'static str, nth: usize, errno: i32) {
        self.state.borrow_mut().failures.push((op, nth, errno));
    }

    /// How the DAD of `address` goes once added without `nodad` (usable at once otherwise).
    pub(crate) fn dad(&self, address: IpNet, dad: Dad) {
        self.state.borrow_mut().dad.push((address, dad));
    }

    /// Every call so far, in order, as "<netns> <op> <arguments>".
    pub(crate) fn calls(&self) -> Vec<String> {
        self.state.borrow().calls.clone()
    }

    pub(crate) fn link(&self, ns: usize, name: &str) -> Option<Link> {
        self.state.borrow().named(ns, name).map(|l| l.link.clone())
    }

    pub(crate) fn link_names(&self, ns: usize) -> Vec<String> {
        let s = self.state.borrow();
        s.links[ns].iter().map(|l| l.link.name.clone()).collect()
    }

    pub(crate) fn routes(&self, ns: usize) -> Vec<Route> {
        self.state.borrow().routes[ns].clone()
    }
}

impl Socket<'_> {
    /// Log the call, then fail it if a failure was injected for this occurrence of `op`.
    fn call(&self, op: &'static str, args: String) -> Result<(), NetlinkError> {
        let mut s = self.kernel.state.borrow_mut();
        s.calls.push(
            format!("{} {op} {args}", NAMES[self.ns])
                .trim_end()
                .to_string(),
        );
        let n = s.counts.entry(op).or_default();
        *n += 1;
        let n = *n;
        match s.failures.iter().find(|f| f.0 == op && f.1 == n) {
            Some(&(_, _, e)) => Err(errno(op, e)),
            None => Ok(()),
        }
    }

    fn state(&self) -> std::cell::RefMut<'_, State> {
        self.kernel.state.borrow_mut()
    }
}

impl LinkOps for Socket<'_> {
    fn link_by_name(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        self.call("link_by_name", name.to_string())?;
        Ok(self.state().named(self.ns, name).map(|l| l.link.clone()))
    }

    fn link_by_index(&self, index: u32) -> Result<Option<Link>, NetlinkError> {
        self.call("link_by_index", format!("#{index}"))?;
        Ok(self.state().find(self.ns, index).map(|l| l.link.clone()))
    }

    fn default_route_link(&self) -> Result<Option<Link>, NetlinkError> {
        self.call("default_route_link", String::new())?;
        let s = self.state();
        let oif = s.routes[self.ns]
            .iter()
            .filter(|r| r.dst.addr().is_ipv4() && r.dst.prefix_len() == 0)
            .filter(|r| r.table.unwrap_or(MAIN_TABLE) == MAIN_TABLE)
            .find_map(|r| r.oif);
        Ok(oif.and_then(|i| s.find(self.ns, i)).map(|l| l.link.clone()))
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
        let into = if target.is_some() { " into pod" } else { "" };
        self.call("create_ipvlan", format!("{name} on #{parent}{into}"))?;
        let dest = if target.is_some() { POD } else { self.ns };
        let s = self.state();
        let p = s
            .find(self.ns, parent)
            .ok_or_else(|| errno("create_ipvlan", libc::ENODEV))?
            .link
            .clone();
        if s.named(dest, name).is_some() {
            return Err(errno("create_ipvlan", libc::EEXIST));
        }
        drop(s);
        self.kernel.put(
            dest,
            Link {
                index: 0,
                name: name.into(),
                mac: p.mac,
                mtu: mtu.or(p.mtu),
                up: false,
                carrier: false,
                kind: Some("ipvlan".into()),
                ipvlan_mode: Some(mode),
                ipvlan_flag: Some(flag),
                parent_index: Some(parent),
            },
        );
        Ok(())
    }

    fn rename(&self, index: u32, name: &str) -> Result<(), NetlinkError> {
        self.call("rename", format!("#{index} {name}"))?;
        let mut s = self.state();
        if s.named(self.ns, name)
            .is_some_and(|l| l.link.index != index)
        {
            return Err(errno("rename", libc::EEXIST));
        }
        s.find_mut(self.ns, index)?.link.name = name.into();
        Ok(())
    }

    fn set_up(&self, index: u32) -> Result<(), NetlinkError> {
        self.call("set_up", format!("#{index}"))?;
        let mut s = self.state();
        let l = &mut s.find_mut(self.ns, index)?.link;
        l.up = true;
        l.carrier = true;
        Ok(())
    }

    fn delete_link(&self, index: u32) -> Result<bool, NetlinkError> {
        self.call("delete_link", format!("#{index}"))?;
        let mut s = self.state();
        let before = s.links[self.ns].len();
        s.links[self.ns].retain(|l| l.link.index != index);
        // The kernel drops the routes through a link with it.
        s.routes[self.ns].retain(|r| r.oif != Some(index));
        Ok(s.links[self.ns].len() < before)
    }

    fn add_address(&self, index: u32, addr: IpNet, nodad: bool) -> Result<(), NetlinkError> {
        let flag = if nodad { " nodad" } else { "" };
        self.call("add_address", format!("#{index} {addr}{flag}"))?;
        let mut s = self.state();
        let dad = match s.dad.iter().find(|d| d.0 == addr) {
            Some(&(_, d)) if addr.addr().is_ipv6() && !nodad => Some(d),
            _ => None,
        };
        let l = s.find_mut(self.ns, index)?;
        if l.addrs.iter().any(|a| a.address == addr) {
            return Err(errno("add_address", libc::EEXIST));
        }
        l.addrs.push(FakeAddr {
            address: addr,
            tentative_polls: match dad {
                None => Some(0),
                Some(Dad::TentativeFor(n)) => Some(n),
                // The kernel keeps a failed address tentative too, flagged dadfailed.
                Some(Dad::Stuck | Dad::Failed) => None,
            },
            dad_failed: dad == Some(Dad::Failed),
        });
        Ok(())
    }

    fn addresses(&self, index: u32) -> Result<Vec<Address>, NetlinkError> {
        self.call("addresses", format!("#{index}"))?;
        let mut s = self.state();
        let Ok(l) = s.find_mut(self.ns, index) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for a in &mut l.addrs {
            out.push(Address {
                index,
                address: a.address,
                tentative: a.tentative_polls != Some(0),
                dad_failed: a.dad_failed,
            });
            if let Some(n) = &mut a.tentative_polls {
                *n = n.saturating_sub(1);
            }
        }
        Ok(out)
    }

    fn add_route(&self, route: &Route) -> Result<(), NetlinkError> {
        let via = route
            .gateway
            .map(|g| format!(" via {g}"))
            .unwrap_or_default();
        let dev = route.oif.map(|i| format!(" dev #{i}")).unwrap_or_default();
        self.call("add_route", format!("{}{via}{dev}", route.dst))?;
        let mut s = self.state();
        if let Some(oif) = route.oif {
            s.find_mut(self.ns, oif)?;
        }
        let table = |r: &Route| r.table.unwrap_or(MAIN_TABLE);
        if s.routes[self.ns]
            .iter()
            .any(|r| r.dst == route.dst && table(r) == table(route))
        {
            return Err(errno("add_route", libc::EEXIST));
        }
        s.routes[self.ns].push(route.clone());
        Ok(())
    }

    fn all_routes(&self) -> Result<Vec<Route>, NetlinkError> {
        self.call("all_routes", String::new())?;
        Ok(self.state().routes[self.ns].clone())
    }
}
