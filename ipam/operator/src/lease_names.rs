//! The upgrade from leases named by network (tether before uniqueness domains) to leases named
//! by address: who decides when the old names are no longer needed, and how every node hears it.
//!
//! During a DaemonSet roll old and new node-agents run side by side, and an old tether-ipam
//! reads and claims only `<network>.<address>`. So while one may still run, every write of a
//! domain's record keeps a mirror under that name (`tether_kube_store::by_network`), and records
//! written the old way are moved into their domains. The switch:
//!
//! - **The controller decides** ([`controller_pass`]): mirrors stay while any node-agent pod
//!   lacks the label [`AGENT_LABEL`]`=`[`AGENT_LABEL_VALUE`] (the pod template of this version
//!   carries it; an older one does not), or has been Ready for less than [`SETTLED_S`] (a plugin
//!   of the old version started before its node's agent was replaced may still be running), or a
//!   record named by network is left. Each pass moves what is left into its domain. Once none of
//!   that holds, the mirrors are deleted and the switch turns off. An old agent that appears
//!   again (a rolled-back DaemonSet) turns it on again, and every lease gets its mirror back.
//! - **It publishes** in the ConfigMap [`SWITCH_CONFIG_MAP`] of the agents' namespace, which the
//!   manifest ships empty (so re-applying it never undoes the controller's word, and the
//!   controller needs no right to create ConfigMaps).
//! - **Each node-agent follows** ([`Follower`]): it reads the ConfigMap, keeps its lease
//!   service's stores in step, and writes the word beside the plugins' kubeconfig
//!   ([`tether_kube_store::by_network::MIRROR_SWITCH_FILE`]) for the plugins' direct path. It
//!   does so, and moves its own node's records named by network into their domains, before it
//!   installs this version's plugins: they then find every lease of their node under its new
//!   name. Until the controller has said otherwise, an agent keeps mirrors (the safe side).

// KubeStoreError is large by design (it carries what the operator needs); this is not a hot path.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tether_cluster::{AgentPod, ConfigMapData};
use tether_kube_store::by_network::{Adoption, MIRROR_SWITCH_FILE, mirror_switch_text};
use tether_kube_store::convert::naming_of;
use tether_kube_store::{Kinds, KubeStoreError, LegacyMirrors, Naming};
use tether_leases::Lease;

use crate::kube::Kube;
use crate::nads::{domains, nad_networks};

/// The ConfigMap, in the node-agents' namespace, that holds the controller's word.
pub const SWITCH_CONFIG_MAP: &str = "tether-lease-names";
/// Its key: `"true"` (keep mirrors) or `"false"`.
pub const SWITCH_KEY: &str = "mirrorLegacyNames";
/// Its key saying why, for whoever looks.
pub const REASON_KEY: &str = "reason";
/// The label of a node-agent pod of a version that names leases by address.
pub const AGENT_LABEL: &str = "ipam.tether.dev/lease-names";
/// Its value.
pub const AGENT_LABEL_VALUE: &str = "by-address";
/// How long every node-agent must have been Ready before mirrors go: an old plugin started before
/// its node's agent was replaced ends within its time budget (`kubernetes.timeout_s`, 10 s by
/// default), and a CNI call rarely lives longer than a minute.
pub const SETTLED_S: u64 = 120;

/// What a controller pass found and did.
#[derive(Debug, Default)]
pub struct NamesReport {
    /// Whether mirrors are kept now.
    pub mirrors: bool,
    /// Why (or why not).
    pub reason: String,
    /// Records named by network moved into their domains, mirrors deleted, and what is left.
    pub adoption: Adoption,
    /// Mirrors made for leases that had none (mirrors turned on again).
    pub mirrors_made: usize,
    /// Records named by network seen in this pass (before it moved any).
    pub by_network: usize,
}

/// Why an agent pod may still run a tether that names leases by network, if it may.
fn not_settled(p: &AgentPod, now: u64) -> Option<String> {
    let node = p.node.as_deref().unwrap_or("(unscheduled)");
    if p.labels.get(AGENT_LABEL).map(String::as_str) != Some(AGENT_LABEL_VALUE) {
        return Some(format!(
            "node-agent pod {} on node {node} is of a version that names leases by network (no label {AGENT_LABEL}={AGENT_LABEL_VALUE})",
            p.name
        ));
    }
    match p.ready_since {
        None => Some(format!(
            "node-agent pod {} on node {node} is not Ready",
            p.name
        )),
        Some(t) if now.saturating_sub(t) < SETTLED_S => Some(format!(
            "node-agent pod {} on node {node} has been Ready for less than {SETTLED_S} s",
            p.name
        )),
        Some(_) => None,
    }
}

