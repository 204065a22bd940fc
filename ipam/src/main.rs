//! tether-ipam: the CNI entry point.

fn main() {
    tether_cni::run_main(&tether_ipam::Ipam)
}
