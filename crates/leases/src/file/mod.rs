//! Node-local lease store: one JSON state file per uniqueness domain ([`Scope`]).
//!
//! Layout under the data directory (created 0700):
//!
//! - `@cluster.json` — the records of the cluster-wide domain, which every network without
//!   `isolated_fabric` shares; `@fabric.<name>.json` — those of an isolated fabric. The state
//!   (0600): `{"format": 2, "domain": null, "next_version", "leases": [...]}`, each record naming
//!   the network that holds it. Networks whose ranges overlap in one domain share the record of
//!   an address in both, so one node never hands out an address twice whichever NAD asks.
//! - `<stem>.lock` — lock file (0600); every operation holds an exclusive `flock` on it
//!   (`std::fs::File::lock`) from reading the state to renaming the new state in place.
//! - `.<stem>.json.tmp` — scratch file of an interrupted write; ignored and overwritten.
//! - `<network stem>.json` — a network's state as tether wrote it before uniqueness domains
//!   (format 1, one file per network). The first call about that network moves its records into
//!   its domain's file, holding both locks (the old one is the lock an older tether-ipam still
//!   running would take), then removes it. Two records for one address, which could exist
//!   before, keep the one that is leased and say so.
//!
//! `<network stem>` is the network name with every byte outside `[A-Za-z0-9._-]` replaced by
//! `_`; when that changed the name (or it is empty, starts with `.`, or is over 100 bytes) it is
//! cut to 100 bytes, a leading `.` gets a `_` in front, and `-<hash of the original name>` is
//! appended, so distinct names never share a file. No such stem contains `@`, so a domain's file
//! is never a network's.
//!
//! Every file is opened relative to the data directory's handle, never through a symlink, and only
//! after that directory and every one above it passed tether-trusted-fs's checks (owned by root,
//! not writable by group or others): a NAD's `dataDir` in a directory a user can write is refused,
//! so nobody can make root overwrite a file of their choosing.
//!
//! Writes are atomic: write the temp file in the same directory, fsync it, rename it over the
//! state file, fsync the directory. A crash at any point leaves the old or the new state (a crash
//! while moving a network's old file leaves that file, moved again next time). A corrupt or
//! unreadable state file is an error naming the file; it is never reset, because a reset would
//! hand out live addresses a second time.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use tether_trusted_fs::{Open, Place, TrustError, TrustedDir};

use crate::model::{Lease, Scope};
use crate::store::{BackendFailure, CasResult, LeaseStore, StoreError};

mod state;
pub use state::Transaction;
use state::{NetworkStateFile, StateFile, load, move_network_file, parse_state, save};

/// Version of the state file layout this code writes: one file per uniqueness domain.
pub const FORMAT_VERSION: u32 = 2;

/// The layout of a network's own state file, before uniqueness domains: read only to move its
/// records into their domain's file.
pub const PER_NETWORK_FORMAT: u32 = 1;

/// Errors of the node-local file store. Each names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum FileStoreError {
    /// The data directory, or a file in it, cannot be used safely (or at all).
    #[error("lease state directory: {0}")]
    Dir(TrustError),
    /// The lock file could not be opened or locked.
    #[error("cannot lock {path}: {source}")]
    Lock {
        /// Lock file.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// The state file exists but cannot be read.
    #[error("cannot read lease state file {path}: {source}")]
    Read {
        /// State file.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// The state file is not valid. Never reset automatically.
    #[error(
        "lease state file {path} is corrupt: {detail}; refusing to reset it, since that could hand out addresses \
         that are in use a second time: repair the file, or move it aside once no pod on this node uses its networks"
    )]
    Corrupt {
        /// State file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The state file was written by a newer tether.
    #[error(
        "lease state file {path} has format {found}, but this tether understands only formats {PER_NETWORK_FORMAT} \
         and {FORMAT_VERSION}: install a tether at least as new as the one that wrote it"
    )]
    UnsupportedFormat {
        /// State file.
        path: PathBuf,
        /// Format found.
        found: u64,
    },
    /// The state file belongs to another network name or domain.
    #[error("lease state file {path} belongs to {found}, not {expected}")]
    WrongOwner {
        /// State file.
        path: PathBuf,
        /// Owner recorded in the file.
        found: String,
        /// Owner asked for.
        expected: String,
    },
    /// Writing the new state failed; the old state is intact.
    #[error("cannot write lease state file {path}: {source} (the previous state is intact)")]
    Write {
        /// File being written.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
}

