//! The operator's two views of one long-lived API client: the lease store ([`KubeStore`]) and
//! the cluster reader ([`Cluster`]: pods, nodes, NADs, Events, the election Lease), sharing its
//! connection, time budget and counters.

use tether_cluster::Cluster;
use tether_kube_store::{ApiClient, KubeSettings, KubeStore};

use crate::options::long_lived;

/// The lease store and the cluster reader over one client.
pub struct Kube {
    /// IPLease objects.
    pub leases: KubeStore,
    /// Everything else the operator reads or writes.
    pub cluster: Cluster,
}

impl Kube {
    /// Connect one long-lived client (see [`long_lived`]) for both; sends no request.
    pub fn connect(settings: &KubeSettings) -> Result<Kube, String> {
        let settings = long_lived(settings);
        let api = ApiClient::connect(&settings).map_err(|e| e.to_string())?;
        Ok(Kube {
            cluster: Cluster::new(api.clone()),
            leases: KubeStore::on(api, settings),
        })
    }

    /// Start a new time budget for the next operation (both views share it).
    pub fn restart_budget(&self) {
        self.leases.restart_budget()
    }
}
