//! Files that root opens only inside directories nobody else controls, never through a symlink.
//!
//! The plugins run as root and write their state, lock, temporary and log files where a config
//! (a NAD, written by someone else) says. If anyone but root could write that directory, or any
//! directory above it, they could plant a symlink or swap a directory and make root overwrite or
//! create any file. So a [`TrustedDir`] is opened by walking the path from `/` one component at
//! a time with `O_NOFOLLOW`, checking each directory on the way (owned by root or by us, not
//! writable by group or others — a sticky directory like `/tmp` is allowed above, not as the
//! directory itself), and every file in it is then opened relative to that handle with
//! `O_NOFOLLOW`: what was checked is what is used, even if a path is swapped later.
//!
//! Symlinks in the configured path itself (`/var/run` → `/run`) are resolved once, before the
//! walk (`canonicalize`); the walk then refuses any symlink, so a swap after that fails closed.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, mkdirat};
use nix::unistd::{UnlinkatFlags, fsync, geteuid, unlinkat};

/// Why a directory or file cannot be used. Each names the path and what to do.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Not an absolute path, or under /proc, /sys or /dev.
    #[error("{key} {path:?} is not a place for tether's files: {reason}")]
    Unfit {
        /// The config key that named it (`ipam.dataDir`, `log_file`).
        key: String,
        /// As configured.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Someone other than root could change the directory (or one above it).
    #[error(
        "{key} {path:?} cannot be trusted: {dir:?} {reason}; use a directory that only root can \
         write, in directories only root can write (e.g. the default /var/lib/cni/tether)"
    )]
    Untrusted {
        /// The config key that named it.
        key: String,
        /// As configured.
        path: PathBuf,
        /// The directory that failed the check.
        dir: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file in a trusted directory is not what it must be (a symlink, a directory, another
    /// owner's file).
    #[error("{path:?} {reason}; remove it (tether creates it again)")]
    UnfitFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The system refused an operation.
    #[error("{op} {path:?}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The system's error.
        source: io::Error,
    },
}

impl TrustError {
    /// Worth retrying? Only an I/O error that may pass (out of space, interrupted, busy); a bad
    /// or untrusted path never passes by itself.
    pub fn is_transient(&self) -> bool {
        match self {
            TrustError::Io { source, .. } => {
                !matches!(
                    source.kind(),
                    io::ErrorKind::PermissionDenied
                        | io::ErrorKind::NotADirectory
                        | io::ErrorKind::InvalidInput
                        | io::ErrorKind::ReadOnlyFilesystem
                        | io::ErrorKind::AlreadyExists
                        | io::ErrorKind::IsADirectory
                        | io::ErrorKind::NotFound
                ) && source.raw_os_error() != Some(libc::ELOOP)
                    && source.raw_os_error() != Some(libc::EXDEV)
            }
            _ => false,
        }
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> TrustError + 'a {
    move |e| TrustError::Io {
        op,
        path: path.to_path_buf(),
        source: io::Error::from(e),
    }
}

/// How a file is opened for writing in a [`TrustedDir`] ([`TrustedDir::open_file`]); reading
/// and creating a file only once have methods of their own, as they may find no file to open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// Read and write, created (mode 0600) when missing, never truncated: a lock file.
    Lock,
    /// Write, created (0600) or truncated: a temporary file to be renamed in place.
    Replace,
    /// Append, created (given mode) when missing: a log file.
    Append(u32),
}

/// Every way [`TrustedDir`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    Write(Open),
    /// Read only; a missing file is `Ok(None)`.
    Read,
    /// Write, created (0600) only when missing (`O_EXCL`); an existing file is `Ok(None)`.
    CreateNew,
}

/// An open directory that passed the checks (see the module docs).
#[derive(Debug)]
pub struct TrustedDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// Is `st` a directory that only root (or we) can change? `top`: the directory the files go in
/// (a sticky directory is fine above it, not as it).
fn check_dir(st: &FileStat, top: bool) -> Result<(), String> {
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
        return Err("is not a directory".into());
    }
    let me = geteuid().as_raw();
    if st.st_uid != 0 && st.st_uid != me {
        return Err(format!("is owned by uid {}", st.st_uid));
    }
    let writable = st.st_mode & 0o022;
    let sticky = st.st_mode & 0o1000 != 0;
    if writable != 0 && (top || !sticky) {
        return Err(format!(
            "is writable by {} (mode {:o})",
            if writable & 0o002 != 0 {
                "others"
            } else {
                "its group"
            },
            st.st_mode & 0o7777
        ));
    }
    Ok(())
}

