//! Knowing whether we run in the real-kernel lab (conformance/lab/).

use crate::netns::NetNs;

/// True when `TETHER_LAB=1` (set by conformance/lab/run.sh / run-tests.sh).
pub fn in_lab() -> bool {
    std::env::var("TETHER_LAB").is_ok_and(|v| v == "1")
}

/// Tries to create an ipvlan link on the running kernel (in a throwaway netns,
/// veth end as master; `modprobe ipvlan` attempted first). `Err` says why not.
pub fn ipvlan_available() -> Result<(), String> {
    let _ = crate::cmd::run("modprobe", &["-q", "ipvlan"]);
    let ns = NetNs::new("probe");
    let veth = ns.ip(&["link", "add", "pv0", "type", "veth", "peer", "name", "pv1"]);
    if !veth.success() {
        return Err(format!("cannot create a veth pair: {veth}"));
    }
    let out = ns.ip(&[
        "link", "add", "link", "pv0", "name", "pvl0", "type", "ipvlan", "mode", "l2",
    ]);
    if out.success() {
        Ok(())
    } else {
        Err(out.stderr.trim().to_string())
    }
}

/// Panics (failing the test, never skipping it) unless ipvlan links can be
/// created here. The message says how to run lab tests.
#[track_caller]
pub fn require_ipvlan() {
    if let Err(why) = ipvlan_available() {
        panic!(
            "this test needs a kernel with ipvlan, and the running kernel ({}) cannot create one: {why}\n\
             TETHER_LAB={}; run it in the lab VM: conformance/lab/run-tests.sh <test target>",
            kernel_release(),
            std::env::var("TETHER_LAB").unwrap_or_default()
        );
    }
}

/// `uname -r` of the running kernel.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}
