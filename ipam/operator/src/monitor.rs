//! The node-agent's monitor: every `monitor_interval` (default 30 s) it reads this node's lease
//! records and turns what it finds into data an operator can alert on.
//!
//! - **Conflicts.** A conflict probe that was answered leaves a `Quarantined` record naming the
//!   MAC that answered and keeping the identity of the ADD that probed (its pod and node). For
//!   each new one on this node the monitor counts `tether_address_conflicts_total{network,
//!   address, mac}` and posts a Warning Event (reason `AddressConflict`) on that pod, named
//!   `<pod>.<hash of network, address, MAC, time>`: an agent restarted later finds the Event
//!   there (409) and neither posts nor counts it again. Records quarantined more than an hour
//!   before the monitor first sees them are old news (the API server keeps Events an hour).
//! - **This node's records** by network, store and state (`tether_node_lease_records`).
//! - **Pools** (only when metrics are served): sizes come from the tether-ipam configurations of
//!   the cluster's NetworkAttachmentDefinitions (one watch-cache LIST), counts from the leases.
//!   Cluster-wide (`kubernetes` store) pools are reported by the leading `tether controller`, so
//!   no agent reads the leases of other nodes; a file-store pool is per node and reported by its
//!   node.
//! - **Overlapping NADs** (the leading controller only, metrics served or not): the same NADs'
//!   ranges compared ([`crate::overlap`]), a gauge and a Warning Event on each NAD of a finding
//!   (`monitor/overlap_events.rs`).
//!
//! Cost per round: one LIST of this node's leases (watch cache), plus the NADs when this node has
//! file-store pools; on the leading controller, the NADs and one LIST of the cluster store's
//! records, and an Event CREATE per NAD of a new overlap finding.

// KubeStoreError is large by design (it carries what the operator needs); this is not a hot path.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tether_cluster::{NadConfig, PodWarning, Posted};
use tether_kube_store::{Kinds, KubeStoreError};
use tether_leases::{Allocator, FileStore, Lease, LeaseState, NoProbe, PodRef, SystemClock};
use tether_pool::StoreKind;

use crate::kube::Kube;
use crate::metrics::{PoolGauge, Registry, store_label};
use crate::nads::{NadNetwork, nad_networks};
use crate::options::Options;
use crate::pool_usage::{ListedLeases, one_per_network};
use crate::report::{StoreName, now_s};

mod overlap_events;

/// The Event reason of an address conflict.
pub const CONFLICT_REASON: &str = "AddressConflict";
/// Conflicts older than this when first seen get no Event (and are not counted).
pub const EVENT_MAX_AGE_S: u64 = 3600;

/// The `AddressConflict` Warning on `pod`, named after a hash of `occurrence` so that posting
/// the same occurrence again (a later pass, a restarted agent) finds it instead of adding one;
/// `None` for a pod without a namespace or name.
pub(crate) fn conflict_warning(
    pod: &PodRef,
    occurrence: &str,
    message: String,
    node: &str,
    at: u64,
) -> Option<PodWarning> {
    Some(PodWarning {
        namespace: pod.namespace.clone()?,
        pod: pod.name.clone()?,
        uid: pod.uid.clone(),
        key: format!(
            "{:016x}",
            tether_stable_hash::fnv1a64(occurrence.as_bytes(), 0)
        ),
        reason: CONFLICT_REASON.into(),
        message,
        node: node.into(),
        at,
    })
}

/// A conflict: (network, address, MAC, when).
type Conflict = (String, IpAddr, String, u64);

/// The monitor of one node.
pub struct Monitor {
    node: String,
    kube: Option<Kube>,
    data_dir: Option<PathBuf>,
    events: bool,
    pools: bool,
    /// The controller's monitor: cluster-wide pools only (no node, no conflicts).
    controller: bool,
    registry: Arc<Registry>,
    started: u64,
    seen: HashSet<Conflict>,
    warned: HashSet<String>,
    /// The controller's overlap findings of the last round, by identity (each is logged once).
    overlaps: HashSet<String>,
    /// The controller's Events on NADs (`ns/nad/key`) → when last posted or found there.
    nad_events: HashMap<String, u64>,
}

