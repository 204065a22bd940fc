//! The ceiling that one object per address allows: how fast the same API server creates IPLeases
//! like the ones tether-ipam writes for an ADD, from clients that cost nothing but the request.
//!
//! tether-ipam through the agent makes one request per ADD: the CREATE of the address's IPLease.
//! Here the same server, in the same run, with the same CRD and the same admission policies in
//! force (the node-scope ValidatingAdmissionPolicy evaluates every write, as for tether: the
//! clients hold the plugins' node-bound token), takes CREATEs of such objects (a domain record
//! named by its address, state Leased, spec.node the token's node, the network, node and pod
//! labels) from `concurrency` workers. Each worker has a client of its own on a thread of its own
//! and keeps its one connection open (HTTP/1.1 keep-alive, as the lease service's client does);
//! each first creates one object unmeasured, so the connection and the token's authentication are
//! made before the clock starts. Rate: successful CREATEs over the wall time from the start
//! barrier to the last answer. The objects are deleted afterwards (with the rest of the store).

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use tether_conformance::bench::{ms, quantile};
use tether_conformance::cpu;
use tether_kube_store::convert::time_text;
use tether_kube_store::crd::{NETWORK_LABEL, NODE_LABEL, POD_LABEL, label_value, pod_label_value};
use tether_kube_store::{IPLease, IPLeaseSpec, LeasePhase, PodInfo, object_name};

use crate::server::{Kube, NODE};

/// One concurrency's CREATEs.
pub struct CeilingRow {
    pub concurrency: usize,
    pub latencies: Vec<Duration>,
    pub failed: usize,
    pub first_error: Option<String>,
    pub wall: Duration,
    /// kube-apiserver and etcd, over the measured CREATEs.
    pub server_cpu: Duration,
}

impl CeilingRow {
    pub fn ok(&self) -> usize {
        self.latencies.len()
    }
    /// Successful CREATEs per second of wall time.
    pub fn rate(&self) -> f64 {
        self.ok() as f64 / self.wall.as_secs_f64()
    }
    pub fn q_ms(&self, q: f64) -> f64 {
        ms(quantile(&self.latencies, q))
    }
    /// API server + etcd CPU milliseconds per successful CREATE.
    pub fn server_cpu_ms(&self) -> f64 {
        self.server_cpu.as_secs_f64() * 1000.0 / self.ok().max(1) as f64
    }
}

/// Host number `h` (1..=65534) of the rows' range, 10.128.0.0/16.
fn host(h: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(
        u32::from(Ipv4Addr::new(10, 128, 0, 0)) + h as u32,
    ))
}

/// The IPLease tether-ipam's store writes for an ADD of `pod` in `network` on this node, at
/// host `h` of the range (the fields and labels of `to_object` for a Leased lease of no fabric).
pub fn lease_like_tethers(network: &str, h: usize, pod: &str, since: &str) -> IPLease {
    let addr = host(h);
    let spec = IPLeaseSpec {
        network: network.to_string(),
        isolated_fabric: None,
        address: addr.to_string(),
        prefix_length: 16,
        range_index: Some(0),
        container_id: format!("ceiling-{h:05}"),
        ifname: "net1".into(),
        pod: Some(PodInfo {
            namespace: Some("bench".into()),
            name: Some(pod.to_string()),
            uid: Some(format!("uid-{pod}")),
        }),
        node: Some(NODE.to_string()),
        state: LeasePhase::Leased,
        since: since.to_string(),
        released_at: None,
        quarantine: None,
    };
    let mut o = IPLease::new(&object_name(None, addr), spec);
    o.metadata.labels = Some(
        [
            (NETWORK_LABEL.to_string(), label_value(network)),
            (NODE_LABEL.to_string(), label_value(NODE)),
            (POD_LABEL.to_string(), pod_label_value("bench", pod)),
        ]
        .into_iter()
        .collect(),
    );
    o
}

/// `n` measured CREATEs from `concurrency` keep-alive clients holding the node credential
/// `node_kc`, each client after one unmeasured CREATE of its own. Hosts 1.. of the range; the
/// caller empties the store before and after.
pub fn measure(
    node_kc: &Path,
    network: &str,
    n: usize,
    concurrency: usize,
    server_pids: [u32; 2],
) -> Result<CeilingRow, String> {
    let workers = concurrency.max(1);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?;
    let since = time_text(now.as_secs())?;
    // Hosts 1..=workers for the warm-ups, then the measured ones.
    if workers + n > 65_534 {
        return Err(format!("{} CREATEs do not fit the range", workers + n));
    }
    let next = AtomicUsize::new(0);
    let done = Mutex::new((Vec::with_capacity(n), 0usize, None::<String>));
    let setup_error = Mutex::new(None::<String>);
    // The workers and this thread: everyone connected and warmed up before the clock starts.
    let start = Barrier::new(workers + 1);
    let server_cpu = || -> Duration {
        server_pids
            .iter()
            .map(|&p| cpu::of_process(p).unwrap_or_default())
            .sum()
    };
    // The scope joins every worker before it returns: the clock stops after the last answer.
    let (t0, c0) = std::thread::scope(|s| {
        for w in 0..workers {
            let (next, done, start, setup_error, since) =
                (&next, &done, &start, &setup_error, &since);
            s.spawn(move || {
                let warm = Kube::connect(node_kc).and_then(|k| {
                    let o = lease_like_tethers(network, 1 + w, &format!("pod-ceiling-w{w}"), since);
                    k.create(&o)
                        .map(|()| k)
                        .map_err(|e| format!("warm-up CREATE: {e}"))
                });
                let kube = match warm {
                    Ok(k) => Some(k),
                    Err(e) => {
                        setup_error.lock().unwrap().get_or_insert(e);
                        None
                    }
                };
                start.wait();
                let Some(kube) = kube else { return };
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    let h = workers + 1 + i;
                    let o = lease_like_tethers(network, h, &format!("pod-ceiling-{i}"), since);
                    let t = Instant::now();
                    let r = kube.create(&o);
                    let latency = t.elapsed();
                    let mut d = done.lock().unwrap();
                    match r {
                        Ok(()) => d.0.push(latency),
                        Err(e) => {
                            d.1 += 1;
                            d.2.get_or_insert(e);
                        }
                    }
                }
            });
        }
        start.wait();
        (Instant::now(), server_cpu())
    });
    let wall = t0.elapsed();
    let server_cpu = server_cpu().saturating_sub(c0);
    if let Some(e) = setup_error.into_inner().unwrap() {
        return Err(format!("the ceiling's clients: {e}"));
    }
    let (latencies, failed, first_error) = done.into_inner().unwrap();
    let row = CeilingRow {
        concurrency,
        latencies,
        failed,
        first_error,
        wall,
        server_cpu,
    };
    eprintln!(
        "  IPLease CREATEs       c={:<3} {:>4} in {:>6.1} s, {} failed ({:.0}/s)",
        concurrency,
        row.ok() + row.failed,
        row.wall.as_secs_f64(),
        row.failed,
        row.rate()
    );
    if let Some(e) = &row.first_error {
        eprintln!("    first failure: {e}");
    }
    Ok(row)
}
