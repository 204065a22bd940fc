//! The records of the networks this node's plugins use, kept by a LIST and a WATCH per network
//! (label `ipam.tether.dev/network`, from the API server's watch cache), started when a plugin
//! first asks about the network. What the lease service answers from memory, without a request:
//! whether a candidate address is free of the network's records (and its record when it is not),
//! a pod's records on any node (its sticky address), this node's records (the node journal's
//! rebuild).
//!
//! Only the network's own records are kept, never its whole uniqueness domain: a cluster-wide
//! domain would have every node watch every lease of the cluster. So "free" here means "no
//! record of this network": another network of the domain may hold the address, and the
//! conditional CREATE that follows finds it (409), as it finds a record this cache has not seen
//! yet. The cache is what this node's pods need; the conditional write is what keeps one holder
//! per address.
//!
//! The alternative, a LIST by pod label on every ADD, costs the API server a scan of every
//! IPLease in the cluster (no index by label): about 1.4 µs per object, 27 ms of its CPU per ADD
//! with 20,000 leases. A watch costs it one event per change per watching node instead.
//!
//! Records carry the object's resourceVersion (etcd's revision, one counter for every object), so
//! a late watch event never replaces what the service itself wrote since: the newer revision
//! wins. A cache is a hint: every write stays conditional on the version it names, so a stale
//! answer costs a lost race, never a second holder.
//!
//! Memory is bounded: a record kept costs about 1.2 KB, and reading a network's list about 1.7 KB
//! per record more while it lasts (the answer's text). A network with more than [`MAX_RECORDS`]
//! records, or whose list is longer than [`MAX_LIST_BYTES`], or that would take the records kept
//! by this node past [`MAX_KEPT`], or that comes after [`MAX_NETWORKS`] others, is not kept: its
//! plugins' requests go to the API server.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tether_kube_store::Change;
use tether_kube_store::convert::split_version;
use tether_leases::{Lease, PodRef, Scope};

/// The most records of one network kept in memory.
pub const MAX_RECORDS: usize = 20_000;

/// The most records kept for all networks together (at most about 80 MB).
pub const MAX_KEPT: usize = 65_536;

/// The most networks kept (each a watch connection and a thread): a node's pods use a few
/// NADs; a network asked about past this goes to the API server.
pub const MAX_NETWORKS: usize = 64;

/// The longest list answer read for a network (a little more than [`MAX_RECORDS`] records).
pub const MAX_LIST_BYTES: usize = 40 << 20;

/// The revision in a lease's version (`<uid>/<resourceVersion>`).
fn revision(l: &Lease) -> u64 {
    l.version
        .as_deref()
        .and_then(split_version)
        .and_then(|(_, rv)| rv.parse().ok())
        .unwrap_or(0)
}

/// Where a record is: its domain and address (a network's label may also name its records in
/// another domain, after its NAD changed fabric).
type Key = (Option<String>, IpAddr);

fn key(l: &Lease) -> Key {
    (l.domain.clone(), l.address)
}

type PodKey = (String, String);

fn pod_key(p: &PodRef) -> Option<PodKey> {
    Some((p.namespace.clone()?, p.name.clone()?))
}

/// Where a network's cache stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Standing {
    /// Its first list is on its way.
    #[default]
    Filling,
    /// Complete, and the watch since has not failed.
    Synced,
    /// Not to be trusted (the watch failed, or the network is too big to keep).
    Off,
}

impl Standing {
    /// Its name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Filling => "filling",
            Standing::Synced => "synced",
            Standing::Off => "off",
        }
    }
}

#[derive(Default)]
struct State {
    standing: Standing,
    /// The most records this network may grow to (set by its list).
    limit: usize,
    by_address: HashMap<Key, Lease>,
    /// The revision of each record's last deletion seen, so an older event does not bring it
    /// back.
    gone: HashMap<Key, u64>,
    by_pod: HashMap<PodKey, HashSet<Key>>,
}

impl State {
    fn unindex(&mut self, a: &Key) {
        if let Some(old) = self.by_address.remove(a)
            && let Some(k) = pod_key(&old.pod)
            && let Some(set) = self.by_pod.get_mut(&k)
        {
            set.remove(a);
            if set.is_empty() {
                self.by_pod.remove(&k);
            }
        }
    }

    fn index(&mut self, l: Lease) {
        let a = key(&l);
        self.unindex(&a);
        if let Some(k) = pod_key(&l.pod) {
            self.by_pod.entry(k).or_default().insert(a.clone());
        }
        self.by_address.insert(a, l);
    }
}

/// One network's records; see the module docs.
#[derive(Default)]
pub struct NetworkLeases {
    state: Mutex<State>,
    changed: Condvar,
}

