//! `tether leases` and `tether release`: the leases of the store found (or named) as a table, JSON,
//! YAML or names, filtered; and the release of one address (refused while its pod may still be
//! alive, unless forced).

use std::collections::HashMap;
use std::net::IpAddr;

use serde_json::json;
use tether_cluster::Cluster;
use tether_kube_store::ClaimMark;
use tether_leases::{Lease, LeaseState, short_id};

use super::lease_filter::{LeaseFilter, matching_labels};
use super::lease_view::{
    header, lease_json, lease_name, mark_json, mark_row, pod_text, row, state_name,
};
use crate::output::{EXIT_OK, EXIT_REFUSED, ListOutput, Output, print_items, print_table};
use crate::store_access::{Backend, OpenStore, StoreArgs};

pub(super) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The leases of `open` that pass `filter`, ordered by network and address.
fn listed(open: &OpenStore, filter: &LeaseFilter) -> Result<Vec<Lease>, String> {
    let mut all = match (&open.backend, &filter.selector) {
        (Backend::Kube(k), Some(sel)) => {
            k.restart_budget();
            k.list_matching(sel).map_err(|e| e.to_string())?
        }
        (_, Some(sel)) => matching_labels(open.leases(None)?, sel)?,
        (_, None) => open.leases(filter.network.as_deref())?,
    };
    all.retain(|l| filter.keeps(l));
    all.sort_by(|a, b| (&a.network, a.address).cmp(&(&b.network, b.address)));
    Ok(all)
}

pub(super) fn leases(
    filter: &LeaseFilter,
    args: &StoreArgs,
    output: ListOutput,
) -> Result<i32, String> {
    let (open, cfg) = OpenStore::open(args)?;
    // `--config` alone: that config's network.
    let mut filter = filter.clone();
    if filter.network.is_none()
        && let Some(c) = &cfg
    {
        filter.network = Some(c.network_name.clone());
    }
    let all = listed(&open, &filter)?;
    // Where the answer came from goes to stderr, so that an empty answer is never a silent one.
    if all.is_empty() {
        eprintln!("tether: no leases match, in {}", open.description);
    } else {
        eprintln!("tether: {} lease(s) from {}", all.len(), open.description);
    }
    let now = now();
    let marks = claim_marks(&open);
    let mark = |l: &Lease| {
        l.is_leased()
            .then(|| marks.get(&(l.domain.clone(), l.address)))
            .flatten()
    };
    match output {
        ListOutput::Json | ListOutput::Yaml => print_items(
            "LeaseList",
            all.iter()
                .map(|l| {
                    let mut v = lease_json(l, now);
                    if let Some(m) = mark(l) {
                        mark_json(&mut v, m);
                    }
                    v
                })
                .collect(),
            output == ListOutput::Yaml,
        )?,
        ListOutput::Name => {
            for l in &all {
                println!("{}", lease_name(l));
            }
        }
        ListOutput::Table | ListOutput::Wide => {
            let wide = output == ListOutput::Wide;
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|l| {
                    let mut r = row(l, now, wide);
                    if let Some(m) = mark(l) {
                        mark_row(&mut r, m, now);
                    }
                    r
                })
                .collect();
            print_table(&header(wide), &rows);
        }
    }
    Ok(EXIT_OK)
}

/// The conflict guard's marks in the cluster store (one LIST of the marked objects), by domain
/// and address; none for a file store, or when they cannot be read (said on stderr).
fn claim_marks(open: &OpenStore) -> HashMap<(Option<String>, IpAddr), ClaimMark> {
    let Backend::Kube(k) = &open.backend else {
        return HashMap::new();
    };
    k.restart_budget();
    match k.claim_marks() {
        Ok(m) => m.into_iter().map(|(d, a, m)| ((d, a), m)).collect(),
        Err(e) => {
            eprintln!("tether: the conflict guard's marks are not shown: {e}");
            HashMap::new()
        }
    }
}

/// `release`'s target: `NETWORK/ADDRESS` (as `tether leases -o name` prints it), or an address
/// with `--network`.
pub(super) fn release_target(
    target: &str,
    network: Option<&str>,
) -> Result<(String, IpAddr), String> {
    let usage = || {
        format!(
            "{target:?} is not NETWORK/ADDRESS (as `tether leases -o name` prints it), nor an address with --network"
        )
    };
    if let Ok(address) = target.parse::<IpAddr>() {
        let network = network.ok_or_else(|| {
            format!("which network's record of {address}? Say NETWORK/{address}, or pass --network")
        })?;
        return Ok((network.to_string(), address));
    }
    let (net, addr) = target.split_once('/').ok_or_else(usage)?;
    let address: IpAddr = addr.parse().map_err(|_| usage())?;
    if net.is_empty() {
        return Err(usage());
    }
    if let Some(n) = network.filter(|n| *n != net) {
        return Err(format!(
            "{target} names network {net}, and --network names {n}: say one"
        ));
    }
    Ok((net.to_string(), address))
}

