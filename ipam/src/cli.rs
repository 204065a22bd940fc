//! `tether-ipam` run by a person (CNI_COMMAND unset, arguments given): inspect and repair leases,
//! diagnose a network, run the reconciler.
//!
//! Exit codes scripts can rely on: 0 success; 1 the operation failed or `doctor` found a problem;
//! 2 usage error; 3 refused (`release` of an address whose pod may be alive, without `--force`).

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};
use tether_leases::{FileStore, Lease, LeaseState, LeaseStore};
use tether_pool::{PoolConfig, StoreKind};

use crate::doctor;

pub const EXIT_OK: i32 = 0;
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_REFUSED: i32 = 3;

#[derive(Parser, Debug)]
#[command(
    name = "tether-ipam",
    version,
    about = "tether-ipam: whereabouts-style IPAM with node-local or cluster-wide leases and conflict probing",
    long_about = "Run by a CNI runtime (CNI_COMMAND set) it is the IPAM plugin. Run by a person it inspects and repairs leases.\n\nExit codes: 0 ok, 1 failed or a problem found, 2 usage error, 3 refused (use --force)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List leases: network, address, pod, node, state, age.
    Leases {
        /// Only this network (the ipam `network_name`, default the network's `name`).
        #[arg(long)]
        network: Option<String>,
        #[command(flatten)]
        store: StoreArgs,
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Release one address now (no cooldown). Refuses a leased address whose pod may be alive.
    Release {
        address: IpAddr,
        #[arg(long)]
        network: String,
        /// Release even if the lease is held by a pod that may still be running.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        store: StoreArgs,
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Check that a network config can work on this node, and say what to fix.
    Doctor {
        /// The network config (a NAD's spec.config, a .conf or a .conflist).
        #[arg(long)]
        config: PathBuf,
        /// Probe at most this many unleased pool addresses per range for conflicts.
        #[arg(long, default_value_t = 256)]
        max_probes: u32,
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Check a network config's ipam section the way the plugin reads it (offline; for CI/GitOps).
    Validate {
        #[arg(long)]
        config: PathBuf,
    },
    /// What the DaemonSet runs: install the plugins, keep their kubeconfig fresh, reconcile leases.
    NodeAgent {
        /// The host's CNI bin directory (mounted).
        #[arg(long)]
        cni_bin_dir: PathBuf,
        /// Where to write the plugin's kubeconfig on the host (mounted).
        #[arg(long)]
        kubeconfig_out: PathBuf,
        /// The host's file-store directory (mounted), reconciled for pods of this node.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Where the binaries to install are (this image's).
        #[arg(long, default_value = "/usr/local/bin")]
        source_dir: PathBuf,
        #[arg(long, default_value = "/var/run/secrets/kubernetes.io/serviceaccount")]
        service_account_dir: PathBuf,
        /// Seconds between kubeconfig refreshes.
        #[arg(long, default_value_t = 60)]
        refresh_s: u64,
        /// One pass, then exit.
        #[arg(long)]
        once: bool,
    },
    /// Print the version.
    Version,
}

/// Which lease store to open: from a network config, or named directly.
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Take the store settings from this network config (its ipam section).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// File store directory (default /var/lib/cni/tether).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

/// Parse and run; returns the exit code.
pub fn run(args: Vec<OsString>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { EXIT_USAGE } else { EXIT_OK };
        }
    };
    let outcome = match cli.cmd {
        Cmd::Version => {
            println!("tether-ipam {}", env!("CARGO_PKG_VERSION"));
            Ok(EXIT_OK)
        }
        Cmd::Leases { network, store, output } => leases(network.as_deref(), &store, output),
        Cmd::Release { address, network, force, store, output } => release(address, &network, force, &store, output),
        Cmd::Doctor { config, max_probes, output } => doctor::run(&config, max_probes, output),
        Cmd::Validate { config } => validate(&config),
        Cmd::NodeAgent { cni_bin_dir, kubeconfig_out, data_dir: _, source_dir, service_account_dir, refresh_s, once } => {
            tether_cni::logging::install("tether-ipam");
            let opts = crate::agent::AgentOptions {
                source_dir,
                cni_bin_dir,
                kubeconfig_out,
                service_account_dir,
                refresh: std::time::Duration::from_secs(refresh_s),
                once,
            };
            crate::agent::run(&opts, || {}).map(|()| EXIT_OK)
        }
    };
    match outcome {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("tether-ipam: {msg}");
            EXIT_FAILED
        }
    }
}

/// Read a network config file: a single config, or a conflist whose plugin with an `ipam` is used.
pub fn read_network_config(path: &PathBuf) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
    let Some(plugins) = v.get("plugins").and_then(Value::as_array) else { return Ok(v) };
    let mut p = plugins
        .iter()
        .find(|p| p.get("ipam").is_some())
        .cloned()
        .ok_or_else(|| format!("no plugin in {} has an ipam section", path.display()))?;
    // A conflist carries name and cniVersion at the top; plugins inherit them.
    for k in ["name", "cniVersion"] {
        if let (Some(obj), Some(val)) = (p.as_object_mut(), v.get(k))
            && !obj.contains_key(k)
        {
            obj.insert(k.to_string(), val.clone());
        }
    }
    Ok(p)
}

/// An opened store and the networks it can list.
pub struct OpenStore {
    pub store: Box<dyn LeaseStore>,
    file: Option<FileStore>,
}

