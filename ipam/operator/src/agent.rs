//! `tether node-agent`: what the DaemonSet runs on every node.
//!
//! 1. Installs `tether-ipvlan` and `tether-ipam` into the host's CNI bin dir: copy to a temporary name
//!    in the same directory, fsync, rename — kubelet never executes a half-written file.
//! 2. Writes the kubeconfig the plugin uses (0600, directory 0700): the CA, and a token bound to
//!    this node that it asks for and renews ([`crate::plugin_token`]; it outlives this
//!    pod), else this pod's own token; rewritten whenever either changes.
//! 3. Runs the lease reconciler for this node ([`crate::reconcile`]) on its own thread, with the
//!    pod's service account: this node's IPLeases and the file store under `--data-dir`, plus the
//!    leases of deleted nodes while this agent is the sweeper. The live nodes and the sweeper come
//!    from the DaemonSet's own pods (`--agent-namespace`, default this pod's namespace;
//!    `--agent-selector`, default `app.kubernetes.io/name=tether`), so no access to nodes is
//!    needed. `--once` runs one full pass.
//! 4. With the reconciler, the monitor ([`crate::monitor`]): a Warning Event on the pod whose ADD
//!    met an address conflict, and with `--metrics-addr` Prometheus metrics ([`crate::metrics`];
//!    docs/monitoring.md).
//! 5. The lease service ([`tether_lease_service::server`]) on `--lease-socket`, once the plugin's
//!    kubeconfig is written: the plugins' lease-store requests on one kept connection, with the
//!    plugin's own credential. Stopped first on SIGTERM, so plugins go on directly.
//! 6. Follows the controller's word on lease names ([`crate::lease_names`]): before it installs
//!    the plugins, and at every refresh.
//! 7. Counts the node's CNI calls from the records the plugins leave in `--call-spool`
//!    ([`crate::metrics::CniCalls`]), every two seconds, into the metrics.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use tether_kube_store::{ApiTraffic, LegacyMirrors};
use tether_lease_service::{LeaseService, ServiceGauges, ServiceOptions};

use crate::installed::Installed;
use crate::kube::Kube;
use crate::lease_names::Follower;
use crate::metrics::CniCalls;
pub use crate::node_files::{write_atomic, write_private};
use crate::observers::Observers;
use crate::plugin_token::PluginToken;
use crate::reconcile::{self, Reconciler};

pub const BINARIES: &[&str] = &["tether-ipvlan", "tether-ipam"];

/// How often the plugins' call records are taken into the metrics.
const ABSORB_EVERY: Duration = Duration::from_secs(2);

/// Where the service account's credentials are mounted, and where the API server is.
#[derive(Debug, Clone)]
pub struct ServiceAccount {
    pub dir: PathBuf,
    pub server: String,
}

impl ServiceAccount {
    /// From the in-cluster environment.
    pub fn in_cluster(dir: PathBuf) -> Result<ServiceAccount, String> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .map_err(|_| "KUBERNETES_SERVICE_HOST is not set: not running in a pod?".to_string())?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Ok(ServiceAccount {
            dir,
            server: format!("https://{host}:{port}"),
        })
    }
}

/// Copy each binary from `src` into `dst`; returns the names that changed.
pub fn install_binaries(src: &Path, dst: &Path) -> Result<Vec<String>, String> {
    fs::create_dir_all(dst).map_err(|e| format!("creating {}: {e}", dst.display()))?;
    let mut changed = Vec::new();
    for b in BINARIES {
        let from = src.join(b);
        let bytes = fs::read(&from).map_err(|e| format!("reading {}: {e}", from.display()))?;
        if write_atomic(&dst.join(b), &bytes, 0o755)
            .map_err(|e| format!("installing {b} into {}: {e}", dst.display()))?
        {
            changed.push(b.to_string());
        }
    }
    Ok(changed)
}

