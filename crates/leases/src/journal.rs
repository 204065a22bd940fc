//! The node journal: which leases of a cluster-wide store this node's attachments hold.
//!
//! A store that can only be read by point lookups (the Kubernetes store: one object per address)
//! cannot afford a LIST per ADD or DEL. The engine finds an attachment's leases here instead, and
//! goes straight to their objects: DEL is one conditional write per address, a repeated ADD one
//! GET. Only this node's attachments are recorded, so the journal stays as small as the node's
//! pod count, whatever the size of the cluster.
//!
//! Layout: `<dir>/<network stem>/` holds one file per attachment, named
//! `<hash(containerID, ifname)>.<hash(namespace, pod, ifname) or ->.json`, so an attachment and
//! the other sandboxes of the same pod are both found with one `readdir`. Every lease the engine
//! is about to claim is written here *before* the claim, so a process killed between the claim
//! and its record cannot leave a lease nobody knows of. Files are replaced atomically (write to a
//! temporary name, rename); one attachment is never worked on by two processes at once (CNI
//! runs no parallel operations for one container), so no lock is needed for them.
//!
//! The journal is authoritative only once `.complete` exists in the network's directory: a
//! missing entry then means "this node holds no lease for that attachment". When the directory is
//! new (first use of a network on this node, an upgrade from a version without the journal, a
//! wiped `/var/lib`), the store rebuilds it once from a LIST narrowed to this node and network
//! ([`FileJournal::rebuild`]), under `.lock`.
//!
//! What the journal says is a hint, never the truth: every record read from it is verified
//! against the store (by the compare-and-swap of a write, or a GET) before it is acted on —
//! with one exception, while the store cannot be reached: a DEL is then recorded as a pending
//! release, and an ADD for a sandbox re-created for the same pod object is answered with the
//! addresses the journal says that pod holds, recorded as a pending re-key (see
//! `engine::offline`). A claim whose answer never came stays in its attachment's entry, marked
//! unanswered, until fenced. `.pending` exists while any entry has such work left; every call
//! that reaches the store finishes it first.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tether_trusted_fs::{Open, Place, TrustError, TrustedDir};

use crate::file::file_stem;
use crate::model::{Lease, PodRef};
use crate::store::{AttachmentIndex, BackendFailure, JournalEntry, Lookup, StoreError};

/// Errors of the journal files.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The journal's directory, or a file in it, cannot be used safely (see tether-trusted-fs).
    #[error("the node's lease journal: {0}")]
    Dir(TrustError),
    /// A journal file or directory could not be read.
    #[error(
        "cannot read the node's lease journal {path}: {source}; check that the CNI data directory is a writable host directory"
    )]
    Read {
        /// The path.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// A journal file could not be written.
    #[error(
        "cannot write the node's lease journal {path}: {source}; check that the CNI data directory is a writable host directory"
    )]
    Write {
        /// The path.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
}

impl From<JournalError> for StoreError {
    fn from(e: JournalError) -> StoreError {
        let transient = matches!(&e, JournalError::Dir(t) if t.is_transient());
        StoreError::Backend(BackendFailure::new(e, transient))
    }
}

