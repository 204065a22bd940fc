//! `tether-ipvlan`: attach a pod to the physical L2 network through an ipvlan sub-interface.
//!
//! Differences from the reference ipvlan plugin, each on purpose:
//! - every ADD failure after the link exists removes the link and releases the IPAM lease ([`Undo`]);
//! - DEL never resolves the master, deletes the link and releases the lease even when one of them is
//!   already gone or fails; it also removes the link of an ADD killed before its rename (found by
//!   its [`temporary_name`], derived from the attachment);
//! - CHECK resolves the master like ADD, so it works with `master` omitted;
//! - STATUS checks the master; GC is forwarded to IPAM; a requested MAC is refused (code 2);
//! - `mtu` above the master's is refused before anything is created.

pub mod config;
pub mod error;

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use tether_cni::delegate::{Exit, Running};
use tether_cni::result::{Interface, Route as CniRoute};
use tether_cni::{CniError, CniResult, Command, Request, code};
use tether_link::netlink::EEXIST;
use tether_link::{IpvlanMode, Link, NetNs, Netlink, NetnsError, NsThread, Route, sysctl};
use tether_wire::frame::format_mac;

pub use config::IpvlanConfig;
pub use error::AttachError;

/// How long ADD waits for IPv6 duplicate address detection before giving up.
const DAD_WAIT: Duration = Duration::from_secs(5);

/// How long the kernel's DAD listens for a defender on the pod's new interface, instead of its
/// default random delay of up to 1 s plus 1 s (RetransTimer): the same window as tether-ipam's
/// default probe. An address is never returned tentative; it just leaves that state sooner.
const DAD_WINDOW_MS: u32 = 100;

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
    host: &Netlink,
    pod: &Netlink,
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

/// Undoes a partial ADD when dropped armed: removes the link, then releases the lease. Errors here are
/// logged, not returned: the ADD's own error is what the runtime must see.
struct Undo<'a> {
    req: &'a Request,
    pod: &'a Netlink,
    link: Option<u32>,
    ipam: Option<String>,
    /// The IPAM ADD, when it runs while the link is made: waited for before its DEL.
    running: Option<Running>,
    /// The IPAM ADD whose Result is in, until it has exited: its DEL must not overlap it.
    exit: Option<Exit>,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.wait();
        }
        if let Some(e) = self.exit.take() {
            let _ = e.check();
        }
        if !self.armed {
            return;
        }
        if let Some(index) = self.link
            && let Err(e) = self.pod.delete_link(index)
        {
            log::error!("rollback: removing the half-made link #{index}: {e}");
        }
        if let Some(plugin) = &self.ipam
            && let Err(e) = self.req.delegation().exec(plugin, Command::Del)
        {
            log::error!("rollback: releasing the lease through {plugin}: {e}");
        }
    }
}

/// IPAM plugins that only allocate, so they can run while the link is made: most of an ADD is the
/// IPAM's exec and probe, and the link's creation then costs nothing. Others (dhcp talks through the
/// pod's interface) run once it exists, as under the reference plugin.
fn ipam_needs_no_link(cfg: &IpvlanConfig, plugin: &str) -> bool {
    match plugin {
        // Without `master`, tether-ipam finds its probe link through CNI_IFNAME.
        "tether-ipam" => cfg.master.is_some(),
        "host-local" | "static" | "whereabouts" => true,
        _ => false,
    }
}

