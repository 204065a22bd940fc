//! What the guard watches: the addresses this node's pods hold, read from the node's own files
//! (the journal of each cluster-store network, the records of each file-store network) and put
//! on the master their NAD names. Reading local files every second costs the API server nothing,
//! and the journal names an address before its claim is sent, so a new lease is watched within a
//! second of its ADD.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use tether_leases::{AttachmentIndex, FileJournal, FileStore, Lease, file_stem};
use tether_pool::StoreKind;

use crate::nads::NadNetwork;

/// A network as the guard needs it, from its NADs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardedNetwork {
    pub network: String,
    /// The NAD's `master` (`None`: the default route's interface, as the attacher takes it).
    pub master: Option<String>,
    /// Any of its NADs on that master asks for defence.
    pub defend: bool,
    pub store: StoreKind,
    /// `ipam.dataDir`: the journal or the file store is under it.
    pub data_dir: PathBuf,
}

/// One address of a pod of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The record as the node last knew it.
    pub lease: Lease,
    pub store: StoreKind,
    pub defend: bool,
    /// The network's `dataDir`.
    pub data_dir: PathBuf,
}

impl Held {
    /// Does the node's journal still say the attachment holds the address? (A DEL removes its
    /// entry right after its release; a node cut off from the API server keeps it while its pod
    /// runs, whatever the controller did to the record meanwhile.)
    pub fn still_journaled(&self) -> bool {
        let l = &self.lease;
        FileJournal::new(self.data_dir.join("journal"))
            .lookup(&l.network, &l.container_id, &l.ifname, &l.pod)
            .ok()
            .and_then(|found| found.mine)
            .is_some_and(|e| e.held().any(|h| h.address == l.address))
    }
}

/// Master name → address → what holds it.
pub type WatchSet = BTreeMap<String, BTreeMap<IpAddr, Held>>;

/// The attachers whose pods answer for their addresses with the master's MAC (ipvlan): a frame
/// from any other MAC speaking as such an address is another host's. A macvlan pod has a MAC of
/// its own, which the guard cannot tell from a stranger's, and an announcement from the master
/// would send its traffic to the wrong MAC, so its networks are not guarded.
pub const GUARDED_ATTACHERS: &[&str] = &["tether-ipvlan", "ipvlan"];

/// The networks of `nads`, one per (network, master): NADs of one network on one master are
/// one; defence is on if any of them asks. NADs of another attacher than ipvlan are left out
/// and returned as `namespace/name (type)`.
pub fn guarded_networks(nads: &[NadNetwork]) -> (Vec<GuardedNetwork>, Vec<String>) {
    let mut out: Vec<GuardedNetwork> = Vec::new();
    let mut left_out = Vec::new();
    for n in nads {
        let c = &n.cfg;
        if !n
            .attacher
            .as_deref()
            .is_some_and(|a| GUARDED_ATTACHERS.contains(&a))
        {
            left_out.push(format!(
                "{} ({})",
                n.nad,
                n.attacher.as_deref().unwrap_or("no type")
            ));
            continue;
        }
        match out
            .iter_mut()
            .find(|g| g.network == c.network_name && g.master == n.master)
        {
            Some(g) => g.defend |= c.defend,
            None => out.push(GuardedNetwork {
                network: c.network_name.clone(),
                master: n.master.clone(),
                defend: c.defend,
                store: c.store,
                data_dir: c.data_dir.clone(),
            }),
        }
    }
    (out, left_out)
}

/// The journal directories under `networks`' data directories and `default_dir` that no network
/// of `networks` accounts for: a network used on this node whose NAD the guard has not read yet
/// (its first ADD here created the directory), or one whose NAD is gone.
pub fn unknown_journals(networks: &[GuardedNetwork], default_dir: &Path) -> BTreeSet<PathBuf> {
    let mut dirs: BTreeSet<&Path> = networks.iter().map(|n| n.data_dir.as_path()).collect();
    dirs.insert(default_dir);
    let known: BTreeSet<PathBuf> = networks
        .iter()
        .map(|n| n.data_dir.join("journal").join(file_stem(&n.network)))
        .collect();
    let mut out = BTreeSet::new();
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(d.join("journal")) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !known.contains(&p) {
                out.insert(p);
            }
        }
    }
    out
}

