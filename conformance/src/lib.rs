//! Black-box harness for driving the tether binaries the way runtimes do.
//!
//! - [`cmd`]: run a command, capture stdout/stderr/status ([`cmd::CmdOutput`]).
//! - [`cpu`]: CPU time of reaped children and of processes by pid (what a call costs).
//! - [`paths`]: repo root, target dir, `target/libcni-driver`, reference
//!   plugins, unique names, [`paths::TempDir`].
//! - [`netns`]: named network namespaces with a Drop guard ([`netns::NetNs`]),
//!   veth pairs and `ip` helpers.
//! - [`libcni`]: drive a conflist through the real libcni ([`libcni::Libcni`]).
//! - [`lab`]: are we in the real-kernel lab; does the kernel have ipvlan.
//! - [`prometheus_text`]: label sets of `/metrics` lines.
//! - [`signals`]: benchmarks stop the servers they started when interrupted.
//!
//! Lab tests (needing ipvlan etc.) are `#[ignore]`d so a plain `cargo test`
//! on a kernel without ipvlan reports them as ignored; run them with
//! `conformance/lab/run-tests.sh <target>`, which boots the lab VM and passes
//! `--include-ignored`. They call [`lab::require_ipvlan`] and FAIL, never skip,
//! when the kernel cannot create ipvlan links.

pub mod cmd;
pub mod cpu;
pub mod lab;
pub mod libcni;
pub mod netns;
pub mod paths;
pub mod prometheus_text;
pub mod signals;

pub use cmd::{CmdOutput, capture, run, run_ok};
pub use libcni::{Libcni, multus_cni_args};
pub use netns::{NetNs, veth_pair};
pub use paths::{
    TempDir, libcni_driver, reference_plugin, reference_plugins_dir, repo_root, target_dir,
};

/// Polls `cond` every 50 ms until it holds or `timeout` passes; returns
/// whether it held. For kernel effects that are asynchronous, e.g. devices of
/// a deleted netns disappear only when the kernel's cleanup_net work runs.
pub fn eventually(timeout: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

// Direct plugin execution and a recording fake IPAM (see plugin.rs).
pub mod plugin;
pub use plugin::{FakeIpam, PluginExec, assert_cni_error, tether_bin_dir, tether_binary};

// A layer-2 segment (bridge master, rogue, extra hosts), packet capture, a slow ARP responder, and
// tether-ipam helpers for conflict-probing tests (see segment.rs).
pub mod segment;
pub use segment::{Capture, LeaseState, Segment, SlowRogue, first_candidates};

// A simulated cluster on a real API server: node-agents as processes, faults, measurements
// (ipam/operator/tests/agents_faults.rs, src/bin/bench-agents.rs; see fleet/mod.rs).
pub mod fleet;

// Timing helpers for the benchmark binaries (src/bin/bench-ipam.rs, bench-probe.rs, bench-kube.rs).
pub mod bench;
