//! The node-agent's conflict guard: after the ADD's probe, the wire is still watched (RFC 5227
//! §2.4). When another MAC speaks as an address leased to a pod of this node (an administrator
//! configured it by hand, a VM came up with it, a node cut off from the API server still
//! answers for it), the agent, within a second of the frame:
//!
//! - marks the pod's IPLease (label `ipam.tether.dev/claimed`, annotations naming the MAC and
//!   when), which `tether leases` shows, once it checked with a GET that the pod still holds it;
//! - counts `tether_address_claims_total{network,address,mac}` and sets
//!   `tether_address_claim_timestamp_seconds` (the alert `TetherAddressClaimed` reads it);
//! - posts a Warning Event `AddressConflict` on the pod naming the address, the MAC and the
//!   interface, once per sandbox and MAC;
//! - where the NAD says `"defend": true`, announces the address back, at most once per 10 s.
//!
//! It sends nothing else: no probes, no announcements while nothing conflicts.
//!
//! What it watches comes from this node's files ([`watch_set`]), every second; which interface
//! from the NADs (`master`), read every 30 s from the API server's watch cache, and at once when
//! a network new on this node shows in its journal. One thread per
//! interface ([`interface`]) runs the socket loop; this one, the supervisor, keeps them in step
//! and does the API work, so a slow API server never delays reading the wire.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use tether_cluster::Posted;
use tether_kube_store::{ClaimMark, Marked};
use tether_pool::StoreKind;
use tether_pool::config::DEFAULT_DATA_DIR;
use tether_wire::frame::format_mac;
use tether_wire::guard::{DEFEND_INTERVAL, Report};
use tether_wire::socket::link_facts;

use crate::kube::Kube;
use crate::metrics::Registry;
use crate::monitor::conflict_warning;
use crate::nads::nad_networks;
use crate::options::Options;
use crate::report::now_s;

pub mod interface;
pub mod watch_set;

use interface::{Heard, Watcher};
use watch_set::{
    GuardedNetwork, Held, WatchSet, guarded_networks, held_addresses, unknown_journals,
};

/// How often the node's files are read for what to watch.
const ROUND: Duration = Duration::from_secs(1);
/// How often the NADs are read for which interface each network uses.
const NADS_EVERY: Duration = Duration::from_secs(30);
/// The soonest the NADs are read again when a network new on this node shows in its journal.
const NADS_SOONEST: Duration = Duration::from_secs(2);

/// The supervisor of one node's guard threads.
pub struct ConflictGuard {
    node: String,
    kube: Option<Kube>,
    events: bool,
    registry: Arc<Registry>,
    networks: Vec<GuardedNetwork>,
    nads_read: Option<Instant>,
    held: WatchSet,
    watchers: HashMap<String, Watcher>,
    heard_tx: Sender<Heard>,
    heard: Receiver<Heard>,
    /// Problems said once until they change (a missing master, a socket that cannot open).
    warned: HashSet<String>,
    /// Journal directories no NAD accounted for at the last read of the NADs.
    unknown: BTreeSet<PathBuf>,
}

impl ConflictGuard {
    /// From the agent's options: its node, API access, whether to post Events.
    pub fn new(opts: &Options, registry: Arc<Registry>) -> Result<ConflictGuard, String> {
        let kube = opts.kube.as_ref().map(Kube::connect).transpose()?;
        let (heard_tx, heard) = channel();
        Ok(ConflictGuard {
            node: opts.node.clone(),
            kube,
            events: opts.conflict_events,
            registry,
            networks: Vec::new(),
            nads_read: None,
            held: WatchSet::new(),
            watchers: HashMap::new(),
            heard_tx,
            heard,
            warned: HashSet::new(),
            unknown: BTreeSet::new(),
        })
    }

