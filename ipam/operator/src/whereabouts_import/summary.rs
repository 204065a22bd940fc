//! What an import did, kept across the passes of `--follow`: each allocation is counted once,
//! when it is decided (imported, already imported, pod gone); a conflict is kept until it is
//! resolved; what is no longer allocated is forgotten (memory stays bounded by whereabouts'
//! allocations). Printed as a table or JSON.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

use serde_json::{Value, json};
use tether_leases::{Lease, domain_text};

use super::claim::{Conflict, HolderPod, Outcome};
use super::entries::{Entry, ReadPool, Skipped};
use super::networks::Placement;
use crate::output::{Output, print_table};

/// One allocation across passes: its pool, address and holder.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryKey {
    pool: String,
    address: IpAddr,
    holder: (String, String, String),
}

impl EntryKey {
    /// The key of `e`, of the pool `pool` (`namespace/name`).
    pub fn of(e: &Entry, pool: &ReadPool) -> EntryKey {
        EntryKey {
            pool: pool_key(pool),
            address: e.address,
            holder: (e.container_id.clone(), e.ifname.clone(), e.podref()),
        }
    }
}

fn pool_key(p: &ReadPool) -> String {
    format!("{}/{}", p.pool.namespace, p.pool.name)
}

/// Decided allocations of one pool, and where they went.
#[derive(Debug, Clone, Default)]
struct PoolRow {
    range: String,
    placement: Option<Placement>,
    imported: usize,
    already: usize,
    pod_gone: usize,
}

/// The running account of an import.
#[derive(Debug, Default)]
pub struct Summary {
    dry_run: bool,
    pools: BTreeMap<String, PoolRow>,
    decided: HashSet<EntryKey>,
    conflicts: BTreeMap<EntryKey, Conflict>,
    skipped: BTreeSet<Skipped>,
    /// Requests that failed in the last pass.
    failures: Vec<String>,
    notes: BTreeSet<String>,
}

impl Summary {
    /// An empty account; `dry_run`: nothing is written.
    pub fn new(dry_run: bool) -> Summary {
        Summary {
            dry_run,
            ..Summary::default()
        }
    }

    /// A pass starts: its failures are its own.
    pub fn begin_pass(&mut self) {
        self.failures.clear();
    }

    /// `pool` is placed at `placement` (the last pass's word counts).
    pub fn pool(&mut self, pool: &ReadPool, placement: &Placement) {
        let row = self.pools.entry(pool_key(pool)).or_default();
        row.range = pool.pool.range.clone();
        row.placement = Some(placement.clone());
    }

    /// Has `key` been decided in an earlier pass?
    pub fn is_decided(&self, key: &EntryKey) -> bool {
        self.decided.contains(key)
    }

    /// Account for the outcome of `key` (recorded by whereabouts at `source`). Returns whether
    /// it is news (first decided, or a conflict or reason to skip not seen before), for
    /// `--follow`'s log.
    pub fn record(&mut self, key: EntryKey, source: &str, outcome: Outcome) -> bool {
        let row = self.pools.entry(key.pool.clone()).or_default();
        match outcome {
            Outcome::Imported { .. } => row.imported += 1,
            Outcome::Already => row.already += 1,
            Outcome::PodGone => row.pod_gone += 1,
            Outcome::Conflict(c) => return self.conflicts.insert(key, *c).is_none(),
            Outcome::Failed(why) => {
                self.failures.push(why);
                return true;
            }
            Outcome::NotYet(reason) => {
                return self.skip(Skipped {
                    source: source.to_string(),
                    reason,
                });
            }
        }
        // A conflict or a reason to wait that an earlier pass met is over.
        self.conflicts.remove(&key);
        self.skipped.retain(|s| s.source != source);
        self.decided.insert(key)
    }

    /// A pass could not read what it needs.
    pub fn fail(&mut self, why: String) {
        self.failures.push(why);
    }

    /// Account for a record that is not imported. Returns whether it is news.
    pub fn skip(&mut self, s: Skipped) -> bool {
        self.skipped.insert(s)
    }

    /// Something the operator should know (a NAD tether cannot read, a pool no NAD names).
    pub fn note(&mut self, note: String) -> bool {
        self.notes.insert(note)
    }

    /// A pass ended having seen `present`: what whereabouts no longer holds is forgotten.
    pub fn end_pass(&mut self, present: &HashSet<EntryKey>) {
        self.decided.retain(|k| present.contains(k));
        self.conflicts.retain(|k, _| present.contains(k));
    }

    /// Unresolved conflicts or failed requests: the exit status says so.
    pub fn has_problems(&self) -> bool {
        !self.conflicts.is_empty() || !self.failures.is_empty()
    }

    fn totals(&self) -> (usize, usize, usize) {
        self.pools.values().fold((0, 0, 0), |(i, a, g), r| {
            (i + r.imported, a + r.already, g + r.pod_gone)
        })
    }

