//! `tether-apiserver-double`: run the Kubernetes API test double as its own process.
//!
//! ```text
//! tether-apiserver-double [--port N] [--latency-ms MS] [--no-crd] [--forbid VERB[:RESOURCE[:NAMESPACE]]]...
//!                         [--kubeconfig-out PATH] [--threads N] [--exit-on-stdin-eof]
//! ```
//!
//! Prints `listening http://127.0.0.1:PORT` on the first line of stdout once it accepts
//! connections. It is a test double, not an API server: see the crate docs.

use std::io::{Read, Write};
use std::time::Duration;

use tether_apiserver_double::{ApiServerDouble, Options};

fn usage() -> ! {
    eprintln!(
        "usage: tether-apiserver-double [--port N] [--latency-ms MS] [--no-crd] [--forbid VERB[:RESOURCE[:NAMESPACE]]]... \
         [--kubeconfig-out PATH] [--threads N] [--exit-on-stdin-eof]\n\
         A test double of the Kubernetes API (IPLease and pod subset), not an API server."
    );
    std::process::exit(2)
}

fn main() {
    let mut opts = Options::default();
    let mut forbid = Vec::new();
    let mut kubeconfig_out = None;
    let mut exit_on_eof = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--port" => opts.port = val().parse().unwrap_or_else(|_| usage()),
            "--latency-ms" => {
                let ms: f64 = val().parse().unwrap_or_else(|_| usage());
                opts.latency = Duration::from_micros((ms * 1000.0) as u64);
            }
            "--no-crd" => opts.crd_installed = false,
            "--forbid" => {
                let v = val();
                let mut parts = v.splitn(3, ':');
                let verb = parts.next().unwrap_or_default().to_string();
                let res = parts.next().unwrap_or("ipleases").to_string();
                forbid.push((verb, res, parts.next().map(str::to_string)));
            }
            "--kubeconfig-out" => kubeconfig_out = Some(val()),
            "--threads" => opts.worker_threads = val().parse().unwrap_or_else(|_| usage()),
            "--exit-on-stdin-eof" => exit_on_eof = true,
            "-h" | "--help" => usage(),
            _ => usage(),
        }
    }
    let double = match ApiServerDouble::start_with(opts) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("tether-apiserver-double: cannot start: {e}");
            std::process::exit(1)
        }
    };
    for (verb, res, ns) in &forbid {
        match ns {
            Some(ns) => double.forbid_in(verb, res, ns),
            None => double.forbid(verb, res),
        }
    }
    if let Some(p) = kubeconfig_out
        && let Err(e) = double.write_kubeconfig(std::path::Path::new(&p))
    {
        eprintln!("tether-apiserver-double: cannot write {p}: {e}");
        std::process::exit(1)
    }
    println!("listening {}", double.url());
    let _ = std::io::stdout().flush();
    if exit_on_eof {
        let mut buf = [0u8; 256];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
        drop(double);
    } else {
        loop {
            std::thread::park();
        }
    }
}
