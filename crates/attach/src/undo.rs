//! What a partial ADD has made, and taking it back. The ADD says at its end whether it succeeded
//! ([`Undo::finish`]); nothing is done behind its back on drop.

use tether_cni::delegate::{Exit, Running};
use tether_cni::{Command, Request};

use crate::kernel::LinkOps;

/// What an ADD has made so far: the link, the IPAM ADD under way or done.
pub(crate) struct Undo<'a> {
    pub(crate) req: &'a Request,
    pub(crate) pod: &'a dyn LinkOps,
    pub(crate) link: Option<u32>,
    pub(crate) ipam: Option<String>,
    /// The IPAM ADD, when it runs while the link is made: waited for before its DEL.
    pub(crate) running: Option<Running>,
    /// The IPAM ADD whose Result is in, until it has exited: its DEL must not overlap it.
    pub(crate) exit: Option<Exit>,
}

impl<'a> Undo<'a> {
    /// Nothing made yet.
    pub(crate) fn new(req: &'a Request, pod: &'a dyn LinkOps) -> Self {
        Undo {
            req,
            pod,
            link: None,
            ipam: None,
            running: None,
            exit: None,
        }
    }

    /// The end of the ADD: an IPAM ADD still running is waited for; after a failure the link is
    /// removed, then the lease released. Errors here are logged, not returned: the ADD's own
    /// error is what the runtime must see.
    pub(crate) fn finish(mut self, failed: bool) {
        if let Some(r) = self.running.take() {
            let _ = r.wait();
        }
        if let Some(e) = self.exit.take() {
            let _ = e.check();
        }
        if !failed {
            return;
        }
        if let Some(index) = self.link
            && let Err(e) = self.pod.delete_link(index)
        {
            log::error!("rollback: removing the half-made link #{index}: {e}");
        }
        if let Some(plugin) = &self.ipam
            && let Err(e) = self.req.delegation().exec(plugin, Command::Del)
        {
            log::error!("rollback: releasing the lease through {plugin}: {e}");
        }
    }
}