/// The controller's pass: move records named by network into their domains, keep mirrors while
/// an old tether may run, delete them once none can, and publish the switch. Errors are in the
/// report's adoption errors.
pub fn controller_pass(kube: &Kube, agent_ns: &str, agent_sel: &str, now: u64) -> NamesReport {
    let mut r = NamesReport::default();
    kube.restart_budget();
    let old = match kube.cluster.agent_pods(agent_ns, agent_sel) {
        Ok(pods) if pods.is_empty() => Some(format!(
            "no node-agent pod in namespace {agent_ns} matches {agent_sel}"
        )),
        Ok(pods) => pods.iter().find_map(|p| not_settled(p, now)),
        Err(e) => Some(format!("cannot list the node-agent pods: {e}")),
    };
    kube.restart_budget();
    let published = kube.cluster.config_map(agent_ns, SWITCH_CONFIG_MAP);
    let was_off = matches!(&published, Ok(Some(cm)) if cm.data.get(SWITCH_KEY).map(String::as_str) == Some("false"));
    kube.restart_budget();
    // Once off, with no old agent, no record named by network can appear: only stray mirrors
    // (a plugin that had not heard yet) are left to delete, found without reading every lease.
    let listed = if was_off && old.is_none() {
        kube.leases.list_mirrors()
    } else {
        kube.leases.list_every(Kinds::All)
    };
    let records = match listed {
        Ok(l) => l,
        Err(e) => {
            r.mirrors = true;
            r.reason = format!("cannot list the leases: {e}");
            r.adoption.errors.push(r.reason.clone());
            return publish(kube, agent_ns, published, r);
        }
    };
    r.by_network = records
        .iter()
        .filter(|l| naming_of(l) == Naming::ByNetwork)
        .count();
    let keep = old.is_some();
    let domain_of = domains_of_networks(kube, &records);
    r.adoption = kube.leases.adopt(&records, &|n| domain_of(n), keep);
    if keep && was_off {
        // Leases written while mirrors were off have none, and an old tether runs again.
        let (made, errors) = kube.leases.ensure_mirrors(&records);
        r.mirrors_made = made;
        r.adoption.errors.extend(errors);
    }
    r.mirrors = keep || r.adoption.left > 0 || !r.adoption.errors.is_empty();
    r.reason = match (old, r.adoption.left) {
        (Some(why), _) => why,
        (None, 0) if r.adoption.errors.is_empty() => {
            "every node-agent names leases by address, and no lease is named by network".into()
        }
        (None, 0) => "moving records named by network failed this pass".into(),
        (None, left) => format!("{left} record(s) named by network are left to move"),
    };
    publish(kube, agent_ns, published, r)
}

/// The domain of each network (its NADs'); a network no NAD names is in the cluster's. Read only
/// when there is a record named by network to move.
fn domains_of_networks(kube: &Kube, records: &[Lease]) -> impl Fn(&str) -> Option<String> + use<> {
    let needed = records.iter().any(|l| naming_of(l) == Naming::ByNetwork);
    let map: BTreeMap<String, Option<String>> = if needed {
        kube.restart_budget();
        match kube.cluster.network_attachment_definitions() {
            Ok(Some(nads)) => domains(&nad_networks(&nads)),
            Ok(None) => BTreeMap::new(),
            Err(e) => {
                log::warn!(
                    "lease names: reading the NADs (domains of networks): {e}; moving into the cluster's domain"
                );
                BTreeMap::new()
            }
        }
    } else {
        BTreeMap::new()
    };
    move |n: &str| map.get(n).cloned().flatten()
}

