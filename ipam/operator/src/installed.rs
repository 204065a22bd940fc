//! What the node-agent put on the node, for its readiness (`GET /readyz`, the DaemonSet's
//! readinessProbe): ready only while the plugins it installed and their kubeconfig are in place,
//! so `kubectl rollout status daemonset/tether` says a node runs this version's plugins only when
//! it does.
//!
//! A plugin is identified by the file the agent installed (device, inode, size, modification
//! time), taken right after installing: any other installer, a rollback, or a removal changes it.
//! The kubeconfig is rewritten (renamed into place) whenever its token rotates, so for it only
//! its presence counts: a non-empty regular file the plugins can read as root and no one else.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The installed files as they were once installed.
#[derive(Debug, Clone, PartialEq)]
pub struct Installed {
    plugins: Vec<(PathBuf, FileId)>,
    kubeconfig: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

fn file_id(path: &Path) -> Result<FileId, String> {
    let m = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !m.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    Ok(FileId {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    })
}

impl Installed {
    /// Record `names` in `bin_dir` as they are now (just installed) and where the kubeconfig is.
    pub fn record(bin_dir: &Path, names: &[&str], kubeconfig: &Path) -> Result<Installed, String> {
        let plugins = names
            .iter()
            .map(|n| {
                let p = bin_dir.join(n);
                file_id(&p).map(|id| (p, id))
            })
            .collect::<Result<_, _>>()?;
        Ok(Installed {
            plugins,
            kubeconfig: kubeconfig.to_path_buf(),
        })
    }

    /// `Ok` while every plugin is the file installed and the kubeconfig is in place; else what
    /// is wrong, for the probe's answer (kubectl describe shows it).
    pub fn check(&self) -> Result<(), String> {
        for (path, id) in &self.plugins {
            match file_id(path) {
                Ok(now) if now == *id => {}
                Ok(_) => {
                    return Err(format!(
                        "{} was replaced after this agent installed it",
                        path.display()
                    ));
                }
                Err(e) => return Err(format!("the installed plugin is gone: {e}")),
            }
        }
        let k = &self.kubeconfig;
        let m = std::fs::metadata(k)
            .map_err(|e| format!("the plugins' kubeconfig is missing: {}: {e}", k.display()))?;
        if !m.is_file() || m.len() == 0 {
            return Err(format!("the plugins' kubeconfig {} is empty", k.display()));
        }
        if m.mode() & 0o077 != 0 {
            return Err(format!(
                "the plugins' kubeconfig {} is readable by others (mode {:o})",
                k.display(),
                m.mode() & 0o777
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn write(path: &Path, bytes: &[u8], mode: u32) {
        std::fs::write(path, bytes).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn ready_only_while_plugins_and_kubeconfig_are_in_place() {
        let dir = std::env::temp_dir().join(format!("tether-installed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b, kc) = (dir.join("p-a"), dir.join("p-b"), dir.join("kubeconfig"));
        write(&a, b"a", 0o755);
        write(&b, b"b", 0o755);
        write(&kc, b"apiVersion: v1", 0o600);
        let i = Installed::record(&dir, &["p-a", "p-b"], &kc).unwrap();
        assert_eq!(i.check(), Ok(()));

        // The token rotates: a new kubeconfig renamed into place is still in place.
        let tmp = dir.join(".kc.tmp");
        write(&tmp, b"apiVersion: v1 # new token", 0o600);
        std::fs::rename(&tmp, &kc).unwrap();
        assert_eq!(i.check(), Ok(()));

        write(&kc, b"apiVersion: v1", 0o644);
        assert!(i.check().unwrap_err().contains("readable by others"));
        std::fs::remove_file(&kc).unwrap();
        assert!(i.check().unwrap_err().contains("kubeconfig is missing"));
        write(&kc, b"apiVersion: v1", 0o600);
        assert_eq!(i.check(), Ok(()));

        // Another installer (or an older agent) puts its own binary there.
        let other = dir.join(".p-b.other");
        write(&other, b"another b", 0o755);
        std::fs::rename(&other, &b).unwrap();
        assert!(i.check().unwrap_err().contains("was replaced"), "{i:?}");
        std::fs::remove_file(&b).unwrap();
        assert!(i.check().unwrap_err().contains("is gone"));

        assert!(Installed::record(&dir, &["p-b"], &kc).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
