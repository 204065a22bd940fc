//! Undoing an ADD that failed part way: every record it wrote goes back to what it was, newest
//! first, each a conditional write so a record someone changed meanwhile is left to them.

use super::Allocator;
use super::call::Written;
use crate::model::Lease;
use crate::store::{StoreError, Taken};

impl Allocator<'_> {
    /// Restore what an ADD wrote, newest first. Returns the records that could not be
    /// restored (still held by the attachment: GC, DEL or the reconciler release them).
    pub(super) fn rollback(&self, written: Vec<Written>) -> Vec<Lease> {
        let mut stuck = Vec::new();
        for w in written.into_iter().rev() {
            let addr = w.now.address;
            let res: Result<Option<Taken>, StoreError> = match w.prev {
                Some(mut p) => {
                    p.version = None;
                    self.store.claim(p, Some(&w.now)).map(|r| r.err())
                }
                None => self.store.remove(&w.now).map(|r| r.err()),
            };
            match res {
                Ok(None) => log::debug!("network {}: rolled back {addr}", self.scope.network),
                Ok(Some(t)) => {
                    log::warn!(
                        "network {}: rollback of {addr} skipped: {t}",
                        self.scope.network
                    )
                }
                Err(e) => {
                    log::error!(
                        "network {}: rollback of {addr} failed: {e}; GC or DEL will release it",
                        self.scope.network
                    );
                    stuck.push(w.now);
                }
            }
        }
        stuck
    }
}