    /// Guard until `stop`; the interface threads are stopped before it returns.
    pub fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            self.round();
            let until = Instant::now() + ROUND;
            while let Some(left) = until.checked_duration_since(Instant::now()) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match self
                    .heard
                    .recv_timeout(left.min(Duration::from_millis(100)))
                {
                    Ok(h) => self.on_heard(h),
                    Err(_) => continue,
                }
            }
        }
        for (_, w) in self.watchers.drain() {
            w.stop();
        }
    }

    /// Read what to watch and bring the interface threads in step with it.
    pub fn round(&mut self) {
        // A network new on this node (its first ADD made its journal) is read from its NAD at
        // once, not at the next periodic read: a new lease is watched within seconds.
        let unknown = unknown_journals(&self.networks, Path::new(DEFAULT_DATA_DIR));
        let new_network = unknown.iter().any(|d| !self.unknown.contains(d));
        let due = self.nads_read.is_none_or(|t| t.elapsed() >= NADS_EVERY)
            || (new_network && self.nads_read.is_none_or(|t| t.elapsed() >= NADS_SOONEST));
        if due {
            self.read_nads();
            self.unknown = unknown_journals(&self.networks, Path::new(DEFAULT_DATA_DIR));
        }
        let default_master = self
            .networks
            .iter()
            .any(|n| n.master.is_none())
            .then(default_route_interface)
            .flatten();
        let (held, errors) = held_addresses(&self.networks, &self.node, default_master.as_deref());
        for e in errors {
            self.say_once(format!("reading this node's leases: {e}"));
        }
        self.held = held;
        let mut watched = BTreeMap::new();
        let sets: Vec<(String, Vec<(IpAddr, bool)>)> = self
            .held
            .iter()
            .map(|(i, addrs)| {
                (
                    i.clone(),
                    addrs.iter().map(|(a, h)| (*a, h.defend)).collect(),
                )
            })
            .collect();
        for (interface, watch) in sets {
            watched.insert(interface.clone(), watch.len() as u64);
            self.keep_watching(&interface, watch);
        }
        let gone: Vec<String> = self
            .watchers
            .keys()
            .filter(|i| !self.held.contains_key(*i))
            .cloned()
            .collect();
        for i in gone {
            if let Some(w) = self.watchers.remove(&i) {
                w.stop();
            }
        }
        self.registry.set_guarded(watched);
    }

    /// The NADs' networks, from the watch cache; the last ones are kept when the list fails.
    fn read_nads(&mut self) {
        self.nads_read = Some(Instant::now());
        let Some(kube) = &self.kube else {
            self.say_once("no API access: the NADs, which name each network's master, cannot be read; nothing is watched".into());
            return;
        };
        kube.restart_budget();
        match kube.cluster.network_attachment_definitions() {
            Ok(Some(nads)) => {
                let (networks, left_out) = guarded_networks(&nad_networks(&nads));
                self.networks = networks;
                for nad in left_out {
                    if self.warned.insert(format!("left out {nad}")) {
                        log::info!(
                            "conflict guard: NAD {nad} is not guarded: only ipvlan pods answer with their master's MAC"
                        );
                    }
                }
            }
            Ok(None) => self.networks.clear(),
            Err(e) => log::error!("conflict guard: listing the NetworkAttachmentDefinitions: {e}"),
        }
    }

    /// Start, restart or update the thread of `interface`.
    fn keep_watching(&mut self, interface: &str, watch: Vec<(IpAddr, bool)>) {
        let facts = match link_facts(interface) {
            Ok(Some(f)) => f,
            Ok(None) => {
                self.say_once(format!(
                    "interface {interface} (a NAD's master) is not on this node: its pods' addresses are not watched"
                ));
                return;
            }
            Err(e) => {
                self.say_once(format!("reading interface {interface}: {e}"));
                return;
            }
        };
        let Some(mac) = facts.mac else {
            self.say_once(format!(
                "interface {interface} is not Ethernet: not watched"
            ));
            return;
        };
        let current = self
            .watchers
            .get(interface)
            .is_some_and(|w| !w.ended() && w.ifindex == facts.index && w.mac == mac);
        if current {
            if let Some(w) = self.watchers.get_mut(interface) {
                w.watch(watch);
            }
            return;
        }
        // Gone, ended, or the interface was re-created: a new thread on the new index.
        if let Some(w) = self.watchers.remove(interface) {
            w.stop();
        }
        match Watcher::spawn(interface, facts.index, mac, watch, self.heard_tx.clone()) {
            Ok(w) => {
                log::info!("conflict guard: watching {interface}");
                self.watchers.insert(interface.to_string(), w);
            }
            Err(e) => self.say_once(format!("cannot start the guard of {interface}: {e}")),
        }
    }

    fn on_heard(&mut self, h: Heard) {
        match h {
            Heard::Claim { interface, report } => self.on_claim(&interface, &report),
            Heard::Dropped { interface, frames } => {
                self.registry.guard_dropped(&interface, frames);
                log::debug!("conflict guard: {interface}: the kernel dropped {frames} frame(s)");
            }
            Heard::Failed { interface, error } => {
                // Started again at the next round (it has ended).
                self.say_once(format!("guarding {interface}: {error}"));
            }
        }
    }

    /// Another MAC spoke as an address of this node's pods on `interface`.
    fn on_claim(&mut self, interface: &str, report: &Report) {
        let address = report.claim.address;
        let Some(held) = self
            .held
            .get(interface)
            .and_then(|a| a.get(&address))
            .cloned()
        else {
            return;
        };
        let mac = format_mac(&report.claim.mac);
        let now = now_s();
        let l = &held.lease;
        let mut recorded = true;
        if let (StoreKind::Kubernetes, Some(kube)) = (held.store, &self.kube) {
            kube.restart_budget();
            let mark = ClaimMark {
                mac: mac.clone(),
                at: now,
            };
            match kube.leases.mark_claimed(l, &mark) {
                Ok(Marked::Marked) => {}
                // Released since the last round (its DEL removed the journal entry too): the
                // claim is on no pod of ours. Still journaled: the pod runs with the address, but
                // the store released it, as the controller does for a node it lost: another
                // pod may be given the address, and this pod is the one to move.
                Ok(Marked::NotHeld) if !held.still_journaled() => {
                    log::info!(
                        "conflict guard: {address} of network {} was claimed by {mac}, but this node no longer holds it",
                        l.network
                    );
                    return;
                }
                Ok(Marked::NotHeld) => recorded = false,
                Err(e) => log::error!(
                    "conflict guard: marking the lease of {address} of network {} as claimed by {mac}: {e}",
                    l.network
                ),
            }
        }
        self.registry
            .claim(&l.network, &address.to_string(), &mac, now);
        log::warn!(
            "address conflict on node {}: {address} of network {}, leased to pod {} ({}), was claimed on {interface} by MAC {mac}{}",
            self.node,
            l.network,
            l.pod,
            l.ifname,
            if report.defended {
                "; announced it back"
            } else {
                ""
            }
        );
        self.post_event(interface, &held, &mac, report.defended, recorded, now);
    }

    /// The Warning Event on the holder's pod: one per sandbox and claimant (its name says so, so
    /// an agent restarted later does not post it again).
    fn post_event(
        &mut self,
        interface: &str,
        held: &Held,
        mac: &str,
        defended: bool,
        recorded: bool,
        now: u64,
    ) {
        let l = &held.lease;
        let (Some(kube), true) = (&self.kube, self.events) else {
            return;
        };
        let Some(w) = conflict_warning(
            &l.pod,
            &format!(
                "claim/{}/{}/{mac}/{}/{}",
                l.network, l.address, l.container_id, l.ifname
            ),
            claim_message(held, mac, interface, &self.node, defended, recorded),
            &self.node,
            now,
        ) else {
            return;
        };
        kube.restart_budget();
        match kube.cluster.post_pod_event(&w) {
            Ok(Posted::Created) => self.registry.event(true),
            Ok(Posted::AlreadyThere) => {}
            Err(e) => {
                self.registry.event(false);
                self.say_once(format!(
                    "cannot post the AddressConflict Event on pod {}/{}: {e}",
                    w.namespace, w.pod
                ));
            }
        }
    }

    /// Log `msg` as an error the first time it is met.
    fn say_once(&mut self, msg: String) {
        if self.warned.insert(msg.clone()) {
            log::error!("conflict guard: {msg}");
        }
    }
}

