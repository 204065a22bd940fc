//! `tether-ipvlan`: attach a pod to the physical L2 network through an ipvlan sub-interface.
//!
//! Differences from the reference ipvlan plugin, each on purpose:
//! - every ADD failure after the link exists removes the link and releases the IPAM lease (`Undo`);
//! - DEL never resolves the master, deletes the link and releases the lease even when one of them is
//!   already gone or fails (the IPAM's error is returned first, the link's second); it also removes
//!   the link of an ADD killed before its rename (found by its [`temporary_name`], derived from the
//!   attachment);
//! - CHECK works with `master` omitted: with `master` set it compares the link's parent with it;
//!   without, it checks that the parent still exists (a chained ADD's master cannot be recovered);
//! - STATUS checks the master; GC is forwarded to IPAM; a requested MAC is refused (code 2);
//! - `mtu` above the master's is refused before anything is created.
//!
//! ADD, DEL and STATUS are here, the link's configuration in `configure.rs`, CHECK in `check.rs`.
//! Every link operation goes through [`kernel::LinkOps`], so the unit tests run this logic against
//! a recording fake (`fake_kernel.rs`) instead of the kernel.

mod check;
pub mod config;
mod configure;
pub mod error;
#[cfg(test)]
mod fake_kernel;
mod kernel;
#[cfg(test)]
mod seam_tests;
mod undo;

use std::net::IpAddr;
use std::path::Path;

use tether_cni::result::Interface;
use tether_cni::{CniError, CniResult, Command, Request};
use tether_link::netlink::EEXIST;
use tether_link::{Link, NetNs, Netlink, NetnsError};
use tether_wire::frame::format_mac;

pub use check::check;
pub use config::{IpamStart, IpvlanConfig};
pub use error::AttachError;

use configure::{PodSide, configure};
use kernel::LinkOps;
use undo::Undo;

/// Open CNI_NETNS, telling "gone" apart from "not a netns".
fn open_pod_netns(path: &Path) -> Result<NetNs, AttachError> {
    NetNs::open(path).map_err(|e| match e {
        NetnsError::Missing { path } => AttachError::NetnsMissing { path },
        other @ NetnsError::NotANetns { .. } => AttachError::NetnsInvalid(other),
        other => AttachError::Netns(other),
    })
}

/// The master link: `master`, else the chained prevResult's interface, else the default route's
/// interface — looked up in the pod netns under `linkInContainer`, in the host netns otherwise.
fn resolve_master(
    cfg: &IpvlanConfig,
    prev: Option<&CniResult>,
    host: &dyn LinkOps,
    pod: &dyn LinkOps,
) -> Result<Link, AttachError> {
    let (nl, place) = if cfg.link_in_container {
        (pod, "in the pod network namespace")
    } else {
        (host, "on the host")
    };
    let name = match &cfg.master {
        Some(m) => Some(m.clone()),
        None => IpvlanConfig::chained_master(prev)?,
    };
    match name {
        Some(name) => nl
            .link_by_name(&name)?
            .ok_or(AttachError::MasterMissing { name, place }),
        None => nl.default_route_link()?.ok_or(AttachError::NoDefaultRoute {
            place: if cfg.link_in_container {
                "the pod network namespace"
            } else {
                "the host"
            },
        }),
    }
}

/// ADD refuses a master that is down or has no carrier before anything is leased or created: the
/// kernel would accept the slave, and the pod would run with an interface that reaches no one.
fn require_carrier(link_in_container: bool, master: &Link) -> Result<(), AttachError> {
    let name = &master.name;
    let (state, remedy) = match (master.up, master.carrier) {
        (true, true) => return Ok(()),
        (false, _) => (
            "administratively down",
            format!(
                "bring it up on the node (`ip link set {name} up`); tether never changes a master's state"
            ),
        ),
        (true, false) => (
            "up but has no carrier",
            format!(
                "check its cable, switch port or bond members (`ip link show {name}` says NO-CARRIER)"
            ),
        ),
    };
    Err(AttachError::MasterDown {
        name: name.clone(),
        place: if link_in_container {
            "in the pod network namespace"
        } else {
            "on the host"
        },
        state,
        remedy,
    })
}

