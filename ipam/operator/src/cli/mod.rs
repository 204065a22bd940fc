//! `tether` run by a person: inspect and repair leases, diagnose and validate a network, run the
//! reconciler or the node-agent. The command line and its dispatch.
//!
//! Exit codes scripts can rely on: 0 success; 1 the operation failed or `doctor` found a problem;
//! 2 usage error; 3 refused (`release` of an address whose pod may be alive, without `--force`).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use serde_json::{Value, json};
use tether_kube_store::KubeSettings;
use tether_lease_service::ServiceOptions;

use crate::doctor;
use crate::options;
use crate::output::{EXIT_FAILED, EXIT_OK, EXIT_USAGE, ListOutput, Output};
use crate::reconcile;
use crate::store_access::StoreArgs;

mod lease_commands;
mod lease_filter;
mod lease_view;
mod pools;
mod reconcile_args;
mod validate;
mod version;
use lease_commands::{leases, now, release, release_target};
use lease_filter::LeaseFilter;
pub use lease_view::{age, lease_json};
use pools::{PoolsArgs, pools};
pub use reconcile_args::ReconcileArgs;
pub use validate::validate_warnings;
use validate::{ValidateArgs, validate};

#[derive(Parser, Debug)]
#[command(
    name = "tether",
    version = tether_build_info::DESCRIBE,
    about = "tether: inspect and repair tether leases, diagnose and validate networks, run the node-agent",
    long_about = "The operator and node-agent program of tether. The CNI plugins are tether-ipvlan and tether-ipam; this binary inspects and repairs their leases, diagnoses and validates networks, and runs the reconciler and the node-agent.\n\nExit codes: 0 ok, 1 failed or a problem found, 2 usage error, 3 refused (use --force)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List leases: network, address, pod, interface, node, state, age. Reads the cluster store
    /// when it finds credentials as kubectl does (else this node's file store) and says which on
    /// stderr.
    Leases {
        #[command(flatten)]
        filter: LeaseFilter,
        #[command(flatten)]
        store: StoreArgs,
        #[arg(short = 'o', long, value_enum, default_value_t = ListOutput::Table)]
        output: ListOutput,
    },
    /// How full each network's pool is: range, size, leased, quarantined, cooling, free (from the
    /// cluster's NADs, or --config).
    Pools(PoolsArgs),
    /// Release one address now (no cooldown). Refuses a leased address whose pod is (or, without
    /// API access, may be) alive.
    Release {
        /// NETWORK/ADDRESS, as `tether leases -o name` prints it (or ADDRESS with --network).
        target: String,
        #[arg(long)]
        network: Option<String>,
        /// Release even if the lease is held by a pod that may still be running.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        store: StoreArgs,
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Check that a network config can work on this node, and say what to fix; first, that the
    /// installed plugins are this tether's build.
    Doctor {
        /// The network config (a NAD's spec.config, a .conf or a .conflist). Without it, only the
        /// plugins are checked.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where the plugins are installed (the node-agent's --cni-bin-dir; Multus' binDir).
        #[arg(long, default_value = "/opt/cni/bin")]
        cni_bin_dir: PathBuf,
        /// Probe at most this many unleased pool addresses per range for conflicts.
        #[arg(long, default_value_t = 256)]
        max_probes: u32,
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Check network configs' ipam sections the way the plugin reads them (offline unless
    /// --cluster; for CI/GitOps). Warns when a config keeps leases in the node-local file store (a
    /// NAD is used on every node, and nodes with file stores hand out the same range each on its
    /// own), and when two configs' ranges overlap in two uniqueness domains on one master, or in
    /// one domain with another prefix or gateway.
    Validate(ValidateArgs),
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
        #[command(flatten)]
        reconcile: ReconcileArgs,
        /// Kubeconfig for the reconciler (default: this pod's service account).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Do not run the lease reconciler.
        #[arg(long)]
        no_reconcile: bool,
        /// Serve the plugins' lease-store requests on this root-only socket (one kept API
        /// connection, a watch of the records of each network its pods use); a plugin goes on
        /// directly whenever it does not answer.
        #[arg(long, default_value = tether_lease_client::DEFAULT_SOCKET)]
        lease_socket: PathBuf,
        /// Do not run the lease service: every plugin call goes straight to the API server.
        #[arg(long)]
        no_lease_service: bool,
        /// Where the plugins leave a record of each CNI call, which the agent counts into its
        /// metrics (created root-only; the plugins use the default unless their
        /// TETHER_CALL_SPOOL says otherwise).
        #[arg(long, default_value = tether_cni::call_spool::SPOOL_DIR)]
        call_spool: PathBuf,
        /// One pass, then exit.
        #[arg(long)]
        once: bool,
    },
    /// Serve the plugins' lease-store requests, alone (what the node-agent runs beside its other
    /// jobs): for a node without the DaemonSet, or a benchmark. Runs until SIGTERM.
    LeaseService {
        /// The plugins' kubeconfig, as their network configs name it (its credential, bound to
        /// this node, is the one the requests are sent with).
        #[arg(long)]
        kubeconfig: PathBuf,
        /// Where to listen.
        #[arg(long, default_value = tether_lease_client::DEFAULT_SOCKET)]
        socket: PathBuf,
        /// This node's name when the credential is not bound to a node (default: NODE_NAME).
        #[arg(long)]
        node: Option<String>,
    },
    /// Release leases whose pod is gone or replaced (never a live one): event-driven from a pod
    /// watch plus a periodic full pass. What the node-agent runs; see the reconcile module docs.
    Reconcile {
        /// Kubeconfig for the API (default: in-cluster service account, else KUBECONFIG).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// File-store directory whose networks are reconciled for this node's pods.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        #[command(flatten)]
        reconcile: ReconcileArgs,
        /// One full pass, print what was released, exit (1 if anything failed).
        #[arg(long)]
        once: bool,
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// The cluster's lease controller (deploy/base/controller.yaml; replicas elect one with a
    /// coordination Lease): releases the leases of nodes that no longer run a node-agent pod (a
    /// deleted node) once a GET of each lease's pod confirms it is gone, and of pods still bound
    /// to a node that stopped reporting (see --node-lost-grace-s). Node credentials may not free
    /// another node's lease (deploy/base/policy.yaml); this identity may, and no node holds it.
    Controller {
        /// Kubeconfig for the API (default: in-cluster service account, else KUBECONFIG).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Leases younger than this are never released.
        #[arg(long, default_value_t = options::DEFAULT_GRACE_S)]
        grace_s: u64,
        /// Seconds between passes.
        #[arg(long, default_value_t = 60)]
        interval_s: u64,
        /// Release the leases of pods bound to a node whose kubelet has not renewed its
        /// heartbeat Lease for this many seconds and that is not Ready (crashed, powered off,
        /// cut off). At least 60 (above the node lifecycle controller's own grace); 0: never.
        #[arg(long, default_value_t = options::DEFAULT_NODE_LOST_GRACE_S)]
        node_lost_grace_s: u64,
        /// Serve Prometheus metrics here (`IP:PORT`, `:PORT`); off when unset. The leading
        /// replica reports the cluster-wide pools (`tether_pool_*`); see docs/monitoring.md.
        #[arg(long)]
        metrics_addr: Option<String>,
        /// Namespace of the node-agent's pods (the nodes running one are alive). Default:
        /// $POD_NAMESPACE, else the service account's namespace file, else kube-system.
        #[arg(long)]
        agent_namespace: Option<String>,
        /// Label selector of the node-agent's pods (the DaemonSet's pod label).
        #[arg(long, default_value = options::DEFAULT_AGENT_SELECTOR)]
        agent_selector: String,
        /// One pass, print what was released, exit (1 if anything failed).
        #[arg(long)]
        once: bool,
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Turn a running whereabouts' allocations into IPLeases (its pods keep their addresses while
    /// NADs move over; tether never hands out an address whereabouts holds). Needs an admin's
    /// credential; see docs/operations.md.
    ImportWhereabouts(crate::whereabouts_import::ImportArgs),
    /// Print the version, the commit and the target of this build.
    Version {
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

/// Parse and run; returns the exit code.
pub fn run(args: Vec<OsString>) -> i32 {
    // Installed as `kubectl-tether`, it is kubectl's plugin `kubectl tether`: its help says so.
    let as_kubectl_plugin = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == "kubectl-tether");
    let mut command = <Cli as clap::CommandFactory>::command();
    if as_kubectl_plugin {
        command = command.bin_name("kubectl tether");
    }
    let parsed = command
        .try_get_matches_from(args)
        .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m));
    let cli = match parsed {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { EXIT_USAGE } else { EXIT_OK };
        }
    };
    let outcome = match cli.cmd {
        Cmd::Version { output } => {
            version::print(output);
            Ok(EXIT_OK)
        }
        Cmd::Leases {
            filter,
            store,
            output,
        } => match filter.check() {
            Ok(()) => leases(&filter, &store, output),
            Err(e) => {
                eprintln!("tether: {e}");
                return EXIT_USAGE;
            }
        },
        Cmd::Pools(args) => pools(&args),
        Cmd::Release {
            target,
            network,
            force,
            store,
            output,
        } => match release_target(&target, network.as_deref()) {
            Ok((network, address)) => release(address, &network, force, &store, output),
            Err(e) => {
                eprintln!("tether: {e}");
                return EXIT_USAGE;
            }
        },
        Cmd::Doctor {
            config,
            cni_bin_dir,
            max_probes,
            output,
        } => doctor::run(config.as_deref(), &cni_bin_dir, max_probes, output),
        Cmd::Validate(args) => validate(&args),
        Cmd::ImportWhereabouts(args) => crate::whereabouts_import::run(&args),
        Cmd::NodeAgent {
            cni_bin_dir,
            kubeconfig_out,
            data_dir,
            source_dir,
            service_account_dir,
            refresh_s,
            reconcile,
            kubeconfig,
            no_reconcile,
            lease_socket,
            no_lease_service,
            call_spool,
            once,
        } => {
            tether_cni::logging::install("tether");
            // Before any thread exists: they all inherit the blocked signals.
            let stop = (!once).then(crate::termination::stop_flag);
            // The plugin's node-bound token is asked for with this pod's own credential.
            let mut plugin_token_api = match kubeconfig.clone() {
                Some(p) => Some(KubeSettings::with_kubeconfig(p)),
                None => {
                    std::env::var_os("KUBERNETES_SERVICE_HOST").map(|_| KubeSettings::default())
                }
            }
            .map(|s| options::long_lived(&s));
            let reconcile = if no_reconcile {
                None
            } else {
                // Installing the plugins matters more than reconciling: never fail the agent here.
                match reconcile.options(kubeconfig, data_dir) {
                    Ok(o) => Some(o),
                    Err(e) => {
                        log::error!("the lease reconciler is off: {e}");
                        None
                    }
                }
            };
            // One set of API counters for the agent's metrics: the token's client counts there too.
            if let (Some(p), Some(k)) = (
                plugin_token_api.as_mut(),
                reconcile.as_ref().and_then(|o| o.kube.as_ref()),
            ) {
                p.traffic = k.traffic.clone();
            }
            let opts = crate::agent::AgentOptions {
                source_dir,
                cni_bin_dir,
                kubeconfig_out,
                service_account_dir,
                refresh: std::time::Duration::from_secs(refresh_s),
                plugin_token_api,
                reconcile,
                lease_socket: (!no_lease_service && !once).then_some(lease_socket),
                call_spool: (!once).then_some(call_spool),
                once,
            };
            crate::agent::run(&opts, stop.unwrap_or_default(), || {}).map(|()| EXIT_OK)
        }
        Cmd::LeaseService {
            kubeconfig,
            socket,
            node,
        } => {
            tether_cni::logging::install("tether");
            let stop = crate::termination::stop_flag();
            let node = node.or_else(|| std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty()));
            crate::agent::serve_leases(ServiceOptions::new(socket, kubeconfig, node), &stop)
                .map(|()| EXIT_OK)
        }
        Cmd::Reconcile {
            kubeconfig,
            data_dir,
            reconcile,
            once,
            output,
        } => match reconcile.api_options(kubeconfig, data_dir, "reconcile") {
            Ok(opts) => run_reconcile(opts, once, output),
            Err(e) => {
                eprintln!("tether: {e}");
                return EXIT_USAGE;
            }
        },
        Cmd::Controller {
            kubeconfig,
            grace_s,
            interval_s,
            node_lost_grace_s,
            metrics_addr,
            agent_namespace,
            agent_selector,
            once,
            output,
        } => {
            if node_lost_grace_s != 0 && node_lost_grace_s < options::MIN_NODE_LOST_GRACE_S {
                eprintln!(
                    "tether: --node-lost-grace-s {node_lost_grace_s} is shorter than a node needs to be marked not Ready \
                     ({} s at least; 0 turns the node-lost release off)",
                    options::MIN_NODE_LOST_GRACE_S
                );
                return EXIT_USAGE;
            }
            // The agent flags' checks, for a reconciler whose "node" names it in logs and is its
            // identity in the election (unique per replica: the pod's name, else host and pid).
            let identity = std::env::var("POD_NAME")
                .ok()
                .filter(|n| !n.trim().is_empty())
                .unwrap_or_else(|| {
                    let host =
                        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                    format!("{}-{}", host.trim(), std::process::id())
                });
            let args = ReconcileArgs {
                node: Some(identity),
                grace_s,
                interval_s,
                agent_namespace,
                agent_selector,
                no_sweep: false,
                metrics_addr,
                monitor_interval_s: options::DEFAULT_MONITOR_INTERVAL_S,
                no_conflict_events: true,
                no_conflict_guard: true,
            };
            match args.api_options(kubeconfig, None, "the controller") {
                Ok(opts) => run_reconcile(
                    reconcile::Options {
                        controller: true,
                        node_lost_grace_s,
                        ..opts
                    },
                    once,
                    output,
                ),
                Err(e) => {
                    eprintln!("tether: {e}");
                    return EXIT_USAGE;
                }
            }
        }
    };
    match outcome {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("tether: {msg}");
            EXIT_FAILED
        }
    }
}

