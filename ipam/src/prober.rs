//! The conflict prober: which interface to probe on, and the probe itself (tether-wire).
//!
//! Where matters. An ARP probe sent from an ipvlan L2 slave never sees the reply: Linux answers a probe
//! with target IP 0.0.0.0, and ipvlan delivers unicast ARP by target IP, so the reply lands on the
//! master. So:
//! 1. the config's `master` (the attacher's key, which the IPAM receives too) — in the host netns, or in
//!    the pod netns under `linkInContainer`;
//! 2. else, if CNI_IFNAME in the pod netns is an ipvlan slave, its parent;
//! 3. else CNI_IFNAME itself (macvlan slave, veth), raised for the probe if it is down and put back.

use std::cell::OnceCell;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use tether_cni::Request;
use tether_leases::{ProbeError, ProbeOutcome, Prober};
use tether_link::{NetNs, Netlink};
use tether_pool::IpRange;
use tether_wire::ProbeBudget;

/// Where to look for the interface.
#[derive(Debug, Clone)]
enum Target {
    /// A named link in the host netns (None) or the pod netns (Some).
    Named { name: String, netns: Option<PathBuf> },
    /// CNI_IFNAME in the pod netns, or its ipvlan parent.
    PodInterface { ifname: String, netns: PathBuf },
}

/// The interface found for probing.
struct Iface {
    index: u32,
    mac: [u8; 6],
    name: String,
    /// Set when the probe needs to run inside the pod netns.
    netns: Option<PathBuf>,
    /// We raised it and must lower it again.
    raised: bool,
}

pub struct WireProber {
    target: Target,
    budget: ProbeBudget,
    iface: OnceCell<Result<Iface, String>>,
}

impl WireProber {
    /// The prober for this request; None when there is nothing to probe through (no master and no
    /// netns: e.g. cnitool against a runtime that gives no netns), which the caller treats as an error.
    pub fn for_request(req: &Request, budget: ProbeBudget) -> Option<WireProber> {
        let v = &req.conf.value;
        let in_container = v.get("linkInContainer").and_then(Value::as_bool).unwrap_or(false);
        let netns = req.env.netns.clone();
        let target = match v.get("master").and_then(Value::as_str).filter(|m| !m.is_empty()) {
            Some(m) if in_container => Target::Named { name: m.to_string(), netns: Some(netns?) },
            Some(m) => Target::Named { name: m.to_string(), netns: None },
            None => Target::PodInterface { ifname: req.env.ifname().to_string(), netns: netns? },
        };
        Some(WireProber { target, budget, iface: OnceCell::new() })
    }

    fn resolve(&self) -> Result<Iface, String> {
        let rt = Netlink::runtime().map_err(|e| e.to_string())?;
        let open = |p: &PathBuf| NetNs::open(p).map_err(|e| e.to_string());
        let (link, netns, nl) = match &self.target {
            Target::Named { name, netns } => {
                let nl = match netns {
                    Some(p) => Netlink::in_netns(&rt, &open(p)?),
                    None => Netlink::current(&rt),
                }
                .map_err(|e| e.to_string())?;
                let link = nl.link_by_name(name).map_err(|e| e.to_string())?.ok_or_else(|| format!("master {name:?} not found for probing"))?;
                (link, netns.clone(), nl)
            }
            Target::PodInterface { ifname, netns } => {
                let pod = Netlink::in_netns(&rt, &open(netns)?).map_err(|e| e.to_string())?;
                let link = pod.link_by_name(ifname).map_err(|e| e.to_string())?.ok_or_else(|| format!("{ifname} not found in {}", netns.display()))?;
                match (link.kind.as_deref(), link.parent_index) {
                    // An ipvlan slave created from the host: probe on its parent, in the host netns.
                    (Some("ipvlan"), Some(parent)) => {
                        let host = Netlink::current(&rt).map_err(|e| e.to_string())?;
                        match host.link_by_index(parent).map_err(|e| e.to_string())? {
                            Some(master) => (master, None, host),
                            // The parent is not in the host netns (linkInContainer): it is next to the slave.
                            None => {
                                let m = pod.link_by_index(parent).map_err(|e| e.to_string())?.ok_or_else(|| format!("the master of {ifname} was not found"))?;
                                (m, Some(netns.clone()), pod)
                            }
                        }
                    }
                    _ => (link, Some(netns.clone()), pod),
                }
            }
        };
        let mac: [u8; 6] = link
            .mac
            .as_deref()
            .and_then(|m| m.try_into().ok())
            .ok_or_else(|| format!("{} has no Ethernet address to probe with", link.name))?;
        let raised = !link.up;
        if raised {
            nl.set_up(link.index).map_err(|e| e.to_string())?;
        }
        Ok(Iface { index: link.index, mac, name: link.name, netns, raised })
    }
}

impl Prober for WireProber {
    fn probe(&self, address: IpAddr, _range: &IpRange) -> Result<ProbeOutcome, ProbeError> {
        let iface = self.iface.get_or_init(|| self.resolve()).as_ref().map_err(|e| ProbeError::Failed(e.clone()))?;
        let (index, mac, budget) = (iface.index, iface.mac, self.budget);
        let run = move || tether_wire::probe(index, mac, address, budget);
        let outcome = match &iface.netns {
            None => run(),
            Some(p) => NetNs::open(p).map_err(|e| ProbeError::Other(Box::new(e)))?.run(run).map_err(|e| ProbeError::Other(Box::new(e)))?,
        }
        .map_err(|e| ProbeError::Other(Box::new(e)))?;
        log::debug!("probe {address} on {}: {outcome:?}", iface.name);
        Ok(match outcome {
            tether_wire::ProbeOutcome::Free => ProbeOutcome::Free,
            tether_wire::ProbeOutcome::InUse { mac } => ProbeOutcome::InUse { mac },
        })
    }
}

impl Drop for WireProber {
    /// Put a link we raised for probing back down: the attacher raises it when it is configured.
    fn drop(&mut self) {
        if let Some(Ok(iface)) = self.iface.get()
            && iface.raised
        {
            let lower = || -> Result<(), String> {
                let rt = Netlink::runtime().map_err(|e| e.to_string())?;
                let nl = match &iface.netns {
                    Some(p) => Netlink::in_netns(&rt, &NetNs::open(p).map_err(|e| e.to_string())?),
                    None => Netlink::current(&rt),
                }
                .map_err(|e| e.to_string())?;
                nl.set_down(iface.index).map_err(|e| e.to_string())
            };
            if let Err(e) = lower() {
                log::warn!("could not set {} down again after probing: {e}", iface.name);
            }
        }
    }
}

/// The probe budget from the config's `probe` section.
pub fn budget(timeout_ms: u64, attempts: u32) -> ProbeBudget {
    ProbeBudget { timeout: Duration::from_millis(timeout_ms), attempts }
}