impl NetworkLeases {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Everything, from a complete list: synced from now on, unless there are more than
    /// `limit` records (the room [`Networks::room`] gives it), then off.
    pub fn replace_all(&self, leases: Vec<Lease>, limit: usize) {
        let mut s = self.lock();
        *s = State {
            limit,
            ..State::default()
        };
        if leases.len() > limit {
            s.standing = Standing::Off;
        } else {
            for l in leases {
                s.index(l);
            }
            s.standing = Standing::Synced;
        }
        drop(s);
        self.changed.notify_all();
    }

    /// Not to be trusted until the next complete list (the watch failed).
    pub fn unsynced(&self) {
        self.lock().standing = Standing::Off;
        self.changed.notify_all();
    }

    /// Where it stands, waiting up to `wait` for its first list.
    pub fn standing(&self, wait: Duration) -> Standing {
        let s = self.lock();
        let (s, _) = self
            .changed
            .wait_timeout_while(s, wait, |s| s.standing == Standing::Filling)
            .unwrap_or_else(|p| p.into_inner());
        s.standing
    }

    /// A change the watch carried, or a write the service made (`Upsert` of the stored record,
    /// `Deleted` of the removed one): applied unless what is here is newer.
    pub fn apply(&self, c: Change<Lease>) {
        let mut s = self.lock();
        if s.standing == Standing::Off {
            return;
        }
        match c {
            Change::Upsert(l) => {
                let (a, rv) = (key(&l), revision(&l));
                let newer_here = s.by_address.get(&a).is_some_and(|h| revision(h) > rv)
                    || s.gone.get(&a).is_some_and(|g| *g >= rv);
                if !newer_here {
                    s.gone.remove(&a);
                    s.index(l);
                }
            }
            Change::Deleted(l) => {
                let (a, rv) = (key(&l), revision(&l));
                if s.by_address.get(&a).is_none_or(|h| revision(h) <= rv) {
                    s.unindex(&a);
                    s.gone.insert(a, rv);
                }
            }
        }
        if s.standing == Standing::Synced && s.by_address.len() > s.limit {
            *s = State {
                standing: Standing::Off,
                ..State::default()
            };
        }
    }

    /// The network's record of `address` in `domain` (`Some(None)`: the network has none; see
    /// the module docs); `None` when not synced.
    pub fn get(&self, domain: Option<&str>, address: IpAddr) -> Option<Option<Lease>> {
        let s = self.lock();
        let k = (domain.map(str::to_string), address);
        (s.standing == Standing::Synced).then(|| s.by_address.get(&k).cloned())
    }

    /// The records naming `pod` (namespace and name) in `scope`'s domain; `None` when not
    /// synced.
    pub fn by_pod(&self, scope: &Scope, pod: &PodRef) -> Option<Vec<Lease>> {
        let s = self.lock();
        if s.standing != Standing::Synced {
            return None;
        }
        let Some(k) = pod_key(pod) else {
            return Some(Vec::new());
        };
        Some(
            s.by_pod
                .get(&k)
                .into_iter()
                .flatten()
                .filter_map(|a| s.by_address.get(a))
                .filter(|l| l.in_domain(scope.domain.as_deref()))
                .cloned()
                .collect(),
        )
    }

    /// Every record in `scope`'s domain; `None` when not synced.
    pub fn of_network(&self, scope: &Scope) -> Option<Vec<Lease>> {
        let s = self.lock();
        (s.standing == Standing::Synced).then(|| {
            s.by_address
                .values()
                .filter(|l| l.in_domain(scope.domain.as_deref()))
                .cloned()
                .collect()
        })
    }

