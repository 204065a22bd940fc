//! The state files themselves: a domain's (format 2), a network's from before uniqueness domains
//! (format 1, only read, to move it), their checks, atomic writes, and the transaction that reads
//! and writes one.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tether_trusted_fs::{Open, TrustedDir};

use super::{
    FORMAT_VERSION, FileStoreError, PER_NETWORK_FORMAT, domain_stem, file_stem, lock_in, owner,
    read_file,
};
use crate::model::Lease;
use crate::store::{CasResult, StoreError, Taken, validate_claim};
use std::io::Write;

/// A domain's state file.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StateFile {
    pub(super) format: u32,
    pub(super) domain: Option<String>,
    pub(super) next_version: u64,
    pub(super) leases: Vec<Lease>,
}

/// A network's state file as tether wrote it before uniqueness domains.
#[derive(Debug, Deserialize)]
pub(super) struct NetworkStateFile {
    pub(super) network: String,
    pub(super) leases: Vec<Lease>,
}

#[derive(Deserialize)]
struct Header {
    format: Option<serde_json::Value>,
}

/// The bytes of a state file of format `want`, parsed; any other format is an error naming it.
pub(super) fn parse_state<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    path: &Path,
    want: u32,
) -> Result<T, FileStoreError> {
    let corrupt = |detail: String| FileStoreError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };
    let header: Header =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not a JSON object ({e})")))?;
    match header.format.as_ref().map(|v| v.as_u64()) {
        None => return Err(corrupt("no \"format\" field".to_string())),
        Some(None) => return Err(corrupt(format!("\"format\" is {}", header.format.unwrap()))),
        Some(Some(n)) if n == want as u64 => {}
        Some(Some(n)) if n == 0 || n < FORMAT_VERSION as u64 => {
            return Err(corrupt(format!(
                "\"format\" is {n} where format {want} belongs"
            )));
        }
        Some(Some(found)) => {
            return Err(FileStoreError::UnsupportedFormat {
                path: path.to_path_buf(),
                found,
            });
        }
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de)
        .map_err(|e| corrupt(format!("at {}: {}", e.path(), e.inner())))
}

/// Each address at most once, and every record stored (with a version).
pub(super) fn check_records(leases: &[Lease], path: &Path) -> Result<(), FileStoreError> {
    let mut seen = std::collections::HashSet::<IpAddr>::new();
    for l in leases {
        let corrupt = |detail: String| FileStoreError::Corrupt {
            path: path.to_path_buf(),
            detail,
        };
        if !seen.insert(l.address) {
            return Err(corrupt(format!("two records for {}", l.address)));
        }
        if l.version.is_none() {
            return Err(corrupt(format!("record of {} has no version", l.address)));
        }
    }
    Ok(())
}

pub(super) fn load(dir: &TrustedDir, domain: Option<&str>) -> Result<StateFile, FileStoreError> {
    let name = format!("{}.json", domain_stem(domain));
    let path = dir.join(&name);
    let Some(bytes) = read_file(dir, &name)? else {
        return Ok(StateFile {
            format: FORMAT_VERSION,
            domain: domain.map(str::to_string),
            next_version: 1,
            leases: Vec::new(),
        });
    };
    let state: StateFile = parse_state(&bytes, &path, FORMAT_VERSION)?;
    if state.domain.as_deref() != domain {
        return Err(FileStoreError::WrongOwner {
            path,
            found: owner(state.domain.as_deref()),
            expected: owner(domain),
        });
    }
    if let Some(l) = state.leases.iter().find(|l| !l.in_domain(domain)) {
        return Err(FileStoreError::Corrupt {
            path,
            detail: format!(
                "record of {} is in {}",
                l.address,
                owner(l.domain.as_deref())
            ),
        });
    }
    check_records(&state.leases, &path)?;
    Ok(state)
}