impl OpenStore {
    pub fn open(args: &StoreArgs) -> Result<(OpenStore, Option<PoolConfig>), String> {
        let cfg = match &args.config {
            Some(p) => Some(PoolConfig::from_value(&read_network_config(p)?).map_err(|e| e.to_string())?),
            None => None,
        };
        let kind = cfg.as_ref().map_or(StoreKind::File, |c| c.store.clone());
        match kind {
            StoreKind::File => {
                let dir = args
                    .data_dir
                    .clone()
                    .or_else(|| cfg.as_ref().map(|c| c.data_dir.clone()))
                    .unwrap_or_else(|| PathBuf::from("/var/lib/cni/tether"));
                let fs = FileStore::new(dir);
                Ok((OpenStore { store: Box::new(fs.clone()), file: Some(fs) }, cfg))
            }
            StoreKind::Kubernetes => Err("the kubernetes store is not available in this build".into()),
        }
    }

    pub fn networks(&self, only: Option<&str>) -> Result<Vec<String>, String> {
        if let Some(n) = only {
            return Ok(vec![n.to_string()]);
        }
        match &self.file {
            Some(fs) => fs.networks().map_err(|e| e.to_string()),
            None => Err("pass --network".into()),
        }
    }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `5s`, `3m`, `2h`, `4d`.
pub fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn pod_text(l: &Lease) -> String {
    match (&l.pod.namespace, &l.pod.name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n.clone(),
        _ => format!("(container {})", short(&l.container_id)),
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

fn state_text(s: &LeaseState) -> String {
    match s {
        LeaseState::Leased => "leased".into(),
        LeaseState::Released { .. } => "released".into(),
        LeaseState::Quarantined { mac, .. } => format!("quarantined({mac})"),
    }
}

pub fn lease_json(l: &Lease, now: u64) -> Value {
    let (state, mac) = match &l.state {
        LeaseState::Leased => ("leased", None),
        LeaseState::Released { .. } => ("released", None),
        LeaseState::Quarantined { mac, .. } => ("quarantined", Some(mac.clone())),
    };
    json!({
        "network": l.network,
        "address": l.address.to_string(),
        "prefixLength": l.prefix_len,
        "containerID": l.container_id,
        "ifname": l.ifname,
        "pod": { "namespace": l.pod.namespace, "name": l.pod.name, "uid": l.pod.uid },
        "node": l.node,
        "state": state,
        "mac": mac,
        "since": l.since,
        "ageSeconds": now.saturating_sub(l.since),
    })
}

/// A plain aligned table.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:<width$}", width = w[i])).collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r.clone());
    }
}

fn validate(path: &PathBuf) -> Result<i32, String> {
    let cfg = PoolConfig::from_value(&read_network_config(path)?).map_err(|e| e.to_string())?;
    let ranges: Vec<String> = cfg.ranges.iter().map(|r| format!("{r} ({} usable)", r.usable_count())).collect();
    println!("network {}: {}; {:?} store", cfg.network_name, ranges.join(", "), cfg.store);
    Ok(EXIT_OK)
}

fn leases(network: Option<&str>, args: &StoreArgs, output: Output) -> Result<i32, String> {
    let (open, cfg) = OpenStore::open(args)?;
    let only = network.map(str::to_string).or_else(|| args.config.as_ref().and(cfg.as_ref().map(|c| c.network_name.clone())));
    let mut all = Vec::new();
    for n in open.networks(only.as_deref())? {
        all.extend(open.store.list(&n).map_err(|e| e.to_string())?);
    }
    all.sort_by(|a, b| (&a.network, a.address).cmp(&(&b.network, b.address)));
    let now = now();
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&all.iter().map(|l| lease_json(l, now)).collect::<Vec<_>>()).expect("json")),
        Output::Table => {
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|l| {
                    vec![
                        l.network.clone(),
                        format!("{}/{}", l.address, l.prefix_len),
                        pod_text(l),
                        l.node.clone().unwrap_or_default(),
                        state_text(&l.state),
                        age(now.saturating_sub(l.since)),
                    ]
                })
                .collect();
            print_table(&["NETWORK", "ADDRESS", "POD", "NODE", "STATE", "AGE"], &rows);
        }
    }
    Ok(EXIT_OK)
}

fn release(address: IpAddr, network: &str, force: bool, args: &StoreArgs, output: Output) -> Result<i32, String> {
    let (open, _) = OpenStore::open(args)?;
    let leases = open.store.list(network).map_err(|e| e.to_string())?;
    let Some(lease) = leases.iter().find(|l| l.address == address) else {
        return Err(format!("network {network} has no record of {address}"));
    };
    if lease.is_leased() && !force {
        eprintln!(
            "tether-ipam: {address} is leased to {} (container {}, {}); its pod may still be running. \
             Check with kubectl, then pass --force to release it anyway.",
            pod_text(lease),
            short(&lease.container_id),
            lease.ifname
        );
        return Ok(EXIT_REFUSED);
    }
    match open.store.remove(lease).map_err(|e| e.to_string())? {
        Ok(()) => {}
        Err(_) => return Err(format!("{address} changed while releasing it; look again with `tether-ipam leases`")),
    }
    match output {
        Output::Json => println!("{}", json!({"released": address.to_string(), "network": network, "was": lease_json(lease, now())})),
        Output::Table => println!("released {address} in network {network} (was {} of {})", state_text(&lease.state), pod_text(lease)),
    }
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_well() {
        assert_eq!(age(5), "5s");
        assert_eq!(age(600), "10m");
        assert_eq!(age(3 * 3600), "3h");
        assert_eq!(age(5 * 86_400), "5d");
    }

    #[test]
    fn usage_errors_exit_2_and_help_exits_0() {
        assert_eq!(run(vec!["tether-ipam".into(), "frobnicate".into()]), EXIT_USAGE);
        assert_eq!(run(vec!["tether-ipam".into(), "release".into()]), EXIT_USAGE);
        assert_eq!(run(vec!["tether-ipam".into(), "--help".into()]), EXIT_OK);
    }
}
