//! The `tether-ipam` plugin a runtime execs for every pod: config → requests → allocation engine →
//! Result.
//!
//! The engine and the store live in tether-leases, ranges and config in tether-pool, probing in
//! tether-wire (through [`prober`]). This crate wires them to the CNI verbs; which CNI code each
//! failure gets is decided in [`cni_errors`]. Each verb builds one [`Context`] (one store
//! connection, one time budget) and passes it by reference.

pub mod cni_errors;
pub mod prober;
pub mod requests;
pub mod said_once;
#[cfg(test)]
mod tests;

use cni_errors::{
    config_error, data_dir_error, gc_without_list, kube_error, not_ready, nowhere_to_probe,
    range_full, to_cni, unfit_prefix,
};
use tether_cni::result::IpConfig;
use tether_cni::{Added, CniError, CniResult, MasterKeys, Plugin, Request, code};
use tether_kube_store::by_network::mirrors_wanted;
use tether_kube_store::{KubeSettings, KubeStore, LegacyMirrors, node_agent};
use tether_lease_client::{ServedStore, open_served, socket_path};

/// The node journal of the Kubernetes store, under `dataDir`.
pub const JOURNAL_DIR: &str = "journal";
use tether_leases::{
    AddRequest, Allocator, Attachment, FileStore, Lease, LeaseStore, NoProbe, Prober, SystemClock,
};
use tether_pool::{KubeconfigSource, PoolConfig, ProbeConfig, StoreKind};

/// The plugin: one method per CNI verb.
pub struct Ipam;

