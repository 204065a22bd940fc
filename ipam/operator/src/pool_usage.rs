//! How full each network's pool is, from one list of leases: what the controller's `tether_pool_*`
//! gauges and `tether pools` both count. A pool is counted against every record of its domain in its
//! ranges, whichever network holds it (NADs may overlap).

use tether_leases::{
    Allocator, CasResult, Lease, LeaseStore, NoProbe, RangeStatus, Scope, StoreError, SystemClock,
};

use crate::nads::NadNetwork;

/// Leases listed once, read as a store (read only).
pub struct ListedLeases<'a>(pub &'a [Lease]);

impl LeaseStore for ListedLeases<'_> {
    fn list(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        Ok(self
            .0
            .iter()
            .filter(|l| l.in_domain(scope.domain.as_deref()))
            .cloned()
            .collect())
    }
    fn claim(&self, new: Lease, _: Option<&Lease>) -> CasResult<Lease> {
        Err(StoreError::Invalid(format!(
            "a listed set of leases is read only (a claim of {})",
            new.address
        )))
    }
    fn remove(&self, expected: &Lease) -> CasResult<()> {
        Err(StoreError::Invalid(format!(
            "a listed set of leases is read only (a removal of {})",
            expected.address
        )))
    }
}

/// A network as its NADs give it: the first NAD's configuration (by namespace and name), every
/// NAD that names the network, and those whose ranges differ from the first's.
#[derive(Debug, Clone)]
pub struct NetworkOfNads {
    pub first: NadNetwork,
    pub nads: Vec<String>,
    pub other_ranges: Vec<String>,
}

/// One [`NetworkOfNads`] per network name, in name order.
pub fn one_per_network(nets: Vec<NadNetwork>) -> Vec<NetworkOfNads> {
    let mut by_name: std::collections::BTreeMap<String, NetworkOfNads> = Default::default();
    for n in nets {
        match by_name.get_mut(&n.cfg.network_name) {
            Some(first) => {
                if first.first.cfg.ranges != n.cfg.ranges {
                    first.other_ranges.push(n.nad.clone());
                }
                first.nads.push(n.nad);
            }
            None => {
                by_name.insert(
                    n.cfg.network_name.clone(),
                    NetworkOfNads {
                        nads: vec![n.nad.clone()],
                        first: n,
                        other_ranges: Vec::new(),
                    },
                );
            }
        }
    }
    by_name.into_values().collect()
}

/// The counts of each range of `net` against `leases`.
pub fn usage(net: &NadNetwork, leases: &[Lease]) -> Result<Vec<RangeStatus>, String> {
    Allocator::from_config(&net.cfg, &ListedLeases(leases), &NoProbe, &SystemClock)
        .usage()
        .map_err(|e| e.to_string())
}
