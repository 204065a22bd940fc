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
//! same time, so a down master is an error naming it.
//!
//! One budget for all families. The engine probes the ranges of an ADD one after the other. With
//! [`add_probing`], the probe of every range but the last is only started (one packet socket for
//! all of them queues every reply from then on) and provisionally answered Free; the last range's
//! probe then waits for all of them together, so IPv4 + IPv6 cost one budget and one socket. If an
//! earlier address turns out to be in use after all, the ADD fails inside the engine (which rolls
//! it back) and is redone probing one address at a time, so the address is quarantined and another
//! one handed out exactly as before. If adding an address to the running probe fails, the earlier
//! ones are dropped unproved, but the probe error fails the whole ADD, so none is handed out.

use std::cell::{OnceCell, RefCell};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use tether_cni::{Added, CniError, CniResult, Env, MasterKeys};
use tether_leases::{ProbeError, ProbeOutcome, Prober};
use tether_link::{Link, NetNs, Netlink, NsThread};
use tether_pool::IpRange;
use tether_wire::socket::LinkFacts;
use tether_wire::{Probe, ProbeBudget};

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

/// The interface found for probing.
struct Iface {
    index: u32,
    mac: [u8; 6],
    name: String,
    /// A thread in the pod netns when the link is there: packet sockets are opened from it.
    pod: Option<NsThread>,
    /// The pod's own interface, raised for probing: lowered again on drop through this handle.
    raised: Option<Netlink>,
}

impl Iface {
    /// Probe `address`: on `running`'s socket when earlier ranges' probes are under way, else on a new one.
    fn start(
        &self,
        running: Option<Probe>,
        address: IpAddr,
        budget: ProbeBudget,
    ) -> Result<Probe, ProbeError> {
        let (index, mac) = (self.index, self.mac);
        let start = move || match running {
            Some(mut p) => p.add(address, budget).map(|()| p),
            None => Probe::start(index, mac, address, budget),
        };
        match &self.pod {
            None => start(),
            Some(t) => t.run(start).map_err(|e| ProbeError::Other(Box::new(e)))?,
        }
        .map_err(|e| ProbeError::Other(Box::new(e)))
    }
}

/// What the probes of one ADD attempt found: made by [`add_probing`] for each attempt and lent to
/// its [`WireProber`] (the engine holds the prober as `&dyn Prober`, hence the cells).
pub struct ProbeSession {
    /// Probe earlier ranges without waiting (the first attempt only).
    concurrent: bool,
    /// Addresses probed and found unused.
    proved: RefCell<Vec<IpAddr>>,
    /// Set when a provisionally accepted address was answered after all: the ADD must be redone.
    redo: RefCell<Option<String>>,
    /// Probes waited for, their sockets still open: closing one waits out an RCU grace period (6-8 ms
    /// natively, more in a VM), so they are handed to the dispatcher to drop once the reply is out,
    /// while the caller is already configuring the pod.
    spent: RefCell<Vec<Probe>>,
}

impl ProbeSession {
    fn new(concurrent: bool) -> ProbeSession {
        ProbeSession {
            concurrent,
            proved: RefCell::default(),
            redo: RefCell::default(),
            spent: RefCell::default(),
        }
    }
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

pub struct WireProber<'s> {
    target: Target,
    budget: ProbeBudget,
    /// The config's ranges: the engine probes them in this order, and the last one waits for all.
    ranges: Vec<IpRange>,
    concurrent: bool,
    session: &'s ProbeSession,
    iface: OnceCell<Result<Iface, String>>,
    /// The probes of earlier ranges of this ADD, started and not yet waited for.
    pending: RefCell<Option<Probe>>,
}

