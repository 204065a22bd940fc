//! `tether pools`: how full each network's pool is (range, size, leased, quarantined, cooling,
//! free), per range or per node, from the networks' NADs (or one `--config`) and the leases of the
//! store found.

use std::collections::BTreeSet;

use clap::Args;
use serde_json::{Value, json};
use tether_leases::{Lease, RangeStatus};
use tether_pool::{NodeAgent, StoreKind};

use crate::nads::{NadNetwork, nad_networks, network_of};
use crate::output::{EXIT_OK, ListOutput, print_items, print_table};
use crate::pool_usage::{NetworkOfNads, one_per_network, usage};
use crate::store_access::{Backend, OpenStore, StoreArgs};

#[derive(Args, Debug, Clone)]
pub struct PoolsArgs {
    /// Only this network.
    #[arg(long)]
    pub network: Option<String>,
    /// One row per range and node that holds addresses in it (leased, quarantined, cooling).
    #[arg(long)]
    pub by_node: bool,
    #[command(flatten)]
    pub store: StoreArgs,
    #[arg(short = 'o', long, value_enum, default_value_t = ListOutput::Table)]
    pub output: ListOutput,
}

/// One row: a range of a network, as a whole or on one node.
struct PoolRow<'a> {
    net: &'a NetworkOfNads,
    node: Option<String>,
    status: RangeStatus,
}

impl PoolRow<'_> {
    fn json(&self) -> Value {
        let c = &self.net.first.cfg;
        let mut v = json!({
            "network": c.network_name,
            "isolatedFabric": c.domain,
            "nads": self.net.nads,
            "range": self.status.range,
            "leased": self.status.leased,
            "quarantined": self.status.quarantined,
            "cooling": self.status.cooling,
        });
        match &self.node {
            Some(n) => v["node"] = json!(n),
            None => {
                // Past what JSON numbers carry exactly (an IPv6 /64), as text.
                v["size"] = count(self.status.usable);
                v["free"] = count(self.status.free);
            }
        }
        v
    }
}

fn count(n: u128) -> Value {
    u64::try_from(n)
        .ok()
        .filter(|n| *n < 1 << 53)
        .map_or_else(|| json!(n.to_string()), |n| json!(n))
}

/// The networks to count: `--config`'s, else the cluster's NADs.
fn networks(args: &PoolsArgs, open: &OpenStore) -> Result<Vec<NetworkOfNads>, String> {
    let nets: Vec<NadNetwork> = match (&args.store.config, &open.config) {
        // The file `OpenStore::open` read: read again, a pipe would be empty.
        (Some(p), Some(file)) => vec![network_of(file.clone(), p, &NodeAgent::on_every_node())?],
        _ => {
            let cluster = open.cluster().ok_or(
                "tether pools needs the networks' ranges: from the cluster's NADs (no cluster credentials were found) \
                 or from --config FILE",
            )?;
            match cluster
                .network_attachment_definitions()
                .map_err(|e| format!("reading the NetworkAttachmentDefinitions: {e}"))?
            {
                Some(nads) => nad_networks(&nads),
                None => {
                    return Err(
                        "the cluster serves no NetworkAttachmentDefinitions (k8s.cni.cncf.io/v1): is Multus installed? \
                         Count one network with --config FILE"
                            .into(),
                    );
                }
            }
        }
    };
    Ok(one_per_network(nets)
        .into_iter()
        .filter(|n| {
            args.network
                .as_ref()
                .is_none_or(|w| *w == n.first.cfg.network_name)
        })
        .collect())
}