/// A kubeconfig with the token and CA embedded, so the plugin needs no access to the pod's mounts:
/// `token` (the node-bound one, [`crate::plugin_token`]), else this pod's own.
pub fn kubeconfig(sa: &ServiceAccount, token: Option<&str>) -> Result<String, String> {
    let read = |f: &str| {
        fs::read(sa.dir.join(f)).map_err(|e| format!("reading {}: {e}", sa.dir.join(f).display()))
    };
    let token = match token {
        Some(t) => t.to_string(),
        None => String::from_utf8(read("token")?)
            .map_err(|_| "the service-account token is not text".to_string())?,
    };
    let ca = read("ca.crt")?;
    Ok(format!(
        "# Written by tether node-agent from the tether service account; rewritten when the token is renewed.\n\
         apiVersion: v1\nkind: Config\n\
         clusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n- name: tether\n  user:\n    token: {token}\n\
         contexts:\n- name: tether\n  context:\n    cluster: local\n    user: tether\n\
         current-context: tether\n",
        server = sa.server,
        ca = STANDARD.encode(&ca),
        token = token.trim(),
    ))
}

/// Write the kubeconfig (0600) into a 0700 directory; returns whether it changed.
pub fn write_kubeconfig(
    sa: &ServiceAccount,
    token: Option<&str>,
    out: &Path,
) -> Result<bool, String> {
    write_private(out, kubeconfig(sa, token)?.as_bytes())
}

/// The agent's options.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub source_dir: PathBuf,
    pub cni_bin_dir: PathBuf,
    pub kubeconfig_out: PathBuf,
    pub service_account_dir: PathBuf,
    pub refresh: Duration,
    /// The API, with this pod's credential, to ask for the plugin's node-bound token (`None`:
    /// the plugin gets this pod's token).
    pub plugin_token_api: Option<tether_kube_store::KubeSettings>,
    /// The reconciler to run (`None`: `--no-reconcile`).
    pub reconcile: Option<reconcile::Options>,
    /// Where to serve the lease service (`None`: `--no-lease-service`).
    pub lease_socket: Option<PathBuf>,
    /// The plugins' call records to count (`None`: not counted).
    pub call_spool: Option<PathBuf>,
    /// Stop after the first pass (tests, and `kubectl debug` style checks).
    pub once: bool,
}

