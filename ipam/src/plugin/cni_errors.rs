//! Every failure of tether-ipam becomes a CNI error here: the engine's, a store's met outside the
//! engine, the data directory's, STATUS's not-ready answers and the config faults the verbs find.
//! (Parsing a request's addresses, in `requests`, can only find config faults: code 7.)

use tether_cni::{CniError, code};
use tether_kube_store::KubeStoreError;
use tether_leases::{AllocError, FileStoreError, Lease, ProbeError, RangeStatus};
use tether_pool::ConfigError;

/// An engine error.
pub fn to_cni(e: AllocError) -> CniError {
    let c = match &e {
        _ if e.is_transient() => code::TRY_AGAIN_LATER,
        // A file in dataDir that is not what it must be (a symlink, a directory): only the
        // operator can fix it, like the dataDir itself.
        AllocError::Store(s)
            if FileStoreError::from_store_error(s).is_some_and(FileStoreError::is_config) =>
        {
            code::INVALID_CONFIG
        }
        // Credentials that are not tether's: the NAD's kubeconfig is what must change.
        AllocError::Store(s)
            if KubeStoreError::from_store_error(s).is_some_and(KubeStoreError::is_config) =>
        {
            code::INVALID_CONFIG
        }
        AllocError::Store(_) | AllocError::Gc { .. } => code::STORE,
        AllocError::Request(_) | AllocError::DuplicateRequest { .. } => code::INVALID_CONFIG,
        AllocError::HeldByOther { .. } | AllocError::AttachmentHasOther { .. } => {
            code::ADDRESS_TAKEN
        }
        AllocError::RequestedInUse { .. }
        | AllocError::TooManyConflicts { .. }
        | AllocError::InUseOnSegment { .. } => code::ADDRESS_IN_USE,
        // The interface faults the attacher meets too get its codes: a master that is down is
        // worth a retry once the link is up, a missing one is the config's.
        AllocError::Probe {
            source: ProbeError::LinkDown { .. },
            ..
        } => code::TRY_AGAIN_LATER,
        AllocError::Probe {
            source: ProbeError::LinkMissing { .. },
            ..
        } => code::INVALID_CONFIG,
        AllocError::Probe { .. } => code::IO,
        AllocError::Exhausted { .. } => code::POOL_EXHAUSTED,
        AllocError::Contention { .. } => code::TRY_AGAIN_LATER,
        AllocError::NoLease { .. } | AllocError::MissingRange { .. } => code::CHECK_FAILED,
    };
    CniError::new(c, e.to_string())
}

pub fn config_error(e: ConfigError) -> CniError {
    CniError::invalid_config(e.to_string())
}

/// Kubernetes store failures that happen outside the engine (credentials, readiness).
pub fn kube_error(e: KubeStoreError) -> CniError {
    store_failure(e.is_config(), e.is_transient(), e.to_string())
}

/// The data directory could not be opened as a trusted directory.
pub fn data_dir_error(e: FileStoreError) -> CniError {
    store_failure(e.is_config(), e.is_transient(), e.to_string())
}

/// A store's failure met outside the engine: the config's fault (7), worth a retry (11), or the
/// store's (4). No store error is both of the first two.
fn store_failure(config: bool, transient: bool, msg: String) -> CniError {
    let c = if config {
        code::INVALID_CONFIG
    } else if transient {
        code::TRY_AGAIN_LATER
    } else {
        code::STORE
    };
    CniError::new(c, msg)
}

/// A stored prefix that cannot fit its address (a hand-edited state file or object).
pub fn unfit_prefix(l: &Lease) -> CniError {
    CniError::new(
        code::STORE,
        format!(
            "the lease of {} in network {} has prefix length {}, which does not fit the address; \
             correct or delete that lease",
            l.address, l.network, l.prefix_len
        ),
    )
}

/// Probing is on, and neither the config nor the runtime names an interface to probe through.
pub fn nowhere_to_probe() -> CniError {
    CniError::invalid_config(
        "conflict probing needs \"master\" in the config or a CNI_NETNS; set \"probe\": false to allocate without probing",
    )
}

/// GC without the list of attachments to keep.
pub fn gc_without_list() -> CniError {
    CniError::invalid_config(
        "GC needs cni.dev/valid-attachments (an empty list releases every lease of the network)",
    )
}

/// STATUS: this plugin cannot serve an ADD now, because of `why`.
pub fn not_ready(why: impl std::fmt::Display) -> CniError {
    CniError::new(code::NOT_AVAILABLE, why.to_string())
}

/// STATUS: a range has nothing left to hand out.
pub fn range_full(full: &RangeStatus, network: &str) -> CniError {
    not_ready(format!(
        "range {} of network {network} has no free address: {} usable, {} leased, {} quarantined",
        full.range, full.usable, full.leased, full.quarantined
    ))
}