impl<'s> WireProber<'s> {
    /// The prober of one attempt: what it proves goes to `session`.
    pub fn new(
        target: Target,
        ranges: &[IpRange],
        budget: ProbeBudget,
        session: &'s ProbeSession,
    ) -> WireProber<'s> {
        WireProber {
            target,
            budget,
            ranges: ranges.to_vec(),
            concurrent: session.concurrent && ranges.len() > 1,
            session,
            iface: OnceCell::new(),
            pending: RefCell::new(None),
        }
    }

    fn resolve(&self) -> Result<Iface, String> {
        let s = |e: &dyn std::fmt::Display| e.to_string();
        let in_pod = |p: &PathBuf| -> Result<(NsThread, Netlink), String> {
            let t = NetNs::open(p)
                .map_err(|e| s(&e))?
                .thread()
                .map_err(|e| s(&e))?;
            let nl = t
                .run(Netlink::current)
                .map_err(|e| s(&e))?
                .map_err(|e| s(&e))?;
            Ok((t, nl))
        };
        match &self.target {
            Target::Named { name, netns: None } => {
                let link = tether_wire::socket::link_facts(name)
                    .map_err(|e| s(&e))?
                    .ok_or_else(|| format!("master {name:?} not found for probing"))?;
                master(name, &link, None)
            }
            Target::Named {
                name,
                netns: Some(p),
            } => {
                let (t, pod) = in_pod(p)?;
                let link = pod.link_by_name(name).map_err(|e| s(&e))?.ok_or_else(|| {
                    format!("master {name:?} not found in {} for probing", p.display())
                })?;
                master(&link.name, &found(&link), Some(t))
            }
            Target::PodInterface { ifname, netns } => {
                let (t, pod) = in_pod(netns)?;
                let link = pod
                    .link_by_name(ifname)
                    .map_err(|e| s(&e))?
                    .ok_or_else(|| format!("{ifname} not found in {}", netns.display()))?;
                match (link.kind.as_deref(), link.parent_index) {
                    // An ipvlan slave created from the host: probe on its parent, in the host netns.
                    (Some("ipvlan"), Some(parent)) => {
                        let host = Netlink::current().map_err(|e| s(&e))?;
                        match host.link_by_index(parent).map_err(|e| s(&e))? {
                            Some(m) => master(&m.name, &found(&m), None),
                            // The parent is not in the host netns (linkInContainer): it is next to the slave.
                            None => {
                                let m = pod.link_by_index(parent).map_err(|e| s(&e))?.ok_or_else(
                                    || format!("the master of {ifname} was not found"),
                                )?;
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
                            pod.set_up(link.index).map_err(|e| s(&e))?;
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

    fn is_last(&self, range: &IpRange) -> bool {
        self.ranges
            .iter()
            .rposition(|r| r == range)
            .is_none_or(|i| i + 1 == self.ranges.len())
    }
}

/// The MAC to probe with: `link` must be Ethernet.
fn ethernet(name: &str, link: &LinkFacts) -> Result<[u8; 6], String> {
    link.mac
        .ok_or_else(|| format!("{name} has no Ethernet address to probe with"))
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
fn master(name: &str, link: &LinkFacts, pod: Option<NsThread>) -> Result<Iface, String> {
    if !link.up {
        return Err(format!(
            "cannot probe through {name:?}: the link is down, and a probe through a down link proves nothing; \
             bring {name} up (tether never changes the state of a master) or set \"probe\": false"
        ));
    }
    Ok(Iface {
        index: link.index,
        mac: ethernet(name, link)?,
        name: name.to_string(),
        pod,
        raised: None,
    })
}

/// Wait for every address of `probe` and record what each found: unused (proved), or, for one that was
/// provisionally accepted (all but `last_is_ours`' last), in use after all: the ADD must be redone.
/// The outcomes come back in order.
fn wait_and_record(
    mut probe: Probe,
    last_is_ours: bool,
    session: &ProbeSession,
) -> Vec<Result<tether_wire::ProbeOutcome, tether_wire::WireError>> {
    let addrs = probe.candidates();
    let outcomes = probe.wait();
    let provisional = outcomes.len() - usize::from(last_is_ours);
    for (i, (a, o)) in addrs.iter().zip(&outcomes).enumerate() {
        match o {
            Ok(tether_wire::ProbeOutcome::Free) => session.proved.borrow_mut().push(*a),
            Ok(tether_wire::ProbeOutcome::InUse { mac }) if i < provisional => {
                session.redo.borrow_mut().get_or_insert_with(|| {
                    format!("{a} answered the conflict probe from MAC {mac} after it was provisionally accepted")
                });
            }
            _ => {}
        }
    }
    session.spent.borrow_mut().push(probe);
    outcomes
}

fn wire_error(e: tether_wire::WireError) -> ProbeError {
    ProbeError::Other(Box::new(e))
}

impl Prober for WireProber<'_> {
    fn probe(&self, address: IpAddr, range: &IpRange) -> Result<ProbeOutcome, ProbeError> {
        let iface = self
            .iface
            .get_or_init(|| self.resolve())
            .as_ref()
            .map_err(|e| ProbeError::Failed(e.clone()))?;
        let running = self.pending.borrow_mut().take();
        let started = iface.start(running, address, self.budget)?;
        if self.concurrent && !self.is_last(range) {
            log::debug!(
                "probe {address} on {}: started; answered with the last range's",
                iface.name
            );
            *self.pending.borrow_mut() = Some(started);
            return Ok(ProbeOutcome::Free);
        }
        let mut outcomes = wait_and_record(started, true, self.session);
        let mine = outcomes.pop().expect("our own probe");
        for o in outcomes {
            o.map_err(wire_error)?;
        }
        if let Some(why) = self.session.redo.borrow().clone() {
            // The engine rolls this ADD back; add_probing redoes it one probe at a time.
            return Err(ProbeError::Failed(format!(
                "{why}; allocating again, probing one address at a time"
            )));
        }
        let mine = mine.map_err(wire_error)?;
        log::debug!("probe {address} on {}: {mine:?}", iface.name);
        Ok(match mine {
            tether_wire::ProbeOutcome::Free => ProbeOutcome::Free,
            tether_wire::ProbeOutcome::InUse { mac } => ProbeOutcome::InUse { mac },
        })
    }
}

impl Drop for WireProber<'_> {
    fn drop(&mut self) {
        // Probes the engine never waited for (it probed no later range): settle them now, while the
        // interface is still as it was during the probe.
        if let Some(pending) = self.pending.get_mut().take() {
            for o in wait_and_record(pending, false, self.session) {
                if let Err(e) = o {
                    self.session
                        .redo
                        .borrow_mut()
                        .get_or_insert_with(|| format!("a conflict probe failed: {e}"));
                }
            }
        }
        if let Some(Ok(iface)) = self.iface.get()
            && let Some(nl) = &iface.raised
            && let Err(e) = nl.set_down(iface.index)
        {
            log::warn!("could not set {} down again after probing: {e}", iface.name);
        }
    }
}

/// ADD with the probes of all ranges running at the same time (see the module doc): `add` runs the
/// engine with a prober lending the session it is given, `del` releases what a wrongly accepted ADD
/// got. Returns the Result, the addresses of it that were probed and found unused, and the spent
/// probes for the dispatcher to close once the reply is out.
pub fn add_probing(
    add: impl Fn(&ProbeSession) -> Result<CniResult, CniError>,
    del: impl Fn() -> Result<(), CniError>,
) -> Result<Added, CniError> {
    let done = |r: CniResult, session: ProbeSession| {
        let proved = session.proved.into_inner();
        let probed = r
            .ips
            .iter()
            .map(|ip| ip.address.addr())
            .filter(|a| proved.contains(a))
            .collect();
        Added {
            result: r,
            probed,
            linger: Some(Box::new(session.spent.into_inner())),
        }
    };
    let first = ProbeSession::new(true);
    let outcome = add(&first);
    match (outcome, first.redo.take()) {
        (Ok(r), None) => return Ok(done(r, first)),
        (Err(e), None) => return Err(e),
        (Ok(_), Some(why)) => {
            log::warn!("{why}; releasing and allocating again, probing one address at a time");
            del()?;
        }
        (Err(_), Some(why)) => log::info!("{why}; allocating again, probing one address at a time"),
    }
    drop(first);
    let second = ProbeSession::new(false);
    let r = add(&second)?;
    Ok(done(r, second))
}

/// The probe budget from the config's `probe` section.
pub fn budget(timeout_ms: u64, attempts: u32) -> ProbeBudget {
    ProbeBudget {
        timeout: Duration::from_millis(timeout_ms),
        attempts,
    }
}
