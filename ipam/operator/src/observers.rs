//! What runs beside a reconciler: the Prometheus endpoint over its metrics registry, the
//! monitor (conflict Events, pool and record gauges) and an agent's conflict guard (the wire),
//! each on a thread of its own. The node-agent
//! and `tether reconcile`/`tether controller` start them next to [`Reconciler::run`], so the
//! reconciler knows neither.
//!
//! [`Reconciler::run`]: crate::reconcile::Reconciler::run

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crate::conflict_guard::ConflictGuard;
use crate::metrics::{self, Registry};
use crate::monitor::Monitor;
use crate::options::Options;

/// The running observers; [`Observers::stop`] ends them.
pub struct Observers {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    metrics_addr: Option<SocketAddr>,
}

impl Observers {
    /// Start the metrics endpoint (with `opts.metrics_addr`), the monitor (an agent's with
    /// conflict Events or metrics; the controller's always, as it posts the Events of overlapping
    /// NADs) and an agent's conflict guard (`opts.conflict_guard`). None failing to start stops
    /// the caller: it is logged.
    pub fn start(opts: &Options, registry: &Arc<Registry>) -> Observers {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let mut metrics_addr = None;
        if let Some(addr) = opts.metrics_addr {
            match metrics::start(addr, registry.clone(), opts.installed.clone(), stop.clone()) {
                Ok((bound, h)) => {
                    metrics_addr = Some(bound);
                    log::warn!("serving metrics on http://{bound}/metrics");
                    threads.push(h);
                }
                Err(e) => log::error!("cannot serve metrics on {addr}: {e}; going on without"),
            }
        }
        if opts.controller || opts.conflict_events || opts.metrics_addr.is_some() {
            let (opts, registry, stop) = (opts.clone(), registry.clone(), stop.clone());
            let spawned = std::thread::Builder::new()
                .name("monitor".into())
                .spawn(move || match Monitor::new(&opts, registry) {
                    Ok(mut m) => m.run(opts.monitor_interval, &stop),
                    Err(e) => log::error!("monitor: {e}; no conflict Events or pool metrics"),
                });
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => log::error!("cannot start the monitor: {e}"),
            }
        }
        if opts.conflict_guard && !opts.controller {
            let (opts, registry, stop) = (opts.clone(), registry.clone(), stop.clone());
            let spawned = std::thread::Builder::new()
                .name("conflict guard".into())
                .spawn(move || match ConflictGuard::new(&opts, registry) {
                    Ok(g) => g.run(&stop),
                    Err(e) => log::error!("conflict guard: {e}; the wire is not watched"),
                });
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => log::error!("cannot start the conflict guard: {e}"),
            }
        }
        Observers {
            stop,
            threads,
            metrics_addr,
        }
    }

    /// Where the metrics are served (the bound address: a `:0` port resolved).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Stop both and wait for them.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.threads {
            let _ = h.join();
        }
    }
}