/// ADD: create, rename, address, raise, announce. Nothing is left behind on failure.
///
/// One thread enters the pod netns for the whole ADD ([`NsThread`]): it opens the pod's netlink socket
/// (used from this thread afterwards), writes the sysctls and sends the announcements.
pub fn add(req: &Request) -> Result<CniResult, AttachError> {
    let cfg = IpvlanConfig::from_conf(&req.conf)?;
    reject_requested_mac(req)?;
    let prev = req.conf.prev_result.as_ref();
    if cfg.ipam_type.is_none() && prev.is_none_or(|p| p.ips.is_empty()) {
        return Err(AttachError::IpamRequired);
    }
    let netns_path = req.env.netns.as_deref().expect("ADD validated CNI_NETNS");
    let ifname = req.env.ifname();
    let ns = open_pod_netns(netns_path)?;
    let in_pod = ns.thread()?;
    let pod = in_pod.run(Netlink::current)??;
    let host = Netlink::current()?;

    let master = resolve_master(&cfg, prev, &host, &pod)?;
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

    let mut undo = Undo {
        req,
        pod: &pod,
        link: None,
        ipam: None,
        running: None,
        exit: None,
        armed: true,
    };
    if let Some(plugin) = &cfg.ipam_type
        && ipam_needs_no_link(&cfg, plugin)
    {
        // Armed before the call: a failed delegate ADD is followed by its DEL, as the spec asks.
        undo.ipam = Some(plugin.clone());
        undo.running = Some(
            req.delegation()
                .spawn(plugin, Command::Add)
                .map_err(AttachError::Cni)?,
        );
    }

    // Under linkInContainer the master is in the pod netns already: create there, no move.
    let (creator, target) = if cfg.link_in_container {
        (&pod, None)
    } else {
        (&host, Some(&ns))
    };
    let tmp = temporary_name(req.env.container_id(), ifname);
    let create = || creator.create_ipvlan(&tmp, master.index, cfg.mode, cfg.flag, cfg.mtu, target);
    match create() {
        // The link of an earlier ADD of this attachment that was killed before its rename (the
        // runtime retries ADD without a DEL in between): ours by its name, removed, made again.
        Err(e) if e.errno() == Some(EEXIST) && remove_temporary_link(&pod, &tmp)? => create()?,
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
    set_sysctls(&in_pod, ifname)?;

    // The IPAM's Result is used as soon as it is printed; its exit is checked once the link is
    // configured (tether-ipam closes its probe sockets in between, see `Running::early_result`).
    let running = match (&cfg.ipam_type, undo.running.take()) {
        (_, Some(running)) => Some(running),
        (Some(plugin), None) => {
            undo.ipam = Some(plugin.clone());
            Some(
                req.delegation()
                    .spawn(plugin, Command::Add)
                    .map_err(AttachError::Cni)?,
            )
        }
        (None, None) => None,
    };
    let (mut result, probed) = match running {
        Some(running) => {
            let (r, raw, exit) = running.early_result().map_err(AttachError::Cni)?;
            undo.exit = Some(exit);
            (r, tether_cni::result::probed_addresses(&raw))
        }
        None => (prev.cloned().unwrap_or_default(), Vec::new()),
    };
    kill_point("ipam");
    if result.ips.is_empty() {
        return Err(AttachError::NoAddresses {
            plugin: cfg.ipam_type.clone().unwrap_or_else(|| "prevResult".into()),
        });
    }

    configure(&in_pod, &pod, &link, ifname, &result, &probed)?;
    kill_point("configure");
    if let Some(exit) = undo.exit.take() {
        exit.check().map_err(AttachError::Cni)?;
    }

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
    undo.armed = false;
    Ok(result)
}

/// The pod interface's DAD timing as it was before [`short_dad_window`].
struct DadTiming {
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

/// Announce on link-up and on address changes, so peers drop stale entries when an address moves.
/// Set before the link is up.
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
fn configure(
    in_pod: &NsThread,
    pod: &Netlink,
    link: &Link,
    ifname: &str,
    result: &CniResult,
    probed: &[IpAddr],
) -> Result<(), AttachError> {
    let nodad = |a: IpAddr| a.is_ipv6() && probed.contains(&a);
    let dad: Vec<IpNet> = result
        .ips
        .iter()
        .map(|i| i.address)
        .filter(|a| a.addr().is_ipv6() && !nodad(a.addr()))
        .collect();
    let window = if dad.is_empty() {
        None
    } else {
        short_dad_window(in_pod, ifname)?
    };
    for ip in &result.ips {
        pod.add_address(link.index, ip.address, nodad(ip.address.addr()))?;
    }
    pod.set_up(link.index)?;
    wait_for_dad(pod, link.index, ifname, &dad)?;
    if let Some(w) = window {
        w.restore(in_pod, ifname)?;
    }
    for r in &result.routes {
        let gateway = r.gw.or_else(|| same_family_gateway(result, r));
        let route = Route {
            dst: r.dst,
            gateway,
            oif: Some(link.index),
            priority: r.priority,
            table: r.table,
        };
        match pod.add_route(&route) {
            Err(e) if e.errno() == Some(EEXIST) => log::info!("route to {} already present", r.dst),
            other => other?,
        }
    }
    announce_addresses(in_pod, link, result);
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
fn same_family_gateway(result: &CniResult, r: &CniRoute) -> Option<IpAddr> {
    result
        .ips
        .iter()
        .filter_map(|ip| ip.gateway)
        .find(|g| g.is_ipv4() == r.dst.addr().is_ipv4())
}

/// Return only once every address of `wanted` (IPv6, added without `nodad`) has left the tentative
/// state, so the pod can use it at once.
fn wait_for_dad(
    pod: &Netlink,
    index: u32,
    ifname: &str,
    wanted: &[IpNet],
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
        if start.elapsed() >= DAD_WAIT {
            return Err(AttachError::DadTimeout {
                address: p.to_string(),
                ifname: ifname.to_string(),
                waited_ms: DAD_WAIT.as_millis() as u64,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
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
fn remove_temporary_link(pod: &Netlink, name: &str) -> Result<bool, AttachError> {
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
    let pod = Netlink::in_netns(ns)?;
    remove_temporary_link(&pod, &temporary_name(container_id, ifname))?;
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
    let expected = &prev.interfaces[idx];
    let ns = open_pod_netns(netns_path)?;
    let host = Netlink::current()?;
    let pod = Netlink::in_netns(&ns)?;

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
        (&pod, "pod netns")
    } else {
        (&host, "host")
    };
    match &cfg.master {
        Some(_) => {
            let master = resolve_master(&cfg, None, &host, &pod)?;
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

/// STATUS: ready when the master exists and IPAM is ready. Any failure is code 50 (or IPAM's 50/51).
pub fn status(req: &Request) -> Result<(), CniError> {
    let not_ready = |msg: String| CniError::new(code::NOT_AVAILABLE, msg);
    let cfg = IpvlanConfig::from_conf(&req.conf).map_err(CniError::from)?;
    // Under linkInContainer the master appears only with the pod; there is nothing to check up front.
    if !cfg.link_in_container {
        let host = Netlink::current().map_err(|e| not_ready(e.to_string()))?;
        resolve_master(&cfg, None, &host, &host).map_err(|e| not_ready(e.to_string()))?;
    }
    if let Some(plugin) = &cfg.ipam_type {
        req.delegation()
            .exec(plugin, Command::Status)
            .map_err(|e| match e.code {
                code::NOT_AVAILABLE | code::NOT_AVAILABLE_LIMITED => e,
                _ => CniError::new(
                    code::NOT_AVAILABLE,
                    format!("IPAM {plugin} is not ready: {}", e.msg),
                )
                .with_details(e.details),
            })?;
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
