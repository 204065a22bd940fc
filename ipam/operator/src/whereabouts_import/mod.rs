//! `tether import-whereabouts`: the addresses a running whereabouts hands out become IPLeases, so
//! that its pods keep them while NADs move over to tether one by one, and tether never hands out
//! an address whereabouts still holds.
//!
//! One pass reads whereabouts' IPPools and OverlappingRangeIPReservations (of `--namespace`,
//! default `kube-system` as whereabouts', or of every namespace) and the cluster's NADs; each
//! allocation ([`entries`]) goes to the network and domain tether gives the NAD of its pool
//! ([`networks`]); its pod is read (gone: skipped, the address is free) and its record created
//! as `Leased` to whereabouts' holder, on the pod's node ([`claim`]: an address `Leased` to
//! someone else is a conflict, reported and never overwritten). The imported leases are then
//! like any other: the reconciler of the pod's node releases them once the pod is gone.
//!
//! The holder keeps whereabouts' interface name, also when it recorded none (entries older than
//! its PR #471): a guessed `net1` could name another attachment of the pod, while an empty one
//! only means that no DEL through tether matches the record, which the reconciler releases when
//! the pod goes (and tether never gets GC through Multus, which would judge it by attachment).
//!
//! `--follow` passes again every `--interval-s` until SIGTERM or SIGINT, for the window where
//! both IPAMs run: a LIST of the pools each time rather than a watch, because whereabouts itself
//! LISTs every pool on each ADD (one more per interval is what one ADD costs the server), a watch
//! would carry the whole pool object per change anyway, and a pass that lists also recovers from
//! any failure by itself. A new allocation always shows in its pool first (whereabouts patches
//! the pool, then creates the reservation), so the reservations, which only add what drifted,
//! are read every [`RESERVATIONS_EVERY`]. What a pass decided is not asked again.
//!
//! It writes the leases of many nodes, which the node-scope policy refuses to the node identity:
//! it runs with an admin's credential (`--kubeconfig`, else in-cluster, else `KUBECONFIG`),
//! and refuses one bound to a node. RBAC: `deploy/import-whereabouts/rbac.yaml`.

mod claim;
mod entries;
mod networks;
mod summary;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use tether_cluster::Cluster;
use tether_cluster::whereabouts::WHEREABOUTS_DEFAULT_NAMESPACE;
use tether_kube_store::{ApiClient, KubeSettings, KubeStore};

use crate::output::{EXIT_FAILED, EXIT_OK, Output};
use claim::{Importer, Outcome};
use entries::{ReadPool, Skipped, entries};
use networks::{Matched, Networks, Placement, known_prefixes};
use summary::{EntryKey, Summary, describe_conflict};

/// How often `--follow` reads the reservations again.
pub const RESERVATIONS_EVERY: Duration = Duration::from_secs(30);
/// Objects per page of a list: an IPPool holds every allocation of its range (up to etcd's
/// 1.5 MB request limit), so a page stays within tens of megabytes.
const PAGE_SIZE: u32 = 20;

