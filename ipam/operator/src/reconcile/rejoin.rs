//! A node back from a partition: taking back the addresses its running pods still use.
//!
//! The controller releases the leases of a node that has not reported for longer than its
//! node-lost grace, though the node's pods may still run: a partition that cut the node off from
//! the API server but not from the wire. When the node's agent reaches the API server again, the
//! node's journal (`<data dir>/journal`, written by the plugin before each claim) still names the
//! addresses those pods use. Each pass of the node's reconciler compares it with the store, and
//! for an attachment whose pod still runs on this node:
//!
//! - its record is no longer `Leased` (released, quarantined by another node's probe that heard
//!   this pod answer, or deleted): the agent **takes it back** for that attachment, with a
//!   conditional write, so no other pod is handed it;
//! - another node's pod holds it now (nothing heard this pod when that one was given it): two
//!   pods answer for one address. Neither lease is touched (which pod keeps it is the user's
//!   choice); the pass reports it, and with conflict Events an `AddressConflict` Warning on this
//!   node's pod says which pod holds it and asks for one of them to be deleted.
//!
//! An entry whose pod is gone or was replaced (a DEL that never reached tether) is read against
//! the store once, then not again while the agent runs.
//!
//! An entry is taken at its word only where nothing else explains it: it has no work left for
//! the store (`pending`: a DEL or a claim whose answer never came, settled by the next call), its
//! pod exists with the same uid, is bound to this node and is not being deleted, no newer
//! sandbox of the pod holds a lease on that interface, the record was not released in the last
//! [`SETTLE_S`] seconds (a DEL between its write and its journal update), and the entry is still
//! there right before the write.

use std::collections::HashSet;

use tether_cluster::Posted;
use tether_leases::{AttachmentIndex, FileJournal, JournalEntry, Lease, LeaseState, LeaseStore};

use super::Reconciler;
use crate::kube::Kube;
use crate::monitor::conflict_warning;
use crate::report::{HeldElsewhere, PassReport};

/// A record changed this recently is left for the next pass: a DEL releases the record before
/// it removes its journal entry.
pub const SETTLE_S: u64 = 10;

/// How often a lasting double holder's `AddressConflict` Event is posted again (an API write
/// each time): well inside the API server's default Event TTL of one hour.
pub const REPOST_S: u64 = 600;

/// Where a journaled lease stands against the store's record of its address.
#[derive(Debug, PartialEq)]
enum Standing {
    /// The record is the attachment's, Leased, or it is not this entry's to judge.
    Fine,
    /// The record is not Leased (or is gone): the attachment may take it back.
    Free(Option<Lease>),
    /// Another node's pod holds it.
    Elsewhere(Lease),
}

/// `entry`'s lease of an address against `current`, the store's record of it, on node `node`.
fn standing(entry: &JournalEntry, current: Option<Lease>, node: &str) -> Standing {
    match current {
        None => Standing::Free(None),
        Some(c) if !c.is_leased() => Standing::Free(Some(c)),
        Some(c) if c.is_attachment(&entry.container_id, &entry.ifname) => Standing::Fine,
        // Held on this node, or by another sandbox of the same pod: this entry is the stale one
        // (a dead sandbox's), which the node's own rules settle.
        Some(c)
            if c.node.as_deref().is_none_or(|n| n == node)
                || (c.pod.uid.is_some() && c.pod.uid == entry.pod.uid) =>
        {
            Standing::Fine
        }
        Some(c) => Standing::Elsewhere(c),
    }
}

