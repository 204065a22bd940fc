//! The one WATCH loop every watcher shares (pods for the reconciler; for the node-agent's lease
//! service, every record, of all nodes, of each network its pods use): from a resourceVersion, for
//! at most a timeout (asked of the server as `timeoutSeconds`, enforced here too) or until the
//! caller says stop; not bounded by the client's per-call budget. Counted as a LIST in the request
//! counters and as a `watch` in the traffic, like every long request.

use std::fmt::Debug;
use std::time::Duration;

use futures_util::TryStreamExt;
use kube::core::WatchEvent;
use serde::de::DeserializeOwned;

use crate::api::{ApiClient, Verb, failure_code};
use crate::error::KubeStoreError;

/// How a watch ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEnd {
    /// The server closed it (its timeout) or the caller stopped it; resume from this
    /// resourceVersion.
    Closed {
        /// Last resourceVersion seen.
        resource_version: String,
    },
    /// `410 Gone`/`Expired`: the resourceVersion is too old; list again.
    Expired,
}

/// One change a watch carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<T> {
    /// The object exists now (added, or modified).
    Upsert(T),
    /// The object was deleted (or left the watch's selection).
    Deleted(T),
}

/// An object whose resourceVersion a watch resumes from.
pub trait Versioned {
    /// Its `metadata.resourceVersion`, if it has one.
    fn resource_version(&self) -> Option<String>;
}

/// What to watch.
pub struct WatchRequest<'a> {
    /// The request (`Request::watch` or `watch_metadata`).
    pub req: http::Request<Vec<u8>>,
    /// What it is, for errors.
    pub what: &'a str,
    /// The resource named in a 403 (`pods`); `None`: the lease resource.
    pub resource: Option<&'a str>,
}

impl ApiClient {
    /// Watch from `resource_version`, calling `f` per change, for at most `timeout` or until
    /// `keep_going()` turns false (checked every 200 ms).
    pub fn watch_each<T>(
        &self,
        w: WatchRequest<'_>,
        resource_version: &str,
        timeout: Duration,
        keep_going: &dyn Fn() -> bool,
        mut f: impl FnMut(Change<T>),
    ) -> Result<WatchEnd, KubeStoreError>
    where
        T: DeserializeOwned + Clone + Debug + Versioned,
    {
        self.counter(Verb::List)
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (client, rt, traffic) = self.unbudgeted();
        traffic.record("watch", None);
        let mut rv = resource_version.to_string();
        let closed = |rv: &str| WatchEnd::Closed {
            resource_version: rv.to_string(),
        };
        let outcome: Result<WatchEnd, kube::Error> = rt.block_on(async {
            let deadline = tokio::time::sleep(timeout + Duration::from_secs(15));
            tokio::pin!(deadline);
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            let stream = tokio::select! {
                s = client.request_events::<T>(w.req) => s?,
                _ = &mut deadline => return Ok(closed(&rv)),
            };
            tokio::pin!(stream);
            loop {
                tokio::select! {
                    ev = stream.try_next() => match ev? {
                        None => return Ok(closed(&rv)),
                        Some(WatchEvent::Added(o)) | Some(WatchEvent::Modified(o)) => {
                            if let Some(v) = o.resource_version() { rv = v; }
                            f(Change::Upsert(o));
                        }
                        Some(WatchEvent::Deleted(o)) => {
                            if let Some(v) = o.resource_version() { rv = v; }
                            f(Change::Deleted(o));
                        }
                        Some(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                        Some(WatchEvent::Error(s)) if s.code == 410 => return Ok(WatchEnd::Expired),
                        Some(WatchEvent::Error(s)) => return Err(kube::Error::Api(s)),
                    },
                    _ = tick.tick() => if !keep_going() {
                        return Ok(closed(&rv));
                    },
                    _ = &mut deadline => return Ok(closed(&rv)),
                }
            }
        });
        traffic.record_failure("watch", outcome.as_ref().err().and_then(failure_code));
        match outcome {
            Ok(end) => Ok(end),
            Err(kube::Error::Api(s)) if s.code == 410 => Ok(WatchEnd::Expired),
            Err(e) => Err(match w.resource {
                None => self.map_error(Verb::List, w.what, e),
                Some(r) => self.map_other("watch", r, w.what, e),
            }),
        }
    }
}
