//! The leading controller's guard over the cluster's NADs: each round the overlap findings
//! ([`crate::overlap`]) become the gauge `tether_nad_overlaps{kind}` and a Warning Event on each
//! NAD of each finding (reason `AddressDomainsOverlap` or `InconsistentSubnet`, the message naming
//! both NADs and what to change).
//!
//! An Event is named `<nad>.<hash of the finding and the NAD's uid>`: a restarted replica, or the
//! one that takes over, meets 409 for an Event posted before and does not post it again. The API
//! server drops Events after an hour while the finding may stay, so the monitor posts each again
//! every [`EVENT_RECHECK_S`]: a 409 while the old one is there, a new one (the same name) once it
//! is gone.

use std::collections::HashSet;

use tether_cluster::{NadConfig, NadWarning};

use super::Monitor;
use crate::nads::nad_networks;
use crate::overlap::findings;

/// How often an Event of a standing finding is posted again (mostly a 409).
pub const EVENT_RECHECK_S: u64 = 600;
/// `source.component` of the controller's Events.
pub const CONTROLLER_COMPONENT: &str = "tether-controller";

impl Monitor {
    /// Count the findings among `nads` and post their Events.
    pub(super) fn report_overlaps(
        &mut self,
        nads: &[NadConfig],
        now: u64,
        errors: &mut Vec<String>,
    ) {
        let found = findings(&nad_networks(nads));
        self.registry.set_nad_overlaps(Some(&found));
        let identities: HashSet<String> = found.iter().map(|f| f.identity()).collect();
        for f in found
            .iter()
            .filter(|f| !self.overlaps.contains(&f.identity()))
        {
            log::warn!("controller: {}", f.message());
        }
        self.overlaps = identities;
        let Some(kube) = &self.kube else {
            return;
        };
        let mut present = HashSet::new();
        for f in &found {
            for nad in f.nads() {
                let Some(n) = nads
                    .iter()
                    .find(|n| nad.split_once('/') == Some((&n.namespace, &n.name)))
                else {
                    continue;
                };
                let key = format!(
                    "{:016x}",
                    tether_stable_hash::fnv1a64(
                        format!("{}|{}", f.identity(), n.uid).as_bytes(),
                        0
                    )
                );
                let id = format!("{nad}/{key}");
                present.insert(id.clone());
                if self
                    .nad_events
                    .get(&id)
                    .is_some_and(|t| now.saturating_sub(*t) < EVENT_RECHECK_S)
                {
                    continue;
                }
                let w = NadWarning {
                    namespace: n.namespace.clone(),
                    nad: n.name.clone(),
                    uid: Some(n.uid.clone()).filter(|u| !u.is_empty()),
                    key,
                    reason: f.kind.reason().into(),
                    message: f.message(),
                    component: CONTROLLER_COMPONENT.into(),
                    instance: self.node.clone(),
                    at: now,
                };
                kube.restart_budget();
                match kube.cluster.post_nad_event(&w) {
                    Ok(_) => {}
                    Err(e) if e.is_transient() => {
                        errors.push(format!(
                            "posting the {} Event on NAD {nad}: {e}; retrying",
                            w.reason
                        ));
                        continue;
                    }
                    Err(e) => {
                        let msg = format!("cannot post the {} Event on NAD {nad}: {e}", w.reason);
                        // Usually RBAC (events: create), the same for every Event: say it once.
                        if self.warned.insert("nad-event".into()) {
                            log::error!("monitor: {msg}");
                        } else {
                            log::debug!("monitor: {msg}");
                        }
                    }
                }
                self.nad_events.insert(id, now);
            }
        }
        self.nad_events.retain(|id, _| present.contains(id));
    }
}