impl Reconciler {
    /// Compare the node's journal with `leases` (this pass's LIST of the node's records) and take
    /// back, or report, what the node's running pods use but the store no longer gives them.
    pub(super) fn rejoin(&self, leases: &[Lease], now: u64, kube: &Kube, r: &mut PassReport) {
        let Some(dir) = &self.opts.data_dir else {
            return;
        };
        let journal = FileJournal::new(dir.join("journal"));
        let entries = match journal.every_entry() {
            Ok(e) => e,
            Err(e) => {
                r.errors.push(e.to_string());
                return;
            }
        };
        let errors = r.errors.len();
        let gone = {
            let mut g = self.gone_pods.lock().unwrap_or_else(|p| p.into_inner());
            g.retain(|uid| entries.iter().any(|e| e.pod.uid.as_ref() == Some(uid)));
            g.clone()
        };
        let judged = |e: &&JournalEntry| {
            e.pending.is_none() && e.pod.uid.as_ref().is_none_or(|u| !gone.contains(u))
        };
        let mut seen = HashSet::new();
        let mut event_failures = 0;
        for entry in entries.iter().filter(judged) {
            for held in entry.held().filter(|l| l.version.is_some()) {
                let listed = leases.iter().any(|c| {
                    c.address == held.address
                        && c.in_domain(held.domain.as_deref())
                        && c.is_leased()
                        && c.is_attachment(&entry.container_id, &entry.ifname)
                });
                if listed {
                    continue;
                }
                // Not Leased to it in the LIST (or named otherwise): the record itself decides.
                kube.restart_budget();
                let current = match kube.leases.get(&held.scope(), held.address) {
                    Ok(c) => c,
                    Err(e) => {
                        r.errors
                            .push(format!("reading the record of {}: {e}", held.address));
                        continue;
                    }
                };
                match standing(entry, current, &self.opts.node) {
                    Standing::Fine => {}
                    Standing::Free(c) => {
                        if self.may_take_back(entry, held, c.as_ref(), leases, now, kube, r) {
                            self.take_back(&journal, entry, held, c, now, kube, r);
                        }
                    }
                    Standing::Elsewhere(theirs) => {
                        if self.pod_runs_here(entry, kube, r)
                            && self.held_elsewhere(entry, held, theirs, now, kube, &mut seen, r)
                        {
                            event_failures += 1;
                        }
                    }
                }
            }
        }
        // Every entry was judged: what it found is the whole finding (an Event that could not
        // be posted does not change it).
        r.journal_compared = r.errors.len() == errors + event_failures;
        if r.journal_compared {
            // A double holder that ended and comes back later gets an Event again.
            self.posted_elsewhere
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|o, _| seen.contains(o));
        }
    }

    /// Whether nothing but a release behind this node's back explains `current`, the record of
    /// `held` (see the module docs).
    #[allow(clippy::too_many_arguments)]
    fn may_take_back(
        &self,
        entry: &JournalEntry,
        held: &Lease,
        current: Option<&Lease>,
        leases: &[Lease],
        now: u64,
        kube: &Kube,
        r: &mut PassReport,
    ) -> bool {
        if current.is_some_and(|c| now.saturating_sub(c.since) < SETTLE_S) {
            super::due_at(r, now + SETTLE_S);
            return false;
        }
        let newer_sandbox = leases.iter().any(|c| {
            c.is_leased()
                && c.network == held.network
                && c.ifname == entry.ifname
                && c.container_id != entry.container_id
                && c.pod.uid.is_some()
                && c.pod.uid == entry.pod.uid
        });
        !newer_sandbox && self.pod_runs_here(entry, kube, r)
    }

    /// Whether `entry`'s pod exists with its uid, bound to this node and not being deleted.
    fn pod_runs_here(&self, entry: &JournalEntry, kube: &Kube, r: &mut PassReport) -> bool {
        let (Some(ns), Some(name), Some(uid)) =
            (&entry.pod.namespace, &entry.pod.name, &entry.pod.uid)
        else {
            // Not a pod's (cnitool, a plain runtime): CNI GC's to judge.
            return false;
        };
        kube.restart_budget();
        let gone = || {
            let mut g = self.gone_pods.lock().unwrap_or_else(|p| p.into_inner());
            g.insert(uid.clone());
            false
        };
        match kube.cluster.pod_placement(ns, name) {
            Ok(Some(p)) if p.uid != *uid => gone(),
            Ok(Some(p)) => p.node.as_deref() == Some(&self.opts.node) && !p.terminating,
            Ok(None) => gone(),
            Err(e) => {
                r.errors.push(format!("checking pod {ns}/{name}: {e}"));
                false
            }
        }
    }

    /// Write `held` back as `entry`'s, conditional on `current` (absent: created).
    #[allow(clippy::too_many_arguments)]
    fn take_back(
        &self,
        journal: &FileJournal,
        entry: &JournalEntry,
        held: &Lease,
        current: Option<Lease>,
        now: u64,
        kube: &Kube,
        r: &mut PassReport,
    ) {
        // A DEL that ran since the journal was read removed the entry: its pod is done with it.
        let still = journal
            .lookup(
                &held.network,
                &entry.container_id,
                &entry.ifname,
                &entry.pod,
            )
            .ok()
            .and_then(|l| l.mine)
            .is_some_and(|e| e.pending.is_none() && e.held().any(|l| l.address == held.address));
        if !still {
            return;
        }
        let wanted = Lease {
            container_id: entry.container_id.clone(),
            ifname: entry.ifname.clone(),
            pod: entry.pod.clone(),
            node: Some(self.opts.node.clone()),
            state: LeaseState::Leased,
            since: now,
            version: None,
            ..held.clone()
        };
        kube.restart_budget();
        match kube.leases.claim(wanted, current.as_ref()) {
            Ok(Ok(l)) => {
                log::warn!(
                    "reconcile: took back {} of network {} for pod {} ({}, container {}): {}, and the pod still uses it",
                    l.address,
                    l.network,
                    l.pod,
                    l.ifname,
                    tether_leases::short_id(&l.container_id),
                    match &current {
                        Some(c) => format!("the store had it {}", state_word(c)),
                        None => "the store had no record of it".to_string(),
                    }
                );
                r.taken_back.push(l);
            }
            Ok(Err(_)) => r.lost_races += 1,
            Err(e) => r.errors.push(format!(
                "taking back {} of network {}: {e}",
                held.address, held.network
            )),
        }
    }

    /// Report `held`, used by `entry`'s running pod, as leased to `theirs` of another node, and
    /// note the occurrence in `seen`; true if its Event could not be posted (an error of the
    /// report, not of the comparison).
    #[allow(clippy::too_many_arguments)]
    fn held_elsewhere(
        &self,
        entry: &JournalEntry,
        held: &Lease,
        theirs: Lease,
        now: u64,
        kube: &Kube,
        seen: &mut HashSet<String>,
        r: &mut PassReport,
    ) -> bool {
        let message = elsewhere_message(held, &theirs, &self.opts.node);
        log::error!("reconcile: pod {}: {message}", entry.pod);
        let occurrence = format!(
            "elsewhere/{}/{}/{}/{}/{}",
            held.network, held.address, entry.container_id, entry.ifname, theirs.container_id
        );
        let posted = self.opts.conflict_events.then(|| {
            let warning = conflict_warning(&entry.pod, &occurrence, message, &self.opts.node, now)?;
            let mut known = self
                .posted_elsewhere
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // Posted by a recent pass: the Event is there. Posted again now and then, as the API
            // server drops Events after their TTL (1 h by default) while the double holder lasts.
            if known
                .get(&occurrence)
                .is_some_and(|&at| now.saturating_sub(at) < REPOST_S)
            {
                return Some(true);
            }
            known.insert(occurrence.clone(), now);
            drop(known);
            kube.restart_budget();
            match kube.cluster.post_pod_event(&warning) {
                Ok(Posted::Created | Posted::AlreadyThere) => Some(true),
                Err(e) => {
                    self.posted_elsewhere
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&occurrence);
                    r.errors.push(format!(
                        "posting the AddressConflict Event on pod {}/{}: {e}",
                        warning.namespace, warning.pod
                    ));
                    Some(false)
                }
            }
        });
        seen.insert(occurrence);
        r.held_elsewhere.push(HeldElsewhere {
            ours: Lease {
                container_id: entry.container_id.clone(),
                ifname: entry.ifname.clone(),
                pod: entry.pod.clone(),
                ..held.clone()
            },
            theirs,
        });
        posted.flatten() == Some(false)
    }
}

