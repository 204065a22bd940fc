//! Node-local lease store: one JSON state file per network.
//!
//! Layout under the data directory (created 0700):
//!
//! - `<stem>.json` — the state (0600): `{"format": 1, "network", "next_version", "leases": [...]}`
//! - `<stem>.lock` — lock file (0600); every operation holds an exclusive `flock` on it
//!   (`std::fs::File::lock`) from reading the state to renaming the new state in place.
//! - `.<stem>.json.tmp` — scratch file of an interrupted write; ignored and overwritten.
//!
//! `<stem>` is the network name with every byte outside `[A-Za-z0-9._-]` replaced by `_`; when
//! that changed the name (or it is empty, starts with `.`, or is over 100 bytes) it is cut to
//! 100 bytes, a leading `.` gets a `_` in front, and `-<hash of the original name>` is appended, so distinct names never share a file. The file records the exact
//! network name, and a mismatch is an error.
//!
//! Every file is opened relative to the data directory's handle, never through a symlink, and only
//! after that directory and every one above it passed tether-trusted-fs's checks (owned by root,
//! not writable by group or others): a NAD's `dataDir` in a directory a user can write is refused,
//! so nobody can make root overwrite a file of their choosing.
//!
//! Writes are atomic: write the temp file in the same directory, fsync it, rename it over the
//! state file, fsync the directory. A crash at any point leaves the old or the new state. A
//! corrupt or unreadable state file is an error naming the file; it is never reset, because a
//! reset would hand out live addresses a second time.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use tether_trusted_fs::{Open, Place, TrustError, TrustedDir};

use serde::{Deserialize, Serialize};

use crate::model::Lease;
use crate::store::{BackendFailure, CasResult, LeaseStore, StoreError, Taken, validate_claim};

/// Version of the state file layout this code reads and writes.
pub const FORMAT_VERSION: u32 = 1;

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
         that are in use a second time: repair the file, or move it aside once no pod on this node uses the network"
    )]
    Corrupt {
        /// State file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The state file was written by a newer tether.
    #[error(
        "lease state file {path} has format {found}, but this tether understands only format {FORMAT_VERSION}: \
         install a tether at least as new as the one that wrote it"
    )]
    UnsupportedFormat {
        /// State file.
        path: PathBuf,
        /// Format found.
        found: u64,
    },
    /// The state file belongs to another network name.
    #[error("lease state file {path} belongs to network {found:?}, not {expected:?}")]
    WrongNetwork {
        /// State file.
        path: PathBuf,
        /// Network recorded in the file.
        found: String,
        /// Network asked for.
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
            StoreError::Failed(f) => f.downcast_ref::<FileStoreError>(),
            _ => None,
        }
    }
}

