//! The reconciler's loop: the pod watch keeps the cache and wakes the loop; passes on events,
//! when a young lease leaves its grace period, and every interval; the controller's election.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tether_cluster::{Cluster, ListWatch, PodEvent, Resume};
use tether_leases::reclaim::PodIndex;

use super::silence_check_every;
use super::{PodCache, Reconciler, Trigger};
use crate::leader;
use crate::options::long_lived;
use crate::report::{PassReport, log_report, now_s};

impl Reconciler {
    /// Run until `stop` is set: the pod watch on its own thread, a pass after each pod deletion
    /// (debounced), when a young lease leaves its grace period, and a full pass every interval;
    /// the controller's election on another. `on_pass` sees each report (after logging).
    pub fn run(
        &self,
        stop: &AtomicBool,
        mut on_pass: impl FnMut(&PassReport),
    ) -> Result<(), String> {
        let (tx, rx) = mpsc::channel();
        let stop_watch = Arc::new(AtomicBool::new(false));
        let watcher = match &self.opts.kube {
            Some(settings) => {
                let cluster = Cluster::connect(&long_lived(settings)).map_err(|e| e.to_string())?;
                let cache = self.cache.clone();
                // An agent watches its node's pods. The controller watches the node-agent pods'
                // namespace: a node whose agent pod goes (the node was deleted, or drained) is
                // judged at once, not at the next periodic pass; after a relist (the API server
                // back from an outage) too.
                let sel = if self.opts.controller {
                    format!("metadata.namespace={}", self.opts.agent_namespace)
                } else {
                    self.pod_selector()
                };
                let stop_w = stop_watch.clone();
                let timeout = self.opts.watch_timeout;
                Some(
                    std::thread::Builder::new()
                        .name("pod-watch".into())
                        .spawn(move || watch_loop(&cluster, &sel, timeout, &cache, &tx, &stop_w))
                        .map_err(|e| format!("cannot start the pod watch: {e}"))?,
                )
            }
            None => None,
        };
        let mut helpers = Vec::new();
        // The controller passes only while it holds the election Lease (see leader.rs).
        let leading = Arc::new(AtomicBool::new(false));
        if let (true, Some(settings)) = (self.opts.controller, &self.opts.kube) {
            let cluster = Cluster::connect(&long_lived(settings)).map_err(|e| e.to_string())?;
            let (ns, id) = (self.opts.agent_namespace.clone(), self.opts.node.clone());
            let (lead, stop_e) = (leading.clone(), stop_watch.clone());
            helpers.push(
                std::thread::Builder::new()
                    .name("election".into())
                    .spawn(move || leader::campaign(&cluster, &ns, &id, &lead, &stop_e))
                    .map_err(|e| format!("cannot start the election: {e}"))?,
            );
        }
        let result = self.pass_loop(
            stop,
            &rx,
            self.opts.controller.then_some(leading.as_ref()),
            &mut on_pass,
        );
        stop_watch.store(true, Ordering::Relaxed);
        for h in watcher.into_iter().chain(helpers) {
            let _ = h.join();
        }
        result
    }