fn state_word(l: &Lease) -> &'static str {
    match l.state {
        LeaseState::Leased => "leased",
        LeaseState::Released { .. } => "released",
        _ => "quarantined",
    }
}

/// The Event's message: `ours` is used by this node's pod, `theirs` is the store's record.
fn elsewhere_message(ours: &Lease, theirs: &Lease, node: &str) -> String {
    format!(
        "{} of network {} is in use by this pod ({}) on node {node}, but the cluster store leases it to pod {} ({}) on node {}: \
         this pod's lease was released while node {node} could not reach the API server, and the address was given again. \
         Both pods answer for it. Delete one of the two pods so that it gets an address of its own.",
        ours.address,
        ours.network,
        ours.ifname,
        theirs.pod,
        theirs.ifname,
        theirs.node.as_deref().unwrap_or("?"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_leases::PodRef;

    fn lease(container: &str, node: &str, uid: &str, state: LeaseState) -> Lease {
        Lease {
            network: "mgmt".into(),
            domain: None,
            address: "10.9.0.7".parse().unwrap(),
            prefix_len: 24,
            range_index: Some(0),
            container_id: container.into(),
            ifname: "net1".into(),
            pod: PodRef::new("ml", "p", uid),
            node: Some(node.into()),
            state,
            since: 1_000,
            version: Some("7".into()),
        }
    }

    fn entry() -> JournalEntry {
        let l = lease("c-b", "b", "u1", LeaseState::Leased);
        JournalEntry {
            container_id: "c-b".into(),
            ifname: "net1".into(),
            pod: l.pod.clone(),
            leases: vec![l],
            pending: None,
        }
    }

    #[test]
    fn a_record_released_or_gone_is_free_one_of_this_attachment_is_fine() {
        let e = entry();
        let released = lease("c-b", "b", "u1", LeaseState::Released { at: 1_000 });
        assert_eq!(
            standing(&e, Some(released.clone()), "b"),
            Standing::Free(Some(released))
        );
        assert_eq!(standing(&e, None, "b"), Standing::Free(None));
        assert_eq!(
            standing(&e, Some(lease("c-b", "b", "u1", LeaseState::Leased)), "b"),
            Standing::Fine
        );
    }

    #[test]
    fn another_nodes_pod_is_elsewhere_this_nodes_or_a_newer_sandbox_is_not() {
        let e = entry();
        let theirs = lease("c-a", "a", "u2", LeaseState::Leased);
        assert_eq!(
            standing(&e, Some(theirs.clone()), "b"),
            Standing::Elsewhere(theirs)
        );
        // Another container of this node: this entry is the stale one.
        assert_eq!(
            standing(&e, Some(lease("c-x", "b", "u2", LeaseState::Leased)), "b"),
            Standing::Fine
        );
        // The same pod's newer sandbox (even if its record says another node).
        assert_eq!(
            standing(&e, Some(lease("c-y", "a", "u1", LeaseState::Leased)), "b"),
            Standing::Fine
        );
    }

    #[test]
    fn the_message_names_both_pods_and_nodes() {
        let ours = lease("c-b", "b", "u1", LeaseState::Leased);
        let mut theirs = lease("c-a", "a", "u2", LeaseState::Leased);
        theirs.pod = PodRef::new("ml", "q", "u2");
        let m = elsewhere_message(&ours, &theirs, "b");
        for part in [
            "10.9.0.7",
            "network mgmt",
            "ml/q",
            "on node a",
            "node b could not reach",
        ] {
            assert!(m.contains(part), "{part}: {m}");
        }
    }
}