/// What exists of `path`, resolved once (a symlinked /var/run), and the names below it still to
/// create (deepest first), which [`TrustedDir::open`] creates under directories that passed. A
/// missing part is an error unless `create`.
fn resolve_existing(path: &Path, create: bool) -> Result<(PathBuf, Vec<OsString>), TrustError> {
    let (mut real, mut missing) = (path.to_path_buf(), Vec::<OsString>::new());
    loop {
        match std::fs::canonicalize(&real) {
            Ok(r) => return Ok((r, missing)),
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                let Some(name) = real.file_name() else {
                    return Err(io_err("resolving", path)(Errno::ENOENT));
                };
                missing.push(name.to_os_string());
                real = real.parent().map(Path::to_path_buf).unwrap_or_default();
            }
            Err(source) => {
                return Err(TrustError::Io {
                    op: "resolving",
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
    }
}

impl TrustedDir {
    /// Open the directory `path` (`key` names it in errors), creating it (0700; missing parents
    /// 0755) when `create`. Every directory from `/` down must pass the checks.
    pub fn open(
        key: &str,
        path: &Path,
        place: Place,
        create: bool,
    ) -> Result<TrustedDir, TrustError> {
        check_place(key, path, place)?;
        let (resolved, missing) = resolve_existing(path, create)?;
        // A symlink must not lead out of the allowed places either: what the path really names,
        // the resolved part and the parts still to create (a fresh node has no /var/lib/cni yet,
        // and /var/lib alone is a root, not a place below one).
        let target: PathBuf = missing
            .iter()
            .rev()
            .fold(resolved.clone(), |p, n| p.join(n));
        check_place(key, &target, place)?;
        let untrusted = |dir: &Path, reason: String| TrustError::Untrusted {
            key: key.to_string(),
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
            reason,
        };
        let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
        let mut here = PathBuf::from("/");
        let mut fd =
            nix::fcntl::open("/", flags, Mode::empty()).map_err(io_err("opening", &here))?;
        let mut names: Vec<OsString> = resolved
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n.to_os_string()),
                _ => None,
            })
            .collect();
        let existing = names.len();
        names.extend(missing.into_iter().rev());
        let last = names.len();
        let st = fstat(&fd).map_err(io_err("checking", &here))?;
        check_dir(&st, last == 0).map_err(|r| untrusted(&here, r))?;
        for (i, name) in names.iter().enumerate() {
            here.push(name);
            let top = i + 1 == last;
            if i >= existing {
                let mode = if top { 0o700 } else { 0o755 };
                match mkdirat(&fd, name.as_os_str(), Mode::from_bits_truncate(mode)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(io_err("creating", &here)(e)),
                }
            }
            let next =
                openat(&fd, name.as_os_str(), flags, Mode::empty()).map_err(|e| match e {
                    Errno::ELOOP => untrusted(&here, "became a symlink while it was opened".into()),
                    Errno::ENOTDIR => untrusted(&here, "is not a directory".into()),
                    e => io_err("opening", &here)(e),
                })?;
            let st = fstat(&next).map_err(io_err("checking", &here))?;
            check_dir(&st, top).map_err(|r| untrusted(&here, r))?;
            fd = next;
        }
        Ok(TrustedDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The directory as configured.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `name` in this directory (for messages).
    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// A directory inside this one, created 0700 when `create` and missing, checked the same way.
    pub fn subdir(&self, name: &str, create: bool) -> Result<TrustedDir, TrustError> {
        let path = self.path.join(name);
        check_name(name, &path)?;
        if create {
            match mkdirat(&self.fd, name, Mode::from_bits_truncate(0o700)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(io_err("creating", &path)(e)),
            }
        }
        let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY;
        let fd = openat(&self.fd, name, flags, Mode::empty()).map_err(|e| match e {
            Errno::ELOOP | Errno::ENOTDIR => TrustError::UnfitFile {
                path: path.clone(),
                reason: "is not a directory (a symlink?)".into(),
            },
            e => io_err("opening", &path)(e),
        })?;
        let st = fstat(&fd).map_err(io_err("checking", &path))?;
        check_dir(&st, true).map_err(|reason| TrustError::UnfitFile {
            path: path.clone(),
            reason,
        })?;
        Ok(TrustedDir { fd, path })
    }

    /// Open the regular file `name` here for writing, never through a symlink; it is created
    /// when missing.
    pub fn open_file(&self, name: &str, how: Open) -> Result<File, TrustError> {
        let path = self.path.join(name);
        // Never None: writing creates the file.
        self.open_as(name, How::Write(how))?
            .ok_or_else(|| TrustError::UnfitFile {
                path,
                reason: "was not created".into(),
            })
    }

    /// Open the regular file `name` here for reading, never through a symlink; `Ok(None)` when
    /// there is none.
    pub fn read_file(&self, name: &str) -> Result<Option<File>, TrustError> {
        self.open_as(name, How::Read)
    }

    /// Create the file `name` here (0600) if it is not there yet: a marker that something
    /// happened once. `Ok(None)` when it was there already.
    pub fn create_new(&self, name: &str) -> Result<Option<File>, TrustError> {
        self.open_as(name, How::CreateNew)
    }

    fn open_as(&self, name: &str, how: How) -> Result<Option<File>, TrustError> {
        let path = self.path.join(name);
        check_name(name, &path)?;
        let base = OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let (flags, mode) = match how {
            How::Read => (base | OFlag::O_RDONLY, 0),
            How::Write(Open::Lock) => (base | OFlag::O_RDWR | OFlag::O_CREAT, 0o600),
            How::Write(Open::Replace) => (
                base | OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC,
                0o600,
            ),
            How::Write(Open::Append(m)) => {
                (base | OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_APPEND, m)
            }
            How::CreateNew => (
                base | OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
                0o600,
            ),
        };
        let fd = match openat(&self.fd, name, flags, Mode::from_bits_truncate(mode)) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if how == How::Read => return Ok(None),
            Err(Errno::EEXIST) if how == How::CreateNew => return Ok(None),
            Err(Errno::ELOOP) => {
                return Err(TrustError::UnfitFile {
                    path,
                    reason: "is a symlink".into(),
                });
            }
            // Opening a directory for writing: where one of our files belongs, something else is.
            Err(Errno::EISDIR) => {
                return Err(TrustError::UnfitFile {
                    path,
                    reason: "is a directory, not a regular file".into(),
                });
            }
            Err(e) => return Err(io_err("opening", &path)(e)),
        };
        let st = fstat(&fd).map_err(io_err("checking", &path))?;
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind != SFlag::S_IFREG {
            return Err(TrustError::UnfitFile {
                path,
                reason: "is not a regular file".into(),
            });
        }
        if st.st_uid != geteuid().as_raw() {
            return Err(TrustError::UnfitFile {
                path,
                reason: format!("is owned by uid {}", st.st_uid),
            });
        }
        // A file of ours that an older version (or a umask) left wider than asked.
        if matches!(how, How::Write(Open::Lock | Open::Replace)) && st.st_mode & 0o7777 != mode {
            nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode))
                .map_err(io_err("chmod", &path))?;
        }
        // Blocking I/O from here on (O_NONBLOCK only kept a FIFO from hanging the open).
        let file = File::from(fd);
        let fl = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL)
            .map_err(io_err("opening", &path))?;
        let fl = OFlag::from_bits_truncate(fl) & !OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(fl))
            .map_err(io_err("opening", &path))?;
        Ok(Some(file))
    }

    /// Rename `from` to `to`, both in this directory (atomic replace).
    pub fn rename(&self, from: &str, to: &str) -> Result<(), TrustError> {
        let path = self.path.join(to);
        check_name(from, &path)?;
        check_name(to, &path)?;
        renameat(&self.fd, from, &self.fd, to).map_err(io_err("renaming into", &path))
    }

    /// Remove the file `name`; a missing one is fine.
    pub fn remove(&self, name: &str) -> Result<(), TrustError> {
        let path = self.path.join(name);
        check_name(name, &path)?;
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(io_err("removing", &path)(e)),
        }
    }

    /// Set the permission bits of `name` (a socket just bound in this directory, which cannot
    /// be opened to `fchmod`). The directory is one only we control, so what `name` is cannot
    /// change under us.
    pub fn chmod(&self, name: &str, mode: u32) -> Result<(), TrustError> {
        let path = self.path.join(name);
        check_name(name, &path)?;
        nix::sys::stat::fchmodat(
            &self.fd,
            name,
            Mode::from_bits_truncate(mode),
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )
        .map_err(io_err("chmod", &path))
    }

    /// Flush the directory itself (a rename or create in it is durable after this).
    pub fn sync(&self) -> Result<(), TrustError> {
        fsync(&self.fd).map_err(io_err("syncing", &self.path))
    }

    /// The names in this directory (not `.` and `..`).
    pub fn entries(&self) -> Result<Vec<OsString>, TrustError> {
        let fd = openat(
            &self.fd,
            ".",
            OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .map_err(io_err("listing", &self.path))?;
        let dir = nix::dir::Dir::from_fd(fd).map_err(io_err("listing", &self.path))?;
        let mut out = Vec::new();
        for e in dir {
            let e = e.map_err(io_err("listing", &self.path))?;
            let n = OsStr::from_bytes(e.file_name().to_bytes());
            if n != "." && n != ".." {
                out.push(n.to_os_string());
            }
        }
        Ok(out)
    }

    /// `name` in this directory as a path that goes through this very handle
    /// (`/proc/self/fd/<fd>/<name>`), for what can only be reached by path: a unix socket's
    /// `connect` and `bind`. Whatever is swapped in the path later, it is this directory.
    pub fn pinned_path(&self, name: &str) -> Result<PathBuf, TrustError> {
        check_name(name, &self.path.join(name))?;
        use std::os::fd::AsRawFd;
        Ok(PathBuf::from(format!(
            "/proc/self/fd/{}/{name}",
            self.fd.as_raw_fd()
        )))
    }

    /// Is `name` a unix socket owned by root or by us (not following a symlink)?
    pub fn is_trusted_socket(&self, name: &str) -> bool {
        let me = geteuid().as_raw();
        nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| {
            SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFSOCK
                && (st.st_uid == 0 || st.st_uid == me)
        })
    }

    /// The directory's own size in bytes: on tmpfs it grows with every entry, so it bounds
    /// how much a spool holds without listing it.
    pub fn byte_size(&self) -> Result<u64, TrustError> {
        fstat(&self.fd)
            .map(|st| st.st_size.max(0) as u64)
            .map_err(io_err("checking", &self.path))
    }

    /// Does the directory still exist (it was not removed since it was opened)?
    pub fn exists(&self) -> bool {
        fstat(&self.fd).is_ok_and(|st| st.st_nlink > 0)
    }

    /// Is `name` a regular file (not following a symlink)?
    pub fn is_file(&self, name: &str) -> bool {
        nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| {
            SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFREG
        })
    }
}

impl AsFd for TrustedDir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// One plain name: no `/`, not `.` or `..`, not empty.
fn check_name(name: &str, path: &Path) -> Result<(), TrustError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(TrustError::UnfitFile {
            path: path.to_path_buf(),
            reason: format!("{name:?} is not a plain file name"),
        });
    }
    Ok(())
}

/// Open the file at `path` (its directory checked as a [`TrustedDir`], created when missing):
/// for a single file such as a log.
pub fn open_in_trusted_dir(
    key: &str,
    path: &Path,
    place: Place,
    how: Open,
) -> Result<File, TrustError> {
    check_file_place(key, path, place)?;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(OsStr::to_str)) else {
        return Err(TrustError::Unfit {
            key: key.to_string(),
            path: path.to_path_buf(),
            reason: "it must name a file in a directory".into(),
        });
    };
    TrustedDir::open(key, dir, place, true)?.open_file(name, how)
}

mod place;
pub use place::{Place, check_file_place, check_place};

#[cfg(test)]
mod tests;
