//! Where things are: the repo, build outputs, reference plugins, scratch dirs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The repository root (the workspace directory).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("conformance/ has a parent")
        .to_path_buf()
}

/// Cargo's target dir: `$CARGO_TARGET_DIR` (relative = to the repo root) or
/// `<repo>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => {
            let d = PathBuf::from(d);
            if d.is_absolute() {
                d
            } else {
                repo_root().join(d)
            }
        }
        _ => repo_root().join("target"),
    }
}

/// `<target>/libcni-driver`, built by `conformance/libcni-driver/build.sh`.
/// If missing it runs build.sh once (works on the host; inside the lab VM the
/// tree is read-only, so lab/run-tests.sh builds it before booting). Panics
/// with instructions if it still is not there.
pub fn libcni_driver() -> PathBuf {
    let bin = target_dir().join("libcni-driver");
    if !bin.is_file() {
        let script = repo_root().join("conformance/libcni-driver/build.sh");
        let out = crate::cmd::run("bash", &[script.to_str().unwrap()]);
        if !out.success() || !bin.is_file() {
            panic!(
                "{} is missing and building it failed; run conformance/libcni-driver/build.sh\n{out}",
                bin.display()
            );
        }
    }
    bin
}

/// Directory of the Debian reference CNI plugins (containernetworking-plugins):
/// `$TETHER_REFERENCE_CNI_PATH` or `/usr/lib/cni`.
pub fn reference_plugins_dir() -> PathBuf {
    std::env::var_os("TETHER_REFERENCE_CNI_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/cni"))
}

/// The reference plugin `name`; panics if it is not installed.
pub fn reference_plugin(name: &str) -> PathBuf {
    let p = reference_plugins_dir().join(name);
    assert!(
        p.is_file(),
        "reference CNI plugin {} missing (apt-get install containernetworking-plugins)",
        p.display()
    );
    p
}

/// A process-unique token `<pid>-<counter>-<time>` for names that must not
/// collide between parallel tests or test processes.
pub fn unique_token() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64 ^ d.as_secs())
        .unwrap_or(0);
    format!("{}-{n}-{:x}", std::process::id(), t & 0xffff)
}

/// A directory removed (recursively) on drop. Created under
/// `std::env::temp_dir()` (`/tmp`, writable in the lab VM too).
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    /// Creates `<tmp>/tether-<prefix>-<unique>`.
    pub fn new(prefix: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("tether-{prefix}-{}", unique_token()));
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        TempDir { path, keep: false }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `self.path().join(rel)`.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.path.join(rel)
    }

    /// Do not delete on drop (for post-mortems); returns the path.
    pub fn keep(&mut self) -> PathBuf {
        self.keep = true;
        self.path.clone()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The directory of scripts that start the real peers (`k8s-up.sh`, ...): `TETHER_PEERS`, else
/// `../shared/peers` next to the repository.
pub fn peers_dir() -> PathBuf {
    match std::env::var_os("TETHER_PEERS").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => repo_root().join("../shared/peers"),
    }
}

/// [`peers_dir`], or exit 1 with a banner saying that benchmark `bench` measured nothing (the
/// peers hold `what`).
pub fn require_peers(bench: &str, what: &str) -> PathBuf {
    let peers = peers_dir();
    if !peers.join("k8s-up.sh").is_file() {
        eprintln!();
        eprintln!(
            "!!! {bench}: no peers directory at {} (k8s-up.sh missing).",
            peers.display()
        );
        eprintln!("!!! It holds {what}; set TETHER_PEERS to its path. Nothing was measured.");
        eprintln!();
        std::process::exit(1);
    }
    peers
}
