//! The stored objects: kinds, their serialised form, the one `resourceVersion` counter every
//! object shares, and the event history watches replay.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::{GROUP, PLURAL};

const HISTORY: usize = 10_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Lease,
    Pod,
    Node,
}

impl Kind {
    pub(crate) fn resource(self) -> &'static str {
        match self {
            Kind::Lease => PLURAL,
            Kind::Pod => "pods",
            Kind::Node => "nodes",
        }
    }
    pub(crate) fn group(self) -> &'static str {
        match self {
            Kind::Lease => GROUP,
            Kind::Pod | Kind::Node => "",
        }
    }
    pub(crate) fn qualified(self) -> String {
        match self {
            Kind::Lease => format!("{PLURAL}.{GROUP}"),
            Kind::Pod => "pods".to_string(),
            Kind::Node => "nodes".to_string(),
        }
    }
    pub(crate) fn list_kind(self) -> &'static str {
        match self {
            Kind::Lease => "IPLeaseList",
            Kind::Pod => "PodList",
            Kind::Node => "NodeList",
        }
    }
    pub(crate) fn api_version(self) -> &'static str {
        match self {
            Kind::Lease => "ipam.tether.dev/v1alpha1",
            Kind::Pod | Kind::Node => "v1",
        }
    }
}

/// A stored object with its serialised form (lists concatenate these).
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) value: Value,
    pub(crate) json: Bytes,
}

impl Stored {
    pub(crate) fn new(value: Value) -> Arc<Stored> {
        let json = Bytes::from(serde_json::to_vec(&value).expect("JSON value serialises"));
        Arc::new(Stored { value, json })
    }
    pub(crate) fn rv(&self) -> u64 {
        self.value
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }
}

#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) kind: Kind,
    pub(crate) type_: &'static str,
    pub(crate) rv: u64,
    pub(crate) obj: Arc<Stored>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) rv: u64,
    pub(crate) leases: BTreeMap<String, Arc<Stored>>,
    /// Key `namespace/name`.
    pub(crate) pods: BTreeMap<String, Arc<Stored>>,
    pub(crate) nodes: BTreeMap<String, Arc<Stored>>,
    pub(crate) history: VecDeque<Arc<Event>>,
    /// Events with a resourceVersion above this are all in `history`.
    pub(crate) history_floor: u64,
}

impl State {
    pub(crate) fn map(&mut self, kind: Kind) -> &mut BTreeMap<String, Arc<Stored>> {
        match kind {
            Kind::Lease => &mut self.leases,
            Kind::Pod => &mut self.pods,
            Kind::Node => &mut self.nodes,
        }
    }
    pub(crate) fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }
    pub(crate) fn record(&mut self, ev: Arc<Event>, tx: &broadcast::Sender<Arc<Event>>) {
        if self.history.len() >= HISTORY
            && let Some(old) = self.history.pop_front()
        {
            self.history_floor = old.rv;
        }
        self.history.push_back(ev.clone());
        let _ = tx.send(ev);
    }
}

pub(crate) fn key(ns: Option<&str>, name: &str) -> String {
    match ns {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

pub(crate) fn meta_str<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get("metadata")
        .and_then(|m| m.get(k))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}