/// What a round read of the cluster's NADs.
enum Nads {
    /// Nothing this round needed them.
    NotNeeded,
    /// The API serves no NetworkAttachmentDefinitions.
    NotServed,
    /// The list could not be read (the failure is among the round's errors).
    Failed,
    /// Every NAD of the cluster.
    Listed(Vec<NadConfig>),
}

/// A network configuration found in a NAD, and where.
impl Monitor {
    /// From the reconciler's options (node, API access, data dir; `conflict_events`; pools when
    /// metrics are served).
    pub fn new(opts: &Options, registry: Arc<Registry>) -> Result<Monitor, String> {
        let kube = match &opts.kube {
            Some(s) => Some(Kube::connect(s)?),
            None => None,
        };
        Ok(Monitor {
            node: opts.node.clone(),
            kube,
            data_dir: opts.data_dir.clone(),
            events: opts.conflict_events,
            pools: opts.metrics_addr.is_some(),
            controller: opts.controller,
            registry,
            started: now_s(),
            seen: HashSet::new(),
            warned: HashSet::new(),
            overlaps: HashSet::new(),
            nad_events: HashMap::new(),
        })
    }

    /// Rounds every `interval` until `stop`.
    pub fn run(&mut self, interval: Duration, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            self.round();
            let until = Instant::now() + interval;
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// One round; returns its failures (also logged and counted).
    pub fn round(&mut self) -> Vec<String> {
        let now = now_s();
        let mut errors = Vec::new();
        let mut counts: BTreeMap<(String, &'static str, &'static str), u64> = BTreeMap::new();
        let mut quarantined: Vec<Lease> = Vec::new();
        let mut tally = |which: StoreName, leases: Vec<Lease>| {
            for l in leases {
                let state = match l.state {
                    LeaseState::Leased => "leased",
                    LeaseState::Released { .. } => "released",
                    LeaseState::Quarantined { .. } => "quarantined",
                };
                *counts
                    .entry((l.network.clone(), store_label(which), state))
                    .or_insert(0) += 1;
                if state == "quarantined" {
                    quarantined.push(l);
                }
            }
        };
        if let Some(k) = self.kube.as_ref().filter(|_| !self.controller) {
            k.restart_budget();
            match k.leases.list_node(&self.node) {
                Ok(ls) => tally(StoreName::Kubernetes, ls),
                Err(KubeStoreError::CrdMissing { .. }) => {}
                Err(e) => errors.push(format!("listing the leases of node {}: {e}", self.node)),
            }
        }
        let mut file_networks = Vec::new();
        if let Some(dir) = self.data_dir.as_ref().filter(|_| !self.controller) {
            match FileStore::new(dir.clone()).records() {
                Ok(ls) => {
                    file_networks = ls.iter().map(|l| l.network.clone()).collect();
                    file_networks.sort();
                    file_networks.dedup();
                    tally(StoreName::File, ls);
                }
                Err(e) => errors.push(format!("reading the leases in {}: {e}", dir.display())),
            }
        }
        if !self.controller {
            self.registry.set_node_leases(counts);
            self.conflicts(&quarantined, now, &mut errors);
        }
        let reporter = self.registry.pool_reporter();
        let checks = self.controller && reporter;
        let pools = self.pools && (reporter || !file_networks.is_empty());
        let nads = if pools || checks {
            self.nads(&mut errors)
        } else {
            Nads::NotNeeded
        };
        if self.pools {
            let gauges = match &nads {
                Nads::Listed(n) => self.pools(n, &file_networks, &mut errors),
                Nads::NotNeeded | Nads::NotServed => Some(Vec::new()),
                Nads::Failed => None,
            };
            // None: keep the last ones (a list failed).
            if let Some(g) = gauges {
                self.registry.set_pools(g);
            }
        }
        if self.controller {
            match &nads {
                Nads::Listed(n) if checks => self.report_overlaps(n, now, &mut errors),
                Nads::NotServed if checks => self.report_overlaps(&[], now, &mut errors),
                Nads::Failed => {}
                // Not leading: the leader reports them.
                _ => self.registry.set_nad_overlaps(None),
            }
        }
        for e in &errors {
            log::error!("monitor: {e}");
        }
        self.registry.monitored(errors.len(), now);
        errors
    }

    /// Count and report the quarantine records not seen before.
    fn conflicts(&mut self, quarantined: &[Lease], now: u64, errors: &mut Vec<String>) {
        let mut present = HashSet::new();
        let mut times = BTreeMap::new();
        for l in quarantined {
            let LeaseState::Quarantined { mac, at } = &l.state else {
                continue;
            };
            let key: Conflict = (l.network.clone(), l.address, mac.clone(), *at);
            present.insert(key.clone());
            let t = times
                .entry((l.network.clone(), l.address.to_string(), mac.clone()))
                .or_insert(*at);
            *t = (*t).max(*at);
            if self.seen.contains(&key) {
                continue;
            }
            if now.saturating_sub(*at) > EVENT_MAX_AGE_S {
                self.seen.insert(key);
                continue;
            }
            let node = l.node.clone().unwrap_or_else(|| self.node.clone());
            let event = self
                .events
                .then(|| {
                    conflict_warning(
                        &l.pod,
                        &format!("{}/{}/{mac}/{at}", l.network, l.address),
                        conflict_message(l, mac, &node),
                        &node,
                        *at,
                    )
                })
                .flatten();
            let (counted, how) = match (&event, &self.kube) {
                (Some(w), Some(k)) => {
                    k.restart_budget();
                    match k.cluster.post_pod_event(w) {
                        Ok(Posted::Created) => {
                            self.registry.event(true);
                            (
                                true,
                                format!(
                                    "Event {CONFLICT_REASON} posted on pod {}/{}",
                                    w.namespace, w.pod
                                ),
                            )
                        }
                        // Posted (and counted) by this node's agent before a restart.
                        Ok(Posted::AlreadyThere) => (false, String::new()),
                        Err(e) if e.is_transient() => {
                            errors.push(format!(
                                "posting the conflict Event for {} of network {}: {e}; retrying",
                                l.address, l.network
                            ));
                            continue;
                        }
                        Err(e) => {
                            self.registry.event(false);
                            let msg = format!(
                                "cannot post the conflict Event on pod {}/{}: {e}",
                                w.namespace, w.pod
                            );
                            // Usually RBAC (events: create), the same for every Event: say it once.
                            if self.warned.insert("event".into()) {
                                log::error!("monitor: {msg}");
                            } else {
                                log::debug!("monitor: {msg}");
                            }
                            (*at >= self.started, "no Event".to_string())
                        }
                    }
                }
                _ => (*at >= self.started, String::new()),
            };
            if counted {
                self.registry
                    .conflict(&l.network, &l.address.to_string(), mac);
                log::warn!(
                    "address conflict on node {node}: {} of network {} answered the probe from MAC {mac} (ADD of pod {}){}",
                    l.address,
                    l.network,
                    l.pod,
                    if how.is_empty() {
                        String::new()
                    } else {
                        format!("; {how}")
                    }
                );
            }
            self.seen.insert(key);
        }
        self.seen.retain(|k| present.contains(k));
        self.registry.set_conflict_times(times);
    }

    /// The cluster's NADs, from the watch cache.
    fn nads(&mut self, errors: &mut Vec<String>) -> Nads {
        let Some(kube) = self.kube.as_ref() else {
            return Nads::NotNeeded;
        };
        kube.restart_budget();
        match kube.cluster.network_attachment_definitions() {
            Ok(Some(n)) => Nads::Listed(n),
            Ok(None) => {
                if self.warned.insert("no-nads".into()) {
                    log::warn!(
                        "monitor: the API serves no NetworkAttachmentDefinitions (k8s.cni.cncf.io/v1): pool sizes come from \
                         the NADs' configurations, so there are no tether_pool_* metrics"
                    );
                }
                Nads::NotServed
            }
            Err(e) => {
                errors.push(format!(
                    "listing the NetworkAttachmentDefinitions (pool sizes, overlap checks): {e}"
                ));
                Nads::Failed
            }
        }
    }

    /// The pool gauges of `nads`, or `None` to keep the last ones (the leases could not be read).
    fn pools(
        &mut self,
        nads: &[NadConfig],
        file_networks: &[String],
        errors: &mut Vec<String>,
    ) -> Option<Vec<PoolGauge>> {
        let reporter = self.registry.pool_reporter();
        let kube = self.kube.as_ref()?;
        let mut out = Vec::new();
        // The cluster store's domain records, one LIST for every network of the round.
        let mut listed: Option<Vec<Lease>> = None;
        for nc in network_configs(nads, &mut self.warned) {
            let cfg = &nc.cfg;
            let (which, node, usage) = match cfg.store {
                StoreKind::Kubernetes if reporter => {
                    if listed.is_none() {
                        kube.restart_budget();
                        match kube.leases.list_every(Kinds::Domain) {
                            Ok(l) => listed = Some(l),
                            Err(e) => {
                                errors.push(format!("listing the leases (pool counts): {e}"));
                                return None;
                            }
                        }
                    }
                    let records = ListedLeases(listed.as_deref().unwrap_or_default());
                    (
                        StoreName::Kubernetes,
                        None,
                        Allocator::from_config(cfg, &records, &NoProbe, &SystemClock).usage(),
                    )
                }
                StoreKind::File if file_networks.contains(&cfg.network_name) => {
                    let Some(dir) = &self.data_dir else { continue };
                    let fs = FileStore::new(dir.clone());
                    (
                        StoreName::File,
                        Some(self.node.clone()),
                        Allocator::from_config(cfg, &fs, &NoProbe, &SystemClock).usage(),
                    )
                }
                _ => continue,
            };
            match usage {
                Ok(ranges) => out.extend(ranges.into_iter().map(|status| PoolGauge {
                    network: cfg.network_name.clone(),
                    store: which,
                    node: node.clone(),
                    status,
                })),
                Err(e) => errors.push(format!(
                    "counting network {} (NAD {}): {e}",
                    cfg.network_name, nc.nad
                )),
            }
        }
        Some(out)
    }
}

/// One configuration per network from the NADs using tether-ipam (first NAD by namespace/name
/// wins; one with other ranges is named in a warning, once).
fn network_configs(nads: &[NadConfig], warned: &mut HashSet<String>) -> Vec<NadNetwork> {
    let mut out = Vec::new();
    for n in one_per_network(nad_networks(nads)) {
        for other in &n.other_ranges {
            if warned.insert(format!("ranges:{}:{other}", n.first.cfg.network_name)) {
                log::warn!(
                    "monitor: NADs {} and {other} give network {} different ranges; its pool metrics use {}'s",
                    n.first.nad,
                    n.first.cfg.network_name,
                    n.first.nad
                );
            }
        }
        out.push(n.first);
    }
    out
}

/// The Event message of a conflict.
fn conflict_message(l: &Lease, mac: &str, node: &str) -> String {
    format!(
        "{} of network {} is in use by another host: it answered the conflict probe from MAC {mac} on node {node}. \
         tether-ipam quarantined the address and did not give it to this pod; find the host with that MAC, or exclude \
         the address from the range.",
        l.address, l.network
    )
}

#[cfg(test)]
mod tests {
    use crate::nads::tether_ipam_configs;
    use tether_pool::{NodeAgent, PoolConfig};

