//! [`KubeStore`]: the [`LeaseStore`] over one `IPLease` object per address of a uniqueness
//! domain.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::core::Request;
use kube::core::params::{DeleteParams, ListParams, Preconditions, VersionMatch};
use serde_json::Value;
use tether_leases::{
    AttachmentIndex, BackendFailure, CasResult, FileJournal, JournalBacked, Lease, LeaseStore,
    PodRef, Scope, StoreError, Taken, validate_claim,
};

use crate::api::{ApiClient, RequestCounts, Verb};
use crate::convert::{
    Kinds, Naming, name_of, naming_of, read_object, split_version, to_named_object,
};
use crate::crd::{
    IPLease, NODE_LABEL, PLURAL, VERSION, label_value, network_selector, object_name,
};
use crate::error::{CredentialSource, KubeStoreError};
use crate::settings::KubeSettings;

/// The lease store over the Kubernetes API. See the crate docs.
///
/// Synchronous: each call runs on its [`ApiClient`]'s own current-thread tokio runtime, bounded by
/// the client's time budget ([`KubeSettings::timeout`], counted from construction or the calling
/// thread's last [`KubeStore::restart_budget`]). `Sync`: threads may share one store (the
/// node-agent's lease service does), each within its own budget.
pub struct KubeStore {
    pub(crate) api: Arc<ApiClient>,
    pub(crate) settings: KubeSettings,
    /// The collection path of the lease resource.
    pub(crate) path: String,
    /// This node's journal ([`KubeSettings::journal_dir`]), when set with a node name.
    journal: Option<FileJournal>,
    /// The newest resourceVersion this store wrote or read: lists from the watch cache ask for
    /// at least this version, so a store reads its own writes.
    seen_rv: AtomicU64,
}

impl std::fmt::Debug for KubeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStore")
            .field("server", &self.api.server)
            .field("credentials", &self.api.source)
            .field("settings", &self.settings)
            .finish()
    }
}

impl KubeStore {
    /// A store with `settings`: connects its [`ApiClient`] (reads the credentials, sends no
    /// request; see [`KubeStore::ready`]). The time budget starts now.
    pub fn connect(settings: KubeSettings) -> Result<KubeStore, KubeStoreError> {
        Ok(KubeStore::on(ApiClient::connect(&settings)?, settings))
    }

    /// A store over `api` (connected with these `settings`), which the operator's `Cluster`
    /// (tether-cluster) may share.
    pub fn on(api: Arc<ApiClient>, settings: KubeSettings) -> KubeStore {
        let path = format!("/apis/{}/{VERSION}/{PLURAL}", settings.group);
        let mut settings = settings;
        if let Some(claimed) = api.bound_node().map(str::to_string) {
            if let Some(n) = settings.node.as_deref().filter(|n| *n != claimed) {
                log::warn!(
                    "this node is {n:?} by NODE_NAME or its hostname, but its credential is bound to node {claimed:?}: \
                     leases name {claimed:?}, the node the API server holds this credential to"
                );
            }
            settings.node = Some(claimed);
        }
        let journal = match (&settings.journal_dir, &settings.node) {
            (Some(d), Some(_)) => Some(FileJournal::new(d.clone())),
            _ => None,
        };
        KubeStore {
            api,
            settings,
            path,
            journal,
            seen_rv: AtomicU64::new(0),
        }
    }

    /// The client under this store.
    pub fn api(&self) -> &Arc<ApiClient> {
        &self.api
    }

    /// The API server URL.
    pub fn server(&self) -> &str {
        self.api.server()
    }

    /// The node this store's leases name: the node its token is bound to, else the one given.
    pub fn node(&self) -> Option<&str> {
        self.settings.node.as_deref()
    }

    /// Where the credentials came from.
    pub fn credentials(&self) -> &CredentialSource {
        self.api.credentials()
    }

    /// The settings.
    pub fn settings(&self) -> &KubeSettings {
        &self.settings
    }

    /// Start a new time budget of [`KubeSettings::timeout`] from now, for the calling thread.
    /// The plugin never needs this (one store per CNI call); long-lived users (benchmarks, a
    /// reconciler, the lease service's workers) call it before each operation.
    pub fn restart_budget(&self) {
        self.api.restart_budget()
    }

    /// Time left of the calling thread's budget.
    pub fn remaining(&self) -> Duration {
        self.api.remaining()
    }

    /// Remember the resourceVersion of a record read or written (see `seen_rv`).
    pub(crate) fn seen(&self, l: Lease) -> Lease {
        if let Some(rv) = l
            .version
            .as_deref()
            .and_then(split_version)
            .and_then(|(_, rv)| rv.parse::<u64>().ok())
        {
            self.seen_rv.fetch_max(rv, Ordering::Relaxed);
        }
        l
    }