/// An ipvlan slave cannot carry its own MAC, so a requested one is refused rather than ignored.
fn reject_requested_mac(req: &Request) -> Result<(), AttachError> {
    if let Some(mac) = req.conf.runtime_config("mac") {
        let value = mac
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| mac.to_string());
        if !value.is_empty() {
            return Err(AttachError::Unsupported {
                field: "runtimeConfig.mac",
                value,
            });
        }
    }
    if let Some(mac) = req.env.args.get("MAC").filter(|m| !m.is_empty()) {
        return Err(AttachError::Unsupported {
            field: "CNI_ARGS MAC",
            value: mac.to_string(),
        });
    }
    Ok(())
}

/// The name the link is born under in the pod netns, then renamed there to CNI_IFNAME (so a clash
/// with a host interface of the same name, which older kernels check in the creating netns, cannot
/// happen). Derived from the attachment, not random: a DEL after an ADD killed between create and
/// rename finds the link by this name, with no state kept anywhere. 15 bytes (IFNAMSIZ - 1).
pub fn temporary_name(container_id: &str, ifname: &str) -> String {
    let h = tether_stable_hash::fnv1a64(format!("{container_id}/{ifname}").as_bytes(), 0);
    format!("tth{:012x}", h & 0xffff_ffff_ffff)
}

/// Test hook of debug builds only (the lab runs them): `TETHER_TEST_KILL_AFTER=<step>` makes ADD
/// kill itself with SIGKILL right after that step, as a runtime's timeout or the OOM killer
/// would, so the lab can pin what DEL must clean up after each one. Release builds have no hook.
fn kill_point(step: &str) {
    #[cfg(debug_assertions)]
    if std::env::var("TETHER_TEST_KILL_AFTER").is_ok_and(|s| s == step) {
        // SAFETY: raise has no memory-safety preconditions; SIGKILL ends the process here.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = step;
}

/// ADD: create, rename, address, raise, announce. Nothing is left behind on failure.
///
/// One thread enters the pod netns for the whole ADD ([`NsThread`]): it opens the pod's netlink socket
/// (used from this thread afterwards), writes the sysctls and sends the announcements.
///
/// [`NsThread`]: tether_link::NsThread
pub fn add(req: &Request) -> Result<CniResult, AttachError> {
    let cfg = IpvlanConfig::from_conf(&req.conf)?;
    reject_requested_mac(req)?;
    let prev = req.conf.prev_result.as_ref();
    if cfg.ipam_type.is_none() && prev.is_none_or(|p| p.ips.is_empty()) {
        return Err(AttachError::IpamRequired);
    }
    let netns_path = req.env.netns.as_deref().expect("ADD validated CNI_NETNS");
    let ns = open_pod_netns(netns_path)?;
    let in_pod = ns.thread()?;
    let pod = in_pod.run(Netlink::current)??;
    let host = Netlink::current()?;
    let kernel = Kernel {
        host: &host,
        pod: &pod,
        in_pod: &in_pod,
        netns: &ns,
    };
    attach(req, &cfg, &kernel)
}

/// What ADD works through: the host's and the pod's netlink sockets, the pod netns (to create the
/// link into) and what runs inside it. Production passes the kernel's; the unit tests the fakes.
pub(crate) struct Kernel<'k> {
    pub(crate) host: &'k dyn LinkOps,
    pub(crate) pod: &'k dyn LinkOps,
    pub(crate) in_pod: &'k dyn PodSide,
    pub(crate) netns: &'k NetNs,
}