/// The addresses held on node `node` by `networks`, by master (`default_master` for a network
/// naming none; such a network is left out without one), and what could not be read. Records of
/// another node (a data directory shared by mistake) are not this node's to guard.
pub fn held_addresses(
    networks: &[GuardedNetwork],
    node: &str,
    default_master: Option<&str>,
) -> (WatchSet, Vec<String>) {
    let mut out = WatchSet::new();
    let mut errors = Vec::new();
    // A data directory's file store is read once per round, whatever the number of networks.
    let mut file_records: HashMap<PathBuf, Vec<Lease>> = HashMap::new();
    for g in networks {
        let Some(master) = g.master.as_deref().or(default_master) else {
            continue;
        };
        let held: Vec<Lease> = match g.store {
            StoreKind::Kubernetes => {
                let journal = FileJournal::new(g.data_dir.join("journal"));
                match journal.entries(&g.network) {
                    // A claim in flight has no version yet; an unanswered one is not held.
                    Ok(entries) => entries
                        .iter()
                        .flat_map(|e| e.held().cloned().collect::<Vec<_>>())
                        .filter(|l| l.version.is_some())
                        .collect(),
                    Err(e) => {
                        errors.push(format!("network {}: {e}", g.network));
                        continue;
                    }
                }
            }
            StoreKind::File => {
                if !file_records.contains_key(&g.data_dir) {
                    let records = match FileStore::new(g.data_dir.clone()).records() {
                        Ok(r) => r,
                        Err(e) => {
                            errors.push(format!("network {}: {e}", g.network));
                            Vec::new()
                        }
                    };
                    file_records.insert(g.data_dir.clone(), records);
                }
                file_records[&g.data_dir]
                    .iter()
                    .filter(|l| l.network == g.network)
                    .cloned()
                    .collect()
            }
        };
        let on_master = out.entry(master.to_string()).or_default();
        let ours = |l: &Lease| l.is_leased() && l.node.as_deref().is_none_or(|n| n == node);
        for lease in held.into_iter().filter(ours) {
            // One address twice on one master (NADs of two domains overlapping there, which
            // the controller reports): the first holder is reported.
            on_master.entry(lease.address).or_insert(Held {
                lease,
                store: g.store,
                defend: g.defend,
                data_dir: g.data_dir.clone(),
            });
        }
    }
    out.retain(|_, addrs| !addrs.is_empty());
    (out, errors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tether_leases::{JournalEntry, LeaseState, LeaseStore, PodRef};
    use tether_pool::{NodeAgent, PoolConfig};

    fn nad(nad: &str, name: &str, master: Option<&str>, ipam: serde_json::Value) -> NadNetwork {
        let mut ipam = ipam;
        ipam["type"] = json!("tether-ipam");
        NadNetwork {
            nad: nad.into(),
            master: master.map(str::to_string),
            attacher: Some("tether-ipvlan".into()),
            cfg: PoolConfig::from_value(
                &json!({"name": name, "ipam": ipam}),
                &NodeAgent::on_every_node(),
            )
            .unwrap(),
        }
    }

    fn lease(network: &str, address: &str, cid: &str, version: Option<&str>) -> Lease {
        Lease {
            network: network.into(),
            domain: None,
            address: address.parse().unwrap(),
            prefix_len: 24,
            range_index: Some(0),
            container_id: cid.into(),
            ifname: "net1".into(),
            pod: PodRef::new("ml", "trainer-0", "u-0"),
            node: Some("n1".into()),
            state: LeaseState::Leased,
            since: 1,
            version: version.map(str::to_string),
        }
    }

    fn set_entry_holder(set: &WatchSet) -> Held {
        set["eth2"].values().next().unwrap().clone()
    }

    #[test]
    fn one_network_per_master_and_defence_if_any_nad_asks() {
        let mut macvlan = nad(
            "d/mgmt",
            "mgmt",
            Some("eth3"),
            json!({"range": "10.1.0.0/24"}),
        );
        macvlan.attacher = Some("macvlan".into());
        let (nets, left_out) = guarded_networks(&[
            macvlan,
            nad(
                "a/mgmt",
                "mgmt",
                Some("eth1"),
                json!({"range": "10.1.0.0/24"}),
            ),
            nad(
                "b/mgmt",
                "mgmt",
                Some("eth1"),
                json!({"range": "10.1.0.0/24", "defend": true}),
            ),
            nad("c/mgmt", "mgmt", None, json!({"range": "10.1.0.0/24"})),
        ]);
        assert_eq!(
            left_out,
            ["d/mgmt (macvlan)"],
            "its pods have MACs of their own"
        );
        assert_eq!(nets.len(), 2);
        assert!(nets[0].defend && nets[0].master.as_deref() == Some("eth1"));
        assert!(!nets[1].defend && nets[1].master.is_none());
    }

    #[test]
    fn held_addresses_come_from_the_journal_and_the_file_store() {
        let dir = std::env::temp_dir().join(format!("tether-guard-held-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let dd = dir.display().to_string();
        let (nets, _) = guarded_networks(&[
            nad(
                "a/compute",
                "compute",
                Some("eth2"),
                json!({"range": "10.2.0.0/24", "store": "kubernetes", "dataDir": dd, "defend": true}),
            ),
            nad(
                "a/mgmt",
                "mgmt",
                None,
                json!({"range": "10.1.0.0/24", "store": "file", "dataDir": dd}),
            ),
        ]);
        let journal = FileJournal::new(dir.join("journal"));
        let mut entry = JournalEntry {
            container_id: "c1".into(),
            ifname: "net1".into(),
            pod: PodRef::new("ml", "trainer-0", "u-0"),
            leases: vec![
                lease("compute", "10.2.0.5", "c1", Some("uid/1")),
                // A claim in flight: not held yet.
                lease("compute", "10.2.0.6", "c1", None),
            ],
            pending: None,
        };
        journal.record("compute", &entry).unwrap();
        let fs = FileStore::new(dir.clone());
        fs.claim(lease("mgmt", "10.1.0.7", "c1", None), None)
            .unwrap()
            .unwrap();

        let (set, errors) = held_addresses(&nets, "n1", Some("eth0"));
        assert!(errors.is_empty(), "{errors:?}");
        let eth2: Vec<_> = set["eth2"].keys().map(|a| a.to_string()).collect();
        assert_eq!(eth2, ["10.2.0.5"]);
        assert!(
            set["eth2"]
                .values()
                .all(|h| h.defend && h.still_journaled())
        );
        let was = set_entry_holder(&set);
        let eth0: Vec<_> = set["eth0"].keys().map(|a| a.to_string()).collect();
        assert_eq!(eth0, ["10.1.0.7"], "no master: the default route's");
        // Without a default route, the network naming no master is not watched.
        let (set, _) = held_addresses(&nets, "n1", None);
        assert!(!set.contains_key("eth0"));
        // Another node's records are not guarded here.
        let (set, _) = held_addresses(&nets, "n2", Some("eth0"));
        assert!(!set.contains_key("eth2"));
        // Every journal is accounted for; a network whose NAD is not read yet is not.
        assert!(unknown_journals(&nets, &dir).is_empty());
        let other = FileJournal::new(dir.join("journal"));
        other.record("storage", &entry).unwrap();
        let unknown = unknown_journals(&nets, &dir);
        assert_eq!(unknown.len(), 1, "{unknown:?}");
        // Released: no longer watched.
        entry.leases.clear();
        journal.record("compute", &entry).unwrap();
        assert!(!was.still_journaled());
        let (set, _) = held_addresses(&nets, "n1", Some("eth0"));
        assert!(!set.contains_key("eth2"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
