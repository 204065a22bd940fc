//! Warnings said once per network on this node, not on every call.
//!
//! A fact about a network's configuration (whereabouts' kubeconfig replaced by tether's) is the
//! same on every ADD of every pod: repeated each time, it would bury the rest of the runtime's
//! log, and once is enough for whoever reads it. A marker file created with `O_EXCL` under
//! `dataDir` (through tether-trusted-fs, like every file there) records that it was said, so
//! concurrent calls say it once between them; removing the marker says it again.

use tether_leases::file_stem;
use tether_trusted_fs::TrustedDir;

/// The directory of the markers, under `dataDir`.
pub const NOTICES_DIR: &str = "notices";

/// Log `text` as a warning unless it was said for `network` (under the name `what`) on this node
/// before. A marker that cannot be made is logged with the warning, which is then said again on
/// the next call: better twice than never.
pub fn warn_once(data_dir: &TrustedDir, what: &str, network: &str, text: impl FnOnce() -> String) {
    let name = format!("{what}.{}", file_stem(network));
    let first = data_dir
        .subdir(NOTICES_DIR, true)
        .and_then(|d| d.create_new(&name));
    match first {
        Ok(Some(_)) => log::warn!("{} (said once for this network on this node)", text()),
        Ok(None) => {}
        Err(e) => log::warn!("{} (and cannot note that it was said: {e})", text()),
    }
}
