//! What one ADD has read and written: its view of the store, the records it wrote (for the
//! rollback) the node journal and the conflict probe while it runs. Shared by the ADD, the claim and the offline
//! path.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use super::probe_step::ProbeStep;
use crate::model::Lease;
use crate::store::{AttachmentIndex, JournalEntry, Lookup};

/// A record this ADD wrote, with the record it replaced (for rollback).
pub(super) struct Written {
    pub(super) now: Lease,
    pub(super) prev: Option<Lease>,
}

/// The node journal while an ADD runs (point mode).
pub(super) struct Journaling<'j> {
    pub(super) index: &'j dyn AttachmentIndex,
    /// This attachment's entry: every address it holds or is about to claim.
    pub(super) entry: JournalEntry,
    /// What the journal knew before the ADD.
    pub(super) lookup: Lookup,
}

/// What one ADD has read and written.
#[derive(Default)]
pub(super) struct Call<'j> {
    /// Records known: every record of the network once `complete` (a snapshot), else those
    /// read so far.
    pub(super) view: HashMap<IpAddr, Lease>,
    /// Point mode: the addresses read or written (present in `view` or known absent).
    pub(super) seen: HashSet<IpAddr>,
    pub(super) complete: bool,
    /// Records written, for rollback.
    pub(super) written: Vec<Written>,
    pub(super) journal: Option<Journaling<'j>>,
    /// Point mode: the records naming this pod from the store's index by pod identity, read
    /// once per call (`None`: not read yet; empty when the store has no such index).
    pub(super) by_pod: Option<Vec<Lease>>,
    /// The conflict probe of this ADD: what waits for it, what it proved.
    pub(super) probes: ProbeStep,
    /// Point mode: claims of this attachment whose answer never came (this call's, and those an
    /// earlier call left unsettled). They stay journaled until fenced (see `offline`).
    pub(super) unanswered: Vec<Lease>,
}
