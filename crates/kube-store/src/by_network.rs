//! Records named by network: what tether wrote before uniqueness domains (`<network>.<address>`,
//! unique per network only), honoured while a tether of that time may still run, and moved into
//! their domains.
//!
//! During an upgrade old and new node-agents run side by side, and an old tether-ipam reads and
//! claims only `<network>.<address>`. So, while the controller has not seen every node-agent
//! run this version ([`KubeSettings::legacy_mirrors`](crate::KubeSettings::legacy_mirrors) on),
//! every write of a domain's record keeps a mirror under its network's name
//! ([`MIRROR_LABEL`](crate::crd::MIRROR_LABEL)), written after the record itself: an old
//! tether-ipam finds the address taken, and a claim whose mirror an old one holds (it leased
//! the address first) loses and is undone. Whoever claims the mirror name second loses, so one
//! address has one holder across both versions (within a network: that is all an old tether
//! ever promised). Kubernetes moved its Service IPs to `IPAddress` objects the same way, writing
//! both while its old allocator could still run.
//!
//! [`KubeStore::adopt`] moves records named by network into their domains: the node-agent its
//! node's when it starts (before its plugins are installed, so they find every lease of the node
//! under its domain's name), the controller everyone's. While mirrors are kept, a moved record
//! stays behind as the mirror; once every agent runs this version the controller deletes them.

use tether_leases::{Lease, LeaseState, StoreError, Taken};

use crate::convert::{Naming, naming_of};
use crate::crd::{network_object_name, object_name};
use crate::error::KubeStoreError;
use crate::store::KubeStore;

/// Writes of one mirror before giving up (someone else keeps changing it).
const MIRROR_ATTEMPTS: usize = 4;

/// What one [`KubeStore::adopt`] pass did.
#[derive(Debug, Default)]
pub struct Adoption {
    /// Records named by network now in their domains.
    pub moved: usize,
    /// Mirrors deleted (mirrors no longer kept).
    pub mirrors_deleted: usize,
    /// Records named by network left as they are: a race lost (the next pass retries), or a
    /// duplicate.
    pub left: usize,
    /// Two holders of one address of a domain: the domain's record and one named by network,
    /// both leased to different attachments (possible only where two networks overlapped before
    /// uniqueness domains, or an old tether leased what a new one held in another network).
    pub duplicates: Vec<(Lease, Lease)>,
    /// What failed, per record.
    pub errors: Vec<String>,
}

/// The same holder and state, whatever the version, network or domain.
fn same_holding(a: &Lease, b: &Lease) -> bool {
    a.address == b.address
        && a.container_id == b.container_id
        && a.ifname == b.ifname
        && a.pod == b.pod
        && a.node == b.node
        && a.state == b.state
}

/// The mirror of `l`: the same record for its network's name (which holds no fabric).
fn mirror_of(l: &Lease) -> Lease {
    Lease {
        domain: None,
        version: None,
        ..l.clone()
    }
}

/// Does `c` (read under a network's name) block the address for a new claim of another
/// attachment? Only what an old tether holds: its lease, or its quarantine. A mirror says what
/// the domain's record said, and the claim just won that record.
fn held_the_old_way(c: &Lease, now: &Lease) -> bool {
    naming_of(c) == Naming::ByNetwork
        && matches!(c.state, LeaseState::Leased | LeaseState::Quarantined { .. })
        && !c.is_attachment(&now.container_id, &now.ifname)
}

impl KubeStore {
    /// Are mirrors kept for a write of `l`? While the switch is on, for a domain's record.
    pub(crate) fn keeps_mirrors(&self, l: &Lease) -> bool {
        self.settings.legacy_mirrors.on() && naming_of(l) == Naming::Domain
    }

    /// After a claim stored `stored` (replacing `expected`), keep its mirror in step. A mirror an
    /// old tether holds makes the claim lose: it is undone, and that holder returned.
    pub(crate) fn mirror_claim(
        &self,
        stored: Lease,
        expected: Option<&Lease>,
    ) -> Result<Result<Lease, Taken>, StoreError> {
        match self.follow(&stored)? {
            Ok(()) => Ok(Ok(stored)),
            Err(holder) => {
                log::info!(
                    "{} is leased under {} by a tether-ipam from before uniqueness domains; moving on",
                    stored.address,
                    network_object_name(&stored.network, stored.address)
                );
                self.undo(&stored, expected)?;
                Ok(Err(Taken {
                    current: Some(holder),
                }))
            }
        }
    }