    #[test]
    fn finds_tether_ipam_in_configs_and_conflists() {
        let single = r#"{"cniVersion":"1.0.0","name":"mgmt","type":"tether-ipvlan","ipam":{"type":"tether-ipam","range":"10.0.0.0/29"}}"#;
        assert_eq!(tether_ipam_configs(single, "nad").len(), 1);
        let list = r#"{"cniVersion":"1.0.0","name":"compute","plugins":[{"type":"tether-ipvlan","ipam":{"type":"tether-ipam","range":"10.1.0.0/29"}},{"type":"tuning"}]}"#;
        let got = tether_ipam_configs(list, "nad");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["name"], "compute");
        assert_eq!(
            PoolConfig::from_value(&got[0], &NodeAgent::on_every_node())
                .unwrap()
                .network_name,
            "compute"
        );
        assert!(
            tether_ipam_configs(
                r#"{"name":"x","type":"macvlan","ipam":{"type":"whereabouts"}}"#,
                "nad"
            )
            .is_empty()
        );
        assert!(
            tether_ipam_configs("", "nad").is_empty()
                && tether_ipam_configs("not json", "nad").is_empty()
        );
        // No name: the NAD's.
        let unnamed = r#"{"cniVersion":"1.0.0","type":"tether-ipvlan","ipam":{"type":"tether-ipam","range":"10.0.0.0/29"}}"#;
        assert_eq!(
            PoolConfig::from_value(
                &tether_ipam_configs(unnamed, "storage")[0],
                &NodeAgent::on_every_node()
            )
            .unwrap()
            .network_name,
            "storage"
        );
    }
}
