//! The one LIST loop every reader shares (leases, pods, heartbeats, agent pods): from the API
//! server's watch cache (one unpaginated `resourceVersion=0` request, or "not older than" a
//! version the reader saw) or in consistent pages of [`KubeSettings::page_size`] from etcd; a
//! continue token that expired starts the list over; a watch cache that answers 429 (still
//! filling after a restart) is waited out, never bypassed with a consistent LIST.
//!
//! [`KubeSettings::page_size`]: crate::KubeSettings::page_size

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::core::Request;
use kube::core::params::ListParams;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::api::{ApiClient, Verb};
use crate::backoff::jittered;
use crate::convert::null_as_empty;
use crate::error::KubeStoreError;

/// One page of a list: its metadata (continue token, resourceVersion) and items.
#[derive(Deserialize)]
#[serde(bound = "T: DeserializeOwned")]
pub(crate) struct Page<T> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default = "Vec::new", deserialize_with = "null_as_empty")]
    items: Vec<T>,
}

/// What to list and how.
pub struct ListRequest<'a> {
    /// The collection path (`/api/v1/pods`).
    pub path: &'a str,
    /// What the request is, for errors and logs.
    pub what: &'a str,
    /// The resource named in a 403 (`pods`); `None`: the lease resource.
    pub resource: Option<&'a str>,
    /// `labelSelector`.
    pub labels: Option<&'a str>,
    /// `fieldSelector`.
    pub fields: Option<&'a str>,
    /// Metadata only (`PartialObjectMetadataList`).
    pub metadata_only: bool,
    /// From the watch cache at these parameters' resourceVersion; `None`: consistent pages.
    pub cache: Option<ListParams>,
    /// The longest answer (page) read; `None`: any.
    pub max_bytes: Option<usize>,
}

/// How many times an expired continue token (410) starts a paginated list over.
const RESTARTS: u32 = 3;

impl ApiClient {
    /// List `req`, handing each page's items to `page` (`true` with the first page after a
    /// restart: drop what the earlier pages gave). Returns the list's resourceVersion (to
    /// watch from).
    pub fn list_each<T: DeserializeOwned>(
        &self,
        req: &ListRequest<'_>,
        mut page: impl FnMut(Vec<T>, bool),
    ) -> Result<String, KubeStoreError> {
        let map = |e: kube::Error| match req.resource {
            None => self.map_error(Verb::List, req.what, e),
            Some(r) => self.map_other("list", r, req.what, e),
        };
        let mut cont: Option<String> = None;
        let (mut restarts, mut waits, mut fresh) = (0, 0, false);
        loop {
            let mut lp = match &req.cache {
                Some(at) => at.clone(),
                None => ListParams::default().limit(self.page_size),
            };
            if let Some(s) = req.labels {
                lp = lp.labels(s);
            }
            if let Some(s) = req.fields {
                lp = lp.fields(s);
            }
            if let Some(c) = &cont {
                lp = lp.continue_token(c);
            }
            let r = Request::new(req.path);
            let r = if req.metadata_only {
                r.list_metadata(&lp)
            } else {
                r.list(&lp)
            }
            .map_err(|e| self.protocol(req.what, e.to_string()))?;
            match self.send_at_most::<Page<T>>(Verb::List, req.what, r, req.max_bytes) {
                Ok(p) => {
                    page(p.items, std::mem::take(&mut fresh));
                    match p.metadata.continue_ {
                        Some(c) if !c.is_empty() && req.cache.is_none() => cont = Some(c),
                        _ => return Ok(p.metadata.resource_version.unwrap_or_default()),
                    }
                }
                Err(kube::Error::Api(s))
                    if s.code == 410 && cont.is_some() && restarts < RESTARTS =>
                {
                    restarts += 1;
                    cont = None;
                    fresh = true;
                }
                Err(kube::Error::Api(s)) if s.code == 429 && req.cache.is_some() => {
                    self.wait_for_cache(&mut waits, req.what, s).map_err(map)?
                }
                Err(e) => return Err(map(e)),
            }
        }
    }

    /// A watch cache answered 429 (still filling: a new resource, a restarted API server).
    /// Asking etcd instead (a consistent LIST) is what kept a recovering server from serving
    /// when every agent did it at once: wait, with back-off and jitter and never less than the
    /// server's `retryAfterSeconds`, and let the caller ask the cache again while the budget
    /// lasts; `Err` (the 429) when it would run out.
    fn wait_for_cache(
        &self,
        waits: &mut u32,
        what: &str,
        s: Box<kube::core::Status>,
    ) -> Result<(), kube::Error> {
        let asked = Duration::from_secs(
            s.details
                .as_ref()
                .map_or(0, |d| u64::from(d.retry_after_seconds)),
        );
        // At least what the server asked, plus up to half of it again: not all at once.
        let wait = cache_retry_wait(*waits).max(asked + jittered(asked / 2));
        if self.remaining() <= wait {
            return Err(kube::Error::Api(s));
        }
        log::debug!(
            "{what}: the watch cache is not ready ({}); asking it again in {wait:?}",
            s.message
        );
        *waits += 1;
        std::thread::sleep(wait);
        Ok(())
    }

    /// The parameters of a list: from the watch cache at any version when this client lists
    /// from the cache ([`KubeSettings::list_from_cache`]), else `None` (consistent pages).
    ///
    /// [`KubeSettings::list_from_cache`]: crate::KubeSettings::list_from_cache
    pub fn any_cached(&self) -> Option<ListParams> {
        self.list_from_cache
            .then(|| ListParams::default().match_any())
    }
}

/// How long to wait before asking a watch cache that answered 429 again: 250 ms doubling per
/// attempt up to 2 s, times a random factor in [0.5, 1.5) so that agents that all met the same
/// restarted server do not come back in step.
fn cache_retry_wait(attempt: u32) -> Duration {
    jittered(Duration::from_millis(250u64 << attempt.min(3)))
}
