//! ADD's configuration of the renamed link in the pod netns: sysctls, addresses, link up, IPv6 DAD,
//! routes, announcements. The link operations go through [`LinkOps`]; the sysctls and the
//! announcements through [`PodSide`], which the pod's netns thread implements.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use tether_cni::CniResult;
use tether_cni::result::Route as CniRoute;
use tether_link::netlink::EEXIST;
use tether_link::{Link, NsThread, Route, sysctl};

use crate::AttachError;
use crate::kernel::LinkOps;

/// How long ADD waits for IPv6 duplicate address detection before giving up.
pub(crate) const DAD_WAIT: Duration = Duration::from_secs(5);

/// How long the kernel's DAD listens for a defender on the pod's new interface, instead of its
/// default random delay of up to 1 s plus 1 s (RetransTimer): the same window as tether-ipam's
/// default probe. An address is never returned tentative; it just leaves that state sooner.
const DAD_WINDOW_MS: u32 = 100;

/// What ADD does inside the pod netns beside the link operations: interface sysctls and the
/// announcements on the wire. [`NsThread`] runs them there; the unit tests record them.
pub(crate) trait PodSide {
    /// Announce on link-up and on address changes, so peers drop stale entries when an address
    /// moves. Set before the link is up.
    fn notify_on_change(&self, ifname: &str) -> Result<(), AttachError>;
    /// Shorten DAD on `ifname` (see [`DAD_WINDOW_MS`]); the timing to put back, None when IPv6 is
    /// off in the pod or the values cannot be read.
    fn short_dad_window(&self, ifname: &str) -> Result<Option<DadTiming>, AttachError>;
    /// Put `timing` back once DAD is over.
    fn restore_dad_timing(&self, timing: DadTiming, ifname: &str) -> Result<(), AttachError>;
    /// Gratuitous ARP / unsolicited NA for the addresses of `result` on `link`.
    fn announce(&self, link: &Link, result: &CniResult);
}

impl PodSide for NsThread {
    fn notify_on_change(&self, ifname: &str) -> Result<(), AttachError> {
        set_sysctls(self, ifname)
    }
    fn short_dad_window(&self, ifname: &str) -> Result<Option<DadTiming>, AttachError> {
        short_dad_window(self, ifname)
    }
    fn restore_dad_timing(&self, timing: DadTiming, ifname: &str) -> Result<(), AttachError> {
        timing.restore(self, ifname)
    }
    fn announce(&self, link: &Link, result: &CniResult) {
        announce_addresses(self, link, result)
    }
}

/// The pod interface's DAD timing as it was before [`short_dad_window`].
pub(crate) struct DadTiming {
    solicitation_delay: String,
    retrans_time_ms: String,
}

impl DadTiming {
    /// Put the kernel's values back once DAD is over: RetransTimer also paces neighbour
    /// solicitations for the pod's whole life, which stay as the kernel (or a router) has them.
    fn restore(self, in_pod: &NsThread, ifname: &str) -> Result<(), AttachError> {
        let name = ifname.to_string();
        in_pod.run(move || {
            for e in [
                sysctl::set_interface(
                    "ipv6",
                    &name,
                    "router_solicitation_delay",
                    &self.solicitation_delay,
                )
                .err(),
                sysctl::set_neigh("ipv6", &name, "retrans_time_ms", &self.retrans_time_ms).err(),
            ]
            .into_iter()
            .flatten()
            {
                log::warn!("restoring the IPv6 neighbour timing of {name}: {e}");
            }
        })?;
        Ok(())
    }
}

/// Shorten DAD on the pod's new interface to [`DAD_WINDOW_MS`]: no random start delay (it spreads
/// hosts booting together after a power cut; a pod's ADD has no such crowd), one solicitation, and
/// the window to hear a defender. Set before the addresses, so their DAD runs with it. None when
/// IPv6 is off in the pod (DAD then does not run) or the values cannot be read.
fn short_dad_window(in_pod: &NsThread, ifname: &str) -> Result<Option<DadTiming>, AttachError> {
    let name = ifname.to_string();
    let timing = in_pod.run(move || -> Option<DadTiming> {
        let before = DadTiming {
            solicitation_delay: sysctl::get_interface("ipv6", &name, "router_solicitation_delay")
                .ok()?,
            retrans_time_ms: sysctl::get_neigh("ipv6", &name, "retrans_time_ms").ok()?,
        };
        let set =
            sysctl::set_interface("ipv6", &name, "router_solicitation_delay", "0").and_then(|()| {
                sysctl::set_neigh("ipv6", &name, "retrans_time_ms", &DAD_WINDOW_MS.to_string())
            });
        if let Err(e) = set {
            // DAD still runs, with the kernel's timing: slower, never less safe.
            log::warn!("shortening DAD on {name}: {e}");
        }
        Some(before)
    })?;
    Ok(timing)
}

/// [`PodSide::notify_on_change`] on the pod's netns thread.
fn set_sysctls(in_pod: &NsThread, ifname: &str) -> Result<(), AttachError> {
    let name = ifname.to_string();
    in_pod.run(move || {
        if let Err(e) = sysctl::set_interface("ipv4", &name, "arp_notify", "1") {
            log::warn!("{e}");
        }
        // Absent when IPv6 is disabled in the pod; nothing to announce then.
        if let Err(e) = sysctl::set_interface("ipv6", &name, "ndisc_notify", "1")
            && e.kind() != std::io::ErrorKind::NotFound
        {
            log::warn!("{e}");
        }
    })?;
    Ok(())
}