/// Install, then keep the kubeconfig fresh until `stop` (SIGTERM: the reconciler is stopped and
/// joined first).
pub fn run(
    opts: &AgentOptions,
    stop: Arc<AtomicBool>,
    mut each_pass: impl FnMut(),
) -> Result<(), String> {
    // Mirrors of leases under their network's name until the controller says otherwise; this
    // node's records named by network moved into their domains before its plugins are replaced.
    let mirrors = LegacyMirrors::new(true);
    let (follower, names_kube) = follower(opts, &mirrors);
    follower.round(names_kube.as_ref());
    let sa = ServiceAccount::in_cluster(opts.service_account_dir.clone())?;
    // On a fresh node the plugins' kubeconfig is there before the plugins are: its presence is
    // what tells tether-ipam the agent is installed (a config naming no store then uses the
    // cluster store), so no plugin of this agent ever runs as if on a node without it. The pod's
    // own token until the loop below writes the node-bound one.
    if !opts.kubeconfig_out.exists()
        && let Err(e) = write_kubeconfig(&sa, None, &opts.kubeconfig_out)
    {
        log::error!("writing the plugins' kubeconfig before installing them: {e}");
    }
    // The spool exists before the plugins do: their first call is recorded.
    let cni_calls = opts.call_spool.as_deref().and_then(|p| {
        CniCalls::open(p)
            .map_err(|e| log::error!("the plugins' CNI calls are not counted: {e}"))
            .ok()
    });
    let changed = install_binaries(&opts.source_dir, &opts.cni_bin_dir)?;
    log::warn!(
        "installed into {}: {}",
        opts.cni_bin_dir.display(),
        if changed.is_empty() {
            "already current".into()
        } else {
            changed.join(", ")
        }
    );
    let mut reconciler: Option<std::thread::JoinHandle<()>> = None;
    let mut plugin_token = PluginToken::new(opts.plugin_token_api.clone());
    let mut service: Option<LeaseService> = None;
    let mut absorb_error: Option<String> = None;
    // The service's counters and networks show in the reconciler's metrics, and its API
    // requests count with the agent's.
    let gauges = ServiceGauges::default();
    // Ready (GET /readyz) only while these are the files on the node.
    let installed = Some(Installed::record(
        &opts.cni_bin_dir,
        BINARIES,
        &opts.kubeconfig_out,
    )?);
    let reconcile = opts.reconcile.clone().map(|mut ro| {
        if opts.lease_socket.is_some() {
            ro.lease_service = Some(gauges.clone());
        }
        ro.cni_calls = cni_calls.clone();
        ro.installed = installed.clone();
        ro
    });
    let traffic = reconcile
        .as_ref()
        .and_then(|ro| ro.kube.as_ref())
        .map(|k| k.traffic.clone());
    loop {
        let token = plugin_token.current();
        match write_kubeconfig(&sa, token.as_deref(), &opts.kubeconfig_out) {
            Ok(true) => log::warn!("wrote {}", opts.kubeconfig_out.display()),
            Ok(false) => {}
            // Keep the old kubeconfig: a transient read error must not break the plugin.
            Err(e) => log::error!("refreshing the kubeconfig: {e}"),
        }
        follower.round(names_kube.as_ref());
        if let (None, Some(socket)) = (&service, &opts.lease_socket) {
            // Retried every refresh while it cannot start: the plugins go direct meanwhile.
            service = start_service(
                socket,
                &opts.kubeconfig_out,
                &gauges,
                traffic.as_ref(),
                &mirrors,
            );
        }
        if let Some(ro) = &reconcile {
            if opts.once {
                match Reconciler::new(ro.clone()) {
                    Ok(r) => {
                        let report = r.pass(true);
                        for x in &report.released {
                            log::warn!("{}", reconcile::describe(x));
                        }
                        for e in &report.errors {
                            log::error!("reconcile: {e}");
                        }
                    }
                    Err(e) => log::error!("reconcile: {e}"),
                }
            } else if reconciler.as_ref().is_none_or(|h| h.is_finished()) {
                // (Re)start it; it only ends when it cannot start (it logs why), so retry each refresh.
                let (ro, stop) = (ro.clone(), stop.clone());
                reconciler = std::thread::Builder::new()
                    .name("reconcile".into())
                    .spawn(move || match Reconciler::new(ro) {
                        Ok(r) => {
                            let observers = Observers::start(r.options(), r.metrics());
                            if let Err(e) = r.run(&stop, |_| {}) {
                                log::error!("reconcile: {e}");
                            }
                            observers.stop();
                        }
                        Err(e) => log::error!("reconcile: {e}"),
                    })
                    .map_err(|e| log::error!("cannot start the reconciler: {e}"))
                    .ok();
            }
        }
        each_pass();
        if opts.once {
            return Ok(());
        }
        let until = Instant::now() + opts.refresh;
        let mut absorbed: Option<Instant> = None;
        while Instant::now() < until {
            if let Some(c) = cni_calls
                .as_ref()
                .filter(|_| absorbed.is_none_or(|t| t.elapsed() >= ABSORB_EVERY))
            {
                // Said once per kind of failure, not every two seconds.
                match c.absorb() {
                    Ok(_) => absorb_error = None,
                    Err(e) if absorb_error.as_ref() != Some(&e) => {
                        log::error!("counting the plugins' CNI calls: {e}");
                        absorb_error = Some(e);
                    }
                    Err(_) => {}
                }
                absorbed = Some(Instant::now());
            }
            if stop.load(Ordering::Relaxed) {
                // The socket goes first: every plugin from now on goes direct.
                if let Some(s) = service.take() {
                    s.stop(Duration::from_secs(5));
                }
                if let Some(h) = reconciler {
                    let _ = h.join();
                }
                log::warn!("stopped");
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Who follows the controller's word on lease names for this agent, and the API it reads it
/// with (the reconciler's, this pod's credential; `None` without one).
fn follower(opts: &AgentOptions, mirrors: &LegacyMirrors) -> (Follower, Option<Kube>) {
    let ro = opts.reconcile.as_ref();
    let node = ro
        .map(|r| r.node.clone())
        .or_else(|| std::env::var("NODE_NAME").ok())
        .unwrap_or_default();
    let namespace = ro
        .map(|r| r.agent_namespace.clone())
        .unwrap_or_else(crate::options::default_agent_namespace);
    let kube = ro.and_then(|r| r.kube.as_ref()).and_then(|s| {
        Kube::connect(s)
            .map_err(|e| log::error!("lease names: {e}"))
            .ok()
    });
    let f = Follower::new(&node, &namespace, &opts.kubeconfig_out, mirrors.clone());
    (f, kube)
}

/// The lease service for the plugins' kubeconfig, or `None` (logged) when it cannot start now.
fn start_service(
    socket: &Path,
    kubeconfig: &Path,
    gauges: &ServiceGauges,
    traffic: Option<&ApiTraffic>,
    mirrors: &LegacyMirrors,
) -> Option<LeaseService> {
    let node = std::env::var("NODE_NAME").ok().filter(|n| !n.is_empty());
    let mut opts = ServiceOptions::new(socket.to_path_buf(), kubeconfig.to_path_buf(), node);
    opts.gauges = gauges.clone();
    opts.settings.legacy_mirrors = mirrors.clone();
    if let Some(t) = traffic {
        opts.settings.traffic = t.clone();
    }
    LeaseService::start(opts)
        .map_err(|e| {
            log::error!("the lease service is off for now (plugins go straight to the API): {e}")
        })
        .ok()
}

/// `tether lease-service`: the service alone until `stop`.
pub fn serve_leases(opts: ServiceOptions, stop: &AtomicBool) -> Result<(), String> {
    let service = LeaseService::start(opts)?;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    service.stop(Duration::from_secs(5));
    log::warn!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tether-agent-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn installs_atomically_and_only_when_changed() {
        let d = tmp("install");
        let (src, dst) = (d.join("src"), d.join("dst"));
        fs::create_dir_all(&src).unwrap();
        for b in BINARIES {
            fs::write(src.join(b), format!("v1 {b}")).unwrap();
        }
        assert_eq!(install_binaries(&src, &dst).unwrap().len(), 2);
        assert_eq!(
            fs::metadata(dst.join("tether-ipam"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o755
        );
        assert!(
            install_binaries(&src, &dst).unwrap().is_empty(),
            "unchanged binaries are not rewritten"
        );
        fs::write(src.join("tether-ipam"), "v2").unwrap();
        assert_eq!(
            install_binaries(&src, &dst).unwrap(),
            vec!["tether-ipam".to_string()]
        );
        assert_eq!(fs::read_to_string(dst.join("tether-ipam")).unwrap(), "v2");
        let leftovers: Vec<_> = fs::read_dir(&dst)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "no temporary files left");
        assert!(
            install_binaries(&d.join("missing"), &dst)
                .unwrap_err()
                .contains("missing")
        );
    }

    #[test]
    fn kubeconfig_is_private_and_follows_token_rotation() {
        let d = tmp("kubeconfig");
        let sa_dir = d.join("sa");
        fs::create_dir_all(&sa_dir).unwrap();
        fs::write(sa_dir.join("token"), "token-one\n").unwrap();
        fs::write(sa_dir.join("ca.crt"), "CA").unwrap();
        let sa = ServiceAccount {
            dir: sa_dir.clone(),
            server: "https://10.43.0.1:443".into(),
        };
        let out = d.join("net.d/tether.d/tether.kubeconfig");
        assert!(write_kubeconfig(&sa, None, &out).unwrap());
        let text = fs::read_to_string(&out).unwrap();
        assert!(
            text.contains("token: token-one\n")
                && text.contains("certificate-authority-data: Q0E=")
                && text.contains("server: https://10.43.0.1:443")
        );
        assert_eq!(
            fs::metadata(&out).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::metadata(out.parent().unwrap())
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        assert!(
            !write_kubeconfig(&sa, None, &out).unwrap(),
            "unchanged token: no rewrite"
        );
        fs::write(sa_dir.join("token"), "token-two").unwrap();
        assert!(write_kubeconfig(&sa, None, &out).unwrap());
        assert!(
            fs::read_to_string(&out)
                .unwrap()
                .contains("token: token-two\n")
        );
        // The node-bound token, when there is one, instead of the pod's.
        assert!(write_kubeconfig(&sa, Some("node-bound"), &out).unwrap());
        let text = fs::read_to_string(&out).unwrap();
        assert!(text.contains("token: node-bound\n") && !text.contains("token-two"));
        fs::remove_file(sa_dir.join("token")).unwrap();
        assert!(write_kubeconfig(&sa, Some("node-bound"), &out).is_ok());
        assert!(write_kubeconfig(&sa, None, &out).is_err());
        assert!(
            fs::read_to_string(&out).unwrap().contains("node-bound"),
            "a failed refresh keeps the old file"
        );
    }
}