/// Is the pod holding `lease` alive? `Ok(reason it may be released)` or `Err(reason to refuse)`.
fn pod_check(lease: &Lease, api: Option<&Cluster>) -> Result<String, String> {
    let Some(api) = api else {
        return Err(format!(
            "{} is leased to {} (container {}, {}); without API access (--kubeconfig) tether cannot tell whether its pod \
             still runs. Check with kubectl, then pass --force to release it anyway.",
            lease.address,
            pod_text(lease),
            short_id(&lease.container_id),
            lease.ifname
        ));
    };
    let (Some(ns), Some(name)) = (&lease.pod.namespace, &lease.pod.name) else {
        return Err(format!(
            "{} is leased to container {} ({}), which names no pod, so tether cannot tell whether it still runs; \
             pass --force to release it anyway.",
            lease.address,
            short_id(&lease.container_id),
            lease.ifname
        ));
    };
    match api.pod_uid(ns, name) {
        Ok(None) => Ok(format!("pod {ns}/{name} no longer exists")),
        Ok(Some(uid)) => match &lease.pod.uid {
            Some(held) if *held != uid => Ok(format!(
                "pod {ns}/{name} is now another pod (uid {uid}, the lease names {held})"
            )),
            _ => Err(format!(
                "{} is leased to pod {ns}/{name} (uid {uid}), which exists: releasing it would hand a live address to \
                 another pod. Delete the pod first, or pass --force if you are sure.",
                lease.address
            )),
        },
        Err(e) => Err(format!(
            "{} is leased to pod {ns}/{name}, and checking that pod failed ({e}); pass --force to release it anyway.",
            lease.address
        )),
    }
}

pub(super) fn release(
    address: IpAddr,
    network: &str,
    force: bool,
    args: &StoreArgs,
    output: Output,
) -> Result<i32, String> {
    let (open, _) = OpenStore::open(args)?;
    eprintln!("tether: releasing in {}", open.description);
    let records: Vec<Lease> = open
        .leases(None)?
        .into_iter()
        .filter(|l| l.address == address)
        .collect();
    let Some(lease) = records.iter().find(|l| l.network == network) else {
        // One record per address of a domain: another network of the domain may hold it.
        let others: Vec<String> = records
            .iter()
            .map(|l| format!("network {}", l.network))
            .collect();
        return Err(if others.is_empty() {
            format!(
                "network {network} has no record of {address} in {}",
                open.description
            )
        } else {
            format!(
                "network {network} has no record of {address}; {} holds it: release NETWORK/{address} with that \
                 network",
                others.join(" and ")
            )
        });
    };
    let why = match &lease.state {
        LeaseState::Leased if force => "forced (--force)".to_string(),
        LeaseState::Leased => match pod_check(lease, open.cluster()) {
            Ok(why) => why,
            Err(refusal) => {
                eprintln!("tether: {refusal}");
                if output == Output::Json {
                    println!(
                        "{}",
                        json!({"refused": address.to_string(), "network": network, "reason": refusal, "lease": lease_json(lease, now())})
                    );
                }
                return Ok(EXIT_REFUSED);
            }
        },
        LeaseState::Released { .. } => "already released; its cooldown ends now".to_string(),
        LeaseState::Quarantined { mac, .. } => {
            format!("quarantine lifted ({mac} had answered for it)")
        }
    };
    match open.store().remove(lease).map_err(|e| e.to_string())? {
        Ok(()) => {}
        Err(_) => {
            return Err(format!(
                "{address} changed while releasing it; look again with `tether leases`"
            ));
        }
    }
    match output {
        Output::Json => println!(
            "{}",
            json!({"released": address.to_string(), "network": network, "reason": why, "was": lease_json(lease, now())})
        ),
        Output::Table => println!(
            "released {address} in network {network} (was {} by {}): {why}",
            state_name(&lease.state),
            pod_text(lease)
        ),
    }
    Ok(EXIT_OK)
}