pub fn pools(args: &PoolsArgs) -> Result<i32, String> {
    let (open, _) = OpenStore::open(&args.store)?;
    let nets = networks(args, &open)?;
    // The store read keeps the leases of the networks of its kind; the others are elsewhere.
    let here = match open.backend {
        Backend::Kube(_) => StoreKind::Kubernetes,
        Backend::File(_) => StoreKind::File,
    };
    let (counted, elsewhere): (Vec<&NetworkOfNads>, Vec<&NetworkOfNads>) =
        nets.iter().partition(|n| n.first.cfg.store == here);
    for n in &elsewhere {
        eprintln!(
            "tether: network {} keeps its leases in {}; not counted here",
            n.first.cfg.network_name,
            match n.first.cfg.store {
                StoreKind::File => "each node's file store (count it on a node with --data-dir)",
                StoreKind::Kubernetes => "the cluster store (count it with cluster credentials)",
            }
        );
    }
    for n in &counted {
        if !n.other_ranges.is_empty() {
            eprintln!(
                "tether: NADs {} give network {} other ranges than {}; counted with {}'s",
                n.other_ranges.join(", "),
                n.first.cfg.network_name,
                n.first.nad,
                n.first.nad
            );
        }
    }
    let leases = open.leases(None)?;
    let rows = if args.by_node {
        by_node(&counted, &leases)?
    } else {
        let mut rows = Vec::new();
        for n in &counted {
            for status in usage(&n.first, &leases)? {
                rows.push(PoolRow {
                    net: n,
                    node: None,
                    status,
                });
            }
        }
        rows
    };
    if rows.is_empty() {
        eprintln!("tether: no pools to show, from {}", open.description);
    } else {
        eprintln!("tether: pools counted from {}", open.description);
    }
    print(&rows, args.by_node, args.output)?;
    Ok(EXIT_OK)
}

/// Per node: each node's records counted alone (free is the pool's, not a node's: not shown).
fn by_node<'a>(nets: &[&'a NetworkOfNads], leases: &[Lease]) -> Result<Vec<PoolRow<'a>>, String> {
    let nodes: BTreeSet<Option<String>> = leases.iter().map(|l| l.node.clone()).collect();
    let mut rows = Vec::new();
    for n in nets {
        for node in &nodes {
            let of_node: Vec<Lease> = leases.iter().filter(|l| &l.node == node).cloned().collect();
            for status in usage(&n.first, &of_node)? {
                if status.leased + status.quarantined + status.cooling > 0 {
                    rows.push(PoolRow {
                        net: n,
                        node: Some(node.clone().unwrap_or_else(|| "(none)".into())),
                        status,
                    });
                }
            }
        }
    }
    rows.sort_by(|a, b| {
        (&a.net.first.cfg.network_name, &a.status.range, &a.node).cmp(&(
            &b.net.first.cfg.network_name,
            &b.status.range,
            &b.node,
        ))
    });
    Ok(rows)
}

fn print(rows: &[PoolRow], by_node: bool, output: ListOutput) -> Result<(), String> {
    match output {
        ListOutput::Json | ListOutput::Yaml => print_items(
            "PoolList",
            rows.iter().map(PoolRow::json).collect(),
            output == ListOutput::Yaml,
        ),
        ListOutput::Name => {
            let names: BTreeSet<&str> = rows
                .iter()
                .map(|r| r.net.first.cfg.network_name.as_str())
                .collect();
            for n in names {
                println!("{n}");
            }
            Ok(())
        }
        ListOutput::Table | ListOutput::Wide => {
            let wide = output == ListOutput::Wide;
            let mut header = vec!["NETWORK", "RANGE"];
            if by_node {
                header.push("NODE");
            } else {
                header.push("SIZE");
            }
            header.extend(["LEASED", "QUARANTINED", "COOLING"]);
            if !by_node {
                header.push("FREE");
            }
            if wide {
                header.extend(["ISOLATED-FABRIC", "NADS"]);
            }
            let table: Vec<Vec<String>> = rows
                .iter()
                .map(|r| {
                    let s = &r.status;
                    let mut cells = vec![r.net.first.cfg.network_name.clone(), s.range.clone()];
                    match &r.node {
                        Some(n) => cells.push(n.clone()),
                        None => cells.push(s.usable.to_string()),
                    }
                    cells.extend([
                        s.leased.to_string(),
                        s.quarantined.to_string(),
                        s.cooling.to_string(),
                    ]);
                    if r.node.is_none() {
                        cells.push(s.free.to_string());
                    }
                    if wide {
                        cells.push(r.net.first.cfg.domain.clone().unwrap_or_else(|| "-".into()));
                        cells.push(r.net.nads.join(","));
                    }
                    cells
                })
                .collect();
            print_table(&header, &table);
            Ok(())
        }
    }
}