/// ADD of a validated config through `k`: the master checked, the link made, the addresses
/// configured; everything made taken back when a step fails.
pub(crate) fn attach(
    req: &Request,
    cfg: &IpvlanConfig,
    k: &Kernel<'_>,
) -> Result<CniResult, AttachError> {
    let prev = req.conf.prev_result.as_ref();
    let master = resolve_master(cfg, prev, k.host, k.pod)?;
    require_carrier(cfg.link_in_container, &master)?;
    if let (Some(mtu), Some(master_mtu)) = (cfg.mtu, master.mtu)
        && mtu > master_mtu
    {
        return Err(AttachError::MtuTooLarge {
            mtu,
            master: master.name.clone(),
            master_mtu,
        });
    }
    let mut undo = Undo::new(req, k.pod);
    let made = attach_steps(&mut undo, cfg, &master, k);
    undo.finish(made.is_err());
    made
}

/// [`attach`]'s steps once the master is known, each recorded in `undo`.
fn attach_steps(
    undo: &mut Undo,
    cfg: &IpvlanConfig,
    master: &Link,
    k: &Kernel<'_>,
) -> Result<CniResult, AttachError> {
    let req = undo.req;
    let prev = req.conf.prev_result.as_ref();
    let netns_path = req.env.netns.as_deref().expect("ADD validated CNI_NETNS");
    let ifname = req.env.ifname();
    if let Some(plugin) = &cfg.ipam_type
        && cfg.ipam_start == IpamStart::WithLink
    {
        // Recorded before the call: a failed delegate ADD is followed by its DEL, as the spec asks.
        undo.ipam = Some(plugin.clone());
        undo.running = Some(
            req.delegation()
                .spawn(plugin, Command::Add)
                .map_err(AttachError::Cni)?,
        );
    }

    // Under linkInContainer the master is in the pod netns already: create there, no move.
    let (creator, target): (&dyn LinkOps, _) = if cfg.link_in_container {
        (k.pod, None)
    } else {
        (k.host, Some(k.netns))
    };
    let link = make_link(undo, creator, target, cfg, master, netns_path)?;
    k.in_pod.notify_on_change(ifname)?;

    let (mut result, probed) = ipam_result(undo, cfg, prev)?;
    kill_point("ipam");
    if result.ips.is_empty() {
        return Err(AttachError::NoAddresses {
            plugin: cfg.ipam_type.clone().unwrap_or_else(|| "prevResult".into()),
        });
    }

    configure(k.in_pod, k.pod, &link, ifname, &result, &probed)?;
    kill_point("configure");
    if let Some(exit) = undo.exit.take() {
        exit.check().map_err(AttachError::Cni)?;
    }
    describe_interface(&mut result, cfg, &link, ifname, netns_path);
    Ok(result)
}

/// Create the ipvlan under its [`temporary_name`] on `master` through `creator` (into `target`
/// when given), record it in `undo`, and rename it to CNI_IFNAME in the pod netns (`undo.pod`).
fn make_link(
    undo: &mut Undo,
    creator: &dyn LinkOps,
    target: Option<&NetNs>,
    cfg: &IpvlanConfig,
    master: &Link,
    netns_path: &Path,
) -> Result<Link, AttachError> {
    let pod = undo.pod;
    let ifname = undo.req.env.ifname();
    let tmp = temporary_name(undo.req.env.container_id(), ifname);
    let create = || creator.create_ipvlan(&tmp, master.index, cfg.mode, cfg.flag, cfg.mtu, target);
    match create() {
        // The link of an earlier ADD of this attachment that was killed before its rename (the
        // runtime retries ADD without a DEL in between): ours by its name, removed, made again.
        Err(e) if e.errno() == Some(EEXIST) && remove_temporary_link(pod, &tmp)? => create()?,
        r => r?,
    }
    kill_point("create");
    let link = pod.link_by_name(&tmp)?.ok_or_else(|| {
        AttachError::Check(format!("the new link {tmp} vanished from the pod netns"))
    })?;
    undo.link = Some(link.index);
    // A CNI_IFNAME already in the pod shows here (EEXIST). The rename comes before an IPAM that needs
    // the link: without `master`, tether-ipam finds its probe link by CNI_IFNAME.
    pod.rename(link.index, ifname)
        .map_err(|e| match e.errno() {
            Some(EEXIST) => AttachError::IfnameExists {
                ifname: ifname.to_string(),
                netns: netns_path.to_owned(),
            },
            _ => e.into(),
        })?;
    kill_point("rename");
    Ok(link)
}

