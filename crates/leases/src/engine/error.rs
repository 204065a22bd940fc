//! What the engine reports: [`AllocError`], with messages that name addresses, ranges and
//! holders, and whether retrying later may succeed.

use std::net::IpAddr;

use tether_pool::RequestError;

use crate::probe::ProbeError;
use crate::store::StoreError;

/// Errors of the allocation engine. Messages name addresses, ranges and holders.
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// The lease store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A requested address is malformed or outside every range.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// Two requested addresses fall in the same range entry.
    #[error(
        "requested addresses {first} and {second} are both in range {range}: request at most one address per range"
    )]
    DuplicateRequest {
        /// First request.
        first: IpAddr,
        /// Second request.
        second: IpAddr,
        /// The range.
        range: String,
    },
    /// A requested address is leased by another attachment.
    #[error("requested address {address} is held by {holder}")]
    HeldByOther {
        /// The address.
        address: IpAddr,
        /// Who: `pod <namespace/name> (container <id>, interface <ifname>, network <name>)`, the
        /// network being any of the address's domain.
        holder: String,
    },
    /// The attachment already holds another address in the range of a requested one.
    #[error(
        "container {container_id} interface {ifname} already holds {existing} in range {range}, \
         but {requested} was requested: DEL the attachment first"
    )]
    AttachmentHasOther {
        /// Container ID.
        container_id: String,
        /// Interface.
        ifname: String,
        /// Address it holds.
        existing: IpAddr,
        /// Address requested.
        requested: IpAddr,
        /// The range.
        range: String,
    },
    /// The conflict probe found a requested address in use.
    #[error(
        "requested address {address} of network {network} is already in use on the segment by MAC {mac} \
         (it answered the conflict probe): free it on the host with that MAC, or request another address; \
         a retry of this pod probes it again, and the pool keeps it out for {quarantine_s}s"
    )]
    RequestedInUse {
        /// Network.
        network: String,
        /// The address.
        address: IpAddr,
        /// The MAC that answered.
        mac: String,
        /// Quarantine length.
        quarantine_s: u64,
    },
    /// The conflict probe could not run.
    #[error(
        "conflict probe for {} failed: {source} (set \"probe\": false in the ipam config to skip probing)",
        joined(addresses)
    )]
    Probe {
        /// The addresses probed together.
        addresses: Vec<IpAddr>,
        /// Cause.
        source: ProbeError,
    },
    /// No address is free in a range.
    #[error(
        "no free address in range {range} of network {network}: {usable} usable, {leased} leased, \
         {quarantined} quarantined, {cooling} cooling down; delete pods that no longer need this network \
         or widen the range, and the pod is retried by itself"
    )]
    Exhausted {
        /// Network.
        network: String,
        /// The range.
        range: String,
        /// Usable addresses in the range.
        usable: u128,
        /// Leased records in the range.
        leased: usize,
        /// Records in quarantine.
        quarantined: usize,
        /// Released records still within the cooldown.
        cooling: usize,
    },
    /// Too many candidates in a row answered the conflict probe.
    #[error(
        "range {range} of network {network}: {conflicts} candidates answered the conflict probe \
         (last {last} from MAC {mac}); something else hands out addresses from this range"
    )]
    TooManyConflicts {
        /// Network.
        network: String,
        /// The range.
        range: String,
        /// How many.
        conflicts: usize,
        /// Last conflicting address.
        last: IpAddr,
        /// Its MAC.
        mac: String,
    },
    /// No address is left in a range, and candidates answered the conflict probe during this ADD:
    /// the range is used by something else on the segment. The answered addresses are quarantined.
    #[error(
        "no free address in range {range} of network {network}: {} answered the conflict probe during this ADD \
         and {} in use on the segment ({}), now quarantined; {usable} usable, {leased} leased, \
         {quarantined} quarantined, {cooling} cooling down",
        if in_use.len() == 1 { "the last candidate".to_string() } else { format!("{} candidates", in_use.len()) },
        if in_use.len() == 1 { "is" } else { "are" },
        in_use.iter().map(|(a, m)| format!("{a} by MAC {m}")).collect::<Vec<_>>().join(", ")
    )]
    InUseOnSegment {
        /// Network.
        network: String,
        /// The range.
        range: String,
        /// The addresses that answered in this ADD, with the answering MAC, in probe order
        /// (boxed: keeps `AllocError` small).
        in_use: Box<[(IpAddr, String)]>,
        /// Usable addresses in the range.
        usable: u128,
        /// Leased records in the range.
        leased: usize,
        /// Records in quarantine (including the ones above).
        quarantined: usize,
        /// Released records still within the cooldown.
        cooling: usize,
    },
    /// A specific address kept changing under us.
    #[error(
        "gave up on {address} in network {network} after {attempts} concurrent changes; try again"
    )]
    Contention {
        /// Network.
        network: String,
        /// The address.
        address: IpAddr,
        /// Attempts made.
        attempts: usize,
    },
    /// CHECK: the attachment holds no lease.
    #[error(
        "container {container_id} interface {ifname} holds no lease in network {network}{detail}"
    )]
    NoLease {
        /// Network.
        network: String,
        /// Container ID.
        container_id: String,
        /// Interface.
        ifname: String,
        /// Extra detail (starts with "; " when not empty).
        detail: String,
    },
    /// CHECK: the attachment holds no lease in one of the ranges.
    #[error(
        "container {container_id} interface {ifname} holds no lease in range {range} of network {network}"
    )]
    MissingRange {
        /// Network.
        network: String,
        /// Container ID.
        container_id: String,
        /// Interface.
        ifname: String,
        /// The range.
        range: String,
    },
    /// GC could not release some leases.
    #[error("garbage collection of network {network} failed for {} record(s): {}", failures.len(), failures.join("; "))]
    Gc {
        /// Network.
        network: String,
        /// One message per failure.
        failures: Vec<String>,
    },
}

fn joined(addresses: &[IpAddr]) -> String {
    let text: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
    text.join(" and ")
}

impl AllocError {
    /// Worth retrying later (CNI code 11)?
    pub fn is_transient(&self) -> bool {
        match self {
            AllocError::Store(e) => e.is_transient(),
            AllocError::Contention { .. } => true,
            _ => false,
        }
    }

    /// Did this come from a store that could not be reached (a network error, a timeout, an
    /// overloaded or restarting server)? The node journal may answer then.
    pub(crate) fn is_unreachable(&self) -> bool {
        matches!(self, AllocError::Store(s) if s.is_transient())
    }
}
