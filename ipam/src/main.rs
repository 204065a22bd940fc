//! tether-ipam: the IPAM plugin a CNI runtime execs for every pod (CNI_COMMAND set). It holds the
//! CNI verbs only; the operator commands and the node-agent are the `tether` binary.

fn main() {
    let cni_command = std::env::var_os("CNI_COMMAND");
    let cni = cni_command.as_ref().is_some_and(|c| !c.is_empty());
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    // `--version` is run_main's to answer; any other word is a person typing an operator command
    // here, as before the split: say where it went.
    if !cni && !args.is_empty() && !tether_cni::asks_version(cni_command.as_deref(), &args) {
        let words: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
        eprintln!(
            "tether-ipam is the CNI plugin and takes no commands but --version; the operator commands and the \
             node-agent are the `tether` binary: run `tether {}`",
            words.join(" ")
        );
        std::process::exit(2);
    }
    tether_cni::run_main(&tether_ipam::plugin::Ipam)
}