/// The addresses to configure: the IPAM's Result (spawned now unless it already runs), else the
/// chained prevResult; with the addresses the IPAM probed on the wire.
fn ipam_result(
    undo: &mut Undo,
    cfg: &IpvlanConfig,
    prev: Option<&CniResult>,
) -> Result<(CniResult, Vec<IpAddr>), AttachError> {
    // The IPAM's Result is used as soon as it is printed; its exit is checked once the link is
    // configured (tether-ipam closes its probe sockets in between, see `Running::early_result`).
    let running = match (&cfg.ipam_type, undo.running.take()) {
        (_, Some(running)) => Some(running),
        (Some(plugin), None) => {
            undo.ipam = Some(plugin.clone());
            Some(
                undo.req
                    .delegation()
                    .spawn(plugin, Command::Add)
                    .map_err(AttachError::Cni)?,
            )
        }
        (None, None) => None,
    };
    Ok(match running {
        Some(running) => {
            let (r, raw, exit) = running.early_result().map_err(AttachError::Cni)?;
            undo.exit = Some(exit);
            (r, tether_cni::result::probed_addresses(&raw))
        }
        None => (prev.cloned().unwrap_or_default(), Vec::new()),
    })
}

/// ADD's Result names the pod's interface, points every address at it, and falls back to the
/// config's DNS.
fn describe_interface(
    result: &mut CniResult,
    cfg: &IpvlanConfig,
    link: &Link,
    ifname: &str,
    netns_path: &Path,
) {
    result.interfaces = vec![Interface {
        name: ifname.to_string(),
        mac: link.mac.as_deref().map(format_mac),
        mtu: link.mtu,
        sandbox: Some(netns_path.display().to_string()),
        ..Default::default()
    }];
    for ip in &mut result.ips {
        ip.interface = Some(0);
    }
    if result.dns.is_empty()
        && let Some(dns) = &cfg.dns
    {
        result.dns = dns.clone();
    }
}

/// DEL: remove the link if it is there and release the lease through IPAM, at the same time; succeed
/// when both are already gone. Never resolves the master, so a missing master or default route cannot
/// make DEL fail.
pub fn del(req: &Request) -> Result<(), AttachError> {
    let ifname = req.env.ifname();
    // The IPAM runs while the link is removed (its exec is most of a DEL); the lease is released even
    // if the link could not be removed, and even when the config is one ADD would have refused (DEL
    // after a failed ADD). Its error is reported first, once the link is gone.
    let ipam = req
        .conf
        .ipam_type()
        .map(|plugin| req.delegation().spawn(plugin, Command::Del));
    let mut link_error = None;
    if let Some(path) = req.env.netns.as_deref() {
        match NetNs::open(path) {
            Ok(ns) => {
                if let Err(e) = delete_pod_link(&ns, req.env.container_id(), ifname) {
                    log::error!("DEL: removing {ifname} in {}: {e}", path.display());
                    link_error = Some(e);
                }
            }
            // The pod is gone, and its links with it.
            Err(NetnsError::Missing { .. } | NetnsError::NotANetns { .. }) => {}
            Err(e) => link_error = Some(e.into()),
        }
    }
    if let Some(running) = ipam {
        running.and_then(|r| r.wait()).map_err(AttachError::Cni)?;
    }
    link_error.map_or(Ok(()), Err)
}

