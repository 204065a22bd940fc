//! tether-ipam: a CNI plugin when a runtime calls it (CNI_COMMAND set), a CLI when a person does.

fn main() {
    let cni = std::env::var_os("CNI_COMMAND").is_some_and(|c| !c.is_empty());
    if !cni && std::env::args_os().len() > 1 {
        // A person piping into `head` expects a quiet exit, not a panic on EPIPE.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        std::process::exit(tether_ipam::cli::run(std::env::args_os().collect()));
    }
    tether_cni::run_main(&tether_ipam::Ipam)
}