/// Move `network`'s own state file, from before uniqueness domains, into `state` (its domain's,
/// read under the domain's lock), holding the old file's lock too; the domain's state is saved
/// before the old file is removed, so a crash in between only repeats the move. An address both
/// hold keeps the leased record (of two leased ones, the domain's), and says so.
pub(super) fn move_network_file(
    dir: &TrustedDir,
    network: &str,
    state: &mut StateFile,
) -> Result<(), FileStoreError> {
    let stem = file_stem(network);
    let name = format!("{stem}.json");
    if !dir.is_file(&name) {
        return Ok(());
    }
    let _lock = lock_in(dir, &stem)?;
    let path = dir.join(&name);
    let Some(bytes) = read_file(dir, &name)? else {
        return Ok(()); // moved meanwhile
    };
    let old: NetworkStateFile = parse_state(&bytes, &path, PER_NETWORK_FORMAT)?;
    if old.network != network {
        return Err(FileStoreError::WrongOwner {
            path,
            found: format!("network {:?}", old.network),
            expected: format!("network {network:?}"),
        });
    }
    if let Some(l) = old.leases.iter().find(|l| l.network != network) {
        return Err(FileStoreError::Corrupt {
            path,
            detail: format!("record of {} names network {:?}", l.address, l.network),
        });
    }
    check_records(&old.leases, &path)?;
    let domain = state.domain.clone();
    let moved = old.leases.len();
    for mut l in old.leases {
        l.domain = domain.clone();
        let pos = state.leases.iter().position(|h| h.address == l.address);
        let keep_old = match pos.map(|p| &state.leases[p]) {
            None => true,
            Some(here) if same_record(here, &l) => false,
            Some(here) if here.is_leased() && l.is_leased() => {
                log::error!(
                    "{}: {} is leased twice on this node, to container {} of network {} and (in {}, from before \
                     uniqueness domains) to container {} of network {}; keeping the first: one of the two pods \
                     must be given another address",
                    dir.join(&format!("{}.json", domain_stem(domain.as_deref())))
                        .display(),
                    l.address,
                    here.container_id,
                    here.network,
                    path.display(),
                    l.container_id,
                    l.network
                );
                false
            }
            Some(here) => l.is_leased() || (!here.is_leased() && l.since > here.since),
        };
        if keep_old {
            l.version = Some(state.next_version.to_string());
            state.next_version += 1;
            match pos {
                Some(p) => state.leases[p] = l,
                None => state.leases.push(l),
            }
        }
    }
    save(dir, domain.as_deref(), state)?;
    dir.remove(&name).map_err(FileStoreError::Dir)?;
    dir.sync().map_err(FileStoreError::Dir)?;
    log::info!(
        "moved {moved} record(s) of network {network} from {} into {}'s state",
        path.display(),
        owner(domain.as_deref())
    );
    Ok(())
}

/// The same record, whatever its version.
fn same_record(a: &Lease, b: &Lease) -> bool {
    Lease {
        version: None,
        ..a.clone()
    } == Lease {
        version: None,
        ..b.clone()
    }
}

pub(super) fn save(
    dir: &TrustedDir,
    domain: Option<&str>,
    state: &mut StateFile,
) -> Result<(), FileStoreError> {
    state.leases.sort_by_key(|a| a.address);
    let mut bytes = serde_json::to_vec_pretty(state).expect("lease state serialises");
    bytes.push(b'\n');
    let name = format!("{}.json", domain_stem(domain));
    let tmp = format!(".{name}.tmp");
    let werr = |p: PathBuf| move |source| FileStoreError::Write { path: p, source };
    {
        let mut f = dir
            .open_file(&tmp, Open::Replace)
            .map_err(FileStoreError::Dir)?;
        f.write_all(&bytes).map_err(werr(dir.join(&tmp)))?;
        f.sync_all().map_err(werr(dir.join(&tmp)))?;
    }
    dir.rename(&tmp, &name).map_err(FileStoreError::Dir)?;
    dir.sync().map_err(FileStoreError::Dir)?;
    Ok(())
}

/// An open read-modify-write transaction on one domain's state (see [`FileStore::transaction`]).
/// Same semantics as the [`LeaseStore`] methods, applied in memory and written once at the end.
pub struct Transaction<'a> {
    pub(super) domain: Option<&'a str>,
    pub(super) state: &'a mut StateFile,
    pub(super) dirty: bool,
}

impl Transaction<'_> {
    /// The domain.
    pub fn domain(&self) -> Option<&str> {
        self.domain
    }

    /// Every record of the domain, of every network.
    pub fn leases(&self) -> &[Lease] {
        &self.state.leases
    }

    /// The record of `address`, if any.
    pub fn get(&self, address: IpAddr) -> Option<&Lease> {
        self.state.leases.iter().find(|l| l.address == address)
    }

    /// See [`LeaseStore::claim`].
    pub fn claim(&mut self, mut new: Lease, expected: Option<&Lease>) -> CasResult<Lease> {
        if !new.in_domain(self.domain) {
            return Err(StoreError::Invalid(format!(
                "claim of {} in {} in the state of {}",
                new.address,
                owner(new.domain.as_deref()),
                owner(self.domain)
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
        if !expected.in_domain(self.domain) {
            return Err(StoreError::Invalid(format!(
                "removal of {} in {} in the state of {}",
                expected.address,
                owner(expected.domain.as_deref()),
                owner(self.domain)
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
