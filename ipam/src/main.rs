//! tether-ipam: a CNI plugin when a runtime calls it (CNI_COMMAND set), a CLI when a person does.

use std::cell::RefCell;
use std::net::IpAddr;

use serde_json::{Map, Value};
use tether_cni::result::PROBED_KEY;
use tether_cni::{CniError, CniResult, Plugin, Request};
use tether_ipam::{Ipam, prober};

/// The plugin, with the probes of an ADD's ranges run at the same time ([`prober::add_probing`]) and
/// the addresses they proved unused noted in the Result for tether-ipvlan ([`PROBED_KEY`]).
#[derive(Default)]
struct Cni {
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
    fn result_extras(&self) -> Map<String, Value> {
        let probed = self.probed.borrow();
        if probed.is_empty() {
            return Map::new();
        }
        [(PROBED_KEY.to_string(), probed.iter().map(|a| Value::from(a.to_string())).collect())].into_iter().collect()
    }
}

fn main() {
    let cni = std::env::var_os("CNI_COMMAND").is_some_and(|c| !c.is_empty());
    if !cni && std::env::args_os().len() > 1 {
        // A person piping into `head` expects a quiet exit, not a panic on EPIPE.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        std::process::exit(tether_ipam::cli::run(std::env::args_os().collect()));
    }
    tether_cni::run_main(&Cni::default())
}
