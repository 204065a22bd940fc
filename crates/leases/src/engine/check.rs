//! CHECK: does the attachment still hold a `Leased` record in every range?

use super::{AllocError, Allocator};
use crate::model::{Lease, PodRef};

impl Allocator<'_> {
    /// CHECK: `Ok(leases)` (one per range, in range order) iff the attachment holds a Leased
    /// record in every range. With a node journal: one read per lease the journal lists.
    pub fn check(&self, container_id: &str, ifname: &str) -> Result<Vec<Lease>, AllocError> {
        let all = match self.store.index() {
            Some(ix) => {
                self.settle_quietly();
                let mut cur = Vec::new();
                let entry = ix.lookup(
                    &self.scope.network,
                    container_id,
                    ifname,
                    &PodRef::default(),
                )?;
                for l in entry.mine.iter().flat_map(|e| &e.leases) {
                    cur.extend(self.store.get(&self.scope, l.address)?);
                }
                cur
            }
            None => self.store.list(&self.scope)?,
        };
        let mine: Vec<&Lease> = all
            .iter()
            .filter(|l| l.is_attachment(container_id, ifname))
            .collect();
        let leased: Vec<&Lease> = mine.iter().copied().filter(|l| l.is_leased()).collect();
        if leased.is_empty() {
            let detail = match mine.first() {
                Some(l) => format!(
                    "; its record of {} is {:?} since {}",
                    l.address, l.state, l.since
                ),
                None => String::new(),
            };
            return Err(AllocError::NoLease {
                network: self.scope.network.clone(),
                container_id: container_id.to_string(),
                ifname: ifname.to_string(),
                detail,
            });
        }
        let mut out = Vec::new();
        for (i, r) in self.ranges.iter().enumerate() {
            match leased.iter().find(|l| self.range_of(l) == Some(i)) {
                Some(l) => out.push((*l).clone()),
                None => {
                    return Err(AllocError::MissingRange {
                        network: self.scope.network.clone(),
                        container_id: container_id.to_string(),
                        ifname: ifname.to_string(),
                        range: r.to_string(),
                    });
                }
            }
        }
        Ok(out)
    }
}
