//! tether: the operator and node-agent program (`leases`, `release`, `doctor`, `validate`,
//! `reconcile`, `node-agent`). See tether_operator.

fn main() {
    // A closed pipe (`tether leases | head`) ends the program quietly, as for any CLI.
    // SAFETY: at the start of main, before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    std::process::exit(tether_operator::cli::run(std::env::args_os().collect()));
}
