//! tether-ipam: the IPAM plugin a CNI runtime execs for every pod (CNI_COMMAND set). It holds the
//! CNI verbs only; the operator commands and the node-agent are the `tether` binary.

fn main() {
    let cni = std::env::var_os("CNI_COMMAND").is_some_and(|c| !c.is_empty());
    if !cni && std::env::args_os().len() > 1 {
        // A person typing an operator command here, as before the split: say where it went.
        let args: Vec<String> = std::env::args().skip(1).collect();
        eprintln!(
            "tether-ipam is the CNI plugin and takes no commands; the operator commands and the node-agent are \
             the `tether` binary: run `tether {}`",
            args.join(" ")
        );
        std::process::exit(2);
    }
    tether_cni::run_main(&tether_ipam::plugin::Ipam)
}
