//! The service's connections: an accept loop handing each to an idle worker (or a new one), a
//! root-only peer check, the hello that decides whether this plugin's store is the one served,
//! then the plugin's requests, each answered in turn.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Shared;
use crate::protocol::{MAX_REQUEST, PROTOCOL, Reply, Request, peer_uid, read_frame, write_frame};

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
                    self.open.fetch_add(1, Ordering::SeqCst);
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
        let me = // SAFETY: geteuid has no preconditions and cannot fail.
            unsafe { libc::geteuid() };
        match peer_uid(&s) {
            Ok(uid) if uid == 0 || uid == me => {}
            other => {
                log::warn!("lease service: refusing a peer of uid {other:?} (root only)");
                return;
            }
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
            self.gauges.stats().requests.fetch_add(1, Ordering::Relaxed);
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
        if self.open.load(Ordering::SeqCst) > self.max_connections {
            return refused(format!("{} connections open", self.max_connections));
        }
        let mine = &self.identity;
        let same_kubeconfig = match (&store.kubeconfig, &mine.kubeconfig) {
            (Some(a), Some(b)) => same_path(a, b),
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
        Reply::Welcome {
            node: self.node.clone(),
        }
    }
}

/// Wait until `l` can accept, at most `d`.
fn poll_readable(l: &UnixListener, d: Duration) {
    let mut fds = libc::pollfd {
        fd: l.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the listener's open fd.
    unsafe { libc::poll(&mut fds, 1, d.as_millis() as libc::c_int) };
}

/// The same file, however it is written (`/var/run/…` for `/run/…`).
fn same_path(a: &Path, b: &Path) -> bool {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    canon(a) == canon(b)
}