/// Remove the ipvlan link called `name` (a temporary name) from the pod netns; whether there was one.
fn remove_temporary_link(pod: &dyn LinkOps, name: &str) -> Result<bool, AttachError> {
    match pod.link_by_name(name)? {
        Some(l) if l.kind.as_deref() == Some("ipvlan") => {
            pod.delete_link(l.index)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// CNI_IFNAME if it is an ipvlan link, and the link of an ADD killed before its rename.
fn delete_pod_link(ns: &NetNs, container_id: &str, ifname: &str) -> Result<(), AttachError> {
    remove_pod_links(&Netlink::in_netns(ns)?, container_id, ifname)
}

/// [`delete_pod_link`] on the pod netns's socket.
fn remove_pod_links(
    pod: &dyn LinkOps,
    container_id: &str,
    ifname: &str,
) -> Result<(), AttachError> {
    remove_temporary_link(pod, &temporary_name(container_id, ifname))?;
    match pod.link_by_name(ifname)? {
        Some(l) if l.kind.as_deref() == Some("ipvlan") => {
            pod.delete_link(l.index)?;
        }
        Some(l) => log::warn!(
            "DEL: {ifname} is a {} link, not ipvlan; leaving it alone",
            l.kind.as_deref().unwrap_or("unknown")
        ),
        None => {}
    }
    Ok(())
}

/// STATUS: ready when the master exists and IPAM is ready. Any failure is code 50 (or IPAM's 50/51).
pub fn status(req: &Request) -> Result<(), CniError> {
    let not_ready =
        |e: &dyn std::fmt::Display| CniError::from(AttachError::NotReady(e.to_string()));
    let cfg = IpvlanConfig::from_conf(&req.conf).map_err(CniError::from)?;
    // Under linkInContainer the master appears only with the pod; there is nothing to check up front.
    if !cfg.link_in_container {
        let host = Netlink::current().map_err(|e| not_ready(&e))?;
        resolve_master(&cfg, None, &host, &host).map_err(|e| not_ready(&e))?;
    }
    if let Some(plugin) = &cfg.ipam_type {
        req.delegation()
            .exec(plugin, Command::Status)
            .map_err(|e| error::ipam_not_ready(plugin, e))?;
    }
    Ok(())
}

/// GC: the attacher holds nothing outside pod netns (which the runtime removes); IPAM holds the leases.
pub fn gc(req: &Request) -> Result<(), CniError> {
    match req.conf.ipam_type() {
        Some(plugin) => req.delegation().exec(plugin, Command::Gc).map(|_| ()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_cni::code;

    #[test]
    fn the_temporary_name_is_the_attachments_own_and_fits_a_link_name() {
        let a = temporary_name("0123456789abcdef0123456789abcdef", "net1");
        assert_eq!(
            a,
            temporary_name("0123456789abcdef0123456789abcdef", "net1")
        );
        assert_eq!(a.len(), 15, "{a}: IFNAMSIZ - 1");
        assert!(a.starts_with("tth") && a[3..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(
            a,
            temporary_name("0123456789abcdef0123456789abcdef", "net2")
        );
        assert_ne!(
            a,
            temporary_name("0123456789abcdef0123456789abcdee", "net1")
        );
        // Pinned: a DEL by a newer tether must find the link an older one's ADD left.
        assert_eq!(temporary_name("c", "net1"), "tthba3dc66c66d1");
    }

    fn master(up: bool, carrier: bool) -> Link {
        Link {
            index: 2,
            name: "enp5s0".into(),
            mac: Some(vec![2, 0, 0, 0, 0, 1]),
            mtu: Some(1500),
            up,
            carrier,
            kind: None,
            ipvlan_mode: None,
            ipvlan_flag: None,
            parent_index: None,
        }
    }

    #[test]
    fn a_master_without_carrier_is_refused_with_what_to_do() {
        assert!(require_carrier(false, &master(true, true)).is_ok());
        let down = require_carrier(false, &master(false, false)).unwrap_err();
        assert_eq!(down.code(), code::TRY_AGAIN_LATER);
        assert_eq!(
            down.to_string(),
            "master interface \"enp5s0\" on the host is administratively down: a pod attached to it would \
             have no network; bring it up on the node (`ip link set enp5s0 up`); tether never changes a \
             master's state. The kubelet retries the pod by itself once the link is up"
        );
        let dark = require_carrier(true, &master(true, false)).unwrap_err();
        assert_eq!(dark.code(), code::TRY_AGAIN_LATER);
        let m = dark.to_string();
        assert!(
            m.starts_with(
                "master interface \"enp5s0\" in the pod network namespace is up but has no carrier"
            ) && m.contains("NO-CARRIER"),
            "{m}"
        );
    }
}