impl FileStoreError {
    /// Worth retrying later? Only a failed `flock` and I/O errors that may pass; a directory or
    /// file that is wrong stays wrong.
    pub fn is_transient(&self) -> bool {
        match self {
            FileStoreError::Lock { .. } => true,
            FileStoreError::Dir(e) => e.is_transient(),
            _ => false,
        }
    }

    /// A mistake in the config (the `dataDir` it names), not in the store: CNI code 7.
    pub fn is_config(&self) -> bool {
        matches!(self, FileStoreError::Dir(e) if !e.is_transient())
    }

    /// The file store error inside a [`StoreError`], if it is one.
    pub fn from_store_error(e: &StoreError) -> Option<&FileStoreError> {
        match e {
            StoreError::Backend(f) => f.downcast_ref::<FileStoreError>(),
            _ => None,
        }
    }
}

/// Shown as it is, transient exactly when [`FileStoreError::is_transient`].
impl From<FileStoreError> for StoreError {
    fn from(e: FileStoreError) -> StoreError {
        let transient = e.is_transient();
        StoreError::Backend(BackendFailure::new(e, transient))
    }
}

/// The node-local file store. Cheap to create; every handle (in any thread or process) on the
/// same directory serialises through the per-domain lock file.
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
}

/// File stem for a network name (see the module docs).
pub fn file_stem(network: &str) -> String {
    let mut s: String = network
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-' {
                b as char
            } else {
                '_'
            }
        })
        .collect();
    let changed = s != network || s.is_empty() || s.starts_with('.') || s.len() > 100;
    if changed {
        s.truncate(100);
        if s.starts_with('.') {
            s.insert(0, '_');
        }
        s.push('-');
        s.push_str(&format!(
            "{:016x}",
            tether_stable_hash::fnv1a64(network.as_bytes(), 0)
        ));
    }
    s
}

/// File stem of a domain's state: `@cluster`, or `@fabric.<stem of its name>`; `@` never
/// occurs in a network's stem.
pub fn domain_stem(domain: Option<&str>) -> String {
    match domain {
        None => "@cluster".to_string(),
        Some(d) => format!("@fabric.{}", file_stem(d)),
    }
}

/// A domain as a state file names it, for messages.
fn owner(domain: Option<&str>) -> String {
    crate::store::domain_text(domain)
}