fn run_reconcile(opts: reconcile::Options, once: bool, output: Output) -> Result<i32, String> {
    // Before any thread exists (the reconciler's store starts some): they inherit the blocked signals.
    let stop = (!once).then(crate::termination::stop_flag);
    let r = reconcile::Reconciler::new(opts)?;
    if once {
        let report = r.pass(true);
        match output {
            Output::Json => {
                let released: Vec<Value> = report
                    .released
                    .iter()
                    .map(|x| {
                        let mut v = lease_json(&x.lease, now());
                        v["store"] = json!(match x.store {
                            reconcile::StoreName::Kubernetes => "kubernetes",
                            reconcile::StoreName::File => "file",
                        });
                        v["reason"] = json!(x.reason.to_string());
                        v
                    })
                    .collect();
                let taken_back: Vec<Value> = report
                    .taken_back
                    .iter()
                    .map(|l| lease_json(l, now()))
                    .collect();
                let elsewhere: Vec<Value> = report
                    .held_elsewhere
                    .iter()
                    .map(|x| json!({"ours": lease_json(&x.ours, now()), "theirs": lease_json(&x.theirs, now())}))
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "released": released, "takenBack": taken_back, "leasedElsewhere": elsewhere,
                        "examined": report.examined, "lostRaces": report.lost_races,
                        "confirmedAlive": report.confirmed_alive, "swept": report.swept, "errors": report.errors,
                    }))
                    .expect("json")
                );
            }
            Output::Table => {
                for x in &report.released {
                    println!("{}", reconcile::describe(x));
                }
                for l in &report.taken_back {
                    println!(
                        "took back {} network {} pod {} uid {}: the store no longer had it as the pod's, and the pod on this node still uses it",
                        l.address,
                        l.network,
                        l.pod,
                        l.pod.uid.as_deref().unwrap_or("?")
                    );
                }
                for x in &report.held_elsewhere {
                    println!(
                        "leased elsewhere {} network {}: used by pod {} on this node, leased to pod {} on node {}",
                        x.ours.address,
                        x.ours.network,
                        x.ours.pod,
                        x.theirs.pod,
                        x.theirs.node.as_deref().unwrap_or("?")
                    );
                }
                println!(
                    "{} record(s) examined, {} released, {} changed meanwhile, {} alive after all{}",
                    report.examined,
                    report.released.len(),
                    report.lost_races,
                    report.confirmed_alive,
                    if report.swept {
                        "; swept deleted nodes"
                    } else {
                        ""
                    }
                );
            }
        }
        for e in &report.errors {
            eprintln!("tether: reconcile: {e}");
        }
        return Ok(if report.errors.is_empty() {
            EXIT_OK
        } else {
            EXIT_FAILED
        });
    }
    tether_cni::logging::install("tether");
    let observers = super::observers::Observers::start(r.options(), r.metrics());
    let ran = r.run(&stop.unwrap_or_default(), |_| {});
    observers.stop();
    ran?;
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_exit_2_and_help_exits_0() {
        assert_eq!(run(vec!["tether".into(), "frobnicate".into()]), EXIT_USAGE);
        assert_eq!(run(vec!["tether".into(), "release".into()]), EXIT_USAGE);
        assert_eq!(run(vec!["tether".into(), "--help".into()]), EXIT_OK);
        assert_eq!(
            run(vec![
                "/usr/local/bin/kubectl-tether".into(),
                "version".into()
            ]),
            EXIT_OK
        );
    }

    #[test]
    fn release_takes_network_slash_address() {
        let t = |s: &str, n: Option<&str>| release_target(s, n);
        assert_eq!(
            t("mgmt/10.0.0.5", None).unwrap(),
            ("mgmt".to_string(), "10.0.0.5".parse().unwrap())
        );
        assert_eq!(
            t("mgmt/fd00::5", None).unwrap(),
            ("mgmt".to_string(), "fd00::5".parse().unwrap())
        );
        assert_eq!(t("10.0.0.5", Some("mgmt")).unwrap().0, "mgmt");
        assert!(
            t("10.0.0.5", None)
                .unwrap_err()
                .contains("NETWORK/10.0.0.5")
        );
        assert!(
            t("10.0.0.5/24", None)
                .unwrap_err()
                .contains("not NETWORK/ADDRESS")
        );
        assert!(t("/10.0.0.5", None).is_err());
        assert!(
            t("mgmt/10.0.0.5", Some("other"))
                .unwrap_err()
                .contains("say one")
        );
        assert_eq!(
            run(vec!["tether".into(), "release".into(), "10.0.0.5".into()]),
            EXIT_USAGE
        );
    }
}
