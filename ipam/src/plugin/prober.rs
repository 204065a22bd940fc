//! The conflict prober: which interface to probe on, and the probe itself (tether-wire).
//!
//! Where matters. An ARP probe sent from an ipvlan L2 slave never sees the reply: Linux answers a probe
//! with target IP 0.0.0.0, and ipvlan delivers unicast ARP by target IP, so the reply lands on the
//! master. So:
//! 1. the config's `master` (the attacher's key, which the IPAM receives too) — in the host netns, or in
//!    the pod netns under `linkInContainer`;
//! 2. else, if CNI_IFNAME in the pod netns is an ipvlan slave, its parent;
//! 3. else CNI_IFNAME itself (macvlan slave, veth: the pod's own interface, which the calling plugin
//!    created for this pod and raises after IPAM), raised for the probe if it is down and put back.
//!
//! A master (1, 2) is never raised: it is a host interface that other pods' ADDs probe through at the
//! same time, so a down master is an error naming it, with the code the attacher gives the same fault.
//!
//! One budget for all families: the engine hands every address of an ADD to one [`Prober::probe`]
//! call (its probe step), which sends them all on one packet socket and waits for them together.
//! The socket is handed back with the answers, to be closed once the reply is out.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use tether_cni::{Env, MasterKeys};
use tether_leases::{Candidate, ProbeError, ProbeOutcome, Probed, Prober};
use tether_link::{Link, NetNs, Netlink, NsThread};
use tether_wire::socket::LinkFacts;
use tether_wire::{Probe, ProbeBudget, WireError};

/// Where to look for the interface.
#[derive(Debug, Clone)]
pub enum Target {
    /// A named link in the host netns (None) or the pod netns (Some).
    Named {
        name: String,
        netns: Option<PathBuf>,
    },
    /// CNI_IFNAME in the pod netns, or its ipvlan parent.
    PodInterface { ifname: String, netns: PathBuf },
}

const ON_HOST: &str = "on the host";
const IN_POD: &str = "in the pod network namespace";

/// The interface found for one probe step.
struct Iface {
    index: u32,
    mac: [u8; 6],
    name: String,
    /// A thread in the pod netns when the link is there: packet sockets are opened from it.
    pod: Option<NsThread>,
    /// The pod's own interface, raised for probing: [`Iface::put_back`] lowers it through this.
    raised: Option<Netlink>,
}

impl Iface {
    /// Probe `addresses` (not empty) on one socket and wait for all of them: the socket, still
    /// open, with one outcome per address in order.
    fn probe(&self, addresses: Vec<IpAddr>, budget: ProbeBudget) -> Result<Waited, ProbeError> {
        let (index, mac) = (self.index, self.mac);
        let run = move || -> Result<Waited, WireError> {
            let mut rest = addresses.into_iter();
            let Some(first) = rest.next() else {
                return Ok((None, Vec::new()));
            };
            let mut probe = Probe::start(index, mac, first, budget)?;
            for a in rest {
                probe.add(a, budget)?;
            }
            let outcomes = probe.wait();
            Ok((Some(probe), outcomes))
        };
        match &self.pod {
            None => run(),
            Some(t) => t.run(run).map_err(other)?,
        }
        .map_err(other)
    }

    /// The pod's interface back down if the step raised it.
    fn put_back(&self) {
        if let Some(nl) = &self.raised
            && let Err(e) = nl.set_down(self.index)
        {
            log::warn!("could not set {} down again after probing: {e}", self.name);
        }
    }
}

/// A finished probe: its socket (open until the reply is out) and what each address found.
type Waited = (
    Option<Probe>,
    Vec<Result<tether_wire::ProbeOutcome, WireError>>,
);

fn other(e: impl std::error::Error + Send + Sync + 'static) -> ProbeError {
    ProbeError::Other(Box::new(e))
}

/// Where an ADD's probes go, from the config's master keys and the pod (see the module doc); None
/// when there is nothing to probe through (no master and no netns: e.g. cnitool against a runtime
/// that gives no netns), which the caller treats as an error.
pub fn target_for(keys: &MasterKeys, env: &Env) -> Option<Target> {
    let netns = env.netns.clone();
    Some(match &keys.master {
        Some(m) => Target::Named {
            name: m.clone(),
            netns: if keys.link_in_container {
                Some(netns?)
            } else {
                None
            },
        },
        None => Target::PodInterface {
            ifname: env.ifname().to_string(),
            netns: netns?,
        },
    })
}

/// The prober of tether-ipam's ADD: every call is one step on the wire (see the module doc).
pub struct WireProber {
    target: Target,
    budget: ProbeBudget,
}

impl WireProber {
    pub fn new(target: Target, budget: ProbeBudget) -> WireProber {
        WireProber { target, budget }
    }