/// `tether import-whereabouts` flags.
#[derive(Args, Debug, Clone)]
pub struct ImportArgs {
    /// Kubeconfig of an identity allowed to write every node's IPLeases (an admin's; see
    /// deploy/import-whereabouts/rbac.yaml). Default: in-cluster, else KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of whereabouts' objects (its kubeconfig context's namespace).
    #[arg(short = 'n', long, default_value = WHEREABOUTS_DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Read whereabouts' objects in every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    pub all_namespaces: bool,
    /// Judge every allocation, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Keep importing what whereabouts allocates until SIGTERM or SIGINT (while both IPAMs run).
    #[arg(long)]
    pub follow: bool,
    /// With --follow: seconds between passes.
    #[arg(long, default_value_t = 2, requires = "follow")]
    pub interval_s: u64,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Run the import; the exit status is 1 when a conflict is left or a request failed.
pub fn run(args: &ImportArgs) -> Result<i32, String> {
    if args.interval_s == 0 {
        return Err("--interval-s must be at least 1".into());
    }
    // Before any thread exists: they inherit the blocked signals.
    let stop = args.follow.then(crate::termination::stop_flag);
    if args.follow {
        tether_cni::logging::install("tether");
    }
    let settings = KubeSettings {
        kubeconfig: args.kubeconfig.clone(),
        page_size: PAGE_SIZE,
        field_manager: "tether-import-whereabouts".into(),
        ..crate::options::long_lived(&KubeSettings::default())
    };
    let api = ApiClient::connect(&settings).map_err(|e| e.to_string())?;
    if let Some(node) = api.bound_node() {
        return Err(format!(
            "this credential is bound to node {node} (the node-agent's): the import writes the leases of \
             every node, which tether's node-scope policy refuses to a node; run it with an admin's \
             kubeconfig (--kubeconfig)"
        ));
    }
    let cluster = Cluster::new(api.clone());
    let leases = KubeStore::on(api, settings);
    let mut run = Run {
        importer: Importer {
            leases: &leases,
            cluster: &cluster,
            dry_run: args.dry_run,
        },
        namespace: (!args.all_namespaces).then_some(args.namespace.as_str()),
        summary: Summary::new(args.dry_run),
        reservations: None,
        follow: args.follow,
    };
    let never = AtomicBool::new(false);
    let stop = stop.as_deref().unwrap_or(&never);
    loop {
        run.pass(stop)?;
        if !args.follow || wait(stop, Duration::from_secs(args.interval_s)) {
            break;
        }
    }
    run.summary.print(args.output);
    Ok(if run.summary.has_problems() {
        EXIT_FAILED
    } else {
        EXIT_OK
    })
}

/// Wait `d` or until `stop`; true when stopped.
fn wait(stop: &AtomicBool, d: Duration) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100).min(d));
    }
    stop.load(Ordering::Relaxed)
}

/// An import's state across passes.
struct Run<'a> {
    importer: Importer<'a>,
    /// whereabouts' namespace; `None`: every namespace.
    namespace: Option<&'a str>,
    summary: Summary,
    /// The reservations last read, and when.
    reservations: Option<(Instant, Vec<tether_cluster::WhereaboutsReservation>)>,
    follow: bool,
}