    /// Print the account as `output` says.
    pub fn print(&self, output: Output) {
        match output {
            Output::Json => println!(
                "{}",
                serde_json::to_string_pretty(&self.to_json()).expect("json")
            ),
            Output::Table => self.print_table(),
        }
    }

    fn to_json(&self) -> Value {
        let (imported, already, pod_gone) = self.totals();
        let conflicts_of = |pool: &str| self.conflicts.keys().filter(|k| k.pool == pool).count();
        let pools: Vec<Value> = self
            .pools
            .iter()
            .map(|(name, r)| {
                let p = r.placement.as_ref();
                json!({
                    "pool": name, "range": r.range,
                    "network": p.map(|p| &p.scope.network),
                    "isolatedFabric": p.and_then(|p| p.scope.domain.as_ref()),
                    "nad": p.and_then(|p| p.nad.as_ref()),
                    "matchedBy": p.map(|p| p.matched.text()),
                    "imported": r.imported, "already": r.already, "podGone": r.pod_gone,
                    "conflicts": conflicts_of(name),
                })
            })
            .collect();
        json!({
            "dryRun": self.dry_run,
            "counts": {
                "imported": imported, "already": already, "podGone": pod_gone,
                "conflicts": self.conflicts.len(), "skipped": self.skipped.len(),
                "failed": self.failures.len(),
            },
            "pools": pools,
            "conflicts": self.conflicts.values().map(conflict_json).collect::<Vec<_>>(),
            "skipped": self.skipped.iter()
                .map(|s| json!({"source": s.source, "reason": s.reason}))
                .collect::<Vec<_>>(),
            "failures": self.failures,
            "notes": self.notes,
        })
    }

    fn print_table(&self) {
        let rows: Vec<Vec<String>> = self
            .pools
            .iter()
            .map(|(name, r)| {
                let p = r.placement.as_ref();
                vec![
                    name.clone(),
                    r.range.clone(),
                    p.map_or(String::new(), |p| p.scope.network.clone()),
                    p.and_then(|p| p.scope.domain.clone())
                        .unwrap_or_else(|| "cluster".into()),
                    p.and_then(|p| p.nad.clone())
                        .unwrap_or_else(|| "(none)".into()),
                    r.imported.to_string(),
                    r.already.to_string(),
                    r.pod_gone.to_string(),
                    self.conflicts
                        .keys()
                        .filter(|k| k.pool == *name)
                        .count()
                        .to_string(),
                ]
            })
            .collect();
        let header = [
            "POOL",
            "RANGE",
            "NETWORK",
            "DOMAIN",
            "NAD",
            "IMPORTED",
            "ALREADY",
            "POD GONE",
            "CONFLICTS",
        ];
        print_table(&header, &rows);
        let (imported, already, pod_gone) = self.totals();
        println!(
            "\n{} {imported}, already imported {already}, pod gone {pod_gone}, conflicts {}, skipped {}{}",
            if self.dry_run {
                "would import"
            } else {
                "imported"
            },
            self.conflicts.len(),
            self.skipped.len(),
            if self.dry_run {
                " (dry run: nothing written)"
            } else {
                ""
            }
        );
        for c in self.conflicts.values() {
            println!("conflict: {}", describe_conflict(c));
        }
        for s in &self.skipped {
            println!("skipped: {}: {}", s.source, s.reason);
        }
        for n in &self.notes {
            println!("note: {n}");
        }
        for f in &self.failures {
            println!("failed: {f}");
        }
    }
}

/// `pod ns/name (uid u), container c, interface i, node n`.
fn holder_text(l: &Lease) -> String {
    let or = |s: &str, none: &str| {
        if s.is_empty() {
            none.to_string()
        } else {
            s.to_string()
        }
    };
    format!(
        "pod {} (uid {}), container {}, interface {}, node {}",
        l.pod,
        l.pod.uid.as_deref().unwrap_or("?"),
        or(&l.container_id, "(none recorded)"),
        or(&l.ifname, "(none recorded)"),
        l.node.as_deref().unwrap_or("(none)")
    )
}

/// Both holders of a conflict and what to do about it.
pub fn describe_conflict(c: &Conflict) -> String {
    let (w, h) = (&c.wanted, &c.held);
    let advice = match &c.held_pod {
        HolderPod::Alive => format!(
            "both pods exist and use {}: delete one of them (its address is then free), then import again",
            w.address
        ),
        HolderPod::Gone | HolderPod::Replaced => format!(
            "tether's holder is gone: the reconciler of its node releases its lease (or release it now with \
             `tether release {} --network {}`), then import again",
            h.address, h.network
        ),
        HolderPod::Unnamed => {
            "tether's record names no pod (cnitool or a plain runtime): find its \
                               container with `tether leases`, then import again"
                .to_string()
        }
        HolderPod::Unknown(_) => {
            "check tether's holder with `tether leases`, then import again".into()
        }
    };
    let fabric_hint = if w.network != h.network {
        format!(
            "; if networks {} and {} are separate fabrics that reuse addresses, give their NADs \
             ipam.isolated_fabric (tether-ipam) instead",
            w.network, h.network
        )
    } else {
        String::new()
    };
    format!(
        "{} in {}: whereabouts gives it to {} ({}, network {}); tether has it leased to {} (network {}, \
         pod {}): {advice}{fabric_hint}",
        w.address,
        domain_text(w.domain.as_deref()),
        holder_text(w),
        c.source,
        w.network,
        holder_text(h),
        h.network,
        c.held_pod.text(),
    )
}