/// The interface of the host's IPv4 default route, which the attacher takes when a NAD names no
/// master.
fn default_route_interface() -> Option<String> {
    tether_link::Netlink::current()
        .and_then(|n| n.default_route_link())
        .ok()
        .flatten()
        .map(|l| l.name)
}

/// The Event's message; `recorded`: the cluster store still has the lease as this pod's.
fn claim_message(
    held: &Held,
    mac: &str,
    interface: &str,
    node: &str,
    defended: bool,
    recorded: bool,
) -> String {
    let l = &held.lease;
    if !recorded {
        return format!(
            "{} of network {} is in use by this pod ({}) and claimed by another host: MAC {mac} spoke as this address on \
             {interface} of node {node}. The cluster store no longer records this pod's lease (it was released while this \
             node could not reach the API server, or taken over), so the address may have been given to another pod. Delete \
             this pod so that it gets an address of its own.",
            l.address, l.network, l.ifname
        );
    }
    let defence = if defended {
        format!(
            "tether announced the address back on {interface} (the NAD sets \"defend\": true; at most once per {} s)",
            DEFEND_INTERVAL.as_secs()
        )
    } else {
        "tether did not answer it (set \"defend\": true in the NAD's ipam to announce the address back)".to_string()
    };
    format!(
        "{} of network {}, leased to this pod ({}), is claimed by another host: MAC {mac} spoke as this address on {interface} of node {node}. \
         Traffic for the address may go to that host. {defence}. Find the host with that MAC and remove the address from it; or \
         delete this pod so that it gets another address.",
        l.address, l.network, l.ifname
    )
}
