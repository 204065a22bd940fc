//! CPU time, to say what one operation costs the machine, not only how long it took: this
//! process's reaped children (the plugins a benchmark execs) and any process by pid (an API
//! server, etcd, a node-agent). User + system time; the pids' at the kernel's clock tick (10 ms),
//! so read them around batches of hundreds of calls.

use std::time::Duration;

/// CPU time of every child this process has waited for so far (getrusage RUSAGE_CHILDREN).
pub fn reaped_children() -> Duration {
    // SAFETY: `ru` is valid for writes; RUSAGE_CHILDREN is a valid `who`.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time of process `pid` (all its threads) so far; `None` when it is gone.
pub fn of_process(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at its closing parenthesis.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (utime, stime): (u64, u64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_nanos((utime + stime) * 1_000_000_000 / hz))
}

/// The pid in a pid file (k8s-up.sh writes them).
pub fn pid_in(file: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_child_and_this_process_are_counted() {
        let before = reaped_children();
        let ok = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        assert!(
            reaped_children() > before,
            "the child's CPU is counted once reaped"
        );
        let me = of_process(std::process::id()).unwrap();
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(60) {}
        assert!(of_process(std::process::id()).unwrap() > me);
        assert_eq!(of_process(u32::MAX), None);
    }
}