fn lease_holder_json(l: &Lease) -> Value {
    json!({
        "network": l.network, "pod": {"namespace": l.pod.namespace, "name": l.pod.name, "uid": l.pod.uid},
        "containerID": l.container_id, "ifname": l.ifname, "node": l.node,
    })
}

fn conflict_json(c: &Conflict) -> Value {
    let mut tether = lease_holder_json(&c.held);
    tether["since"] = json!(c.held.since);
    tether["podState"] = json!(c.held_pod.text());
    let mut whereabouts = lease_holder_json(&c.wanted);
    whereabouts["source"] = json!(c.source);
    json!({
        "address": c.wanted.address.to_string(),
        "isolatedFabric": c.wanted.domain,
        "whereabouts": whereabouts,
        "tether": tether,
        "advice": describe_conflict(c),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_cluster::WhereaboutsPool;
    use tether_leases::{LeaseState, PodRef};

    fn entry(i: u8) -> Entry {
        Entry {
            pool: 0,
            address: format!("10.203.0.{i}").parse().unwrap(),
            prefix_len: 26,
            container_id: format!("c{i}"),
            ifname: "net1".into(),
            pod_namespace: "ml".into(),
            pod_name: format!("p{i}"),
            source: format!("IPPool kube-system/10.203.0.0-26 key {i}"),
        }
    }

    fn lease(e: &Entry, pod: &str) -> Lease {
        Lease {
            network: "mgmt".into(),
            domain: None,
            address: e.address,
            prefix_len: 26,
            range_index: None,
            container_id: format!("ctr-{pod}"),
            ifname: "net1".into(),
            pod: PodRef::new("ml", pod, "u"),
            node: Some("n1".into()),
            state: LeaseState::Leased,
            since: 0,
            version: None,
        }
    }

    #[test]
    fn each_allocation_counts_once_and_what_is_over_is_forgotten() {
        let pool = ReadPool::new(WhereaboutsPool {
            namespace: "kube-system".into(),
            name: "10.203.0.0-26".into(),
            range: "10.203.0.0/26".into(),
            allocations: Default::default(),
        });
        let (e1, e2, e3) = (entry(1), entry(2), entry(3));
        let key = |e: &Entry| EntryKey::of(e, &pool);
        let conflict = || {
            Outcome::Conflict(Box::new(Conflict {
                wanted: lease(&e2, "p2"),
                source: e2.source.clone(),
                held: lease(&e2, "other"),
                held_pod: HolderPod::Alive,
            }))
        };
        let all: HashSet<EntryKey> = [key(&e1), key(&e2), key(&e3)].into();
        let mut s = Summary::new(false);

        s.begin_pass();
        assert!(s.record(key(&e1), &e1.source, Outcome::Imported { took_over: None }));
        assert!(s.record(key(&e2), &e2.source, conflict()));
        assert!(s.record(key(&e3), &e3.source, Outcome::NotYet("not yet".into())));
        s.end_pass(&all);
        assert!(s.has_problems());
        assert_eq!(s.to_json()["counts"]["skipped"], 1);

        // The next pass: e1 is not asked again, e2 is no news, e3 is imported now.
        s.begin_pass();
        assert!(s.is_decided(&key(&e1)) && !s.is_decided(&key(&e2)));
        assert!(!s.record(key(&e2), &e2.source, conflict()));
        assert!(s.record(key(&e3), &e3.source, Outcome::Already));
        // whereabouts no longer holds e2: its conflict is over.
        s.end_pass(&[key(&e1), key(&e3)].into());
        assert!(!s.has_problems());
        let j = s.to_json();
        assert_eq!(
            j["counts"],
            json!({"imported": 1, "already": 1, "podGone": 0, "conflicts": 0, "skipped": 0, "failed": 0})
        );
        assert_eq!(j["pools"][0]["pool"], "kube-system/10.203.0.0-26");
        assert!(!s.is_decided(&key(&e2)));
    }

    #[test]
    fn a_conflict_says_who_holds_the_address_and_what_to_do() {
        let e = entry(5);
        let c = Conflict {
            wanted: lease(&e, "p5"),
            source: e.source.clone(),
            held: Lease {
                network: "other".into(),
                ..lease(&e, "x")
            },
            held_pod: HolderPod::Gone,
        };
        let text = describe_conflict(&c);
        for part in [
            "10.203.0.5 in the cluster-wide domain",
            "whereabouts gives it to pod ml/p5 (uid u), container ctr-p5, interface net1, node n1",
            "tether has it leased to pod ml/x",
            "tether release 10.203.0.5 --network other",
            "ipam.isolated_fabric",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
    }
}
