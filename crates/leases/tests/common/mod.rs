#![allow(dead_code)]

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tether_leases::{
    AddRequest, BackendFailure, CasResult, Lease, LeaseStore, PodRef, Scope, StoreError, Taken,
};
use tether_pool::{IpRange, RequestedIp};

/// `network` in the cluster-wide domain.
pub fn scope(network: &str) -> Scope {
    Scope::cluster(network)
}

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let p = std::env::temp_dir().join(format!(
            "tether-leases-{tag}-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    /// A not-yet-existing subdirectory (so the store creates it).
    pub fn sub(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn range(s: &str) -> IpRange {
    IpRange::parse(s).unwrap()
}

pub fn pod(ns: &str, name: &str, uid: &str) -> PodRef {
    PodRef::new(ns, name, uid)
}

pub fn add_req(cid: &str, ifname: &str, pod: PodRef) -> AddRequest {
    AddRequest {
        container_id: cid.into(),
        ifname: ifname.into(),
        pod,
        node: Some("node-a".into()),
        requested: vec![],
    }
}

pub fn with_requested(mut r: AddRequest, reqs: &[&str]) -> AddRequest {
    r.requested = reqs
        .iter()
        .map(|s| RequestedIp::parse(s).unwrap())
        .collect();
    r
}

/// A store wrapper that fails every write to the given addresses.
pub struct FlakyStore<S> {
    pub inner: S,
    pub fail: Mutex<Vec<IpAddr>>,
}

impl<S: LeaseStore> FlakyStore<S> {
    pub fn new(inner: S) -> Self {
        FlakyStore {
            inner,
            fail: Mutex::new(vec![]),
        }
    }
    pub fn fail_on(&self, a: IpAddr) {
        self.fail.lock().unwrap().push(a);
    }
    fn check(&self, a: IpAddr) -> Result<(), StoreError> {
        if self.fail.lock().unwrap().contains(&a) {
            Err(StoreError::Backend(BackendFailure::new(
                format!("injected failure on {a}"),
                false,
            )))
        } else {
            Ok(())
        }
    }
}

impl<S: LeaseStore> LeaseStore for FlakyStore<S> {
    fn list(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        self.inner.list(scope)
    }
    fn claim(&self, new: Lease, expected: Option<&Lease>) -> CasResult<Lease> {
        self.check(new.address)?;
        self.inner.claim(new, expected)
    }
    fn remove(&self, expected: &Lease) -> Result<Result<(), Taken>, StoreError> {
        self.check(expected.address)?;
        self.inner.remove(expected)
    }
}