    /// Bring the mirror of `now` in step with it: a lease is mirrored as a lease (made when
    /// missing), a release or quarantine only where the mirror said this attachment held it.
    /// `Err(holder)` when an old tether holds the name.
    fn follow(&self, now: &Lease) -> Result<Result<(), Lease>, KubeStoreError> {
        let name = network_object_name(&now.network, now.address);
        let want = mirror_of(now);
        // A new lease's mirror is usually missing: made at once, read only when that fails.
        let mut current = if now.is_leased() {
            match self.create_named(&want, Naming::Mirror)? {
                Ok(_) => return Ok(Ok(())),
                Err(Taken { current }) => current,
            }
        } else {
            self.get_object(&name)?
        };
        for _ in 0..MIRROR_ATTEMPTS {
            let step = match current {
                None if !now.is_leased() => return Ok(Ok(())),
                None => self.create_named(&want, Naming::Mirror)?.map(drop),
                Some(c) if now.is_leased() && held_the_old_way(&c, now) => return Ok(Err(c)),
                Some(c) if naming_of(&c) == Naming::Mirror && same_holding(&c, &want) => {
                    return Ok(Ok(()));
                }
                Some(c)
                    if now.is_leased()
                        || naming_of(&c) == Naming::Mirror
                        || (c.is_leased() && c.is_attachment(&now.container_id, &now.ifname)) =>
                {
                    self.replace_named(&want, &c, Naming::Mirror)?.map(drop)
                }
                Some(_) => return Ok(Ok(())),
            };
            match step {
                Ok(()) => return Ok(Ok(())),
                Err(Taken { current: c }) => current = c,
            }
        }
        Err(KubeStoreError::Contention {
            what: format!("the mirror {name} of {}", now.address),
            attempts: MIRROR_ATTEMPTS,
        })
    }

    /// Put back what a claim replaced (`expected`), or delete what it created.
    fn undo(&self, stored: &Lease, expected: Option<&Lease>) -> Result<(), KubeStoreError> {
        let undone = match expected {
            None => self.delete_object(stored)?,
            Some(e) => {
                let back = Lease {
                    version: None,
                    ..e.clone()
                };
                self.replace_named(&back, stored, Naming::Domain)?.map(drop)
            }
        };
        undone.map_err(|t| KubeStoreError::Contention {
            what: format!(
                "undoing the claim of {} after its mirror was found held ({t})",
                stored.address
            ),
            attempts: 1,
        })
    }

    /// After `removed` (a domain's record) was deleted: its mirror too, if it still mirrors
    /// that holder. Best effort: a mirror left behind only keeps an old tether from the address.
    pub(crate) fn forget_mirror(&self, removed: &Lease) {
        let name = network_object_name(&removed.network, removed.address);
        let gone = self.get_object(&name).and_then(|c| match c {
            Some(c)
                if naming_of(&c) != Naming::Domain
                    && c.is_attachment(&removed.container_id, &removed.ifname) =>
            {
                self.delete_object(&c).map(drop)
            }
            _ => Ok(()),
        });
        if let Err(e) = gone {
            log::warn!("removing the mirror {name}: {e}");
        }
    }

    /// Move the records named by network among `records` (a list of every kind, see
    /// [`crate::Kinds::All`]) into their domains (`domain_of` a network: where its NADs put it,
    /// `None` the cluster): each gets its domain's record (created, or taking over one nobody
    /// holds), then becomes that record's mirror (`keep_mirrors`) or is deleted. Mirrors are
    /// deleted when not kept. Every write is conditional; what loses a race is left for the next
    /// pass. Two holders of one address are reported, never resolved here.
    pub fn adopt(
        &self,
        records: &[Lease],
        domain_of: &dyn Fn(&str) -> Option<String>,
        keep_mirrors: bool,
    ) -> Adoption {
        let mut out = Adoption::default();
        for l in records {
            let done = match naming_of(l) {
                Naming::Domain => continue,
                Naming::Mirror if keep_mirrors => continue,
                Naming::Mirror => self.delete_object(l).map(|r| {
                    if r.is_ok() {
                        out.mirrors_deleted += 1;
                    }
                }),
                Naming::ByNetwork => {
                    self.adopt_one(l, domain_of(&l.network), keep_mirrors, &mut out)
                }
            };
            if let Err(e) = done {
                out.errors.push(format!(
                    "{}: {e}",
                    network_object_name(&l.network, l.address)
                ));
            }
        }
        out
    }