/// Shown as it is, transient exactly when [`FileStoreError::is_transient`].
impl From<FileStoreError> for StoreError {
    fn from(e: FileStoreError) -> StoreError {
        let transient = e.is_transient();
        StoreError::Failed(BackendFailure::new(e, transient))
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct StateFile {
    format: u32,
    network: String,
    next_version: u64,
    leases: Vec<Lease>,
}

#[derive(Deserialize)]
struct Header {
    format: Option<serde_json::Value>,
}

/// The node-local file store. Cheap to create; every handle (in any thread or process) on the
/// same directory serialises through the per-network lock file.
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

impl FileStore {
    /// A store keeping its files in `dir` (created on first use).
    pub fn new(dir: impl Into<PathBuf>) -> FileStore {
        FileStore { dir: dir.into() }
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Path of the state file of `network`.
    pub fn state_path(&self, network: &str) -> PathBuf {
        self.dir.join(format!("{}.json", file_stem(network)))
    }

    /// Path of the lock file of `network`.
    pub fn lock_path(&self, network: &str) -> PathBuf {
        self.dir.join(format!("{}.lock", file_stem(network)))
    }

    /// The networks that have a state file here, by the exact name each file records.
    pub fn networks(&self) -> Result<Vec<String>, FileStoreError> {
        #[derive(Deserialize)]
        struct Name {
            network: String,
        }
        let dir = match TrustedDir::open(DATA_DIR_KEY, &self.dir, Place::State, false) {
            Ok(d) => d,
            Err(TrustError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Ok(Vec::new());
            }
            Err(e) => return Err(FileStoreError::Dir(e)),
        };
        let mut names = Vec::new();
        for entry in dir.entries().map_err(FileStoreError::Dir)? {
            let Some(name) = entry.to_str().filter(|n| n.ends_with(".json")) else {
                continue;
            };
            if !dir.is_file(name) {
                continue;
            }
            let path = dir.join(name);
            let Some(bytes) = read_file(&dir, name)? else {
                continue;
            };
            // Anything else someone put in the directory is not ours to judge; opening the network
            // itself still reports a damaged state file.
            match serde_json::from_slice::<Name>(&bytes) {
                Ok(n) => names.push(n.network),
                Err(e) => log::debug!("{} is not a lease state file: {e}", path.display()),
            }
        }
        names.sort();
        Ok(names)
    }

    /// Run `f` as one read-modify-write transaction under the network's lock. The new state is
    /// written (atomically) only if `f` returns `Ok` and changed something.
    pub fn transaction<R, E: From<StoreError>>(
        &self,
        network: &str,
        f: impl FnOnce(&mut Transaction<'_>) -> Result<R, E>,
    ) -> Result<R, E> {
        let (dir, _lock) = self.lock(network).map_err(|e| E::from(e.into()))?;
        let mut state = load(&dir, network).map_err(|e| E::from(e.into()))?;
        let mut txn = Transaction {
            network,
            state: &mut state,
            dirty: false,
        };
        let out = f(&mut txn)?;
        if txn.dirty {
            save(&dir, network, &mut state).map_err(|e| E::from(e.into()))?;
        }
        Ok(out)
    }

    /// The data directory, opened (created 0700 when missing) and checked.
    pub fn open_dir(&self) -> Result<TrustedDir, FileStoreError> {
        TrustedDir::open(DATA_DIR_KEY, &self.dir, Place::State, true).map_err(FileStoreError::Dir)
    }

    fn lock(&self, network: &str) -> Result<(TrustedDir, File), FileStoreError> {
        let dir = self.open_dir()?;
        let name = format!("{}.lock", file_stem(network));
        let file = dir
            .open_file(&name, Open::Lock)
            .map_err(FileStoreError::Dir)?
            .expect("a lock file is created");
        loop {
            match file.lock() {
                Ok(()) => return Ok((dir, file)),
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
}

/// The config key a data directory comes from (in error messages).
const DATA_DIR_KEY: &str = "ipam.dataDir";

/// The whole of `name` in `dir`, or `None` when there is no such file.
fn read_file(dir: &TrustedDir, name: &str) -> Result<Option<Vec<u8>>, FileStoreError> {
    let Some(mut f) = dir
        .open_file(name, Open::Read)
        .map_err(FileStoreError::Dir)?
    else {
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

fn load(dir: &TrustedDir, network: &str) -> Result<StateFile, FileStoreError> {
    let name = format!("{}.json", file_stem(network));
    let path = dir.join(&name);
    let Some(bytes) = read_file(dir, &name)? else {
        return Ok(StateFile {
            format: FORMAT_VERSION,
            network: network.to_string(),
            next_version: 1,
            leases: Vec::new(),
        });
    };
    let corrupt = |detail: String| FileStoreError::Corrupt {
        path: path.clone(),
        detail,
    };
    let header: Header =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("not a JSON object ({e})")))?;
    match header.format.as_ref().map(|v| v.as_u64()) {
        None => return Err(corrupt("no \"format\" field".to_string())),
        Some(None) => return Err(corrupt(format!("\"format\" is {}", header.format.unwrap()))),
        Some(Some(n)) if n == FORMAT_VERSION as u64 => {}
        Some(Some(0)) => return Err(corrupt("\"format\" is 0".to_string())),
        Some(Some(found)) => {
            return Err(FileStoreError::UnsupportedFormat { path, found });
        }
    }
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    let state: StateFile = serde_path_to_error::deserialize(de)
        .map_err(|e| corrupt(format!("at {}: {}", e.path(), e.inner())))?;
    if state.network != network {
        return Err(FileStoreError::WrongNetwork {
            path,
            found: state.network,
            expected: network.to_string(),
        });
    }
    let mut seen = std::collections::HashSet::<IpAddr>::new();
    for l in &state.leases {
        if l.network != network {
            return Err(corrupt(format!(
                "record of {} names network {:?}",
                l.address, l.network
            )));
        }
        if !seen.insert(l.address) {
            return Err(corrupt(format!("two records for {}", l.address)));
        }
        if l.version.is_none() {
            return Err(corrupt(format!("record of {} has no version", l.address)));
        }
    }
    Ok(state)
}

fn save(dir: &TrustedDir, network: &str, state: &mut StateFile) -> Result<(), FileStoreError> {
    state.leases.sort_by_key(|a| a.address);
    let mut bytes = serde_json::to_vec_pretty(state).expect("lease state serialises");
    bytes.push(b'\n');
    let name = format!("{}.json", file_stem(network));
    let tmp = format!(".{name}.tmp");
    let werr = |p: PathBuf| move |source| FileStoreError::Write { path: p, source };
    {
        let mut f = dir
            .open_file(&tmp, Open::Replace)
            .map_err(FileStoreError::Dir)?
            .expect("a temporary file is created");
        f.write_all(&bytes).map_err(werr(dir.join(&tmp)))?;
        f.sync_all().map_err(werr(dir.join(&tmp)))?;
    }
    dir.rename(&tmp, &name).map_err(FileStoreError::Dir)?;
    dir.sync().map_err(FileStoreError::Dir)?;
    Ok(())
}

/// An open read-modify-write transaction on one network's state (see [`FileStore::transaction`]).
/// Same semantics as the [`LeaseStore`] methods, applied in memory and written once at the end.
pub struct Transaction<'a> {
    network: &'a str,
    state: &'a mut StateFile,
    dirty: bool,
}

impl Transaction<'_> {
    /// The network.
    pub fn network(&self) -> &str {
        self.network
    }

    /// Every record.
    pub fn leases(&self) -> &[Lease] {
        &self.state.leases
    }

    /// The record of `address`, if any.
    pub fn get(&self, address: IpAddr) -> Option<&Lease> {
        self.state.leases.iter().find(|l| l.address == address)
    }

    /// See [`LeaseStore::claim`].
    pub fn claim(&mut self, mut new: Lease, expected: Option<&Lease>) -> CasResult<Lease> {
        if new.network != self.network {
            return Err(StoreError::Invalid(format!(
                "claim of {} for network {} in the state of network {}",
                new.address, new.network, self.network
            )));
        }
        validate_claim(&new, expected)?;
        let pos = self
            .state
            .leases
            .iter()
            .position(|l| l.address == new.address);
        match (pos, expected) {
            (Some(p), None) => {
                return Ok(Err(Taken {
                    current: Some(self.state.leases[p].clone()),
                }));
            }
            (None, Some(_)) => return Ok(Err(Taken { current: None })),
            (Some(p), Some(e)) if self.state.leases[p].version != e.version => {
                return Ok(Err(Taken {
                    current: Some(self.state.leases[p].clone()),
                }));
            }
            _ => {}
        }
        new.version = Some(self.bump());
        match pos {
            Some(p) => self.state.leases[p] = new.clone(),
            None => self.state.leases.push(new.clone()),
        }
        self.dirty = true;
        Ok(Ok(new))
    }

    /// See [`LeaseStore::remove`].
    pub fn remove(&mut self, expected: &Lease) -> CasResult<()> {
        if expected.network != self.network {
            return Err(StoreError::Invalid(format!(
                "removal of {} of network {} in the state of network {}",
                expected.address, expected.network, self.network
            )));
        }
        match self
            .state
            .leases
            .iter()
            .position(|l| l.address == expected.address)
        {
            None => Ok(Err(Taken { current: None })),
            Some(p)
                if self.state.leases[p].version != expected.version
                    || expected.version.is_none() =>
            {
                Ok(Err(Taken {
                    current: Some(self.state.leases[p].clone()),
                }))
            }
            Some(p) => {
                self.state.leases.remove(p);
                self.dirty = true;
                Ok(Ok(()))
            }
        }
    }

    fn bump(&mut self) -> String {
        let v = self.state.next_version;
        self.state.next_version += 1;
        v.to_string()
    }
}

impl LeaseStore for FileStore {
    fn list(&self, network: &str) -> Result<Vec<Lease>, StoreError> {
        self.transaction(network, |t| Ok::<_, StoreError>(t.leases().to_vec()))
    }

    fn claim(&self, new: Lease, expected: Option<&Lease>) -> CasResult<Lease> {
        let network = new.network.clone();
        self.transaction(&network, |t| t.claim(new, expected))
    }

    fn remove(&self, expected: &Lease) -> CasResult<()> {
        self.transaction(&expected.network, |t| t.remove(expected))
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
