//! Files the node-agent writes on its node (the plugins, their kubeconfig, the word on lease
//! names): replaced atomically, so a reader never sees half of one, and private where they
//! hold a credential.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Write `bytes` to `path` atomically with `mode`. Returns false when the file already held them.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<bool> {
    if fs::read(path).is_ok_and(|old| old == bytes) {
        // Keep the mode right even when the content is.
        fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
        return Ok(false);
    }
    let dir = path.parent().ok_or_else(|| {
        std::io::Error::other(format!("{} has no parent directory", path.display()))
    })?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| true)
}

/// Write `bytes` to `out` (0600) atomically, in a 0700 directory made when missing; returns
/// whether it changed.
pub fn write_private(out: &Path, bytes: &[u8]) -> Result<bool, String> {
    let dir = out
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", out.display()))?;
    if !dir.is_dir() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    write_atomic(out, bytes, 0o600).map_err(|e| format!("writing {}: {e}", out.display()))
}
