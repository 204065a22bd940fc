//! IPLeases created straight through the API before the scale rows, as many pods' allocations
//! would have left them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use tether_kube_store::convert::time_text;
use tether_kube_store::crd::{NETWORK_LABEL, NODE_LABEL, label_value};
use tether_kube_store::{IPLease, IPLeaseSpec, LeasePhase, PodInfo, object_name};

use crate::{OTHER_NETWORK, SCALE_NETWORK};

/// Host number `h` (1..=65534) of RANGE.
pub fn host(h: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + h)
}

/// `n` distinct host numbers of RANGE, spread over it pseudo-randomly and the same in every run,
/// as allocations from many pods' hashed starting points would be: the measured ADDs meet some
/// of them and must move on, as in a busy network.
pub fn occupied_hosts(n: usize) -> BTreeSet<u32> {
    let n = n.min(65_534);
    let mut set = BTreeSet::new();
    let mut x: u64 = 0x5eed;
    while set.len() < n {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        set.insert((z % 65_534) as u32 + 1);
    }
    set
}

/// The isolated fabric of OTHER_NETWORK's records.
pub const OTHER_FABRIC: &str = "bench-other";

/// IPLeases as tether-ipam writes them (crd.rs naming and labels), state Leased with a fake
/// holder: `occupied` in SCALE_NETWORK, and `others` more in OTHER_NETWORK (its own fabric).
pub fn prefill(occupied: &BTreeSet<u32>, others: usize) -> Vec<IPLease> {
    let since = time_text(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap();
    let other_hosts = (1..=others.min(65_534) as u32).map(|h| (OTHER_NETWORK, h));
    occupied
        .iter()
        .map(|h| (SCALE_NETWORK, *h))
        .chain(other_hosts)
        .enumerate()
        .map(|(i, (network, h))| {
            let addr = host(h);
            let node = format!("prefill-node-{:02}", i % 50);
            // The other network's records stand for the rest of a cluster's leases, in ranges of
            // their own: an isolated fabric keeps them off the measured network's addresses.
            let fabric = (network == OTHER_NETWORK).then(|| OTHER_FABRIC.to_string());
            let spec = IPLeaseSpec {
                network: network.to_string(),
                isolated_fabric: fabric.clone(),
                address: addr.to_string(),
                prefix_length: 16,
                range_index: Some(0),
                container_id: format!("prefill-{i:05}"),
                ifname: "net1".into(),
                pod: Some(PodInfo {
                    namespace: Some("prefill".into()),
                    name: Some(format!("pod-{i}")),
                    uid: Some(format!("uid-prefill-{i}")),
                }),
                node: Some(node.clone()),
                state: LeasePhase::Leased,
                since: since.clone(),
                released_at: None,
                quarantine: None,
            };
            let mut o = IPLease::new(&object_name(fabric.as_deref(), IpAddr::V4(addr)), spec);
            o.metadata.labels = Some(BTreeMap::from([
                (NETWORK_LABEL.to_string(), label_value(network)),
                (NODE_LABEL.to_string(), label_value(&node)),
            ]));
            o
        })
        .collect()
}