    fn pass_loop(
        &self,
        stop: &AtomicBool,
        rx: &Receiver<Trigger>,
        leading: Option<&AtomicBool>,
        on_pass: &mut dyn FnMut(&PassReport),
    ) -> Result<(), String> {
        let mut next_full = Instant::now();
        let mut next_due: Option<u64> = None;
        let mut led = false;
        // The controller reads the kubelets' heartbeats on a cadence of its own (cheap), apart
        // from the sweeps (which list every lease's node label).
        let silence_every = (self.opts.controller && self.opts.node_lost_grace_s > 0)
            .then(|| silence_check_every(self.opts.node_lost_grace_s));
        let mut next_silence = Instant::now() + silence_every.unwrap_or_default();
        while !stop.load(Ordering::Relaxed) {
            // A replica that does not lead only waits; one that just took over passes at once.
            if let Some(l) = leading {
                let now_leading = l.load(Ordering::Relaxed);
                if now_leading && !led {
                    next_full = Instant::now();
                }
                led = now_leading;
                self.metrics.set_pool_reporter(led);
                if !led {
                    self.metrics.beat(now_s());
                    while rx.try_recv().is_ok() {}
                    std::thread::sleep(Duration::from_millis(250));
                    continue;
                }
            }
            self.metrics.beat(now_s());
            let now = Instant::now();
            let due_in = next_due.map(|d| Duration::from_secs(d.saturating_sub(now_s())));
            let mut wait = next_full.saturating_duration_since(now);
            if let Some(d) = due_in {
                wait = wait.min(d);
            }
            if let Some(every) = silence_every {
                if now >= next_silence {
                    next_silence = now + every;
                    let report = self.silence_pass();
                    log_report(&report, false);
                    if let Some(d) = report.next_due {
                        next_due = Some(next_due.map_or(d, |n| n.min(d)));
                    }
                    self.metrics.record_pass(&report, false, now_s());
                    on_pass(&report);
                    continue;
                }
                wait = wait.min(next_silence - now);
            }
            // Wake up regularly to notice `stop`.
            let wait = wait.min(Duration::from_millis(250));
            let full = match rx.recv_timeout(wait) {
                Ok(_) => {
                    // Gather the burst (a deleted ReplicaSet, a drained node) into one pass.
                    let until = Instant::now() + self.opts.debounce;
                    while let Some(left) = until.checked_duration_since(Instant::now()) {
                        if rx.recv_timeout(left).is_err() {
                            break;
                        }
                    }
                    false
                }
                Err(RecvTimeoutError::Timeout) => {
                    if Instant::now() >= next_full {
                        true
                    } else if next_due.is_some_and(|d| now_s() >= d) {
                        false
                    } else {
                        continue;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // No watch (file store only, or it ended): periodic passes only.
                    std::thread::sleep(wait);
                    if Instant::now() < next_full && next_due.is_none_or(|d| now_s() < d) {
                        continue;
                    }
                    Instant::now() >= next_full
                }
            };
            if full {
                next_full = Instant::now() + self.opts.interval;
            }
            let report = self.pass(full);
            log_report(&report, full);
            next_due = report.next_due;
            self.metrics.record_pass(&report, full, now_s());
            on_pass(&report);
        }
        Ok(())
    }
}

/// Keep `cache` = the pods of this node: list, then watch from the list's resourceVersion;
/// re-list on expiry (410) or error (with backoff; the cache is stale meanwhile, so a pass lists
/// for itself). Wakes the pass loop on pod deletions and after each re-list.
fn watch_loop(
    cluster: &Cluster,
    sel: &str,
    timeout: Duration,
    cache: &Mutex<PodCache>,
    tx: &Sender<Trigger>,
    stop: &AtomicBool,
) {
    let keep_going = || !stop.load(Ordering::Relaxed);
    let lock = || cache.lock().unwrap_or_else(|p| p.into_inner());
    let list = || {
        let mut fresh: PodIndex = HashMap::new();
        cluster.restart_budget();
        let rv = cluster
            .visit_pods(Some(sel), |k| {
                fresh.insert((k.namespace, k.name), k.uid);
            })
            .map_err(|e| e.to_string())?;
        {
            let mut c = lock();
            c.pods = fresh;
            c.pods.shrink_to_fit();
            c.synced = true;
        }
        let _ = tx.send(Trigger::Relisted);
        Ok(Some(rv))
    };
    let watch = |rv: &str| {
        let ended = cluster.watch_pods(Some(sel), rv, timeout, &keep_going, |ev| {
            let mut c = lock();
            match ev {
                PodEvent::Upsert(k) => {
                    let replaced = c
                        .pods
                        .get(&(k.namespace.clone(), k.name.clone()))
                        .is_some_and(|u| *u != k.uid);
                    c.pods.insert((k.namespace, k.name), k.uid);
                    if replaced {
                        let _ = tx.send(Trigger::PodGone);
                    }
                }
                PodEvent::Deleted(k) => {
                    let key = (k.namespace, k.name);
                    if c.pods.get(&key).is_some_and(|u| *u == k.uid) {
                        c.pods.remove(&key);
                    }
                    let _ = tx.send(Trigger::PodGone);
                }
            }
        });
        ended.map(Resume::from).map_err(|e| e.to_string())
    };
    // An agent is back within 30 s of the server.
    ListWatch {
        what: &format!("reconcile: pods ({sel})"),
        first_wait: Duration::from_millis(500),
        max_wait: Duration::from_secs(30),
        level: log::Level::Error,
    }
    .run(&keep_going, list, watch, || lock().synced = false);
}
