//! Where a config may put tether's files at all ([`Place`]), checked on the path before any
//! directory is opened.

use std::path::{Component, Path};

use crate::TrustError;

/// Pseudo-filesystems where no state or log file belongs: a path there is a config mistake (or
/// an attack), never something to retry.
const PSEUDO_FS: &[&str] = &["/proc", "/sys", "/dev"];

/// What a directory holds, which decides where it may be. A config names these paths, and root
/// writes there: a path in /etc, /root or /usr would let whoever writes a NAD make root create or
/// append to files that the system reads (a log line in /etc/ld.so.preload is a root shell).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// State, lock, temporary and journal files (`dataDir`).
    State,
    /// A log file (`log_file`).
    Log,
}

impl Place {
    /// The directories under which (strictly below) the files may be.
    pub fn roots(self) -> &'static [&'static str] {
        match self {
            Place::State => &["/var/lib", "/run", "/var/run", "/tmp", "/var/tmp"],
            Place::Log => &["/var/log", "/tmp", "/var/tmp"],
        }
    }

    /// A good place of this kind, for messages.
    fn example(self) -> &'static str {
        match self {
            Place::State => "the default /var/lib/cni/tether",
            Place::Log => "/var/log/tether/cni.log",
        }
    }
}

/// The roots anyone may create files in (mode 1777).
const WORLD_WRITABLE: &[&str] = &["/tmp", "/var/tmp"];

/// `path` is absolute, without `..`, not under a pseudo-filesystem, and below one of `place`'s
/// roots (not a root itself).
pub fn check_place(key: &str, path: &Path, place: Place) -> Result<(), TrustError> {
    let unfit = |reason: &str| TrustError::Unfit {
        key: key.to_string(),
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    if !path.is_absolute() {
        return Err(unfit("it must be an absolute path"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(unfit("it must not contain '..'"));
    }
    for p in PSEUDO_FS {
        if path.starts_with(p) {
            return Err(unfit(&format!("{p} is a kernel pseudo-filesystem")));
        }
    }
    let roots = place.roots();
    // A root itself is named apart: "must be below /tmp" said of "/tmp" reads as a contradiction.
    if let Some(root) = roots.iter().find(|r| path == Path::new(r)) {
        return Err(unfit(&format!(
            "it must be below {root}, not {root} itself (e.g. {})",
            place.example()
        )));
    }
    if !roots.iter().any(|r| path.starts_with(r)) {
        return Err(unfit(&format!(
            "it must be below {} (e.g. {})",
            roots.join(", "),
            place.example()
        )));
    }
    Ok(())
}

/// [`check_place`] of a single file (a log): its directory must be below a root too, never a root
/// itself. A file directly in /tmp is one that anyone can create first (a symlink, a hard link to
/// another file, a file of their own), and root opening it by name would write into what they
/// planted; a file directly in /var/log could be one of the system's own logs.
pub fn check_file_place(key: &str, path: &Path, place: Place) -> Result<(), TrustError> {
    check_place(key, path, place)?;
    let Some(dir) = path.parent() else {
        return Ok(());
    };
    if let Some(root) = place.roots().iter().find(|r| dir == Path::new(r)) {
        let why = if WORLD_WRITABLE.contains(root) {
            "which every user can write, so a file opened there by name may be one someone planted"
        } else {
            "which holds the system's own files"
        };
        return Err(TrustError::Unfit {
            key: key.to_string(),
            path: path.to_path_buf(),
            reason: format!(
                "it must be in a directory of its own below {root}, not directly in {root}, {why} (e.g. {})",
                place.example()
            ),
        });
    }
    Ok(())
}
