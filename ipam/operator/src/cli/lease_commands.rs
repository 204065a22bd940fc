//! `tether leases` and `tether release`: the leases of a network as a table or JSON, and the
//! release of one address (refused while its pod may still be alive, unless forced).

use std::net::IpAddr;

use serde_json::{Value, json};
use tether_kube_store::Cluster;
use tether_leases::{Lease, LeaseState};

use crate::output::{EXIT_OK, EXIT_REFUSED, Output, print_table};
use crate::store_access::{OpenStore, StoreArgs};

pub(super) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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
        "isolatedFabric": l.domain,
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

pub(super) fn leases(
    network: Option<&str>,
    args: &StoreArgs,
    output: Output,
) -> Result<i32, String> {
    let (open, cfg) = OpenStore::open(args)?;
    let only = network.map(str::to_string).or_else(|| {
        args.config
            .as_ref()
            .and(cfg.as_ref().map(|c| c.network_name.clone()))
    });
    let mut all = open.leases(only.as_deref())?;
    all.sort_by(|a, b| (&a.network, a.address).cmp(&(&b.network, b.address)));
    let now = now();
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(
                &all.iter().map(|l| lease_json(l, now)).collect::<Vec<_>>()
            )
            .expect("json")
        ),
        Output::Table => {
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|l| {
                    vec![
                        match &l.domain {
                            // The address is unique only within its isolated fabric.
                            Some(f) => format!("{} ({f})", l.network),
                            None => l.network.clone(),
                        },
                        format!("{}/{}", l.address, l.prefix_len),
                        pod_text(l),
                        l.node.clone().unwrap_or_default(),
                        state_text(&l.state),
                        age(now.saturating_sub(l.since)),
                    ]
                })
                .collect();
            print_table(
                &["NETWORK", "ADDRESS", "POD", "NODE", "STATE", "AGE"],
                &rows,
            );
        }
    }
    Ok(EXIT_OK)
}

/// Is the pod holding `lease` alive? `Ok(reason it may be released)` or `Err(reason to refuse)`.
fn pod_check(lease: &Lease, api: Option<&Cluster>) -> Result<String, String> {
    let Some(api) = api else {
        return Err(format!(
            "{} is leased to {} (container {}, {}); without API access (--kubeconfig) tether cannot tell whether its pod \
             still runs. Check with kubectl, then pass --force to release it anyway.",
            lease.address,
            pod_text(lease),
            short(&lease.container_id),
            lease.ifname
        ));
    };
    let (Some(ns), Some(name)) = (&lease.pod.namespace, &lease.pod.name) else {
        return Err(format!(
            "{} is leased to container {} ({}), which names no pod, so tether cannot tell whether it still runs; \
             pass --force to release it anyway.",
            lease.address,
            short(&lease.container_id),
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
            format!("network {network} has no record of {address}")
        } else {
            format!(
                "network {network} has no record of {address}; {} holds it: name that network with --network",
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
            "released {address} in network {network} (was {} of {}): {why}",
            state_text(&lease.state),
            pod_text(lease)
        ),
    }
    Ok(EXIT_OK)
}