impl FileStore {
    /// A store keeping its files in `dir` (created on first use).
    pub fn new(dir: impl Into<PathBuf>) -> FileStore {
        FileStore { dir: dir.into() }
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the state file of `domain`.
    pub fn state_path(&self, domain: Option<&str>) -> PathBuf {
        self.dir.join(format!("{}.json", domain_stem(domain)))
    }

    /// Path of the lock file of `domain`.
    pub fn lock_path(&self, domain: Option<&str>) -> PathBuf {
        self.dir.join(format!("{}.lock", domain_stem(domain)))
    }

    /// Path of `network`'s own state file as tether wrote it before uniqueness domains (moved
    /// into its domain's file on first use).
    pub fn network_state_path(&self, network: &str) -> PathBuf {
        self.dir.join(format!("{}.json", file_stem(network)))
    }

    /// Every record here, of every domain and network (those still in a network's own file
    /// from before uniqueness domains included), for the operator's views. Each file is read as
    /// it stands (every write replaces a file whole), without its lock.
    pub fn records(&self) -> Result<Vec<Lease>, FileStoreError> {
        let dir = match TrustedDir::open(DATA_DIR_KEY, &self.dir, Place::State, false) {
            Ok(d) => d,
            Err(TrustError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Ok(Vec::new());
            }
            Err(e) => return Err(FileStoreError::Dir(e)),
        };
        let mut out = Vec::new();
        for entry in dir.entries().map_err(FileStoreError::Dir)? {
            let Some(name) = entry.to_str().filter(|n| n.ends_with(".json")) else {
                continue;
            };
            if name.starts_with('.') || !dir.is_file(name) {
                continue;
            }
            let path = dir.join(name);
            let Some(bytes) = read_file(&dir, name)? else {
                continue;
            };
            if name.starts_with('@') {
                let state: StateFile = parse_state(&bytes, &path, FORMAT_VERSION)?;
                out.extend(state.leases);
            } else {
                // Anything else someone put in the directory is not ours to judge; the network's
                // own first call reports a damaged one.
                match parse_state::<NetworkStateFile>(&bytes, &path, PER_NETWORK_FORMAT) {
                    Ok(old) => out.extend(old.leases),
                    Err(e) => log::debug!("{} is not a lease state file: {e}", path.display()),
                }
            }
        }
        Ok(out)
    }

    /// The networks that have records here (in a domain's file, or in a network's own file not
    /// moved yet), by their exact names.
    pub fn networks(&self) -> Result<Vec<String>, FileStoreError> {
        let mut names: Vec<String> = self.records()?.into_iter().map(|l| l.network).collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Run `f` as one read-modify-write transaction on the state of `scope`'s domain, under its
    /// lock (`scope`'s network's own file from before uniqueness domains moved in first). The new
    /// state is written (atomically) only if `f` returns `Ok` and changed something.
    pub fn transaction<R, E: From<StoreError>>(
        &self,
        scope: &Scope,
        f: impl FnOnce(&mut Transaction<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        let domain = scope.domain.as_deref();
        let (dir, _lock) = self
            .lock(&domain_stem(domain))
            .map_err(|e| E::from(e.into()))?;
        let mut state = load(&dir, domain).map_err(|e| E::from(e.into()))?;
        move_network_file(&dir, &scope.network, &mut state).map_err(|e| E::from(e.into()))?;
        let mut txn = Transaction {
            domain,
            state: &mut state,
            dirty: false,
        };
        let out = f(&mut txn)?;
        if txn.dirty {
            save(&dir, domain, &mut state).map_err(|e| E::from(e.into()))?;
        }
        Ok(out)
    }

    /// The data directory, opened (created 0700 when missing) and checked.
    pub fn open_dir(&self) -> Result<TrustedDir, FileStoreError> {
        TrustedDir::open(DATA_DIR_KEY, &self.dir, Place::State, true).map_err(FileStoreError::Dir)
    }

    fn lock(&self, stem: &str) -> Result<(TrustedDir, File), FileStoreError> {
        let dir = self.open_dir()?;
        let file = lock_in(&dir, stem)?;
        Ok((dir, file))
    }
}

/// An exclusive lock on `<stem>.lock` in `dir`, held while the file lives.
fn lock_in(dir: &TrustedDir, stem: &str) -> Result<File, FileStoreError> {
    let name = format!("{stem}.lock");
    let file = dir
        .open_file(&name, Open::Lock)
        .map_err(FileStoreError::Dir)?;
    loop {
        match file.lock() {
            Ok(()) => return Ok(file),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(FileStoreError::Lock {
                    path: dir.join(&name),
                    source,
                });
            }
        }
    }
}

/// The config key a data directory comes from (in error messages).
const DATA_DIR_KEY: &str = "ipam.dataDir";

/// The whole of `name` in `dir`, or `None` when there is no such file.
fn read_file(dir: &TrustedDir, name: &str) -> Result<Option<Vec<u8>>, FileStoreError> {
    let Some(mut f) = dir.read_file(name).map_err(FileStoreError::Dir)? else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)
        .map_err(|source| FileStoreError::Read {
            path: dir.join(name),
            source,
        })?;
    Ok(Some(bytes))
}

/// A domain's records, all of them: an allocation respects every network's.
impl LeaseStore for FileStore {
    fn list(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        self.transaction(scope, |t| Ok::<_, StoreError>(t.leases().to_vec()))
    }

    fn claim(&self, new: Lease, expected: Option<&Lease>) -> CasResult<Lease> {
        let scope = new.scope();
        self.transaction(&scope, |t| t.claim(new, expected))
    }

    fn remove(&self, expected: &Lease) -> CasResult<()> {
        self.transaction(&expected.scope(), |t| t.remove(expected))
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    #[test]
    fn store_error_keeps_message_source_and_retry_class() {
        let lock = FileStoreError::Lock {
            path: PathBuf::from("/d/net.lock"),
            source: io::Error::from(io::ErrorKind::Interrupted),
        };
        let shown = lock.to_string();
        let e = StoreError::from(lock);
        assert_eq!(e.to_string(), shown);
        assert!(e.is_transient());
        assert!(e.source().unwrap().downcast_ref::<io::Error>().is_some());
        assert!(matches!(
            FileStoreError::from_store_error(&e),
            Some(FileStoreError::Lock { .. })
        ));

        let corrupt = FileStoreError::Corrupt {
            path: PathBuf::from("/d/net.json"),
            detail: "two records for 10.0.0.1".into(),
        };
        let shown = corrupt.to_string();
        let e = StoreError::from(corrupt);
        assert_eq!(e.to_string(), shown);
        assert!(!e.is_transient());
        assert!(e.source().is_none());

        assert!(FileStoreError::from_store_error(&StoreError::Invalid("x".into())).is_none());
    }
}
