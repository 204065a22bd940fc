//! Network namespaces: open one by path (checking it really is one) and run code inside it.
//!
//! setns(2) changes only the calling thread, so work inside a netns runs on a short-lived thread that
//! enters it and then exits; the caller's thread never changes namespace and nothing must be restored.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};

/// nsfs (`/run/netns/*`, `/proc/<pid>/ns/net` bind mounts) and procfs (`/proc/<pid>/ns/net` itself).
const NSFS_MAGIC: i64 = 0x6e73_6673;
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace {path} does not exist")]
    Missing { path: PathBuf },
    #[error("cannot open network namespace {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a network namespace (filesystem magic {magic:#x}; expected nsfs or proc)")]
    NotANetns { path: PathBuf, magic: i64 },
    #[error("cannot enter network namespace {path}: {source}")]
    Enter { path: PathBuf, source: nix::Error },
    #[error("the helper thread for network namespace {path} died")]
    Thread { path: PathBuf },
}

/// An open network namespace.
#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: PathBuf,
}

impl NetNs {
    /// Open `path` and check that it is a netns, so a plain directory or file fails clearly.
    pub fn open(path: &Path) -> Result<NetNs, NetnsError> {
        let file = File::open(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => NetnsError::Missing { path: path.to_owned() },
            _ => NetnsError::Open { path: path.to_owned(), source },
        })?;
        let st = nix::sys::statfs::fstatfs(&file).map_err(|e| NetnsError::Open { path: path.to_owned(), source: e.into() })?;
        #[allow(clippy::unnecessary_cast)] // the field's width differs between libc targets
        let magic = st.filesystem_type().0 as i64;
        if magic != NSFS_MAGIC && magic != PROC_SUPER_MAGIC {
            return Err(NetnsError::NotANetns { path: path.to_owned(), magic });
        }
        // A regular file on procfs (e.g. /proc/self/status) passes the magic test but setns would reject
        // it; the ns/ entries are the only files we are handed there, and entering is checked anyway.
        Ok(NetNs { file, path: path.to_owned() })
    }

    /// The netns of the calling thread.
    pub fn current() -> Result<NetNs, NetnsError> {
        Self::open(Path::new("/proc/thread-self/ns/net"))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// Run `f` on a fresh thread that has entered this netns.
    pub fn run<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> Result<T, NetnsError> {
        std::thread::scope(|s| {
            s.spawn(|| {
                setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET)
                    .map_err(|source| NetnsError::Enter { path: self.path.clone(), source })?;
                Ok(f())
            })
            .join()
            .map_err(|_| NetnsError::Thread { path: self.path.clone() })?
        })
    }
}
