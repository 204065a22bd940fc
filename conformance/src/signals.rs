//! Benchmarks start servers in sessions of their own, so a Ctrl-C of `make` would not reach them:
//! the termination signals are taken by one thread that stops them first.

/// Block SIGINT, SIGTERM and SIGHUP in every thread (call before starting any) and run `stop`
/// on a thread of its own when one arrives, then exit with 128 + the signal. Children get a
/// clean signal mask from std::process.
pub fn on_termination(stop: impl FnOnce(i32) + Send + 'static) {
    // SAFETY: plain sigset manipulation on a local, before other threads exist.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: waits on the set blocked above.
        unsafe { libc::sigwait(&set, &mut sig) };
        stop(sig);
        std::process::exit(128 + sig);
    });
}