    fn resolve(&self) -> Result<Iface, ProbeError> {
        let in_pod = |p: &PathBuf| -> Result<(NsThread, Netlink), ProbeError> {
            let t = NetNs::open(p).map_err(other)?.thread().map_err(other)?;
            let nl = t.run(Netlink::current).map_err(other)?.map_err(other)?;
            Ok((t, nl))
        };
        let missing = |name: &str, place: &str| ProbeError::LinkMissing {
            name: name.to_string(),
            place: place.to_string(),
        };
        match &self.target {
            Target::Named { name, netns: None } => {
                let link = tether_wire::socket::link_facts(name)
                    .map_err(other)?
                    .ok_or_else(|| missing(name, ON_HOST))?;
                master(name, &link, None)
            }
            Target::Named {
                name,
                netns: Some(p),
            } => {
                let (t, pod) = in_pod(p)?;
                let link = pod
                    .link_by_name(name)
                    .map_err(other)?
                    .ok_or_else(|| missing(name, IN_POD))?;
                master(&link.name, &found(&link), Some(t))
            }
            Target::PodInterface { ifname, netns } => {
                let (t, pod) = in_pod(netns)?;
                let link = pod
                    .link_by_name(ifname)
                    .map_err(other)?
                    .ok_or_else(|| missing(ifname, IN_POD))?;
                match (link.kind.as_deref(), link.parent_index) {
                    // An ipvlan slave created from the host: probe on its parent, in the host netns.
                    (Some("ipvlan"), Some(parent)) => {
                        let host = Netlink::current().map_err(other)?;
                        match host.link_by_index(parent).map_err(other)? {
                            Some(m) => master(&m.name, &found(&m), None),
                            // The parent is not in the host netns (linkInContainer): it is next to the slave.
                            None => {
                                let m =
                                    pod.link_by_index(parent).map_err(other)?.ok_or_else(|| {
                                        ProbeError::Failed(format!(
                                            "the master of {ifname} was not found"
                                        ))
                                    })?;
                                master(&m.name, &found(&m), Some(t))
                            }
                        }
                    }
                    _ => {
                        let mac = ethernet(&link.name, &found(&link))?;
                        // The pod's own interface, down until its plugin configures it after IPAM.
                        let raised = if link.up {
                            None
                        } else {
                            pod.set_up(link.index).map_err(other)?;
                            Some(pod)
                        };
                        Ok(Iface {
                            index: link.index,
                            mac,
                            name: link.name,
                            pod: Some(t),
                            raised,
                        })
                    }
                }
            }
        }
    }
}

/// The MAC to probe with: `link` must be Ethernet.
fn ethernet(name: &str, link: &LinkFacts) -> Result<[u8; 6], ProbeError> {
    link.mac
        .ok_or_else(|| ProbeError::Failed(format!("{name} has no Ethernet address to probe with")))
}

/// A link found over netlink, as [`master`] takes it.
fn found(link: &Link) -> LinkFacts {
    LinkFacts {
        index: link.index,
        mac: link.mac.as_deref().and_then(|m| m.try_into().ok()),
        up: link.up,
    }
}

/// A master to probe through: used as it is, never raised (see the module doc).
fn master(name: &str, link: &LinkFacts, pod: Option<NsThread>) -> Result<Iface, ProbeError> {
    if !link.up {
        return Err(ProbeError::LinkDown {
            name: name.to_string(),
            place: if pod.is_some() { IN_POD } else { ON_HOST }.to_string(),
        });
    }
    Ok(Iface {
        index: link.index,
        mac: ethernet(name, link)?,
        name: name.to_string(),
        pod,
        raised: None,
    })
}

impl Prober for WireProber {
    fn probe(&self, candidates: &[Candidate<'_>]) -> Result<Probed, ProbeError> {
        if candidates.is_empty() {
            return Ok(Probed::answers(Vec::new()));
        }
        let iface = self.resolve()?;
        let addresses: Vec<IpAddr> = candidates.iter().map(|c| c.address).collect();
        let waited = iface.probe(addresses.clone(), self.budget);
        // While the interface is as it was during the probe; then the answers count.
        iface.put_back();
        let (socket, outcomes) = waited?;
        let mut answers = Vec::with_capacity(outcomes.len());
        for (a, o) in addresses.iter().zip(outcomes) {
            let o = o.map_err(other)?;
            log::debug!("probe {a} on {}: {o:?}", iface.name);
            answers.push(match o {
                tether_wire::ProbeOutcome::Free => ProbeOutcome::Free,
                tether_wire::ProbeOutcome::InUse { mac } => ProbeOutcome::InUse { mac },
            });
        }
        Ok(Probed {
            outcomes: answers,
            release_later: socket.map(|s| Box::new(s) as _),
        })
    }
}

/// The probe budget from the config's `probe` section.
pub fn budget(timeout_ms: u64, attempts: u32) -> ProbeBudget {
    ProbeBudget {
        timeout: Duration::from_millis(timeout_ms),
        attempts,
    }
}
