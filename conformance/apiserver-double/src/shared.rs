//! The state every connection shares: the objects, the knobs, the request counters and the
//! event feed watches follow.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::broadcast;

use crate::objects::{Event, State};

/// What every connection shares: the objects, the knobs, the counters, the event feed.
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) latency_us: AtomicU64,
    pub(crate) crd_installed: AtomicBool,
    /// How many more IPLease lists from the watch cache answer 429 (a cache still filling).
    pub(crate) cache_unready: AtomicU64,
    pub(crate) forbidden: Mutex<HashSet<(String, String)>>,
    /// (verb, resource, namespace): 403 on requests in that namespace only.
    pub(crate) forbidden_in: Mutex<HashSet<(String, String, String)>>,
    pub(crate) counts: Mutex<BTreeMap<String, u64>>,
    pub(crate) events: broadcast::Sender<Arc<Event>>,
    pub(crate) user: String,
}

impl Shared {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}