/// Whether `e` says the directory does not exist.
fn is_missing(e: &TrustError) -> bool {
    matches!(e, TrustError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
}

/// A network's directory and the names of its entries.
type Listing = (Arc<TrustedDir>, Vec<String>);

/// The journal in a directory of this node (`<dataDir>/journal`).
///
/// A network's directory, once opened and checked (walked from `/`, see tether-trusted-fs), is
/// kept while it exists: one CNI call asks a dozen times, and each walk is a dozen system calls,
/// where checking that the kept one was not removed is one. The handle pins what was checked.
#[derive(Debug, Clone)]
pub struct FileJournal {
    dir: PathBuf,
    opened: Arc<Mutex<HashMap<String, Arc<TrustedDir>>>>,
}

fn hash_hex(parts: &[&str]) -> String {
    let mut key = Vec::new();
    for p in parts {
        key.extend_from_slice(p.as_bytes());
        key.push(0);
    }
    format!("{:016x}", tether_stable_hash::fnv1a64(&key, 0))
}

fn attachment_key(container_id: &str, ifname: &str) -> String {
    hash_hex(&[container_id, ifname])
}

/// The pod part of a file name: `-` when the pod's namespace or name is unknown.
fn pod_key(pod: &PodRef, ifname: &str) -> String {
    match (&pod.namespace, &pod.name) {
        (Some(ns), Some(n)) => hash_hex(&[ns, n, ifname]),
        _ => "-".to_string(),
    }
}

const COMPLETE: &str = ".complete";
const PENDING: &str = ".pending";
const LOCK: &str = ".lock";

impl FileJournal {
    /// A journal under `dir` (created on first write, 0700).
    pub fn new(dir: impl Into<PathBuf>) -> FileJournal {
        FileJournal {
            dir: dir.into(),
            opened: Arc::default(),
        }
    }

    /// The journal's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn read_err(path: &Path) -> impl FnOnce(io::Error) -> JournalError + '_ {
        move |source| JournalError::Read {
            path: path.to_path_buf(),
            source,
        }
    }

    fn write_err(path: &Path) -> impl FnOnce(io::Error) -> JournalError + '_ {
        move |source| JournalError::Write {
            path: path.to_path_buf(),
            source,
        }
    }

    /// The network's directory, checked (created 0700 with `create`); `None` when it does not
    /// exist and `create` is off. Kept once opened.
    fn net(&self, network: &str, create: bool) -> Result<Option<Arc<TrustedDir>>, JournalError> {
        let lock = || self.opened.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = lock().get(network).filter(|d| d.exists()) {
            return Ok(Some(d.clone()));
        }
        let Some(d) = self.open_net(network, create)? else {
            return Ok(None);
        };
        let d = Arc::new(d);
        lock().insert(network.to_string(), d.clone());
        Ok(Some(d))
    }

    fn open_net(&self, network: &str, create: bool) -> Result<Option<TrustedDir>, JournalError> {
        let Some(root) = self.root(create)? else {
            return Ok(None);
        };
        match root.subdir(&file_stem(network), create) {
            Ok(d) => Ok(Some(d)),
            Err(e) if !create && is_missing(&e) => Ok(None),
            Err(e) => Err(JournalError::Dir(e)),
        }
    }

    /// The journal's own directory, checked (created 0700 with `create`); `None` when it does
    /// not exist and `create` is off.
    fn root(&self, create: bool) -> Result<Option<TrustedDir>, JournalError> {
        match TrustedDir::open(
            "ipam.dataDir (its journal/)",
            &self.dir,
            Place::State,
            create,
        ) {
            Ok(d) => Ok(Some(d)),
            Err(e) if !create && is_missing(&e) => Ok(None),
            Err(e) => Err(JournalError::Dir(e)),
        }
    }

    /// Is the journal of `network` authoritative (complete) on this node?
    pub fn is_complete(&self, network: &str) -> bool {
        self.net(network, false)
            .ok()
            .flatten()
            .is_some_and(|d| d.is_file(COMPLETE))
    }

    /// Make the journal of `network` complete from `leases` (this node's records of the network,
    /// from the store), once: under the network's lock, unless another process finished first.
    /// Entries that exist are kept (they are at least as new as a LIST); Leased records of
    /// attachments without an entry get one.
    pub fn rebuild(
        &self,
        network: &str,
        list: impl FnOnce() -> Result<Vec<Lease>, StoreError>,
    ) -> Result<(), StoreError> {
        let d = self.net(network, true)?.expect("created");
        let lock = d.open_file(LOCK, Open::Lock).map_err(JournalError::Dir)?;
        lock.lock().map_err(Self::write_err(&d.join(LOCK)))?;
        if d.is_file(COMPLETE) {
            return Ok(());
        }
        let leases = list()?;
        let existing = self.entries(network)?;
        let mut fresh: Vec<JournalEntry> = Vec::new();
        for l in leases.into_iter().filter(|l| l.is_leased()) {
            if existing
                .iter()
                .any(|e| e.container_id == l.container_id && e.ifname == l.ifname)
            {
                continue;
            }
            match fresh
                .iter_mut()
                .find(|e| e.container_id == l.container_id && e.ifname == l.ifname)
            {
                Some(e) => e.leases.push(l),
                None => fresh.push(JournalEntry {
                    container_id: l.container_id.clone(),
                    ifname: l.ifname.clone(),
                    pod: l.pod.clone(),
                    leases: vec![l],
                    pending: None,
                }),
            }
        }
        for e in &fresh {
            self.record(network, e)?;
        }
        d.open_file(COMPLETE, Open::Replace)
            .map_err(JournalError::Dir)?;
        log::info!(
            "network {network}: rebuilt this node's lease journal in {} ({} attachment(s) found in the store)",
            d.path().display(),
            fresh.len()
        );
        Ok(())
    }

    fn file_name(e: &JournalEntry) -> String {
        format!(
            "{}.{}.json",
            attachment_key(&e.container_id, &e.ifname),
            pod_key(&e.pod, &e.ifname)
        )
    }

    fn read_entry(d: &TrustedDir, name: &str) -> Result<Option<JournalEntry>, JournalError> {
        let path = d.join(name);
        let Some(mut f) = d.read_file(name).map_err(JournalError::Dir)? else {
            return Ok(None);
        };
        let mut b = Vec::new();
        f.read_to_end(&mut b).map_err(Self::read_err(&path))?;
        match serde_json::from_slice(&b) {
            Ok(e) => Ok(Some(e)),
            // A damaged entry is only a lost hint: the store still holds the truth, and the
            // reconciler reclaims a lease nobody finds.
            Err(err) => {
                log::warn!(
                    "ignoring damaged lease journal entry {}: {err}",
                    path.display()
                );
                Ok(None)
            }
        }
    }

    /// The network's directory and its entry file names (none when it does not exist).
    fn names(&self, network: &str) -> Result<Option<Listing>, JournalError> {
        let Some(d) = self.net(network, false)? else {
            return Ok(None);
        };
        let names = Self::entry_names(&d)?;
        Ok(Some((d, names)))
    }

    /// The entry file names in a network's directory `d`.
    fn entry_names(d: &TrustedDir) -> Result<Vec<String>, JournalError> {
        let mut out = Vec::new();
        for n in d.entries().map_err(JournalError::Dir)? {
            if let Some(n) = n.to_str()
                && n.ends_with(".json")
                && !n.starts_with('.')
            {
                out.push(n.to_string());
            }
        }
        Ok(out)
    }

    /// Every entry of every network on this node (none when the journal does not exist yet):
    /// what the node's reconciler compares with the store. Each entry's leases name their
    /// network.
    pub fn every_entry(&self) -> Result<Vec<JournalEntry>, JournalError> {
        let Some(root) = self.root(false)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for net in root.entries().map_err(JournalError::Dir)? {
            let Some(net) = net.to_str().filter(|n| !n.starts_with('.')) else {
                continue;
            };
            let d = match root.subdir(net, false) {
                Ok(d) => d,
                // Removed meanwhile: nothing to read.
                Err(e) if is_missing(&e) => continue,
                // A stray file or a symlink is nobody's journal, and never followed.
                Err(e @ TrustError::UnfitFile { .. }) => {
                    log::warn!("ignoring {e} in the node's lease journal");
                    continue;
                }
                Err(e) => return Err(JournalError::Dir(e)),
            };
            for n in Self::entry_names(&d)? {
                out.extend(Self::read_entry(&d, &n)?);
            }
        }
        Ok(out)
    }
}

