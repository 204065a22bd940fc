//! `tether doctor --config NAD.json`: every check a platform engineer would do by hand before
//! blaming the plugin, each ending in OK or in what to do.
//!
//! Output: one line per finding, `OK` or `FAIL` in the first column, then the check's name
//! (`plugins`, `config`, `master`, `kubeconfig`, `api`, `crd`, `rbac`, `node-scope`, `store`,
//! `pool`, `overlap`, `conflicts`), then the detail; `-o json` gives the same findings as a list.
//! Exit 1 when any line is FAIL.
//!
//! First, whatever the config: the plugins installed in the CNI bin directory are this tether's
//! build ([`plugins`]). Without `--config`, that is the whole report.
//!
//! With API access (the Kubernetes store, or `kubernetes` settings beside a file store), the
//! config's ranges are compared with those of the cluster's NetworkAttachmentDefinitions
//! ([`crate::overlap`]): a FAIL line per NAD whose ranges share addresses with this config's in
//! another uniqueness domain on the same master, or in the same domain with another prefix or
//! gateway. A config that is a NAD object stands in for the cluster's copy of that NAD.
//!
//! For the Kubernetes store: the kubeconfig parses and its token (or certificate) is readable; the
//! API server answers; the IPLease CRD is installed and established (when RBAC forbids reading
//! CRDs, a LIST of ipleases stands in); and, through SelfSubjectAccessReviews, this identity may
//! get/list/watch/create/update/delete ipleases and get/list/watch pods — exactly what
//! deploy/base/rbac.yaml grants, nothing else (the reconciler finds deleted nodes from the
//! node-agent's own pods, so it needs no access to nodes).

use std::net::IpAddr;
use std::path::Path;

use serde_json::{Value, json};
use tether_cluster::{Cluster, CrdState, NodeScope};
use tether_cni::MasterKeys;
use tether_kube_store::{
    ApiClient, KubeSettings, KubeStore, KubeStoreError, check_credentials, node_agent,
};
use tether_leases::{Allocator, NoProbe, Scope, SystemClock};
use tether_link::Netlink;
use tether_pool::{PoolConfig, ProbeConfig, StoreKind};
use tether_wire::{ProbeBudget, ProbeOutcome};

use super::nads::{nad_networks, network_of, with_files};
use super::output::{EXIT_FAILED, EXIT_OK, Output, print_table};
use super::overlap::findings;
use super::store_access::{NetworkFile, OpenStore, describe_store, read_network_file};

mod plugins;

struct Finding {
    check: &'static str,
    ok: bool,
    detail: String,
}

#[derive(Default)]
struct Report(Vec<Finding>);

impl Report {
    fn ok(&mut self, check: &'static str, detail: impl Into<String>) {
        self.0.push(Finding {
            check,
            ok: true,
            detail: detail.into(),
        });
    }
    fn fail(&mut self, check: &'static str, detail: impl Into<String>) {
        self.0.push(Finding {
            check,
            ok: false,
            detail: detail.into(),
        });
    }
}

/// The report for `config` (none: the plugins only) with the plugins of `cni_bin_dir`.
pub fn run(
    config: Option<&Path>,
    cni_bin_dir: &Path,
    max_probes: u32,
    output: Output,
) -> Result<i32, String> {
    let mut r = Report::default();
    plugins::check(cni_bin_dir, &mut r);
    if let Some(config) = config {
        diagnose(config, max_probes, &mut r);
    }
    match output {
        Output::Json => {
            let v: Vec<Value> =
                r.0.iter()
                    .map(|f| json!({"check": f.check, "ok": f.ok, "detail": f.detail}))
                    .collect();
            println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        }
        Output::Table => {
            let rows: Vec<Vec<String>> =
                r.0.iter()
                    .map(|f| {
                        vec![
                            if f.ok { "OK" } else { "FAIL" }.to_string(),
                            f.check.to_string(),
                            f.detail.clone(),
                        ]
                    })
                    .collect();
            print_table(&["STATUS", "CHECK", "DETAIL"], &rows);
        }
    }
    Ok(if r.0.iter().all(|f| f.ok) {
        EXIT_OK
    } else {
        EXIT_FAILED
    })
}