/// Addresses, link up, IPv6 DAD, routes — in the pod netns. `probed`: addresses the IPAM proved
/// unused on the wire. IPv6 ones among them skip the kernel's DAD (`nodad`): it would only repeat that
/// probe, for a second or two. Every other IPv6 address is waited for until it is no longer tentative.
pub(crate) fn configure(
    in_pod: &dyn PodSide,
    pod: &dyn LinkOps,
    link: &Link,
    ifname: &str,
    result: &CniResult,
    probed: &[IpAddr],
) -> Result<(), AttachError> {
    let window = if dad_addresses(result, probed).is_empty() {
        None
    } else {
        in_pod.short_dad_window(ifname)?
    };
    raise(pod, link.index, ifname, result, probed, DAD_WAIT)?;
    if let Some(w) = window {
        in_pod.restore_dad_timing(w, ifname)?;
    }
    add_routes(pod, link.index, result)?;
    in_pod.announce(link, result);
    Ok(())
}

/// Whether the kernel runs DAD for `a`: an IPv6 address the IPAM did not probe. The probed ones
/// are added `nodad`.
fn kernel_runs_dad(a: IpAddr, probed: &[IpAddr]) -> bool {
    a.is_ipv6() && !probed.contains(&a)
}

/// The addresses of `result` the kernel runs DAD for ([`kernel_runs_dad`]).
fn dad_addresses(result: &CniResult, probed: &[IpAddr]) -> Vec<IpNet> {
    result
        .ips
        .iter()
        .map(|i| i.address)
        .filter(|a| kernel_runs_dad(a.addr(), probed))
        .collect()
}

/// Add every address of `result`, bring the link up, and wait up to `dad_wait` for the DAD of those
/// not probed (a parameter so the tests need not wait [`DAD_WAIT`]).
pub(crate) fn raise(
    pod: &dyn LinkOps,
    index: u32,
    ifname: &str,
    result: &CniResult,
    probed: &[IpAddr],
    dad_wait: Duration,
) -> Result<(), AttachError> {
    for ip in &result.ips {
        let a = ip.address.addr();
        // `nodad` is an IPv6 flag; an IPv4 address never carries it.
        pod.add_address(
            index,
            ip.address,
            a.is_ipv6() && !kernel_runs_dad(a, probed),
        )?;
    }
    pod.set_up(index)?;
    wait_for_dad(pod, index, ifname, &dad_addresses(result, probed), dad_wait)
}

/// The routes of `result` through link `index`; one already there is not an error.
pub(crate) fn add_routes(
    pod: &dyn LinkOps,
    index: u32,
    result: &CniResult,
) -> Result<(), AttachError> {
    for r in &result.routes {
        let gateway = r.gw.or_else(|| same_family_gateway(result, r));
        let route = Route {
            dst: r.dst,
            gateway,
            oif: Some(index),
            priority: r.priority,
            table: r.table,
        };
        match pod.add_route(&route) {
            Err(e) if e.errno() == Some(EEXIST) => log::info!("route to {} already present", r.dst),
            other => other?,
        }
    }
    Ok(())
}

/// Gratuitous ARP / unsolicited NA for every address, now that it is configured and out of DAD, so
/// neighbours and switches drop entries left by the address's previous holder. The kernel sends one
/// more on link-up (arp_notify). A failure here is logged: the attachment itself works.
fn announce_addresses(in_pod: &NsThread, link: &Link, result: &CniResult) {
    let Some(mac) = link
        .mac
        .as_deref()
        .and_then(|m| <[u8; 6]>::try_from(m).ok())
    else {
        return;
    };
    let addrs: Vec<IpAddr> = result.ips.iter().map(|i| i.address.addr()).collect();
    let index = link.index;
    match in_pod.run(move || tether_wire::announce(index, mac, &addrs, 1, Duration::ZERO)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) => log::warn!("announcing addresses: {e}"),
        Err(e) => log::warn!("announcing addresses: {e}"),
    }
}

/// A route without `gw` goes through the gateway of the same family, as the reference plugins do.
pub(crate) fn same_family_gateway(result: &CniResult, r: &CniRoute) -> Option<IpAddr> {
    result
        .ips
        .iter()
        .filter_map(|ip| ip.gateway)
        .find(|g| g.is_ipv4() == r.dst.addr().is_ipv4())
}

/// Return only once every address of `wanted` (IPv6, added without `nodad`) has left the tentative
/// state, so the pod can use it at once; give up after `wait`.
fn wait_for_dad(
    pod: &dyn LinkOps,
    index: u32,
    ifname: &str,
    wanted: &[IpNet],
    wait: Duration,
) -> Result<(), AttachError> {
    if wanted.is_empty() {
        return Ok(());
    }
    let start = Instant::now();
    loop {
        let addrs = pod.addresses(index)?;
        let mut pending = None;
        for w in wanted {
            match addrs.iter().find(|a| a.address.addr() == w.addr()) {
                Some(a) if a.dad_failed => {
                    return Err(AttachError::DadFailed {
                        address: w.to_string(),
                        ifname: ifname.to_string(),
                    });
                }
                Some(a) if a.tentative => pending = Some(*w),
                _ => {}
            }
        }
        let Some(p) = pending else { return Ok(()) };
        if start.elapsed() >= wait {
            return Err(AttachError::DadTimeout {
                address: p.to_string(),
                ifname: ifname.to_string(),
                waited_ms: wait.as_millis() as u64,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