impl Run<'_> {
    /// Read whereabouts' objects and the NADs, import what is not decided yet. `Err`: nothing
    /// could be read (with `--follow`, the next pass tries again).
    fn pass(&mut self, stop: &AtomicBool) -> Result<(), String> {
        self.summary.begin_pass();
        let (pools, networks) = match self.read() {
            Ok(read) => read,
            Err(e) if self.follow => {
                log::warn!("import-whereabouts: {e}; trying again");
                self.summary.fail(e);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let prefixes = known_prefixes(pools.iter().map(|p| p.prefix.as_deref()), &networks);
        let reservations = self.reservations.as_ref().map_or(&[][..], |(_, r)| r);
        let (found, skipped) = entries(&pools, reservations, &prefixes);
        for s in skipped {
            let line = format!("skipped {}: {}", s.source, s.reason);
            if self.summary.skip(s) && self.follow {
                log::warn!("import-whereabouts: {line}");
            }
        }
        let placements = self.place(&pools, &networks);
        let now = crate::report::now_s();
        let mut present = HashSet::new();
        for e in &found {
            let key = EntryKey::of(e, &pools[e.pool]);
            present.insert(key.clone());
            if self.summary.is_decided(&key) || stop.load(Ordering::Relaxed) {
                continue;
            }
            let outcome = self.importer.import(e, &placements[e.pool], now);
            let line = self
                .follow
                .then(|| log_line(e, &placements[e.pool], &outcome));
            if self.summary.record(key, &e.source, outcome)
                && let Some(Some(line)) = line
            {
                log::warn!("import-whereabouts: {line}");
            }
        }
        if !stop.load(Ordering::Relaxed) {
            self.summary.end_pass(&present);
        }
        Ok(())
    }

    /// Where each pool's allocations go; what the operator should know about that is noted.
    fn place(&mut self, pools: &[ReadPool], networks: &Networks) -> Vec<Placement> {
        for n in &networks.unreadable {
            self.summary.note(n.clone());
        }
        let placements: Vec<Placement> = pools
            .iter()
            .map(|p| networks.place(&p.pool.name, p.range.as_ref().ok().copied()))
            .collect();
        for (p, at) in pools.iter().zip(&placements) {
            self.summary.pool(p, at);
            if !at.others.is_empty() {
                self.summary.note(format!(
                    "{} is named by more than one NAD: its allocations go to network {} of NAD {} (tether-ipam \
                     NADs first, then by namespace and name), not to {}",
                    p.label(),
                    at.scope,
                    at.nad.as_deref().unwrap_or_default(),
                    at.others.join(", ")
                ));
            }
            if at.matched == Matched::None {
                self.summary.note(format!(
                    "no NAD names {} ({}): its allocations are imported under network {} in the cluster-wide domain",
                    p.label(),
                    p.pool.range,
                    at.scope.network
                ));
            }
        }
        placements
    }

    /// The pools (read every pass), the reservations (when due), the NADs.
    fn read(&mut self) -> Result<(Vec<ReadPool>, Networks), String> {
        let cluster = self.importer.cluster;
        cluster.restart_budget();
        let pools = cluster
            .whereabouts_pools(self.namespace)
            .map_err(|e| e.to_string())?
            .ok_or(
                "whereabouts' IPPool resource (ippools.whereabouts.cni.cncf.io) is not served by this API server: \
                 there is nothing to import (is whereabouts installed here?)",
            )?;
        for u in pools.unreadable {
            self.summary.skip(Skipped {
                source: format!("IPPool {}", u.object),
                reason: format!("does not parse: {}", u.reason),
            });
        }
        let due = self
            .reservations
            .as_ref()
            .is_none_or(|(at, _)| at.elapsed() >= RESERVATIONS_EVERY);
        if due {
            cluster.restart_budget();
            let read = cluster
                .whereabouts_reservations(self.namespace)
                .map_err(|e| e.to_string())?;
            let (items, unreadable) = match read {
                Some(l) => (l.items, l.unreadable),
                None => {
                    self.summary.note(
                        "whereabouts' OverlappingRangeIPReservation resource is not served: only its pools are read"
                            .into(),
                    );
                    (Vec::new(), Vec::new())
                }
            };
            for u in unreadable {
                self.summary.skip(Skipped {
                    source: format!("OverlappingRangeIPReservation {}", u.object),
                    reason: format!("does not parse: {}", u.reason),
                });
            }
            self.reservations = Some((Instant::now(), items));
        }
        cluster.restart_budget();
        let nads = cluster
            .network_attachment_definitions()
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        Ok((
            pools.items.into_iter().map(ReadPool::new).collect(),
            Networks::from_nads(&nads),
        ))
    }
}

/// What `--follow` logs of an outcome worth a line (not "already", not "pod gone").
fn log_line(e: &entries::Entry, at: &Placement, o: &Outcome) -> Option<String> {
    match o {
        Outcome::Imported { took_over } => Some(format!(
            "imported {} of pod {} into network {}{}",
            e.address,
            e.podref(),
            at.scope.network,
            took_over.map_or(String::new(), |s| format!(" (took over its {s} record)"))
        )),
        Outcome::Conflict(c) => Some(format!("conflict: {}", describe_conflict(c))),
        Outcome::Failed(why) => Some(format!("failed: {why}")),
        Outcome::NotYet(why) => Some(format!("skipped {}: {why}", e.source)),
        Outcome::Already | Outcome::PodGone => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: ImportArgs,
    }

    fn parse(args: &[&str]) -> Result<ImportArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("tether").chain(args.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn flags() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.namespace, "kube-system");
        assert!(!a.all_namespaces && !a.dry_run && !a.follow);
        assert!(parse(&["-A"]).unwrap().all_namespaces);
        assert!(parse(&["-A", "-n", "wb"]).is_err(), "one namespace or all");
        assert!(
            parse(&["--interval-s", "5"]).is_err(),
            "--interval-s needs --follow"
        );
        let f = parse(&["--follow", "--interval-s", "5", "-o", "json"]).unwrap();
        assert_eq!((f.interval_s, f.output), (5, Output::Json));
    }
}