fn diagnose(path: &Path, max_probes: u32, r: &mut Report) {
    // Read once: the config may come on a pipe (`kubectl get net-attach-def … | tether doctor
    // --config /dev/stdin`).
    let file = match read_network_file(path) {
        Ok(f) => f,
        Err(e) => return r.fail("config", e),
    };
    let raw = file.config.clone();
    let cfg = match PoolConfig::from_value(&raw, &node_agent()) {
        Ok(c) => c,
        Err(e) => return r.fail("config", format!("{e}; fix the ipam section")),
    };
    r.ok(
        "config",
        format!(
            "network {}: {} range(s), {}",
            cfg.network_name,
            cfg.ranges.len(),
            describe_store(&cfg)
        ),
    );

    let master = check_master(&raw, r);

    if cfg.store == StoreKind::Kubernetes && !check_kubernetes(&cfg, r) {
        // The store check would only repeat the failure above.
        return;
    }

    let open = match OpenStore::as_the_plugin(&raw) {
        Ok(s) => s,
        Err(e) => return r.fail("store", e),
    };
    let scope = Scope::new(cfg.network_name.clone(), cfg.domain.clone());
    let leases = match open.store().list(&scope) {
        Ok(l) => {
            r.ok(
                "store",
                format!(
                    "readable; {} record(s) for network {}",
                    l.len(),
                    cfg.network_name
                ),
            );
            l
        }
        Err(e) => return r.fail("store", format!("{e}")),
    };

    let alloc = Allocator::from_config(&cfg, open.store(), &NoProbe, &SystemClock);
    match alloc.status() {
        Ok(ranges) => {
            for s in ranges {
                let line = format!(
                    "range {}: {} usable, {} leased, {} quarantined, {} cooling down, {} free",
                    s.range, s.usable, s.leased, s.quarantined, s.cooling, s.free
                );
                if s.free == 0 {
                    r.fail("pool", format!("{line}; widen the range or release leases (tether leases --network {})", cfg.network_name));
                } else {
                    r.ok("pool", line);
                }
            }
        }
        Err(e) => r.fail("pool", e.to_string()),
    }

    if let Some(cluster) = open.cluster() {
        check_overlaps(cluster, file, path, r);
    }

    let Some((index, mac, name)) = master else {
        return;
    };
    if matches!(cfg.probe, ProbeConfig::Disabled) {
        r.ok(
            "conflicts",
            "probing is disabled in the config (\"probe\": false); not probing",
        );
        return;
    }
    let budget = match cfg.probe {
        ProbeConfig::Enabled {
            timeout_ms,
            attempts,
        } => tether_ipam::plugin::prober::budget(timeout_ms, attempts),
        ProbeConfig::Disabled => ProbeBudget::default(),
    };
    let held: Vec<IpAddr> = leases
        .iter()
        .filter(|l| l.is_leased())
        .map(|l| l.address)
        .collect();
    let mut probed = 0;
    let mut conflicts = 0;
    for range in &cfg.ranges {
        for addr in range
            .candidates(0)
            .filter(|a| !held.contains(a))
            .take(max_probes as usize)
        {
            probed += 1;
            match tether_wire::probe(index, mac, addr, budget) {
                Ok(ProbeOutcome::Free) => {}
                Ok(ProbeOutcome::InUse { mac }) => {
                    conflicts += 1;
                    r.fail(
                        "conflicts",
                        format!("{addr} is not leased but {mac} answers for it on {name}: exclude it from the range, or remove it from that host"),
                    );
                }
                Err(e) => return r.fail("conflicts", format!("cannot probe on {name}: {e}")),
            }
        }
    }
    if conflicts == 0 {
        r.ok(
            "conflicts",
            format!("{probed} unleased pool address(es) probed on {name}; none answered"),
        );
    }
}

/// The config of `file` (read from `path`) against the cluster's NADs: a FAIL line per finding
/// involving it.
fn check_overlaps(cluster: &Cluster, file: NetworkFile, path: &Path, r: &mut Report) {
    const CHECK: &str = "overlap";
    // Parsed before (the config check): this only adds its NAD's name and master.
    let Ok(me) = network_of(file, path, &node_agent()) else {
        return;
    };
    let nads = match cluster.network_attachment_definitions() {
        Ok(Some(n)) => n,
        Ok(None) => {
            return r.ok(
                CHECK,
                "the API serves no NetworkAttachmentDefinitions: no other network to compare",
            );
        }
        // Not needed for this config to work (the pool metrics need it): said, not failed.
        Err(e @ KubeStoreError::Forbidden { .. }) => {
            return r.ok(CHECK, format!("not compared with the cluster's NADs: {e}"));
        }
        Err(e) => {
            return r.fail(
                CHECK,
                format!(
                    "cannot read the cluster's NetworkAttachmentDefinitions to compare ranges: {e}"
                ),
            );
        }
    };
    let nets = with_files(nad_networks(&nads), std::slice::from_ref(&me));
    let mut found = 0;
    for f in findings(&nets) {
        if f.nads().contains(&me.nad.as_str()) {
            found += 1;
            r.fail(CHECK, f.message());
        }
    }
    if found == 0 {
        r.ok(
            CHECK,
            format!(
                "compared with {} tether-ipam network(s) of the cluster's NADs: none overlaps network {}'s in \
                 another uniqueness domain on its master, or in its domain with another prefix or gateway",
                nets.len() - 1,
                me.cfg.network_name
            ),
        );
    }
}