/// A store whose attachment index is a node journal it makes authoritative for a network before
/// each use (rebuilt once from the store's records of this node when it is not): the Kubernetes
/// store, directly or through the node-agent.
pub trait JournalBacked {
    /// `network`'s journal, authoritative.
    fn journal_for(&self, network: &str) -> Result<&FileJournal, StoreError>;
}

impl<T: JournalBacked> AttachmentIndex for T {
    fn lookup(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        pod: &PodRef,
    ) -> Result<Lookup, StoreError> {
        self.journal_for(network)?
            .lookup(network, container_id, ifname, pod)
    }
    fn record(&self, network: &str, entry: &JournalEntry) -> Result<(), StoreError> {
        self.journal_for(network)?.record(network, entry)
    }
    fn entries(&self, network: &str) -> Result<Vec<JournalEntry>, StoreError> {
        self.journal_for(network)?.entries(network)
    }
    fn take_pending(&self, network: &str) -> Result<Vec<JournalEntry>, StoreError> {
        self.journal_for(network)?.take_pending(network)
    }
}

impl AttachmentIndex for FileJournal {
    fn lookup(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
        pod: &PodRef,
    ) -> Result<Lookup, StoreError> {
        let a = attachment_key(container_id, ifname);
        let p = pod_key(pod, ifname);
        let mut out = Lookup::default();
        let Some((d, names)) = self.names(network)? else {
            return Ok(out);
        };
        for n in names {
            let Some((fa, rest)) = n.split_once('.') else {
                continue;
            };
            let fp = rest.trim_end_matches(".json");
            let mine = fa == a;
            let same_pod = p != "-" && fp == p;
            if !mine && !same_pod {
                continue;
            }
            let Some(e) = Self::read_entry(&d, &n)? else {
                continue;
            };
            if e.container_id == container_id && e.ifname == ifname {
                out.mine = Some(e);
            } else if same_pod && e.ifname == ifname && e.pod.same_name(pod) {
                out.same_pod.push(e);
            }
        }
        Ok(out)
    }

