//! [`Cni`]: what the `tether-ipam` binary runs — [`Ipam`] with the probes of an ADD's ranges run at
//! the same time ([`prober::add_probing`]) and the addresses they proved unused noted in the Result
//! for tether-ipvlan ([`PROBED_KEY`]).

use std::cell::RefCell;
use std::net::IpAddr;

use serde_json::{Map, Value};
use tether_cni::result::PROBED_KEY;
use tether_cni::{CniError, CniResult, Plugin, Request};

use super::{Ipam, prober};

/// The plugin, with the probes of an ADD's ranges run at the same time ([`prober::add_probing`]) and
/// the addresses they proved unused noted in the Result for tether-ipvlan ([`PROBED_KEY`]).
#[derive(Default)]
pub struct Cni {
    probed: RefCell<Vec<IpAddr>>,
}

impl Plugin for Cni {
    fn name(&self) -> &'static str {
        Ipam.name()
    }
    fn add(&self, req: &Request) -> Result<CniResult, CniError> {
        let (r, probed) = prober::add_probing(|| Ipam.add(req), || Ipam.del(req))?;
        *self.probed.borrow_mut() = probed;
        Ok(r)
    }
    fn del(&self, req: &Request) -> Result<(), CniError> {
        Ipam.del(req)
    }
    fn check(&self, req: &Request) -> Result<(), CniError> {
        Ipam.check(req)
    }
    fn status(&self, req: &Request) -> Result<(), CniError> {
        Ipam.status(req)
    }
    fn gc(&self, req: &Request) -> Result<(), CniError> {
        Ipam.gc(req)
    }
    fn after_reply(&self) {
        prober::close_spent();
    }
    fn result_extras(&self) -> Map<String, Value> {
        let probed = self.probed.borrow();
        if probed.is_empty() {
            return Map::new();
        }
        [(
            PROBED_KEY.to_string(),
            probed.iter().map(|a| Value::from(a.to_string())).collect(),
        )]
        .into_iter()
        .collect()
    }
}