/// The node this store serves, recorded on each lease (kubelet's node name when set, else hostname).
fn node_name() -> Option<String> {
    std::env::var("NODE_NAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The lease store a config selects.
pub enum Store {
    File(FileStore),
    /// One per CNI call: its time budget (`kubernetes.timeout_s`) covers the whole call.
    Kube(Box<KubeStore>),
    /// The cluster store through the node-agent's lease service (one kept connection), going on
    /// directly by itself when the agent does not answer; same budget.
    Served(Box<ServedStore>),
}

/// May a call use the node-agent's lease service? STATUS may not: it tells the runtime whether
/// this plugin can serve an ADD by itself, which is the direct path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Through the node-agent when it answers.
    AgentFirst,
    /// Straight to the API server.
    Direct,
}

impl Store {
    pub fn open(cfg: &PoolConfig, route: Route) -> Result<Store, CniError> {
        // Both stores keep files under dataDir (state, or the node journal): checked first, so a
        // directory someone else could write is refused (code 7) before anything is read.
        let files = FileStore::new(cfg.data_dir.clone());
        let data_dir = files.open_dir().map_err(data_dir_error)?;
        Ok(match cfg.store {
            StoreKind::File => Store::File(files),
            StoreKind::Kubernetes => {
                if let Some(k) = &cfg.kubernetes
                    && let (Some(ours), KubeconfigSource::InsteadOfWhereabouts(theirs)) =
                        (&k.kubeconfig, &k.source)
                {
                    let network = &cfg.network_name;
                    said_once::warn_once(&data_dir, "whereabouts-kubeconfig", network, || {
                        format!(
                            "network {network}: ipam.kubernetes.kubeconfig {} is whereabouts' credential; tether-ipam \
                             uses tether's node-agent kubeconfig {} instead (set ipam.kubernetes.kubeconfig to it, or \
                             remove the key)",
                            theirs.display(),
                            ours.display()
                        )
                    });
                }
                // This node's journal lets ADD, DEL and CHECK go straight to their objects.
                let mut s = KubeSettings::from_pool_config(cfg).map_err(kube_error)?;
                s.node = node_name();
                s.journal_dir = Some(cfg.data_dir.join(JOURNAL_DIR));
                // While a tether-ipam from before uniqueness domains may still run somewhere,
                // the node-agent says so beside the kubeconfig it writes; the direct path then
                // keeps mirrors (the agent's own store does on the served path).
                let mirrors = s.kubeconfig.as_deref().is_some_and(mirrors_wanted);
                s.legacy_mirrors = LegacyMirrors::new(mirrors);
                let served = match (route, socket_path()) {
                    (Route::AgentFirst, Some(socket)) => open_served(&socket, &s),
                    _ => None,
                };
                match served {
                    Some(served) => Store::Served(Box::new(served)),
                    None => Store::Kube(Box::new(KubeStore::connect(s).map_err(kube_error)?)),
                }
            }
        })
    }

    /// The node the leases name: for the cluster store, the node its credential is bound to
    /// (what the API server holds it to), else `NODE_NAME` or the hostname.
    pub fn node(&self) -> Option<String> {
        match self {
            Store::Kube(s) => s.node().map(str::to_string).or_else(node_name),
            Store::Served(s) => Some(s.node().to_string()),
            Store::File(_) => node_name(),
        }
    }

    pub fn get(&self) -> &dyn LeaseStore {
        match self {
            Store::File(s) => s,
            Store::Kube(s) => s.as_ref(),
            Store::Served(s) => s.as_ref(),
        }
    }
}

/// Everything one invocation needs, built from the request.
struct Context {
    cfg: PoolConfig,
    store: Store,
}

impl Drop for Context {
    /// What this call cost the API server (`RUST_LOG=debug`), to see that ADD and DEL stay O(1).
    fn drop(&mut self) {
        match &self.store {
            Store::Kube(k) => {
                let c = k.requests();
                log::debug!(
                    "{} API request(s): {} list, {} get, {} create, {} update, {} delete",
                    c.total(),
                    c.list,
                    c.get,
                    c.create,
                    c.update,
                    c.delete
                );
            }
            Store::Served(s) => {
                let (served, direct) = s.traffic();
                log::debug!(
                    "{served} request(s) through the node-agent{}",
                    direct.map_or(String::new(), |n| format!(
                        ", then {n} API request(s) directly"
                    ))
                );
            }
            Store::File(_) => {}
        }
    }
}

impl Context {
    fn new(req: &Request, route: Route) -> Result<Context, CniError> {
        // The keys the runtime's parse already holds: GC's attachment list is not parsed again.
        // Whether tether's node-agent is installed decides the store of a config naming none.
        let cfg = PoolConfig::from_top(&req.conf.value, &node_agent()).map_err(config_error)?;
        let store = Store::open(&cfg, route)?;
        Ok(Context { cfg, store })
    }

    fn allocator<'a>(&'a self, prober: &'a dyn Prober) -> Allocator<'a> {
        Allocator::from_config(&self.cfg, self.store.get(), prober, &SystemClock)
    }

    /// The ADD of `add` with `prober`, as the runtime gets it: the Result, the addresses the
    /// probe step proved unused (none when `prober` never touches the wire), and the probe
    /// sockets to close once the reply is out.
    fn allocate(
        &self,
        add: &AddRequest,
        prober: &dyn Prober,
        on_wire: bool,
    ) -> Result<Added, CniError> {
        let out = self.allocator(prober).add_probed(add).map_err(to_cni)?;
        Ok(Added {
            result: self.result(&out.leases)?,
            probed: if on_wire { out.probed } else { Vec::new() },
            linger: Some(Box::new(out.release_later)),
        })
    }

    /// Release what `req`'s attachment holds.
    fn release(&self, req: &Request) -> Result<(), CniError> {
        self.allocator(&NoProbe)
            .del(req.env.container_id(), req.env.ifname())
            .map(|_| ())
            .map_err(to_cni)
    }

    /// The Result for the leases, in range order. A stored prefix that cannot fit its address (a
    /// hand-edited state file or object) is a store error, not a panic.
    fn result(&self, leases: &[Lease]) -> Result<CniResult, CniError> {
        let ips = leases
            .iter()
            .map(|l| {
                let address =
                    ipnet::IpNet::new(l.address, l.prefix_len).map_err(|_| unfit_prefix(l))?;
                Ok(IpConfig {
                    address,
                    gateway: l.range_index.and_then(|i| self.cfg.gateway_for(i)),
                    interface: None,
                })
            })
            .collect::<Result<_, CniError>>()?;
        Ok(CniResult {
            interfaces: Vec::new(),
            ips,
            routes: self.cfg.routes.clone(),
            dns: self.cfg.dns.clone(),
        })
    }
}

impl Plugin for Ipam {
    fn name(&self) -> &'static str {
        "tether-ipam"
    }

    fn version(&self) -> String {
        tether_build_info::line(self.name())
    }

    fn add(&self, req: &Request) -> Result<Added, CniError> {
        let ctx = Context::new(req, Route::AgentFirst)?;
        let add = AddRequest {
            container_id: req.env.container_id().to_string(),
            ifname: req.env.ifname().to_string(),
            pod: requests::pod_ref(req),
            node: ctx.store.node(),
            requested: requests::requested_ips(req)?,
        };
        let (timeout_ms, attempts) = match ctx.cfg.probe {
            ProbeConfig::Disabled => return ctx.allocate(&add, &NoProbe, false),
            ProbeConfig::Enabled {
                timeout_ms,
                attempts,
            } => (timeout_ms, attempts),
        };
        let keys = MasterKeys::from_top(&req.conf.value)?;
        let target = prober::target_for(&keys, &req.env).ok_or_else(nowhere_to_probe)?;
        let wire = prober::WireProber::new(target, prober::budget(timeout_ms, attempts));
        ctx.allocate(&add, &wire, true)
    }

    fn del(&self, req: &Request) -> Result<(), CniError> {
        let ctx = match Context::new(req, Route::AgentFirst) {
            Ok(c) => c,
            // An ADD under this configuration fails the same way before it leases anything, and
            // the runtime replays the configuration of the ADD (Multus from its cache), so no
            // retry can change the answer: failing would leave the pod Terminating until someone
            // force-deletes it (seen with a real kubelet). Nothing is held to release; a lease of
            // an earlier, working configuration is the reconciler's once the pod is gone.
            Err(e) if e.code == code::INVALID_CONFIG => {
                log::warn!(
                    "DEL of container {} interface {}: {}; nothing can be held under this configuration, so there is nothing to release",
                    req.env.container_id(),
                    req.env.ifname(),
                    e.msg
                );
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        ctx.release(req)
    }

    fn check(&self, req: &Request) -> Result<(), CniError> {
        let ctx = Context::new(req, Route::AgentFirst)?;
        ctx.allocator(&NoProbe)
            .check(req.env.container_id(), req.env.ifname())
            .map(|_| ())
            .map_err(to_cni)
    }

    fn status(&self, req: &Request) -> Result<(), CniError> {
        let ctx = Context::new(req, Route::Direct).map_err(|e| not_ready(e.msg))?;
        if let Store::Kube(k) = &ctx.store {
            k.ready().map_err(|e| not_ready(e.to_string()))?;
        }
        let ranges = ctx
            .allocator(&NoProbe)
            .status()
            .map_err(|e| not_ready(e.to_string()))?;
        if let Some(full) = ranges.iter().find(|r| r.free == 0) {
            return Err(range_full(full, &ctx.cfg.network_name));
        }
        Ok(())
    }

    fn gc(&self, req: &Request) -> Result<(), CniError> {
        let ctx = Context::new(req, Route::AgentFirst)?;
        // Without the list every lease would look stale; refuse rather than release them all.
        let listed = req
            .conf
            .valid_attachments
            .as_deref()
            .ok_or_else(gc_without_list)?;
        let valid: Vec<Attachment> = listed
            .iter()
            .map(|a| Attachment::new(a.container_id.clone(), a.ifname.clone()))
            .collect();
        let report = ctx.allocator(&NoProbe).gc(&valid).map_err(to_cni)?;
        for l in &report.released {
            log::info!(
                "GC released {} (container {}, {})",
                l.address,
                l.container_id,
                l.ifname
            );
        }
        report
            .into_result(&ctx.cfg.network_name)
            .map(|_| ())
            .map_err(to_cni)
    }
}