    fn record(&self, network: &str, entry: &JournalEntry) -> Result<(), StoreError> {
        let d = self.net(network, true)?.expect("created");
        let name = Self::file_name(entry);
        // Marked before the entry is written: a concurrent take_pending either sees the entry
        // or leaves the mark.
        if entry.pending.is_some() && !entry.leases.is_empty() {
            d.open_file(PENDING, Open::Replace)
                .map_err(JournalError::Dir)?;
        }
        if entry.leases.is_empty() {
            return d.remove(&name).map_err(|e| JournalError::Dir(e).into());
        }
        let body = serde_json::to_vec(entry).expect("a journal entry serialises");
        let tmp = format!(".{name}.tmp.{}", std::process::id());
        let write = || -> Result<(), JournalError> {
            let mut f = d
                .open_file(&tmp, Open::Replace)
                .map_err(JournalError::Dir)?;
            f.write_all(&body).map_err(Self::write_err(&d.join(&tmp)))?;
            // No fsync: the journal guards against a killed process (the page cache survives
            // it); after a power loss the pods are re-created and the reconciler reclaims.
            d.rename(&tmp, &name).map_err(JournalError::Dir)
        };
        write().map_err(|e| {
            let _ = d.remove(&tmp);
            StoreError::from(e)
        })
    }

    fn entries(&self, network: &str) -> Result<Vec<JournalEntry>, StoreError> {
        let mut out = Vec::new();
        let Some((d, names)) = self.names(network)? else {
            return Ok(out);
        };
        for n in names {
            if let Some(e) = Self::read_entry(&d, &n)? {
                out.push(e);
            }
        }
        Ok(out)
    }

    fn take_pending(&self, network: &str) -> Result<Vec<JournalEntry>, StoreError> {
        let Some(d) = self.net(network, false)? else {
            return Ok(Vec::new());
        };
        if !d.is_file(PENDING) {
            return Ok(Vec::new());
        }
        // The mark goes first: whatever is recorded with work left from now on marks again.
        d.remove(PENDING).map_err(JournalError::Dir)?;
        Ok(self
            .entries(network)?
            .into_iter()
            .filter(|e| e.pending.is_some() && !e.leases.is_empty())
            .collect())
    }
}