    /// Parameters of a list served from the watch cache: any version (`resourceVersion=0`), or
    /// not older than what this store has seen, so its own writes are in it.
    pub(crate) fn cache_list_params(&self) -> ListParams {
        match self.seen_rv.load(Ordering::Relaxed) {
            0 => ListParams::default().match_any(),
            rv => ListParams::default()
                .at(&rv.to_string())
                .matching(VersionMatch::NotOlderThan),
        }
    }

    /// Requests sent so far.
    pub fn requests(&self) -> RequestCounts {
        self.api.requests()
    }

    /// STATUS check: the API server answers, the IPLease CRD is installed and established, and
    /// this identity may list leases. Two requests: GET of the CRD (skipped when RBAC forbids
    /// reading CRDs, which the store does not otherwise need) and a LIST with `limit=1`.
    pub fn ready(&self) -> Result<(), KubeStoreError> {
        let crd_name = format!("{PLURAL}.{}", self.settings.group);
        let crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";
        let req = Request::new(crd_path)
            .get(&crd_name, &Default::default())
            .map_err(|e| self.api.protocol("GET of the CRD", e.to_string()))?;
        match self
            .api
            .send::<Value>(Verb::Get, "GET of the IPLease CRD", req)
        {
            Ok(crd) => {
                let established = crd
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .and_then(|cs| cs.iter().find(|c| c["type"] == "Established"));
                match established {
                    Some(c) if c["status"] == "True" => {}
                    other => {
                        return Err(KubeStoreError::CrdNotEstablished {
                            server: self.api.server.clone(),
                            detail: other
                                .and_then(|c| c["message"].as_str())
                                .unwrap_or("no Established condition")
                                .to_string(),
                        });
                    }
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                return Err(KubeStoreError::CrdMissing {
                    server: self.api.server.clone(),
                });
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                log::debug!(
                    "cannot read the IPLease CRD ({}); checking the resource instead",
                    s.message
                );
            }
            Err(e) => return Err(self.api.map_error(Verb::Get, "GET of the IPLease CRD", e)),
        }
        let req = Request::new(&self.path)
            .list(&ListParams::default().limit(1))
            .map_err(|e| self.api.protocol("LIST", e.to_string()))?;
        self.api
            .send::<serde::de::IgnoredAny>(Verb::List, "LIST of ipleases", req)
            .map_err(|e| self.api.map_error(Verb::List, "LIST of ipleases", e))?;
        Ok(())
    }

    /// GET the lease object `name`: `None` when absent or not a valid lease. Whatever its
    /// naming: the version of what it returns says.
    pub(crate) fn get_object(&self, name: &str) -> Result<Option<Lease>, KubeStoreError> {
        let what = format!("GET of IPLease {name}");
        let req = Request::new(&self.path)
            .get(name, &Default::default())
            .map_err(|e| self.api.protocol(&what, e.to_string()))?;
        match self.api.send::<Value>(Verb::Get, &what, req) {
            Ok(v) => match serde_json::from_value::<IPLease>(v)
                .map_err(|e| e.to_string())
                .and_then(|o| read_object(&o).map(|(l, _)| l))
            {
                Ok(l) => Ok(Some(self.seen(l))),
                Err(e) => {
                    log::warn!("{e}");
                    Ok(None)
                }
            },
            Err(kube::Error::Api(s)) if ApiClient::object_missing(&s) => Ok(None),
            Err(e) => Err(self.api.map_error(Verb::Get, &what, e)),
        }
    }

    /// After a lost conditional write: the current record, for the engine's view.
    fn lost(&self, name: &str) -> Result<Taken, KubeStoreError> {
        Ok(Taken {
            current: self.get_object(name)?,
        })
    }

    /// The leases of `network` held by `node` (both label selectors, then the spec), of the
    /// `kinds` wanted.
    pub fn list_network_node(
        &self,
        network: &str,
        node: &str,
        kinds: Kinds,
    ) -> Result<Vec<Lease>, KubeStoreError> {
        let sel = format!(
            "{},{NODE_LABEL}={}",
            network_selector(network),
            label_value(node)
        );
        self.list_selected(
            Some(&sel),
            &format!("LIST of ipleases of network {network:?} on node {node:?}"),
            kinds,
            |o| o.spec.network == network && o.spec.node.as_deref() == Some(node),
        )
    }

    /// CREATE `new` under the name `naming` gives it.
    pub(crate) fn create_named(
        &self,
        new: &Lease,
        naming: Naming,
    ) -> Result<Result<Lease, Taken>, KubeStoreError> {
        let obj = to_named_object(new, None, naming)?;
        let name = obj.metadata.name.clone().unwrap_or_default();
        let what = format!("CREATE of IPLease {name}");
        let body = serde_json::to_vec(&obj).map_err(|e| self.api.protocol(&what, e.to_string()))?;
        let req = Request::new(&self.path)
            .create(&self.api.post_params(), body)
            .map_err(|e| self.api.protocol(&what, e.to_string()))?;
        match self.api.send::<IPLease>(Verb::Create, &what, req) {
            Ok(o) => read_object(&o)
                .map(|(l, _)| Ok(self.seen(l)))
                .map_err(|e| self.api.protocol(&what, e)),
            // AlreadyExists: someone holds (or held) the address.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Err(self.lost(&name)?)),
            Err(e) => Err(self.api.map_error(Verb::Create, &what, e)),
        }
    }

    /// UPDATE the object `expected` was read from to `new`, under the same naming (a mirror
    /// stays one), conditional on `expected`'s uid and resourceVersion.
    pub(crate) fn replace_object(
        &self,
        new: &Lease,
        expected: &Lease,
    ) -> Result<Result<Lease, Taken>, KubeStoreError> {
        self.replace_named(new, expected, naming_of(expected))
    }

    /// UPDATE the object `expected` was read from to `new`, labelled as `naming` says (one
    /// named by network becomes a mirror, or back), conditional on `expected`'s uid and
    /// resourceVersion.
    pub(crate) fn replace_named(
        &self,
        new: &Lease,
        expected: &Lease,
        naming: Naming,
    ) -> Result<Result<Lease, Taken>, KubeStoreError> {
        let name = name_of(expected);
        let what = format!("UPDATE of IPLease {name}");
        let (uid, rv) = self.uid_and_version(expected, &what)?;
        let obj = to_named_object(new, Some((uid, rv)), naming)?;
        if obj.metadata.name.as_deref() != Some(name.as_str()) {
            return Err(self.api.protocol(
                &what,
                format!(
                    "the record would be named {:?}: an update never moves a record",
                    obj.metadata.name
                ),
            ));
        }
        let body = serde_json::to_vec(&obj).map_err(|e| self.api.protocol(&what, e.to_string()))?;
        let req = Request::new(&self.path)
            .replace(&name, &self.api.post_params(), body)
            .map_err(|e| self.api.protocol(&what, e.to_string()))?;
        match self.api.send::<IPLease>(Verb::Update, &what, req) {
            Ok(o) => read_object(&o)
                .map(|(l, _)| Ok(self.seen(l)))
                .map_err(|e| self.api.protocol(&what, e)),
            // Conflict: stale resourceVersion or another uid (deleted and re-created).
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Err(self.lost(&name)?)),
            Err(kube::Error::Api(s)) if ApiClient::object_missing(&s) => {
                Ok(Err(Taken { current: None }))
            }
            Err(e) => Err(self.api.map_error(Verb::Update, &what, e)),
        }
    }

