//! One guard thread per host interface: [`tether_wire::guard::run`] on that interface, its watch
//! set sent in by the supervisor, its claims and trouble sent out. Dropping the [`Watcher`]
//! closes its channel, and the thread ends at its next tick.

use std::net::IpAddr;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::Duration;

use tether_wire::frame::Mac;
use tether_wire::guard::{self, Guard, Report};

/// How often the thread takes a new watch set and reads the kernel's drop count.
const TICK: Duration = Duration::from_millis(250);
/// A claimant is reported again after this long while it goes on.
pub const REPORT_EVERY: Duration = Duration::from_secs(60);

/// What an interface's thread tells the supervisor.
#[derive(Debug)]
pub enum Heard {
    Claim {
        interface: String,
        report: Report,
    },
    /// Frames the kernel dropped since the last tick.
    Dropped {
        interface: String,
        frames: u64,
    },
    /// The thread ended on an error (it is started again at the next round).
    Failed {
        interface: String,
        error: String,
    },
}

/// A running guard thread.
pub struct Watcher {
    pub ifindex: u32,
    pub mac: Mac,
    /// The last watch set sent.
    pub watching: Vec<(IpAddr, bool)>,
    to_thread: Sender<Vec<(IpAddr, bool)>>,
    thread: JoinHandle<()>,
}

impl Watcher {
    /// Start guarding `interface` (index `ifindex`, MAC `mac`, the one the pods' addresses
    /// answer with on it) for `watch`.
    pub fn spawn(
        interface: &str,
        ifindex: u32,
        mac: Mac,
        watch: Vec<(IpAddr, bool)>,
        heard: Sender<Heard>,
    ) -> std::io::Result<Watcher> {
        let (to_thread, from_supervisor) = std::sync::mpsc::channel();
        let name = interface.to_string();
        let first = watch.clone();
        let thread = std::thread::Builder::new()
            .name(format!("guard {interface}"))
            .spawn(move || guard_thread(name, ifindex, mac, first, from_supervisor, heard))?;
        Ok(Watcher {
            ifindex,
            mac,
            watching: watch,
            to_thread,
            thread,
        })
    }

    /// Watch `watch` from the next tick on (nothing is sent when it is what is watched).
    pub fn watch(&mut self, watch: Vec<(IpAddr, bool)>) {
        if watch != self.watching {
            let _ = self.to_thread.send(watch.clone());
            self.watching = watch;
        }
    }

    /// Has the thread ended?
    pub fn ended(&self) -> bool {
        self.thread.is_finished()
    }

    /// Stop the thread and wait for it (at most one tick).
    pub fn stop(self) {
        drop(self.to_thread);
        let _ = self.thread.join();
    }
}

fn guard_thread(
    interface: String,
    ifindex: u32,
    mac: Mac,
    first: Vec<(IpAddr, bool)>,
    from_supervisor: Receiver<Vec<(IpAddr, bool)>>,
    heard: Sender<Heard>,
) {
    let mut g = Guard::new(mac, REPORT_EVERY);
    g.set_watch(first);
    let tick = |g: &mut Guard, seen: guard::Seen| {
        if seen.dropped > 0 {
            let _ = heard.send(Heard::Dropped {
                interface: interface.clone(),
                frames: seen.dropped,
            });
        }
        let mut latest = None;
        loop {
            match from_supervisor.try_recv() {
                Ok(w) => latest = Some(w),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
        if let Some(w) = latest {
            g.set_watch(w);
        }
        true
    };
    let report = |report: Report| {
        let _ = heard.send(Heard::Claim {
            interface: interface.clone(),
            report,
        });
    };
    if let Err(e) = guard::run(ifindex, &mut g, TICK, tick, report) {
        let _ = heard.send(Heard::Failed {
            interface: interface.clone(),
            error: e.to_string(),
        });
    }
}
