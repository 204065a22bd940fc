//! This node's leases, kept by a LIST and a WATCH (label `ipam.tether.dev/node=<node>`, from the
//! API server's watch cache): what the lease service answers without a request — the node
//! journal's rebuild, and reads of records this node holds. A lease another node takes over
//! leaves the selection (the watch says DELETED), so what is here is this node's.
//!
//! Records carry the object's resourceVersion (etcd's revision, one counter for every object), so
//! a late watch event never replaces what the service itself wrote since: the newer revision
//! wins. A cache is a hint: every write stays conditional on the version it names.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use tether_kube_store::Change;
use tether_leases::Lease;

/// The revision in a lease's version (`<uid>/<resourceVersion>`).
fn revision(l: &Lease) -> u64 {
    l.version
        .as_deref()
        .and_then(|v| v.rsplit_once('/'))
        .and_then(|(_, rv)| rv.parse().ok())
        .unwrap_or(0)
}

#[derive(Default)]
struct State {
    /// A complete list has been read, and the watch since has not failed.
    synced: bool,
    by_address: HashMap<(String, IpAddr), Lease>,
    /// The revision of each address's last deletion seen, so an older event does not bring it
    /// back.
    gone: HashMap<(String, IpAddr), u64>,
}

/// See the module docs.
#[derive(Default)]
pub struct NodeLeases {
    state: Mutex<State>,
}

fn key(l: &Lease) -> (String, IpAddr) {
    (l.network.clone(), l.address)
}

impl NodeLeases {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Everything, from a complete list: synced from now on.
    pub fn replace_all(&self, leases: Vec<Lease>) {
        let mut s = self.lock();
        s.by_address = leases.into_iter().map(|l| (key(&l), l)).collect();
        s.gone.clear();
        s.synced = true;
    }

    /// Not to be trusted until the next complete list (the watch failed).
    pub fn unsynced(&self) {
        self.lock().synced = false;
    }

    /// Is it complete?
    pub fn is_synced(&self) -> bool {
        self.lock().synced
    }

    /// A change the watch carried, or a write the service made (`Upsert` of the stored record,
    /// `Deleted` of the removed one): applied unless what is here is newer.
    pub fn apply(&self, c: Change<Lease>) {
        let mut s = self.lock();
        match c {
            Change::Upsert(l) => {
                let k = key(&l);
                let rv = revision(&l);
                let newer_here = s.by_address.get(&k).is_some_and(|h| revision(h) > rv)
                    || s.gone.get(&k).is_some_and(|g| *g >= rv);
                if !newer_here {
                    s.gone.remove(&k);
                    s.by_address.insert(k, l);
                }
            }
            Change::Deleted(l) => {
                let k = key(&l);
                let rv = revision(&l);
                if s.by_address.get(&k).is_none_or(|h| revision(h) <= rv) {
                    s.by_address.remove(&k);
                    s.gone.insert(k, rv);
                }
            }
        }
    }

    /// The record of `address` if this node holds it; `None` also when it is not known here
    /// (another node's, or none: ask the API).
    pub fn get(&self, network: &str, address: IpAddr) -> Option<Lease> {
        let s = self.lock();
        if !s.synced {
            return None;
        }
        s.by_address.get(&(network.to_string(), address)).cloned()
    }

    /// This node's records of `network`; `None` until synced.
    pub fn of_network(&self, network: &str) -> Option<Vec<Lease>> {
        let s = self.lock();
        s.synced.then(|| {
            s.by_address
                .values()
                .filter(|l| l.network == network)
                .cloned()
                .collect()
        })
    }

    /// How many records are kept.
    pub fn len(&self) -> usize {
        self.lock().by_address.len()
    }

    /// Is nothing kept?
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_leases::{LeaseState, PodRef};

    fn lease(addr: &str, rv: u64) -> Lease {
        Lease {
            network: "mgmt".into(),
            address: addr.parse().unwrap(),
            prefix_len: 24,
            range_index: Some(0),
            container_id: format!("c{rv}"),
            ifname: "net1".into(),
            pod: PodRef::default(),
            node: Some("gpu-1".into()),
            state: LeaseState::Leased,
            since: 1,
            version: Some(format!("uid/{rv}")),
        }
    }

    #[test]
    fn nothing_is_answered_before_a_complete_list() {
        let c = NodeLeases::default();
        c.apply(Change::Upsert(lease("10.0.0.1", 5)));
        assert_eq!(c.get("mgmt", "10.0.0.1".parse().unwrap()), None);
        assert_eq!(c.of_network("mgmt"), None);
        c.replace_all(vec![lease("10.0.0.2", 6)]);
        assert_eq!(c.of_network("mgmt").unwrap().len(), 1);
        c.unsynced();
        assert_eq!(c.of_network("mgmt"), None);
    }

    #[test]
    fn a_late_event_never_replaces_a_newer_write() {
        let c = NodeLeases::default();
        c.replace_all(vec![]);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        // The service wrote revision 9; the watch then delivers revision 7 of the same record.
        c.apply(Change::Upsert(lease("10.0.0.1", 9)));
        c.apply(Change::Upsert(lease("10.0.0.1", 7)));
        assert_eq!(c.get("mgmt", a).unwrap().version.as_deref(), Some("uid/9"));
        // Deleted at 10: an older upsert does not bring it back; a newer one does.
        c.apply(Change::Deleted(lease("10.0.0.1", 10)));
        c.apply(Change::Upsert(lease("10.0.0.1", 9)));
        assert_eq!(c.get("mgmt", a), None);
        c.apply(Change::Upsert(lease("10.0.0.1", 11)));
        assert_eq!(c.get("mgmt", a).unwrap().version.as_deref(), Some("uid/11"));
        // An older deletion does not remove a newer record.
        c.apply(Change::Deleted(lease("10.0.0.1", 8)));
        assert!(c.get("mgmt", a).is_some());
        assert_eq!(c.of_network("other"), Some(vec![]));
    }
}