    /// The object identity a conditional write needs, from the lease's opaque version.
    fn uid_and_version<'l>(
        &self,
        expected: &'l Lease,
        what: &str,
    ) -> Result<(&'l str, &'l str), KubeStoreError> {
        expected
            .version
            .as_deref()
            .and_then(split_version)
            .ok_or_else(|| {
                self.api.protocol(
                    what,
                    format!(
                        "lease version {:?} is not <uid>/<resourceVersion>",
                        expected.version
                    ),
                )
            })
    }

    /// DELETE the object `expected` was read from, conditional on its uid and resourceVersion.
    pub(crate) fn delete_object(
        &self,
        expected: &Lease,
    ) -> Result<Result<(), Taken>, KubeStoreError> {
        let name = name_of(expected);
        let what = format!("DELETE of IPLease {name}");
        let (uid, rv) = self.uid_and_version(expected, &what)?;
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: Some(rv.to_string()),
            }),
            ..DeleteParams::default()
        };
        let req = Request::new(&self.path)
            .delete(&name, &dp)
            .map_err(|e| self.api.protocol(&what, e.to_string()))?;
        match self.api.send::<Value>(Verb::Delete, &what, req) {
            Ok(v) => {
                if let Some(rv) = v
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .and_then(|r| r.parse::<u64>().ok())
                {
                    self.seen_rv.fetch_max(rv, Ordering::Relaxed);
                }
                Ok(Ok(()))
            }
            // Conflict: the precondition failed, the object is someone else's now.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Err(self.lost(&name)?)),
            Err(kube::Error::Api(s)) if ApiClient::object_missing(&s) => {
                Ok(Err(Taken { current: None }))
            }
            Err(e) => Err(self.api.map_error(Verb::Delete, &what, e)),
        }
    }
}

