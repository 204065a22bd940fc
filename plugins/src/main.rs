//! tether-ipvlan: the CNI entry point. Parsing and validation live in tether-cni, the work in
//! tether-attach; attacher errors become CNI codes in `tether_attach::error`.

use tether_cni::{Added, CniError, Plugin, Request};

struct Ipvlan;

impl Plugin for Ipvlan {
    fn name(&self) -> &'static str {
        "tether-ipvlan"
    }
    fn version(&self) -> String {
        tether_build_info::line(self.name())
    }
    fn add(&self, req: &Request) -> Result<Added, CniError> {
        tether_attach::add(req)
            .map(Added::from)
            .map_err(CniError::from)
    }
    fn del(&self, req: &Request) -> Result<(), CniError> {
        tether_attach::del(req).map_err(CniError::from)
    }
    fn check(&self, req: &Request) -> Result<(), CniError> {
        tether_attach::check(req).map_err(CniError::from)
    }
    fn status(&self, req: &Request) -> Result<(), CniError> {
        tether_attach::status(req)
    }
    fn gc(&self, req: &Request) -> Result<(), CniError> {
        tether_attach::gc(req)
    }
}

fn main() {
    tether_cni::run_main(&Ipvlan)
}
