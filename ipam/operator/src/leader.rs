//! One active `tether controller` among its replicas: a coordination.k8s.io Lease, taken and
//! renewed with conditional writes, as Kubernetes' own controllers do.
//!
//! Releases stay correct without it (each is a conditional write after a GET of the pod); the
//! election keeps two replicas from doing the same reads and writes, and lets a second replica
//! stand by on another control-plane node, taking over within one lease duration of the first
//! one's loss.

// KubeStoreError carries what a person needs to act (server, verb, detail); it is returned
// once per renewal, never in a hot loop.
#![allow(clippy::result_large_err)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use tether_cluster::{Cluster, ElectionLease};
use tether_kube_store::{KubeStoreError, jittered};

/// The election's Lease object.
pub const LEASE_NAME: &str = "tether-controller";
/// How long a leader's claim holds without a renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the leader renews (and a candidate tries).
const RENEW_EVERY: Duration = Duration::from_secs(5);

/// Campaign for `namespace/LEASE_NAME` as `identity` until `stop`, keeping `leading` true exactly
/// while this replica holds the Lease. Steps down when a renewal has not succeeded for
/// [`LEASE_DURATION`] (another replica may take over from then on), and gives the Lease up on
/// `stop` so a successor need not wait.
pub fn campaign(
    cluster: &Cluster,
    namespace: &str,
    identity: &str,
    leading: &AtomicBool,
    stop: &AtomicBool,
) {
    let mut last_renewed: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        cluster.restart_budget();
        match try_hold(cluster, namespace, identity) {
            Ok(true) => {
                if !leading.swap(true, Ordering::Relaxed) {
                    log::warn!("controller: {identity} leads (lease {namespace}/{LEASE_NAME})");
                }
                last_renewed = Some(Instant::now());
            }
            Ok(false) => {
                if leading.swap(false, Ordering::Relaxed) {
                    log::warn!("controller: {identity} lost the lease to another replica");
                }
                last_renewed = None;
            }
            Err(e) => {
                log::error!("controller: lease {namespace}/{LEASE_NAME}: {e}");
                if last_renewed.is_none_or(|t| t.elapsed() >= LEASE_DURATION)
                    && leading.swap(false, Ordering::Relaxed)
                {
                    log::warn!(
                        "controller: {identity} steps down: no renewal for {LEASE_DURATION:?}"
                    );
                }
            }
        }
        let until = Instant::now() + jittered(RENEW_EVERY);
        while !stop.load(Ordering::Relaxed) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    if leading.swap(false, Ordering::Relaxed) {
        cluster.restart_budget();
        if let Err(e) = give_up(cluster, namespace, identity) {
            log::warn!("controller: giving the lease up: {e}");
        }
    }
}

/// Take the Lease if it is free, expired or already ours; renew it if ours. Whether we hold it.
fn try_hold(cluster: &Cluster, namespace: &str, identity: &str) -> Result<bool, KubeStoreError> {
    let now = Timestamp::now();
    let Some(mut lease) = cluster.election_lease(namespace, LEASE_NAME)? else {
        let new = ElectionLease {
            metadata: ObjectMeta {
                name: Some(LEASE_NAME.into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            },
            spec: Some(spec(identity, now, None)),
        };
        return Ok(cluster.write_election_lease(&new, true)?.is_some());
    };
    let current = lease.spec.clone().unwrap_or_default();
    let holder = current.holder_identity.as_deref().unwrap_or_default();
    let ours = holder == identity;
    let expired = current.renew_time.as_ref().is_none_or(|t| {
        let held = Duration::from_secs(current.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        now.duration_since(t.0).as_secs_f64() > held.as_secs_f64()
    });
    if !ours && !holder.is_empty() && !expired {
        return Ok(false);
    }
    let transitions = current.lease_transitions.unwrap_or(0) + i32::from(!ours);
    let acquired = if ours { current.acquire_time } else { None };
    lease.spec = Some(LeaseSpec {
        lease_transitions: Some(transitions),
        ..spec(identity, now, acquired)
    });
    // Conditional on the resourceVersion just read: two candidates cannot both take it.
    Ok(cluster.write_election_lease(&lease, false)?.is_some())
}

fn spec(identity: &str, now: Timestamp, acquired: Option<MicroTime>) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(identity.into()),
        lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
        acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        ..Default::default()
    }
}

/// Leave the Lease without a holder, if it is still ours.
fn give_up(cluster: &Cluster, namespace: &str, identity: &str) -> Result<(), KubeStoreError> {
    let Some(mut lease) = cluster.election_lease(namespace, LEASE_NAME)? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(identity) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    cluster.write_election_lease(&lease, false).map(|_| ())
}