    /// The records `node` holds (by `spec.node`); `None` when not synced.
    pub fn of_node(&self, node: &str) -> Option<Vec<Lease>> {
        let s = self.lock();
        (s.standing == Standing::Synced).then(|| {
            s.by_address
                .values()
                .filter(|l| l.node.as_deref() == Some(node))
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

/// One network as the running service keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkGauge {
    /// The network's name.
    pub network: String,
    /// Whether its answers come from memory ([`Standing::Synced`]).
    pub standing: Standing,
    /// Records kept.
    pub records: usize,
}

/// The networks kept, by name.
#[derive(Default)]
pub struct Networks {
    kept: Mutex<HashMap<String, Arc<NetworkLeases>>>,
}

impl Networks {
    /// `network`'s cache, and whether it was just made (its watch is to be started); `None`
    /// for a new network once [`MAX_NETWORKS`] are kept.
    pub fn entry(&self, network: &str) -> Option<(Arc<NetworkLeases>, bool)> {
        let mut m = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(network) {
            Some(c) => Some((c.clone(), false)),
            None if m.len() >= MAX_NETWORKS => None,
            None => {
                let c = Arc::new(NetworkLeases::default());
                m.insert(network.to_string(), c.clone());
                Some((c, true))
            }
        }
    }

    /// Each network: where it stands and how many records it keeps.
    pub fn gauges(&self) -> Vec<NetworkGauge> {
        let kept: Vec<(String, Arc<NetworkLeases>)> = self
            .kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, c)| (n.clone(), c.clone()))
            .collect();
        let mut out: Vec<_> = kept
            .into_iter()
            .map(|(network, c)| NetworkGauge {
                network,
                standing: c.standing(Duration::ZERO),
                records: c.len(),
            })
            .collect();
        out.sort_by(|a, b| a.network.cmp(&b.network));
        out
    }

    /// How many records `network` may keep: [`MAX_RECORDS`], less when the other networks
    /// keep most of [`MAX_KEPT`].
    pub fn room(&self, network: &str) -> usize {
        let m = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let others: usize = m
            .iter()
            .filter(|(n, _)| n.as_str() != network)
            .map(|(_, c)| c.len())
            .sum();
        MAX_KEPT.saturating_sub(others).min(MAX_RECORDS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_leases::LeaseState;

    fn lease(addr: &str, rv: u64, pod: &str, node: &str) -> Lease {
        Lease {
            network: "mgmt".into(),
            domain: None,
            address: addr.parse().unwrap(),
            prefix_len: 24,
            range_index: Some(0),
            container_id: format!("c{rv}"),
            ifname: "net1".into(),
            pod: PodRef::new("ns", pod, "u"),
            node: Some(node.into()),
            state: LeaseState::Leased,
            since: 1,
            version: Some(format!("uid/{rv}")),
        }
    }

    fn ip(a: &str) -> IpAddr {
        a.parse().unwrap()
    }

    fn mgmt() -> Scope {
        Scope::cluster("mgmt")
    }

    /// One address of the network in two domains (its NAD moved to an isolated fabric): two
    /// records, each answered for its own domain.
    #[test]
    fn records_are_kept_per_domain() {
        let c = NetworkLeases::default();
        let mut rail = lease("10.0.0.1", 2, "q", "n1");
        rail.domain = Some("rail-1".into());
        c.replace_all(vec![lease("10.0.0.1", 1, "p", "n1"), rail], MAX_RECORDS);
        assert_eq!(
            c.get(None, ip("10.0.0.1")).unwrap().unwrap().container_id,
            "c1"
        );
        let r = c.get(Some("rail-1"), ip("10.0.0.1")).unwrap().unwrap();
        assert_eq!(r.container_id, "c2");
        assert_eq!(c.get(Some("rail-2"), ip("10.0.0.1")), Some(None));
        assert_eq!(c.of_network(&mgmt()).unwrap().len(), 1);
        let q = PodRef::new("ns", "q", "u");
        assert!(c.by_pod(&mgmt(), &q).unwrap().is_empty());
        let on_rail = Scope::new("mgmt", Some("rail-1".into()));
        assert_eq!(c.by_pod(&on_rail, &q).unwrap().len(), 1);
        c.apply(Change::Deleted(lease("10.0.0.1", 3, "p", "n1")));
        assert_eq!(c.get(None, ip("10.0.0.1")), Some(None));
        assert!(c.get(Some("rail-1"), ip("10.0.0.1")).unwrap().is_some());
    }

    #[test]
    fn nothing_is_answered_before_a_complete_list() {
        let c = NetworkLeases::default();
        c.apply(Change::Upsert(lease("10.0.0.1", 5, "p", "n1")));
        assert_eq!(c.get(None, ip("10.0.0.1")), None);
        assert_eq!(c.standing(Duration::from_millis(10)), Standing::Filling);
        c.replace_all(vec![lease("10.0.0.2", 6, "p", "n1")], MAX_RECORDS);
        assert_eq!(c.standing(Duration::ZERO), Standing::Synced);
        assert_eq!(c.get(None, ip("10.0.0.9")), Some(None), "known free");
        assert_eq!(c.of_node("n1").unwrap().len(), 1);
        c.unsynced();
        assert_eq!(c.get(None, ip("10.0.0.2")), None);
        assert_eq!(c.by_pod(&mgmt(), &PodRef::new("ns", "p", "u")), None);
    }

    #[test]
    fn a_late_event_never_replaces_a_newer_write() {
        let c = NetworkLeases::default();
        c.replace_all(vec![], MAX_RECORDS);
        let a = ip("10.0.0.1");
        // The service wrote revision 9; the watch then delivers revision 7 of the same record.
        c.apply(Change::Upsert(lease("10.0.0.1", 9, "p", "n1")));
        c.apply(Change::Upsert(lease("10.0.0.1", 7, "p", "n1")));
        assert_eq!(
            c.get(None, a).unwrap().unwrap().version.as_deref(),
            Some("uid/9")
        );
        // Deleted at 10: an older or equal upsert does not bring it back; a newer one does.
        c.apply(Change::Deleted(lease("10.0.0.1", 10, "p", "n1")));
        c.apply(Change::Upsert(lease("10.0.0.1", 10, "p", "n1")));
        assert_eq!(c.get(None, a), Some(None));
        c.apply(Change::Upsert(lease("10.0.0.1", 11, "p", "n1")));
        assert_eq!(
            c.get(None, a).unwrap().unwrap().version.as_deref(),
            Some("uid/11")
        );
        // An older deletion does not remove a newer record.
        c.apply(Change::Deleted(lease("10.0.0.1", 8, "p", "n1")));
        assert!(c.get(None, a).unwrap().is_some());
    }

    #[test]
    fn a_pods_records_follow_its_changes_on_any_node() {
        let c = NetworkLeases::default();
        c.replace_all(
            vec![
                lease("10.0.0.1", 1, "train-0", "n1"),
                lease("10.0.0.2", 2, "train-1", "n2"),
            ],
            MAX_RECORDS,
        );
        let p0 = PodRef::new("ns", "train-0", "other-uid");
        assert_eq!(c.by_pod(&mgmt(), &p0).unwrap().len(), 1);
        // The address goes to another pod: no longer train-0's.
        c.apply(Change::Upsert(lease("10.0.0.1", 3, "web-7", "n2")));
        assert!(c.by_pod(&mgmt(), &p0).unwrap().is_empty());
        // train-0 leases another address on node n2.
        c.apply(Change::Upsert(lease("10.0.0.5", 4, "train-0", "n2")));
        let found = c.by_pod(&mgmt(), &p0).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].address, ip("10.0.0.5"));
        c.apply(Change::Deleted(lease("10.0.0.5", 5, "train-0", "n2")));
        assert!(c.by_pod(&mgmt(), &p0).unwrap().is_empty());
        assert!(c.by_pod(&mgmt(), &PodRef::default()).unwrap().is_empty());
        assert_eq!(c.of_node("n2").unwrap().len(), 2);
    }

    fn numbered(n: usize, from: u32) -> Vec<Lease> {
        (0..n as u32)
            .map(|i| {
                let mut l = lease("10.0.0.1", u64::from(from + i), "p", "n1");
                l.address = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + from + i));
                l
            })
            .collect()
    }

    #[test]
    fn a_network_too_big_to_keep_is_not_kept() {
        let nets = Networks::default();
        let (c, new) = nets.entry("big").unwrap();
        assert!(new);
        assert_eq!(nets.room("big"), MAX_RECORDS);
        c.replace_all(numbered(MAX_RECORDS + 1, 0), nets.room("big"));
        assert_eq!(c.standing(Duration::ZERO), Standing::Off);
        assert!(c.is_empty());
        assert_eq!(c.get(None, ip("10.0.0.1")), None);
    }

    #[test]
    fn networks_share_what_is_kept_and_one_growing_past_its_room_is_dropped() {
        let nets = Networks::default();
        let mut kept = 0;
        // Networks of MAX_RECORDS each until MAX_KEPT is nearly used up.
        for k in 0..MAX_KEPT / MAX_RECORDS {
            let name = format!("n{k}");
            let (c, _) = nets.entry(&name).unwrap();
            c.replace_all(numbered(MAX_RECORDS, kept as u32), nets.room(&name));
            assert_eq!(c.standing(Duration::ZERO), Standing::Synced);
            kept += MAX_RECORDS;
        }
        let left = MAX_KEPT - kept;
        let (last, _) = nets.entry("last").unwrap();
        assert_eq!(nets.room("last"), left, "what the others leave");
        last.replace_all(numbered(left, kept as u32), nets.room("last"));
        assert_eq!(last.standing(Duration::ZERO), Standing::Synced);
        // One more record than its room: it is no longer kept (nor trusted).
        last.apply(Change::Upsert(numbered(1, 900_000).remove(0)));
        assert_eq!(last.standing(Duration::ZERO), Standing::Off);
        assert!(last.is_empty());
        assert_eq!(nets.room("last"), left);
    }

    #[test]
    fn networks_past_the_most_kept_are_not_kept_and_the_kept_ones_still_answer() {
        let nets = Networks::default();
        for k in 0..MAX_NETWORKS {
            assert!(nets.entry(&format!("n{k}")).is_some_and(|(_, new)| new));
        }
        assert!(
            nets.entry("one-more").is_none(),
            "a new network past the cap"
        );
        assert!(
            nets.entry("n0").is_some_and(|(_, new)| !new),
            "a kept network is still found"
        );
    }
}
