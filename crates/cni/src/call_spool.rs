//! What each CNI call leaves for the node-agent's metrics: one small record (plugin, verb, network,
//! CNI code, duration) in a root-only directory, `/run/tether/calls`. The agent takes the records
//! in and counts them; while it is away (restarting, rolling to a new image) they wait there, so
//! no call goes uncounted.
//!
//! A file per call rather than a message on the lease socket: the record is written after the
//! reply is out, whether or not an agent answers, and a record is either whole (written under a
//! temporary name, then renamed) or absent. Only root can write the directory
//! ([`TrustedDir`]), so nobody else can forge or flood records; a spool left to grow (no agent
//! for a long time) stops taking records at [`MAX_SPOOL_BYTES`].

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tether_trusted_fs::{Open, Place, TrustError, TrustedDir};

/// Where the records go unless [`SPOOL_ENV`] says otherwise.
pub const SPOOL_DIR: &str = "/run/tether/calls";

/// Moves [`SPOOL_DIR`] (set by the runtime or a test, never by a NAD); empty: no records.
pub const SPOOL_ENV: &str = "TETHER_CALL_SPOOL";

/// The directory size (tmpfs: 20 bytes an entry) past which no record is added: about 100,000
/// calls waiting for an agent that is not coming back.
pub const MAX_SPOOL_BYTES: u64 = 2 << 20;

/// A record's most bytes: more is not one of ours.
const MAX_RECORD: u64 = 4096;

/// A temporary record older than this was left by a plugin that died mid-write.
const STALE_PART: Duration = Duration::from_secs(60);

const RECORD_SUFFIX: &str = ".call";
const PART_PREFIX: &str = ".part-";

/// One CNI call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    /// The binary: `tether-ipvlan`, `tether-ipam`.
    pub plugin: String,
    /// `ADD`, `DEL`, `CHECK`, `STATUS`, `GC`, `VERSION`; `unknown` for a command that is none.
    pub verb: String,
    /// The configuration's `name`; empty when the call failed before it was read.
    pub network: String,
    /// The CNI error code; 0 for success.
    pub code: u32,
    /// From the plugin's start to its reply.
    pub seconds: f64,
}

/// What one invocation was, for its record: known once the dispatcher is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub verb: &'static str,
    /// Empty until the configuration was read.
    pub network: String,
    pub code: u32,
}

impl Call {
    /// Leave this call's record (`seconds` from the plugin's start to its reply) in the spool,
    /// when the node has one. A failure here never fails the call: it is only logged.
    pub fn leave_record(self, plugin: &str, seconds: f64) {
        let Some(path) = spool_path() else {
            return;
        };
        let record = CallRecord {
            plugin: plugin.to_string(),
            verb: self.verb.to_string(),
            network: self.network,
            code: self.code,
            seconds,
        };
        if let Err(e) = Spool::existing(&path).and_then(|s| s.map(|s| s.write(&record)).transpose())
        {
            log::debug!("not recording this call for the node-agent: {e}");
        }
    }
}

/// The spool directory this process should use: `$TETHER_CALL_SPOOL`, else [`SPOOL_DIR`]; `None`
/// when the variable is set empty.
pub fn spool_path() -> Option<PathBuf> {
    match std::env::var_os(SPOOL_ENV) {
        Some(v) if v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => Some(PathBuf::from(SPOOL_DIR)),
    }
}

/// The spool directory, opened and checked.
#[derive(Debug)]
pub struct Spool {
    dir: TrustedDir,
}

/// Records taken from the spool, with the names to remove once they are counted.
#[derive(Debug, Default)]
pub struct Taken {
    pub records: Vec<CallRecord>,
    /// Every file read (records and unreadable ones alike).
    pub names: Vec<OsString>,
    /// Files that were not a record (not counted, removed with the rest).
    pub unreadable: usize,
}

impl Spool {
    /// The plugin's side: the spool at `path` when it exists (the agent creates it); `Ok(None)`
    /// on a node without one.
    pub fn existing(path: &Path) -> Result<Option<Spool>, TrustError> {
        if !path.is_dir() {
            return Ok(None);
        }
        Self::open(path, false).map(Some)
    }

    /// The agent's side: the spool at `path`, created (0700) when missing.
    pub fn open(path: &Path, create: bool) -> Result<Spool, TrustError> {
        let dir = TrustedDir::open("call spool", path, Place::State, create)?;
        Ok(Spool { dir })
    }

    /// The directory, for the agent's own files beside the records.
    pub fn dir(&self) -> &TrustedDir {
        &self.dir
    }