impl LeaseStore for KubeStore {
    /// One LIST with the network's label selector (one request served by the watch cache at
    /// `resourceVersion=0` or not older than what this store has seen, or paginated by
    /// `page_size` without `list_from_cache`), keeping the domain's records of `scope`'s network.
    fn list(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        Ok(in_domain(self.list_network(&scope.network, None)?.0, scope))
    }

    /// One GET of the object `<address>[.<fabric>]`.
    fn get(&self, scope: &Scope, address: IpAddr) -> Result<Option<Lease>, StoreError> {
        let l = self.get_object(&object_name(scope.domain.as_deref(), address))?;
        Ok(l.filter(|l| {
            l.address == address
                && l.in_domain(scope.domain.as_deref())
                && naming_of(l) == Naming::Domain
        }))
    }

    /// The node journal, with a journal directory and a node name in the settings: ADD, DEL and
    /// CHECK then read and write single objects only.
    fn index(&self) -> Option<&dyn AttachmentIndex> {
        match (&self.journal, &self.settings.node) {
            (Some(_), Some(_)) => Some(self),
            _ => None,
        }
    }

    /// `KubeStore::by_pod_label`: the records of any node that name the pod.
    fn by_pod(&self, scope: &Scope, pod: &PodRef) -> Result<Option<Vec<Lease>>, StoreError> {
        Ok(Some(in_domain(
            self.by_pod_label(&scope.network, pod)?,
            scope,
        )))
    }

    /// This node's leases of `scope`'s network (GC must not judge other nodes' attachments: they
    /// are not in this runtime's list of valid attachments), those named by network not yet
    /// moved into the domain included. Without a node name: an error.
    fn list_mine(&self, scope: &Scope) -> Result<Vec<Lease>, StoreError> {
        match &self.settings.node {
            Some(node) => Ok(self
                .list_network_node(&scope.network, node, Kinds::Leases)?
                .into_iter()
                .filter(|l| naming_of(l) != Naming::Domain || l.in_domain(scope.domain.as_deref()))
                .collect()),
            None => Err(StoreError::Backend(BackendFailure::new(
                "GC with the Kubernetes store needs this node's name (NODE_NAME or the hostname) so it only judges this node's leases",
                false,
            ))),
        }
    }

    /// CREATE (`expected = None`; 409 AlreadyExists → `Taken`) or UPDATE with the expected uid
    /// and resourceVersion (409 Conflict or 404 → `Taken`). A lost race costs one GET to report
    /// the current record. While mirrors are kept ([`KubeSettings::legacy_mirrors`]), the
    /// record's mirror follows (see [`crate::by_network`]): a mirror someone else holds the old
    /// way makes the claim lose, undone.
    fn claim(&self, new: Lease, expected: Option<&Lease>) -> CasResult<Lease> {
        validate_claim(&new, expected)?;
        let done = match expected {
            None => self.create_named(&new, Naming::Domain)?,
            Some(e) => self.replace_object(&new, e)?,
        };
        match done {
            Ok(stored) if self.keeps_mirrors(&stored) => Ok(self.mirror_claim(stored, expected)?),
            other => Ok(other),
        }
    }

    /// DELETE with preconditions {uid, resourceVersion} (409 Conflict or 404 → `Taken`); its
    /// mirror too, while mirrors are kept.
    fn remove(&self, expected: &Lease) -> CasResult<()> {
        if expected.version.is_none() {
            return Err(StoreError::Invalid(format!(
                "remove of {} in network {} without a version (never stored)",
                expected.address, expected.network
            )));
        }
        let done = self.delete_object(expected)?;
        if done.is_ok() && self.keeps_mirrors(expected) {
            self.forget_mirror(expected);
        }
        Ok(done)
    }
}

/// The records of `scope`'s domain (a network's label may also name its records in another
/// domain, after its NAD changed fabric, and records named by network).
fn in_domain(leases: Vec<Lease>, scope: &Scope) -> Vec<Lease> {
    leases
        .into_iter()
        .filter(|l| l.in_domain(scope.domain.as_deref()) && naming_of(l) == Naming::Domain)
        .collect()
}

/// The node journal of this store, made authoritative for `network` first (see
/// [`tether_leases::journal`]): the first call on a node (or after its journal was lost) lists
/// this node's leases of the network once.
impl JournalBacked for KubeStore {
    fn journal_for(&self, network: &str) -> Result<&FileJournal, StoreError> {
        let (Some(j), Some(node)) = (&self.journal, &self.settings.node) else {
            return Err(StoreError::Invalid(
                "the node journal needs a directory and a node name".into(),
            ));
        };
        if !j.is_complete(network) {
            j.rebuild(network, || {
                Ok(self.list_network_node(network, node, Kinds::Domain)?)
            })?;
        }
        Ok(j)
    }
}
