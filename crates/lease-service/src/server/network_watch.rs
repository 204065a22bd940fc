//! The networks the service keeps: each watched from the first request about it (a LIST, then a
//! WATCH from its resourceVersion, listed again when the watch expires or fails), into a
//! [`NetworkLeases`] the answers read.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tether_cluster::{ListWatch, Resume};
use tether_kube_store::KubeStoreError;

use super::Shared;
use crate::network_cache::{MAX_LIST_BYTES, NetworkLeases, Standing};

impl Shared {
    /// `network`'s cache, its watch started on the first ask; `None` once stopping or when too
    /// many networks are kept.
    pub(super) fn network(self: &Arc<Self>, network: &str) -> Option<Arc<NetworkLeases>> {
        if self.stopping.load(Ordering::SeqCst) {
            return None;
        }
        let Some((cache, new)) = self.networks.entry(network) else {
            log::debug!(
                "lease service: {network} is past the networks kept; asking the API server"
            );
            return None;
        };
        if new {
            let (sh, net, c) = (self.clone(), network.to_string(), cache.clone());
            let spawned = std::thread::Builder::new()
                .name("lease-watch".into())
                .spawn(move || sh.keep_network(&net, &c));
            match spawned {
                Ok(h) => self
                    .watchers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(h),
                Err(e) => {
                    log::warn!("lease service: cannot watch network {network}: {e}");
                    cache.unsynced();
                }
            }
        }
        Some(cache)
    }

    /// `network`'s cache when it can answer: its first list waited for (a node's first ADD in
    /// a network), no longer.
    pub(super) fn kept(self: &Arc<Self>, network: &str) -> Option<Arc<NetworkLeases>> {
        self.network(network)
            .filter(|c| c.standing(WARM_UP) == Standing::Synced)
    }

    /// List `network`'s records, then watch them; list again after an expired watch, with
    /// back-off after a failure (answers go to the API meanwhile). A network too big to keep is
    /// left alone. One network is listed at a time: a list's answer is the largest thing the
    /// service holds.
    fn keep_network(&self, network: &str, cache: &NetworkLeases) {
        let stop = || self.stopping.load(Ordering::SeqCst);
        let too_big = |why: &dyn std::fmt::Display| {
            log::warn!(
                "lease service: network {network} is not kept in memory ({why}); its plugins' requests go to the API server"
            );
        };
        let synced = || cache.standing(Duration::ZERO) == Standing::Synced;
        let list = || {
            let store = self.store();
            store.restart_budget();
            let listed = {
                let _one = self.listing.lock().unwrap_or_else(|p| p.into_inner());
                store.list_network_at(network, MAX_LIST_BYTES)
            };
            match listed {
                Ok((leases, rv)) => {
                    let (n, room) = (leases.len(), self.networks.room(network));
                    cache.replace_all(leases, room);
                    if synced() {
                        Ok(Some(rv))
                    } else {
                        too_big(&format_args!("{n} records, room for {room}"));
                        Ok(None)
                    }
                }
                Err(e @ KubeStoreError::TooLarge { .. }) => {
                    cache.unsynced();
                    too_big(&e);
                    Ok(None)
                }
                Err(e) => Err(e.to_string()),
            }
        };
        // Until stopping, or the network grows past its room (then listed again).
        let keep_watching = || !stop() && synced();
        let watch = |rv: &str| {
            // Each round with the current credential (the agent renews its token).
            let ended = self.store().watch_network(
                network,
                rv,
                Duration::from_secs(300),
                &keep_watching,
                |c| cache.apply(c),
            );
            match ended {
                // Grown past its room: read whole again (or given up) rather than resumed.
                Ok(_) if !synced() => Ok(Resume::Relist),
                other => other.map(Resume::from).map_err(|e| e.to_string()),
            }
        };
        ListWatch {
            what: &format!("lease service: network {network}"),
            first_wait: Duration::from_secs(1),
            max_wait: Duration::from_secs(30),
            level: log::Level::Warn,
        }
        .run(&|| !stop(), list, watch, || cache.unsynced());
    }
}

/// How long a node's first request about a network waits for the network's first list.
const WARM_UP: Duration = Duration::from_secs(2);
