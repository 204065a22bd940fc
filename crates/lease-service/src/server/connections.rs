//! The service's connections: an accept loop handing each to an idle worker (or a new one), a
//! root-only peer check, the hello that decides whether this plugin's store is the one served,
//! then the plugin's requests, each answered in turn.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Shared;
use tether_lease_client::protocol::{
    MAX_REQUEST, PROTOCOL, Reply, Request, check_peer, read_frame, write_frame,
};

/// How long a connection may sit between two requests (a CNI call sends them back to back).
const IDLE: Duration = Duration::from_secs(30);

/// How long a worker waits for another connection before it ends.
const IDLE_WORKER: Duration = Duration::from_secs(60);

/// Count one out of `n` unless it is zero.
fn take_one(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

impl Shared {
    pub(super) fn accept_loop(self: Arc<Shared>, listener: UnixListener) {
        // Connections go to idle workers when there are some (a thread per CNI call would cost
        // the node a thread's creation and teardown, stack mappings included, every call).
        let (tx, rx) = std::sync::mpsc::channel::<UnixStream>();
        let rx = Arc::new(Mutex::new(rx));
        while !self.stopping.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, _)) => {
                    // Over the limit: closed before any thread takes it (its plugin goes on
                    // directly).
                    if self.open.fetch_add(1, Ordering::SeqCst) >= self.max_connections {
                        self.open.fetch_sub(1, Ordering::SeqCst);
                        self.gauges.stats().refused.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if take_one(&self.idle) {
                        // An idle worker was counted: one of them takes it.
                        let _ = tx.send(stream);
                        continue;
                    }
                    let (sh, rx) = (self.clone(), rx.clone());
                    let spawned = std::thread::Builder::new()
                        .name("lease-conn".into())
                        .spawn(move || sh.work(stream, &rx));
                    if spawned.is_ok() {
                        self.gauges.stats().workers.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Err(e) = spawned {
                        self.open.fetch_sub(1, Ordering::SeqCst);
                        log::warn!("lease service: cannot serve a connection: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    poll_readable(&listener, Duration::from_millis(200));
                }
                Err(e) => {
                    log::warn!("lease service: accept: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }

    /// A worker: serve `first`, then each connection handed over while it is idle; end after
    /// [`IDLE_WORKER`] without one, or when the accept loop has ended.
    fn work(self: &Arc<Self>, first: UnixStream, rx: &Mutex<Receiver<UnixStream>>) {
        let mut stream = first;
        loop {
            self.serve(stream);
            self.open.fetch_sub(1, Ordering::SeqCst);
            self.idle.fetch_add(1, Ordering::SeqCst);
            stream = loop {
                let next = rx
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .recv_timeout(IDLE_WORKER);
                match next {
                    Ok(s) => break s,
                    // Counted out by the accept loop meanwhile: a connection is on its way.
                    Err(RecvTimeoutError::Timeout) if !take_one(&self.idle) => {}
                    Err(_) => return,
                }
            };
        }
    }

    /// One plugin's connection: a hello, then its requests, each answered in turn.
    fn serve(self: &Arc<Self>, mut s: UnixStream) {
        let _ = s.set_nonblocking(false);
        if let Err(why) = check_peer(&s) {
            log::warn!("lease service: refusing a connection: {why}");
            return;
        }
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        let Ok(Some(hello)) = read_frame::<Request>(&mut s, MAX_REQUEST) else {
            return;
        };
        let welcome = self.welcome(&hello);
        let welcomed = matches!(welcome, Reply::Welcome { .. });
        let counter = if welcomed {
            &self.gauges.stats().welcomed
        } else {
            &self.gauges.stats().refused
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if write_frame(&mut s, &welcome).is_err() || !welcomed {
            return;
        }
        let _ = s.set_read_timeout(Some(IDLE));
        while let Ok(Some(req)) = read_frame::<Request>(&mut s, MAX_REQUEST) {
            let reply = if self.stopping.load(Ordering::SeqCst) {
                Reply::Refused {
                    reason: "the node-agent is stopping".into(),
                }
            } else {
                self.answer(req)
            };
            if !matches!(reply, Reply::Refused { .. }) {
                self.gauges.stats().requests.fetch_add(1, Ordering::Relaxed);
            }
            if write_frame(&mut s, &reply).is_err() {
                return;
            }
        }
    }

    fn welcome(&self, hello: &Request) -> Reply {
        let refused = |reason: String| Reply::Refused { reason };
        let Request::Hello { protocol, store } = hello else {
            return refused("a connection starts with a hello".into());
        };
        if self.stopping.load(Ordering::SeqCst) {
            return refused("the node-agent is stopping".into());
        }
        if *protocol != PROTOCOL {
            return refused(format!("protocol {protocol}, this agent speaks {PROTOCOL}"));
        }
        let mine = &self.identity;
        // The same file, however it is written (`/var/run/…` for `/run/…`); ours is canonical.
        let same_kubeconfig = match (&store.kubeconfig, &mine.kubeconfig) {
            (Some(a), Some(b)) => std::fs::canonicalize(a).is_ok_and(|a| a == *b),
            _ => false,
        };
        if !same_kubeconfig
            || store.api_root != mine.api_root
            || store.list_from_cache != mine.list_from_cache
            || store.page_size != mine.page_size
            || store.group != mine.group
        {
            return refused(format!(
                "this agent serves the store of {:?}, not {:?}",
                mine.kubeconfig, store.kubeconfig
            ));
        }
        // A credential bound to a node names it on both paths; without one, the plugin's
        // direct path names its own idea of the node, which must be this one.
        if !self.bound && store.node.as_deref() != Some(self.node.as_str()) {
            return refused(format!(
                "this agent writes leases as node {:?}, the plugin as {:?} (NODE_NAME or hostname)",
                self.node, store.node
            ));
        }
        Reply::Welcome {
            node: self.node.clone(),
        }
    }
}

/// Wait until `l` can accept, at most `d`.
fn poll_readable(l: &UnixListener, d: Duration) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(l.as_fd(), PollFlags::POLLIN)];
    let _ = poll(
        &mut fds,
        PollTimeout::try_from(d).unwrap_or(PollTimeout::MAX),
    );
}