/// The verbs tether needs: (API group, resource, verbs, what breaks without them).
const NEEDED: &[(&str, &str, &[&str], &str)] = &[
    (
        "ipam.tether.dev",
        "ipleases",
        &["get", "list", "watch", "create", "update", "delete"],
        "allocation fails",
    ),
    (
        "",
        "pods",
        &["get", "list", "watch"],
        "leases of deleted pods and nodes are not reclaimed and `release` cannot check pods",
    ),
];

/// The Kubernetes checks; false when the API cannot be used at all (later checks would only repeat it).
fn check_kubernetes(cfg: &PoolConfig, r: &mut Report) -> bool {
    let settings = match KubeSettings::from_pool_config(cfg) {
        Ok(s) => s,
        Err(e) => {
            r.fail("kubeconfig", format!("{e}; fix ipam.kubernetes"));
            return false;
        }
    };
    match check_credentials(&settings) {
        Ok(d) => r.ok("kubeconfig", d),
        Err(e) => {
            r.fail("kubeconfig", e.to_string());
            return false;
        }
    }
    // The lease store as the plugin opens it, and the rest of the API on the same client.
    let api = match ApiClient::connect(&settings) {
        Ok(a) => a,
        Err(e) => {
            r.fail("kubeconfig", e.to_string());
            return false;
        }
    };
    let cluster = Cluster::new(api.clone());
    let store = KubeStore::on(api, settings);
    match cluster.server_version() {
        Ok(v) => r.ok(
            "api",
            format!("{} answers (Kubernetes {v})", store.server()),
        ),
        Err(e) => {
            r.fail("api", e.to_string());
            return false;
        }
    }
    store.restart_budget();
    let mut usable = true;
    match cluster.crd_state() {
        Ok(CrdState::Established) => r.ok(
            "crd",
            format!(
                "{} is installed and established",
                tether_kube_store::crd::CRD_NAME
            ),
        ),
        Ok(CrdState::Missing) => {
            r.fail(
                "crd",
                KubeStoreError::CrdMissing {
                    server: store.server().to_string(),
                }
                .to_string(),
            );
            usable = false;
        }
        Ok(CrdState::NotEstablished(detail)) => {
            r.fail(
                "crd",
                KubeStoreError::CrdNotEstablished {
                    server: store.server().to_string(),
                    detail,
                }
                .to_string(),
            );
            usable = false;
        }
        Ok(CrdState::Unreadable(msg)) => {
            store.restart_budget();
            // ready() lists ipleases when the CRD cannot be read.
            match store.ready() {
                Ok(()) => r.ok("crd", format!("cannot read CustomResourceDefinitions ({msg}), but listing ipleases works, so the CRD is installed")),
                Err(e) => {
                    r.fail("crd", format!("cannot read CustomResourceDefinitions ({msg}), and listing ipleases failed: {e}"));
                    usable = false;
                }
            }
        }
        Err(e) => {
            r.fail("crd", e.to_string());
            usable = false;
        }
    }
    'resources: for (group, resource, verbs, without) in NEEDED {
        let qualified = if group.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}.{group}")
        };
        let mut denied = Vec::new();
        for verb in *verbs {
            store.restart_budget();
            match cluster.can_i(verb, group, resource) {
                Ok(a) if a.allowed => {}
                Ok(a) => denied.push(if a.reason.is_empty() {
                    verb.to_string()
                } else {
                    format!("{verb} ({})", a.reason)
                }),
                Err(e) => {
                    r.fail(
                        "rbac",
                        format!("cannot ask the API server what this identity may do ({e}); check with `kubectl auth can-i --list` as {}", store.credentials()),
                    );
                    break 'resources;
                }
            }
        }
        if denied.is_empty() {
            r.ok(
                "rbac",
                format!("{} on {qualified} allowed", verbs.join(", ")),
            );
        } else {
            r.fail(
                "rbac",
                format!(
                    "forbidden: {} on {qualified} for {}, so {without}; grant {} on {qualified} in the ClusterRole bound to this identity (deploy/base/rbac.yaml)",
                    denied.join(", "),
                    store.credentials(),
                    verbs.join(", ")
                ),
            );
        }
    }
    if usable {
        check_node_scope(&cluster, r);
    }
    usable
}