    /// Leave `record` for the agent; nothing when the spool is full. Returns whether it was written.
    pub fn write(&self, record: &CallRecord) -> Result<bool, TrustError> {
        if self.dir.byte_size()? > MAX_SPOOL_BYTES {
            return Ok(false);
        }
        let pid = std::process::id();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let part = format!("{PART_PREFIX}{pid}");
        let name = format!("{nanos}-{pid}{RECORD_SUFFIX}");
        let mut line = serde_json::to_vec(record).expect("a record serializes");
        line.push(b'\n');
        let written = self.dir.open_file(&part, Open::Replace)?.write_all(&line);
        if let Err(source) = written {
            let _ = self.dir.remove(&part);
            return Err(TrustError::Io {
                op: "writing",
                path: self.dir.join(&part),
                source,
            });
        }
        self.dir.rename(&part, &name)?;
        Ok(true)
    }

    /// The agent's side: every whole record now in the spool (at most `limit` files), and the
    /// temporary files of plugins that died mid-write among the names to remove.
    pub fn take(&self, limit: usize) -> Result<Taken, TrustError> {
        let mut taken = Taken::default();
        for name in self.dir.entries()? {
            if taken.names.len() >= limit {
                break;
            }
            let Some(text) = name.to_str() else {
                taken.unreadable += 1;
                taken.names.push(name);
                continue;
            };
            if text.starts_with(PART_PREFIX) {
                if self.is_stale_part(text) {
                    taken.names.push(name);
                }
                continue;
            }
            if !text.ends_with(RECORD_SUFFIX) {
                continue;
            }
            match self.read_record(text) {
                Some(r) => taken.records.push(r),
                None => taken.unreadable += 1,
            }
            taken.names.push(name);
        }
        Ok(taken)
    }

    /// Remove what [`Spool::take`] returned, once it is counted.
    pub fn forget(&self, names: &[OsString]) -> Result<(), TrustError> {
        for name in names.iter().filter_map(|n| n.to_str()) {
            self.dir.remove(name)?;
        }
        Ok(())
    }

    fn read_record(&self, name: &str) -> Option<CallRecord> {
        let file = self.dir.read_file(name).ok()??;
        let mut text = String::new();
        file.take(MAX_RECORD).read_to_string(&mut text).ok()?;
        serde_json::from_str(text.trim_end()).ok()
    }

    fn is_stale_part(&self, name: &str) -> bool {
        let modified = self
            .dir
            .read_file(name)
            .ok()
            .flatten()
            .and_then(|f| f.metadata().ok())
            .and_then(|m| m.modified().ok());
        modified.is_some_and(|t| t.elapsed().is_ok_and(|age| age > STALE_PART))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn spool_in(root: &Path) -> (PathBuf, Spool) {
        let path = root.join("calls");
        let spool = Spool::open(&path, true).unwrap();
        (path, spool)
    }

    fn record(verb: &str, code: u32) -> CallRecord {
        CallRecord {
            plugin: "tether-ipam".into(),
            verb: verb.into(),
            network: "mgmt \"pool\"".into(),
            code,
            seconds: 0.012,
        }
    }

    fn scratch() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "tether-spool-{}-{}",
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    #[test]
    fn records_written_are_taken_whole_and_then_forgotten() {
        let root = scratch();
        let (path, spool) = spool_in(&root);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert!(spool.write(&record("ADD", 0)).unwrap());
        assert!(spool.write(&record("DEL", 7)).unwrap());
        // A plugin still writing (or dead mid-write): its temporary file is not a record.
        std::fs::write(path.join(format!("{PART_PREFIX}1")), b"{\"plugin\":").unwrap();
        // Something that is not one of ours, and a file named like a record that is not one.
        std::fs::write(path.join("tally.json"), b"{}").unwrap();
        std::fs::write(path.join("1-1.call"), b"garbage").unwrap();
        let taken = spool.take(100).unwrap();
        let mut verbs: Vec<_> = taken.records.iter().map(|r| r.verb.as_str()).collect();
        verbs.sort();
        assert_eq!(verbs, ["ADD", "DEL"]);
        assert_eq!(taken.records[0].network, "mgmt \"pool\"");
        assert_eq!((taken.names.len(), taken.unreadable), (3, 1));
        spool.forget(&taken.names).unwrap();
        let mut left: Vec<_> = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [format!("{PART_PREFIX}1"), "tally.json".into()]);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn take_stops_at_its_limit_and_leaves_the_rest() {
        let root = scratch();
        let (_, spool) = spool_in(&root);
        for _ in 0..5 {
            spool.write(&record("ADD", 0)).unwrap();
        }
        let first = spool.take(3).unwrap();
        assert_eq!(first.records.len(), 3);
        spool.forget(&first.names).unwrap();
        assert_eq!(spool.take(100).unwrap().records.len(), 2);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_node_without_a_spool_is_no_error_and_a_wide_one_is_refused() {
        let root = scratch();
        assert!(Spool::existing(&root.join("calls")).unwrap().is_none());
        assert!(!root.join("calls").exists(), "the plugin never creates it");
        let open = root.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Spool::existing(&open).unwrap_err();
        assert!(e.to_string().contains("writable by others"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
