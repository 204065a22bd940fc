//! GC: release the leases of attachments the runtime no longer knows, forget them in the node
//! journal, and prune old records; keep going past errors and report them all.

use std::collections::HashSet;

use super::{AllocError, Allocator};
use crate::model::{Attachment, Lease};
use crate::store::JournalEntry;

/// Result of GC.
#[derive(Debug, Default)]
pub struct GcReport {
    /// Leases released because their attachment is not valid any more.
    pub released: Vec<Lease>,
    /// Old released/quarantine records deleted.
    pub pruned: usize,
    /// What failed (GC kept going).
    pub errors: Vec<AllocError>,
}

impl GcReport {
    /// `Err(AllocError::Gc)` listing every failure, if there was any.
    pub fn into_result(self, network: &str) -> Result<GcReport, AllocError> {
        if self.errors.is_empty() {
            Ok(self)
        } else {
            Err(AllocError::Gc {
                network: network.to_string(),
                failures: self.errors.iter().map(|e| e.to_string()).collect(),
            })
        }
    }
}

impl Allocator<'_> {
    /// GC: release every Leased record this node may judge ([`LeaseStore::list_mine`]: all of a
    /// node-local store, only this node's in a cluster-wide one) whose attachment is not in
    /// `valid`, forget such attachments in the node journal, and delete this node's
    /// released/quarantine records past their retention. Keeps going after errors; they are in
    /// the report (`GcReport::into_result` turns them into one error). `Err` only when the store
    /// cannot even be listed.
    ///
    /// [`LeaseStore::list_mine`]: crate::LeaseStore::list_mine
    pub fn gc(&self, valid: &[Attachment]) -> Result<GcReport, AllocError> {
        let now = self.clock.now();
        // Work left from an outage first: a re-keyed sandbox's records still name the old one.
        self.settle_pending()?;
        let mut report = GcReport::default();
        let entries = match self.store.index().map(|ix| ix.entries(&self.scope.network)) {
            Some(Ok(e)) => e,
            Some(Err(e)) => {
                report.errors.push(e.into());
                Vec::new()
            }
            None => Vec::new(),
        };
        let mut keep: HashSet<(&str, &str)> = valid
            .iter()
            .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
            .collect();
        // A valid sandbox re-created while the store was away whose re-key could not be done
        // yet (settle_pending logged why): its records under the old container stay too.
        for e in &entries {
            if let Some(from) = e.pending.as_ref().and_then(|p| p.rekey_from.as_deref())
                && keep.contains(&(e.container_id.as_str(), e.ifname.as_str()))
            {
                keep.insert((from, e.ifname.as_str()));
            }
        }
        let all = self.store.list_mine(&self.scope)?;
        for l in all.iter().filter(|l| l.is_leased()) {
            if keep.contains(&(l.container_id.as_str(), l.ifname.as_str())) {
                continue;
            }
            let (cid, ifn) = (l.container_id.clone(), l.ifname.clone());
            match self.release_if_ours(l, now, |c| c.is_leased() && c.is_attachment(&cid, &ifn)) {
                Ok(Some(r)) => {
                    log::info!(
                        "network {}: GC released {} of container {} interface {}",
                        self.scope.network,
                        r.address,
                        cid,
                        ifn
                    );
                    report.released.push(r);
                }
                Ok(None) => {}
                Err(e) => report.errors.push(e),
            }
        }
        if let Some(ix) = self.store.index() {
            for e in entries
                .iter()
                .filter(|e| !keep.contains(&(e.container_id.as_str(), e.ifname.as_str())))
            {
                let gone = JournalEntry {
                    leases: Vec::new(),
                    ..e.clone()
                };
                if let Err(err) = ix.record(&self.scope.network, &gone) {
                    report.errors.push(err.into());
                }
            }
        }
        report.pruned = self.prune(&all, now, usize::MAX, &mut report.errors);
        Ok(report)
    }
}
