//! Per-interface sysctls, written from a thread inside the netns they belong to.
//! (/proc/sys/net resolves against the netns of the thread that opens it.)

use std::path::PathBuf;

/// Write `value` to `/proc/sys/net/<family>/conf/<ifname>/<key>` in the caller's netns.
pub fn set_interface(family: &str, ifname: &str, key: &str, value: &str) -> std::io::Result<()> {
    let p = PathBuf::from(format!("/proc/sys/net/{family}/conf/{ifname}/{key}"));
    std::fs::write(&p, value)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))
}

/// Read it back (tests and CHECK use this).
pub fn get_interface(family: &str, ifname: &str, key: &str) -> std::io::Result<String> {
    std::fs::read_to_string(format!("/proc/sys/net/{family}/conf/{ifname}/{key}"))
        .map(|s| s.trim().to_string())
}

/// Write `value` to `/proc/sys/net/<family>/neigh/<ifname>/<key>` (neighbour discovery parameters
/// of one interface) in the caller's netns.
pub fn set_neigh(family: &str, ifname: &str, key: &str, value: &str) -> std::io::Result<()> {
    let p = PathBuf::from(format!("/proc/sys/net/{family}/neigh/{ifname}/{key}"));
    std::fs::write(&p, value)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))
}

/// Read it back.
pub fn get_neigh(family: &str, ifname: &str, key: &str) -> std::io::Result<String> {
    std::fs::read_to_string(format!("/proc/sys/net/{family}/neigh/{ifname}/{key}"))
        .map(|s| s.trim().to_string())
}
