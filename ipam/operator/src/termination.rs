//! SIGTERM and SIGINT for the long-running commands (node-agent, controller, reconcile).
//!
//! In its container the program is PID 1, and the kernel delivers no signal to PID 1 that has no
//! handler: without this, the kubelet waited out the whole grace period (30 s) and then killed it,
//! so a deleted or rolled agent pod came back 30 s late, and a controller never gave its election
//! Lease up (the other replica waited for it to expire).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long the program may take to stop after the signal before it exits anyway (below the
/// kubelet's default grace period, 30 s).
const STOP_WITHIN: Duration = Duration::from_secs(20);

/// Block SIGTERM and SIGINT in the calling thread and every thread it starts afterwards (so call it
/// before starting any), and turn them into the returned flag: set when one arrives. If the program
/// has not returned [`STOP_WITHIN`] later, it exits with status 0.
pub fn stop_flag() -> Arc<AtomicBool> {
    // SAFETY: sigset manipulation on a local, then pthread_sigmask on the calling thread.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: waits on the set blocked above (inherited by this thread).
            unsafe { libc::sigwait(&set, &mut sig) };
            log::warn!("signal {sig}: stopping");
            flag.store(true, Ordering::Relaxed);
            std::thread::sleep(STOP_WITHIN);
            log::error!("not stopped {STOP_WITHIN:?} after signal {sig}: exiting");
            std::process::exit(0);
        });
    if let Err(e) = spawned {
        log::error!("cannot watch for SIGTERM: {e}; the kubelet will have to kill this process");
    }
    stop
}
