//! Network namespaces: open one by path (checking it really is one) and run code inside it.
//!
//! setns(2) changes only the calling thread, so work inside a netns runs on a thread that enters it
//! and exits with it ([`NetNs::run`] for one job, [`NetNs::thread`] for several); the caller's thread
//! never changes namespace and nothing must be restored.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use nix::sched::{CloneFlags, setns};

/// nsfs (`/run/netns/*`, `/proc/<pid>/ns/net` bind mounts) and procfs (`/proc/<pid>/ns/net` itself).
const NSFS_MAGIC: i64 = 0x6e73_6673;
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("network namespace {path} does not exist")]
    Missing { path: PathBuf },
    #[error("cannot open network namespace {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is not a network namespace (filesystem magic {magic:#x}; expected nsfs or proc)"
    )]
    NotANetns { path: PathBuf, magic: i64 },
    #[error("cannot enter network namespace {path}: {source}")]
    Enter { path: PathBuf, source: nix::Error },
    #[error("the helper thread for network namespace {path} died")]
    Thread { path: PathBuf },
    #[error("cannot start a helper thread for network namespace {path}: {source}")]
    Spawn {
        path: PathBuf,
        source: std::io::Error,
    },
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
            std::io::ErrorKind::NotFound => NetnsError::Missing {
                path: path.to_owned(),
            },
            _ => NetnsError::Open {
                path: path.to_owned(),
                source,
            },
        })?;
        let st = nix::sys::statfs::fstatfs(&file).map_err(|e| NetnsError::Open {
            path: path.to_owned(),
            source: e.into(),
        })?;
        #[allow(clippy::unnecessary_cast)] // the field's width differs between libc targets
        let magic = st.filesystem_type().0 as i64;
        if magic != NSFS_MAGIC && magic != PROC_SUPER_MAGIC {
            return Err(NetnsError::NotANetns {
                path: path.to_owned(),
                magic,
            });
        }
        // A regular file on procfs (e.g. /proc/self/status) passes the magic test but setns would reject
        // it; the ns/ entries are the only files we are handed there, and entering is checked anyway.
        Ok(NetNs {
            file,
            path: path.to_owned(),
        })
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
                setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|source| {
                    NetnsError::Enter {
                        path: self.path.clone(),
                        source,
                    }
                })?;
                Ok(f())
            })
            .join()
            .map_err(|_| NetnsError::Thread {
                path: self.path.clone(),
            })?
        })
    }

    /// A thread that enters this netns once and then runs every job given to [`NsThread::run`], so
    /// one ADD pays for one thread and one setns however many things it does in the pod.
    pub fn thread(&self) -> Result<NsThread, NetnsError> {
        let path = self.path.clone();
        let spawn_err = |source| NetnsError::Spawn {
            path: path.clone(),
            source,
        };
        let fd = self.file.try_clone().map_err(spawn_err)?;
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready) = mpsc::sync_channel(1);
        let handle = std::thread::Builder::new()
            .name("netns".into())
            .spawn(move || {
                let entered = setns(fd.as_fd(), CloneFlags::CLONE_NEWNET);
                drop(fd);
                let ok = entered.is_ok();
                let _ = ready_tx.send(entered);
                if ok {
                    for job in rx {
                        job();
                    }
                }
            })
            .map_err(spawn_err)?;
        match ready.recv() {
            Ok(Ok(())) => Ok(NsThread {
                jobs: Some(jobs),
                handle: Some(handle),
                path,
            }),
            Ok(Err(source)) => Err(NetnsError::Enter { path, source }),
            Err(_) => Err(NetnsError::Thread { path }),
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A thread inside a netns, running jobs one at a time (see [`NetNs::thread`]). Sockets it opens stay
/// in that netns and can be used from any thread afterwards.
#[derive(Debug)]
pub struct NsThread {
    jobs: Option<mpsc::Sender<Job>>,
    handle: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl NsThread {
    /// Run `f` inside the netns and wait for its result.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, NetnsError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        let dead = || NetnsError::Thread {
            path: self.path.clone(),
        };
        self.jobs
            .as_ref()
            .ok_or_else(dead)?
            .send(job)
            .map_err(|_| dead())?;
        // A panicking job drops `tx` without sending.
        rx.recv().map_err(|_| dead())
    }
}

impl Drop for NsThread {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
