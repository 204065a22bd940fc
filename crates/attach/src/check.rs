//! CHECK. Its comparisons read the kernel through [`LinkOps`] only.

use tether_cni::{CniError, CniResult, Command, Request};
use tether_link::{IpvlanMode, Link, Netlink};
use tether_wire::frame::format_mac;

use crate::configure::same_family_gateway;
use crate::kernel::LinkOps;
use crate::{AttachError, IpvlanConfig, open_pod_netns, resolve_master};

/// CHECK: the attachment still looks exactly as ADD left it, and IPAM still holds the lease.
pub fn check(req: &Request) -> Result<(), AttachError> {
    let cfg = IpvlanConfig::from_conf(&req.conf)?;
    let prev = req.conf.prev_result.as_ref().ok_or_else(|| {
        AttachError::Cni(CniError::invalid_config(
            "CHECK needs prevResult (the Result of ADD), and the config has none",
        ))
    })?;
    if let Some(plugin) = &cfg.ipam_type {
        req.delegation()
            .exec(plugin, Command::Check)
            .map_err(AttachError::Cni)?;
    }
    let netns_path = req.env.netns.as_deref().expect("CHECK validated CNI_NETNS");
    let ifname = req.env.ifname();
    let sandbox = netns_path.display().to_string();
    let idx = prev
        .interfaces
        .iter()
        .position(|i| i.name == ifname && i.sandbox.as_deref() == Some(sandbox.as_str()))
        .ok_or_else(|| {
            AttachError::Check(format!(
                "prevResult lists no interface {ifname:?} with sandbox {sandbox}"
            ))
        })?;
    let ns = open_pod_netns(netns_path)?;
    let host = Netlink::current()?;
    let pod = Netlink::in_netns(&ns)?;
    let link = check_link(&cfg, ifname, &sandbox, &host, &pod)?;
    check_contents(prev, idx, &link, ifname, &pod)
}

/// The link called `ifname` in the pod netns: an ipvlan of the configured mode, on the configured
/// master (or, without `master`, on a parent that still exists).
pub(crate) fn check_link(
    cfg: &IpvlanConfig,
    ifname: &str,
    sandbox: &str,
    host: &dyn LinkOps,
    pod: &dyn LinkOps,
) -> Result<Link, AttachError> {
    let link = pod
        .link_by_name(ifname)?
        .ok_or_else(|| AttachError::Check(format!("{ifname} does not exist in {sandbox}")))?;
    if link.kind.as_deref() != Some("ipvlan") {
        return Err(AttachError::Check(format!(
            "{ifname} is a {} link, not ipvlan",
            link.kind.as_deref().unwrap_or("unknown")
        )));
    }
    if link.ipvlan_mode != Some(cfg.mode) {
        return Err(AttachError::Check(format!(
            "{ifname} is in ipvlan mode {}, the config says {}",
            mode_name(link.ipvlan_mode),
            mode_name(Some(cfg.mode))
        )));
    }
    // With `master` set, the parent must be that link. Without it, ADD took the default route's
    // interface or a chained plugin's — which CHECK cannot see again — so the parent must still exist.
    let (masters, place) = if cfg.link_in_container {
        (pod, "pod netns")
    } else {
        (host, "host")
    };
    match &cfg.master {
        Some(_) => {
            let master = resolve_master(cfg, None, host, pod)?;
            if link.parent_index != Some(master.index) {
                return Err(AttachError::Check(format!(
                    "{ifname}'s master is link #{}, not {} (#{})",
                    link.parent_index.unwrap_or(0),
                    master.name,
                    master.index
                )));
            }
        }
        None => {
            let parent = link.parent_index.unwrap_or(0);
            if masters.link_by_index(parent)?.is_none() {
                return Err(AttachError::Check(format!(
                    "{ifname}'s master (link #{parent}) no longer exists on the {place}"
                )));
            }
        }
    }
    Ok(link)
}

/// The MAC, addresses and routes of prevResult's interface `idx` are still on `link` and in the pod.
pub(crate) fn check_contents(
    prev: &CniResult,
    idx: usize,
    link: &Link,
    ifname: &str,
    pod: &dyn LinkOps,
) -> Result<(), AttachError> {
    let expected = &prev.interfaces[idx];
    if let Some(mac) = &expected.mac
        && link.mac.as_deref().map(format_mac).as_deref() != Some(mac.to_ascii_lowercase().as_str())
    {
        return Err(AttachError::Check(format!(
            "{ifname} has MAC {}, prevResult says {mac}",
            link.mac.as_deref().map(format_mac).unwrap_or_default()
        )));
    }
    let have = pod.addresses(link.index)?;
    for ip in prev
        .ips
        .iter()
        .filter(|ip| ip.interface.is_none_or(|i| i == idx))
    {
        if !have.iter().any(|a| a.address == ip.address) {
            return Err(AttachError::Check(format!(
                "{ifname} lacks address {}",
                ip.address
            )));
        }
    }
    let routes = pod.all_routes()?;
    for r in &prev.routes {
        let gw = r.gw.or_else(|| same_family_gateway(prev, r));
        if !routes
            .iter()
            .any(|x| x.dst == r.dst && (gw.is_none() || x.gateway == gw))
        {
            return Err(AttachError::Check(format!(
                "route to {}{} is missing",
                r.dst,
                gw.map(|g| format!(" via {g}")).unwrap_or_default()
            )));
        }
    }
    Ok(())
}

fn mode_name(m: Option<IpvlanMode>) -> &'static str {
    match m {
        Some(IpvlanMode::L2) => "l2",
        Some(IpvlanMode::L3) => "l3",
        Some(IpvlanMode::L3s) => "l3s",
        None => "unknown",
    }
}