/// The node-scope policy (deploy/base/policy.yaml): this credential names a node, and the API
/// server refuses it a lease of another node. A dry-run asks the server itself, so a policy that
/// is missing, unbound, in Warn/Audit mode or matching another identity all show as "not
/// enforced".
fn check_node_scope(cluster: &Cluster, r: &mut Report) {
    cluster.restart_budget();
    let id = match cluster.who_am_i() {
        Ok(id) => id,
        Err(e) => {
            return r.fail(
                "node-scope",
                format!("cannot ask who this identity is: {e}"),
            );
        }
    };
    cluster.restart_budget();
    let scope = match cluster.node_scope() {
        Ok(s) => s,
        Err(e) => {
            return r.fail(
                "node-scope",
                format!("cannot test the node-scope policy (a dry-run create of another node's lease): {e}"),
            );
        }
    };
    let user = &id.username;
    match (id.node, scope) {
        (Some(n), NodeScope::Enforced(_)) => r.ok(
            "node-scope",
            format!(
                "{user} is bound to node {n}, and the API server refuses it a lease of another node \
                 (ValidatingAdmissionPolicy tether-iplease-node-scope)"
            ),
        ),
        (Some(n), NodeScope::NotEnforced) => r.fail(
            "node-scope",
            format!(
                "{user} is bound to node {n}, but the API server would let it lease an address to another node, \
                 so every node's credential can free or steal any node's addresses: apply deploy/base/policy.yaml \
                 (a ValidatingAdmissionPolicy and its binding, validationActions [Deny]; Kubernetes 1.30+)"
            ),
        ),
        (None, NodeScope::Enforced(msg)) => r.fail(
            "node-scope",
            format!(
                "{user} carries no node claim (its token is not bound to a pod on a node), so its lease writes are \
                 refused ({msg}); use the kubeconfig the node-agent writes (/etc/cni/net.d/tether.d/tether.kubeconfig)"
            ),
        ),
        (None, NodeScope::NotEnforced) => r.fail(
            "node-scope",
            format!(
                "{user} is not held to one node: it carries no node claim and may lease an address to any node; a \
                 credential on a node should be the node-agent's (bound to its pod), held to its node by \
                 deploy/base/policy.yaml"
            ),
        ),
    }
}

/// The master NIC exists and is up. Returns what probing needs.
fn check_master(raw: &Value, r: &mut Report) -> Option<(u32, [u8; 6], String)> {
    let keys = match raw.as_object().map(MasterKeys::from_top) {
        Some(Ok(k)) => k,
        Some(Err(e)) => {
            r.fail("master", e.msg);
            return None;
        }
        None => MasterKeys::default(),
    };
    if keys.link_in_container {
        r.ok(
            "master",
            "linkInContainer: the master lives in the pod's netns; checked at ADD",
        );
        return None;
    }
    let link = (|| -> Result<tether_link::Link, String> {
        let nl = Netlink::current().map_err(|e| e.to_string())?;
        match &keys.master {
            Some(m) => nl.link_by_name(m).map_err(|e| e.to_string())?.ok_or_else(|| {
                format!("master {m:?} does not exist on this node: fix \"master\" (see `ip -br link`) or leave it out to use the default route's interface")
            }),
            None => nl
                .default_route_link()
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "no \"master\" and no IPv4 default route on this node: set \"master\"".to_string()),
        }
    })();
    match link {
        Ok(l) if !l.up => {
            r.fail(
                "master",
                format!(
                    "{} exists but is down: `ip link set {} up` (and check cabling/bond members)",
                    l.name, l.name
                ),
            );
            None
        }
        Ok(l) => {
            r.ok(
                "master",
                format!("{} exists and is up (mtu {})", l.name, l.mtu.unwrap_or(0)),
            );
            let mac = l.mac.as_deref().and_then(|m| <[u8; 6]>::try_from(m).ok())?;
            Some((l.index, mac, l.name))
        }
        Err(e) => {
            r.fail("master", e);
            None
        }
    }
}
