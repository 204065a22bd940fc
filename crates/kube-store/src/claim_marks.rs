//! The mark the node-agent's conflict guard leaves on an IPLease whose address another MAC
//! claimed on the wire: label [`CLAIMED_LABEL`] (so `kubectl get ipleases -l
//! ipam.tether.dev/claimed=true` and `tether leases` find the marked ones with one selected
//! LIST) and annotations naming the MAC and when it was last seen.
//!
//! The store never writes the mark: every write of a record (a release, a take-over) builds its
//! labels and annotations afresh, so a mark lasts as long as the holding it was made on.

use std::net::IpAddr;

use kube::core::Request;
use serde_json::Value;
use tether_leases::Lease;

use crate::api::{ApiClient, Verb};
use crate::convert::{Kinds, Lenient, lease_of, parse_time, read_object, time_text};
use crate::crd::{IPLease, object_name};
use crate::error::KubeStoreError;
use crate::listing::ListRequest;
use crate::store::KubeStore;

/// Label of a marked lease object (value `true`).
pub const CLAIMED_LABEL: &str = "ipam.tether.dev/claimed";
/// Annotation: the MAC that claimed the address.
pub const CLAIMED_BY_ANNOTATION: &str = "ipam.tether.dev/claimed-by";
/// Annotation: when the claim was last reported (RFC 3339).
pub const CLAIMED_AT_ANNOTATION: &str = "ipam.tether.dev/claimed-at";

/// Another host's claim on a leased address, as marked on its object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimMark {
    /// `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// Unix seconds.
    pub at: u64,
}

/// What [`KubeStore::mark_claimed`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marked {
    /// The object carries the mark now.
    Marked,
    /// The record is no longer Leased to that attachment on that node (released, taken over,
    /// gone): nothing was written.
    NotHeld,
}

/// The mark on `obj`, if it carries a whole one.
pub fn mark_of(obj: &IPLease) -> Option<ClaimMark> {
    let a = obj.metadata.annotations.as_ref()?;
    Some(ClaimMark {
        mac: a.get(CLAIMED_BY_ANNOTATION)?.clone(),
        at: parse_time(a.get(CLAIMED_AT_ANNOTATION)?).ok()?,
    })
}

/// Is `current` still `held`'s holding: Leased, to the same attachment, on the same node?
fn still_held(current: &Lease, held: &Lease) -> bool {
    current.is_leased()
        && current.is_attachment(&held.container_id, &held.ifname)
        && current.node == held.node
}

impl KubeStore {
    /// Mark the object of `held` (a lease of this node, its domain's object) with `mark`, while
    /// it is still Leased to the same attachment on the same node: a GET, then an UPDATE
    /// conditional on what the GET read (once more after a lost race).
    pub fn mark_claimed(&self, held: &Lease, mark: &ClaimMark) -> Result<Marked, KubeStoreError> {
        let name = object_name(held.domain.as_deref(), held.address);
        let at = time_text(mark.at).map_err(|e| self.api.protocol("a claim mark", e))?;
        for _ in 0..2 {
            let what = format!("GET of IPLease {name}");
            let req = Request::new(&self.path)
                .get(&name, &Default::default())
                .map_err(|e| self.api.protocol(&what, e.to_string()))?;
            let mut obj = match self.api.send::<IPLease>(Verb::Get, &what, req) {
                Ok(o) => o,
                Err(kube::Error::Api(s)) if ApiClient::object_missing(&s) => {
                    return Ok(Marked::NotHeld);
                }
                Err(e) => return Err(self.api.map_error(Verb::Get, &what, e)),
            };
            match read_object(&obj) {
                Ok((current, _)) if still_held(&current, held) => {}
                _ => return Ok(Marked::NotHeld),
            }
            obj.metadata.managed_fields = None;
            obj.metadata
                .labels
                .get_or_insert_default()
                .insert(CLAIMED_LABEL.into(), "true".into());
            let notes = obj.metadata.annotations.get_or_insert_default();
            notes.insert(CLAIMED_BY_ANNOTATION.into(), mark.mac.clone());
            notes.insert(CLAIMED_AT_ANNOTATION.into(), at.clone());
            let what = format!("UPDATE of IPLease {name} (claim mark)");
            let body =
                serde_json::to_vec(&obj).map_err(|e| self.api.protocol(&what, e.to_string()))?;
            let req = Request::new(&self.path)
                .replace(&name, &self.api.post_params(), body)
                .map_err(|e| self.api.protocol(&what, e.to_string()))?;
            match self.api.send::<Value>(Verb::Update, &what, req) {
                Ok(_) => return Ok(Marked::Marked),
                // Written meanwhile (by its holder, or released): read it again.
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(kube::Error::Api(s)) if ApiClient::object_missing(&s) => {
                    return Ok(Marked::NotHeld);
                }
                Err(e) => return Err(self.api.map_error(Verb::Update, &what, e)),
            }
        }
        Err(self.api.protocol(
            &format!("UPDATE of IPLease {name} (claim mark)"),
            "the object changed under every attempt; the next claim tries again".into(),
        ))
    }

    /// The marked leases (one LIST selected by [`CLAIMED_LABEL`]): each record's domain and
    /// address, and its mark.
    pub fn claim_marks(&self) -> Result<Vec<(Option<String>, IpAddr, ClaimMark)>, KubeStoreError> {
        let selector = format!("{CLAIMED_LABEL}=true");
        let req = ListRequest {
            path: &self.path,
            what: "LIST of ipleases marked as claimed",
            resource: None,
            labels: Some(&selector),
            fields: None,
            metadata_only: false,
            cache: self.api.list_from_cache.then(|| self.cache_list_params()),
            max_bytes: None,
        };
        let mut out = Vec::new();
        self.api.list_each(&req, |items: Vec<Lenient>, fresh| {
            if fresh {
                out.clear();
            }
            for item in items {
                let mark = match &item {
                    Lenient::Ok(o) => mark_of(o),
                    Lenient::Bad { .. } => None,
                };
                if let (Some(mark), Some(l)) = (mark, lease_of(item, Kinds::Domain, |_| true)) {
                    out.push((l.domain, l.address, mark));
                }
            }
        })?;
        Ok(out)
    }
}
