//! The pod-label LISTs of ADDs that arrive together, sent as one.
//!
//! Every new ADD asks for the records naming its pod (its sticky address, on any node): one LIST
//! from the API server's watch cache, which the server answers by scanning the network's leases
//! (no index by label). When a node starts many pods at once, the service sends one LIST per
//! batch instead (`ipam.tether.dev/pod in (...)`): the first ADD's goes at once, and the ADDs that
//! ask while a LIST is on its way wait for it and go together in the next one. Each gets exactly
//! its pod's records, as from a LIST of its own; at one ADD at a time nothing waits.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use tether_kube_store::{KubeStore, KubeStoreError};
use tether_leases::{Lease, PodRef, StoreError};

/// At most this many pods in one LIST (its selector stays a few kilobytes).
const MAX_BATCH: usize = 64;

#[derive(Default)]
struct Queue {
    /// A LIST of this network is on its way.
    busy: bool,
    waiting: Vec<(u64, PodRef)>,
    done: HashMap<u64, Result<Vec<Lease>, (String, bool)>>,
    next: u64,
}

#[derive(Default)]
struct Network {
    queue: Mutex<Queue>,
    changed: Condvar,
}

/// See the module docs.
#[derive(Default)]
pub struct PodLookups {
    networks: Mutex<HashMap<String, Arc<Network>>>,
    /// LISTs sent.
    lists: std::sync::atomic::AtomicU64,
}

impl PodLookups {
    /// LISTs sent so far.
    pub fn lists(&self) -> u64 {
        self.lists.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The records of `network` naming `pod`, from a LIST shared with the pods asking at the
    /// same time.
    pub fn lookup(
        &self,
        store: &KubeStore,
        network: &str,
        pod: PodRef,
    ) -> Result<Vec<Lease>, StoreError> {
        if pod.namespace.is_none() || pod.name.is_none() {
            return Ok(Vec::new());
        }
        let net = self
            .networks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(network.to_string())
            .or_default()
            .clone();
        let mut q = net.queue.lock().unwrap_or_else(|p| p.into_inner());
        let ticket = q.next;
        q.next += 1;
        q.waiting.push((ticket, pod));
        loop {
            if let Some(r) = q.done.remove(&ticket) {
                return r.map_err(|(message, transient)| StoreError::Backend {
                    message,
                    transient,
                    source: None,
                });
            }
            if q.busy {
                q = net.changed.wait(q).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            // Nobody is listing: send the queue (this ADD's pod among it).
            q.busy = true;
            let take = q.waiting.len().min(MAX_BATCH);
            let batch: Vec<(u64, PodRef)> = q.waiting.drain(..take).collect();
            drop(q);
            let pods: Vec<PodRef> = batch.iter().map(|(_, p)| p.clone()).collect();
            self.lists
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let answer = store.by_pods(network, &pods);
            q = net.queue.lock().unwrap_or_else(|p| p.into_inner());
            for (t, p) in batch {
                q.done.insert(t, share(&answer, &p));
            }
            q.busy = false;
            net.changed.notify_all();
        }
    }
}

/// `pod`'s part of a batch's answer.
fn share(
    answer: &Result<Vec<Lease>, KubeStoreError>,
    pod: &PodRef,
) -> Result<Vec<Lease>, (String, bool)> {
    match answer {
        Ok(all) => Ok(all
            .iter()
            .filter(|l| l.pod.same_name(pod))
            .cloned()
            .collect()),
        Err(e) => Err((e.to_string(), e.is_transient())),
    }
}