/// Write the switch into the ConfigMap (as `published` read it) when it says otherwise.
fn publish(
    kube: &Kube,
    ns: &str,
    published: Result<Option<ConfigMapData>, KubeStoreError>,
    r: NamesReport,
) -> NamesReport {
    let want = BTreeMap::from([
        (SWITCH_KEY.to_string(), r.mirrors.to_string()),
        (REASON_KEY.to_string(), r.reason.clone()),
    ]);
    kube.restart_budget();
    let written = match published {
        Ok(Some(cm)) if cm.data.get(SWITCH_KEY) == want.get(SWITCH_KEY) => Ok(false),
        Ok(Some(cm)) => kube
            .cluster
            .write_config_map(ns, SWITCH_CONFIG_MAP, &want, &cm.resource_version)
            .map_err(|e| e.to_string()),
        Ok(None) => Err(format!(
            "the ConfigMap {ns}/{SWITCH_CONFIG_MAP} is missing (deploy/tether.yaml ships it); the node-agents keep mirrors"
        )),
        Err(e) => Err(e.to_string()),
    };
    match written {
        Ok(true) => log::warn!(
            "lease names: mirrors of leases under their network's name are {} ({})",
            if r.mirrors { "kept" } else { "no longer kept" },
            r.reason
        ),
        Ok(false) => {}
        Err(e) => log::error!("lease names: publishing the switch: {e}"),
    }
    r
}

/// A node-agent following the controller's word (see the module docs).
pub struct Follower {
    mirrors: LegacyMirrors,
    switch_file: PathBuf,
    node: String,
    namespace: String,
}

impl Follower {
    /// For node `node`, the agents' namespace `namespace`, the plugins' kubeconfig
    /// `plugin_kubeconfig` (the switch file goes beside it); `mirrors` is the switch the agent's
    /// lease service shares.
    pub fn new(
        node: &str,
        namespace: &str,
        plugin_kubeconfig: &Path,
        mirrors: LegacyMirrors,
    ) -> Follower {
        Follower {
            mirrors,
            switch_file: plugin_kubeconfig
                .parent()
                .unwrap_or(Path::new("/"))
                .join(MIRROR_SWITCH_FILE),
            node: node.to_string(),
            namespace: namespace.to_string(),
        }
    }

    /// Read the controller's word (`kube`: `None` keeps the current one), turn the switch, write
    /// the file; while mirrors are kept, move this node's records named by network into their
    /// domains.
    pub fn round(&self, kube: Option<&Kube>) {
        let (on, why) = match kube.map(|k| {
            k.restart_budget();
            k.cluster.config_map(&self.namespace, SWITCH_CONFIG_MAP)
        }) {
            Some(Ok(Some(cm))) => (
                cm.data.get(SWITCH_KEY).map(String::as_str) != Some("false"),
                cm.data
                    .get(REASON_KEY)
                    .cloned()
                    .unwrap_or_else(|| "the controller has not decided yet".into()),
            ),
            Some(Ok(None)) => (
                true,
                format!("no ConfigMap {}/{SWITCH_CONFIG_MAP}", self.namespace),
            ),
            Some(Err(e)) => {
                log::warn!("lease names: reading the controller's word: {e}; keeping the last");
                (
                    self.mirrors.on(),
                    "the controller's word could not be read".into(),
                )
            }
            None => (self.mirrors.on(), "no API access".into()),
        };
        if on != self.mirrors.on() {
            log::warn!(
                "lease names: mirrors under network names {} ({why})",
                if on { "on" } else { "off" }
            );
        }
        self.mirrors.set(on);
        if let Err(e) = crate::node_files::write_private(
            &self.switch_file,
            mirror_switch_text(on, &why).as_bytes(),
        ) {
            log::error!("lease names: {e}");
        }
        if let (true, Some(k)) = (on, kube) {
            self.adopt_node(k);
        }
    }

    /// Move this node's records named by network into their domains (they stay as mirrors).
    fn adopt_node(&self, kube: &Kube) {
        kube.restart_budget();
        let records = match kube.leases.list_node_of(&self.node, Kinds::All) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("lease names: listing node {}'s leases: {e}", self.node);
                return;
            }
        };
        let domain_of = domains_of_networks(kube, &records);
        let a = kube.leases.adopt(&records, &|n| domain_of(n), true);
        if a.moved > 0 || a.left > 0 {
            log::warn!(
                "lease names: node {}: {} record(s) named by network moved into their domains, {} left",
                self.node,
                a.moved,
                a.left
            );
        }
        for e in &a.errors {
            log::warn!("lease names: {e}");
        }
    }
}