    /// Give every leased or quarantined domain record among `records` (a list of every kind) a
    /// mirror where it has none: records written while mirrors were off have none, and a tether
    /// from before uniqueness domains may run again (a DaemonSet rolled back). How many were
    /// made, and what failed; a mirror name taken meanwhile is left to the writers.
    pub fn ensure_mirrors(&self, records: &[Lease]) -> (usize, Vec<String>) {
        let named: std::collections::HashSet<String> = records
            .iter()
            .filter(|l| naming_of(l) != Naming::Domain)
            .map(|l| network_object_name(&l.network, l.address))
            .collect();
        let (mut made, mut errors) = (0, Vec::new());
        for l in records.iter().filter(|l| {
            naming_of(l) == Naming::Domain && !matches!(l.state, LeaseState::Released { .. })
        }) {
            let name = network_object_name(&l.network, l.address);
            if named.contains(&name) {
                continue;
            }
            match self.create_named(&mirror_of(l), Naming::Mirror) {
                Ok(Ok(_)) => made += 1,
                Ok(Err(_)) => {}
                Err(e) => errors.push(format!("{name}: {e}")),
            }
        }
        (made, errors)
    }

    fn adopt_one(
        &self,
        l: &Lease,
        domain: Option<String>,
        keep_mirrors: bool,
        out: &mut Adoption,
    ) -> Result<(), KubeStoreError> {
        let target = Lease {
            domain,
            version: None,
            ..l.clone()
        };
        let name = object_name(target.domain.as_deref(), l.address);
        let held = self.get_object(&name)?;
        let record = match held {
            None => self.create_named(&target, Naming::Domain)?,
            Some(c) if same_holding(&c, &target) => Ok(c),
            Some(c) if c.is_leased() && l.is_leased() => {
                log::error!(
                    "{} is leased twice: to container {} (network {}, {name}) and to container {} (network {}, {} \
                     from before uniqueness domains); one of the two pods must be given another address",
                    l.address,
                    c.container_id,
                    c.network,
                    l.container_id,
                    l.network,
                    network_object_name(&l.network, l.address)
                );
                out.duplicates.push((c, l.clone()));
                out.left += 1;
                return Ok(());
            }
            Some(c) if l.is_leased() => self.replace_named(&target, &c, Naming::Domain)?,
            // The domain's record is the newer truth: the old one only becomes its mirror.
            Some(c) => Ok(c),
        };
        let Ok(record) = record else {
            out.left += 1;
            return Ok(());
        };
        let settled = if keep_mirrors {
            let want = if record.network == l.network {
                mirror_of(&record)
            } else {
                mirror_of(l)
            };
            self.replace_named(&want, l, Naming::Mirror)?.map(drop)
        } else {
            self.delete_object(l)?
        };
        match settled {
            Ok(()) => out.moved += 1,
            Err(_) => out.left += 1,
        }
        Ok(())
    }
}

/// The file, beside the plugins' kubeconfig, in which the node-agent tells the plugins whether
/// to keep mirrors (the controller's word, see `tether controller`): `{"mirrorLegacyNames":
/// true}`.
pub const MIRROR_SWITCH_FILE: &str = "lease-names.json";

/// The largest switch file read.
const MAX_SWITCH_FILE: u64 = 4096;

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct MirrorSwitch {
    mirror_legacy_names: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    reason: String,
}

/// Whether the plugins of this node keep mirrors, as the node-agent wrote beside `kubeconfig`
/// ([`MIRROR_SWITCH_FILE`]): no file (no node-agent wrote one: no tether from before uniqueness
/// domains can be running here) is off; a file root does not own is not the agent's, and is
/// ignored; one that cannot be read or understood is on, the safe side.
pub fn mirrors_wanted(kubeconfig: &std::path::Path) -> bool {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let Some(path) = kubeconfig.parent().map(|d| d.join(MIRROR_SWITCH_FILE)) else {
        return false;
    };
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
        Err(e) => {
            log::warn!("{}: {e}; keeping mirrors of leases", path.display());
            return true;
        }
    };
    match file.metadata() {
        Ok(m) if m.is_file() && m.uid() == 0 => {}
        Ok(m) => {
            log::warn!(
                "{} is not a regular file of root's (uid {}); ignoring it",
                path.display(),
                m.uid()
            );
            return false;
        }
        Err(e) => {
            log::warn!("{}: {e}; keeping mirrors of leases", path.display());
            return true;
        }
    }
    let mut text = String::new();
    let read = file.take(MAX_SWITCH_FILE).read_to_string(&mut text);
    match read
        .map_err(|e| e.to_string())
        .and_then(|_| serde_json::from_str::<MirrorSwitch>(&text).map_err(|e| e.to_string()))
    {
        Ok(s) => s.mirror_legacy_names,
        Err(e) => {
            log::warn!("{}: {e}; keeping mirrors of leases", path.display());
            true
        }
    }
}

/// The switch file's content: mirrors `on` or off, and why (for whoever reads the file).
pub fn mirror_switch_text(on: bool, reason: &str) -> String {
    let s = MirrorSwitch {
        mirror_legacy_names: on,
        reason: reason.to_string(),
    };
    let mut t = serde_json::to_string_pretty(&s).expect("the switch serialises");
    t.push('\n');
    t
}
