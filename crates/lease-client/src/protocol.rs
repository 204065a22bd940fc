//! What the plugin and the node-agent say to each other over the socket: one request, one
//! reply, in order, on one connection per CNI call. A frame is a 4-byte big-endian length and
//! that many bytes of JSON. Every read is bounded (a request by [`MAX_REQUEST`], a reply by
//! [`MAX_REPLY`]), so neither side can be made to hold more than that by the other.

use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tether_leases::{Lease, PodRef, Scope};

/// Bumped when a request or a reply changes meaning; a plugin and an agent of different
/// protocols do not talk (the plugin takes the direct path). 3: requests name a network in its
/// uniqueness domain ([`Scope`]), and records carry their domain.
pub const PROTOCOL: u32 = 3;

/// Where the node-agent listens, unless `TETHER_LEASE_SOCKET` says otherwise (tests, a second
/// agent). Not a configuration key: a NAD is written by someone else, and must not choose which
/// root socket the plugin talks to.
pub const DEFAULT_SOCKET: &str = "/run/tether/leases.sock";

/// The environment variable that moves [`DEFAULT_SOCKET`] (set by the runtime, never by a NAD);
/// empty: no lease service (always the direct path).
pub const SOCKET_ENV: &str = "TETHER_LEASE_SOCKET";

/// The largest request an agent reads (two leases and names are a few hundred bytes).
pub const MAX_REQUEST: usize = 64 * 1024;

/// The largest reply a plugin reads (a snapshot of a whole network: tens of thousands of
/// records).
pub const MAX_REPLY: usize = 64 * 1024 * 1024;

/// The socket this process should use: `$TETHER_LEASE_SOCKET`, else [`DEFAULT_SOCKET`]; `None`
/// when the variable is set empty.
pub fn socket_path() -> Option<PathBuf> {
    match std::env::var_os(SOCKET_ENV) {
        Some(v) if v.is_empty() => None,
        Some(v) => Some(PathBuf::from(v)),
        None => Some(PathBuf::from(DEFAULT_SOCKET)),
    }
}

/// Which cluster store a plugin's configuration asks for: the agent serves it only when it is
/// the one it holds (same credentials, same server, same reading rules), so a call through the
/// agent does exactly what the direct path would, as the same identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreIdentity {
    /// `kubernetes.kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `kubernetes.k8s_api_root`.
    pub api_root: Option<String>,
    /// `kubernetes.list_from_cache`.
    pub list_from_cache: bool,
    /// `kubernetes.page_size`.
    pub page_size: u32,
    /// API group of the lease resource.
    pub group: String,
    /// The node the plugin's leases name when its credential is bound to none (`NODE_NAME`,
    /// else the hostname): an agent whose credential is bound to none serves only a plugin that
    /// names the agent's node, so a lease names the same node on both paths.
    pub node: Option<String>,
}

/// A plugin's request.
// One at a time per connection, gone once answered: boxing the leases would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// First on every connection: which protocol and which store.
    Hello {
        /// [`PROTOCOL`].
        protocol: u32,
        /// The store the plugin's configuration names.
        store: StoreIdentity,
    },
    /// `LeaseStore::get`.
    Get {
        /// Network and domain.
        scope: Scope,
        /// Address.
        address: IpAddr,
    },
    /// `LeaseStore::claim`: a conditional CREATE or UPDATE.
    Claim {
        /// The record to write.
        new: Lease,
        /// The record it replaces (its version is the condition); none: a CREATE.
        expected: Option<Lease>,
    },
    /// `LeaseStore::remove`: a conditional DELETE.
    Remove {
        /// The record, with the version the DELETE is conditional on.
        expected: Lease,
    },
    /// `LeaseStore::list`: every record of a network in its domain.
    List {
        /// Network and domain.
        scope: Scope,
    },
    /// This node's records of a network (the node journal's rebuild, GC).
    ListNode {
        /// Network.
        network: String,
    },
    /// `LeaseStore::by_pod`.
    ByPod {
        /// Network and domain.
        scope: Scope,
        /// The pod.
        pod: PodRef,
    },
}

/// The agent's reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// To `Hello`: served, as this node (the node the credentials are bound to).
    Welcome {
        /// The node.
        node: String,
    },
    /// Not served (another store, another protocol, the agent is stopping or not ready): take
    /// the direct path. Nothing was done.
    Refused {
        /// Why, for the log.
        reason: String,
    },
    /// One record, or none.
    Record {
        /// The record.
        lease: Option<Lease>,
    },
    /// Records.
    Records {
        /// The records.
        leases: Vec<Lease>,
    },
    /// A claim won: the stored record.
    Written {
        /// The record as stored (with its new version).
        lease: Lease,
    },
    /// A remove done.
    Removed,
    /// A conditional write lost: the record is not as expected.
    Taken {
        /// The current record, when known.
        current: Option<Lease>,
    },
    /// The API refused or failed (as the direct path would have seen it).
    Failed {
        /// What failed and what to do.
        message: String,
        /// Worth retrying later.
        transient: bool,
    },
}

/// Write one frame.
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(&body);
    w.write_all(&buf)?;
    w.flush()
}

/// Read one frame of at most `max` bytes. `Ok(None)`: the other side closed before a frame
/// began.
pub fn read_frame<T: DeserializeOwned>(r: &mut impl Read, max: usize) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes (at most {max})"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Is the process at the other end of `s` root or this process's own user (SO_PEERCRED)?
/// Both sides talk only to root. `Err`: who it is, or why that cannot be read.
pub fn check_peer(s: &UnixStream) -> Result<(), String> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let uid = getsockopt(s, PeerCredentials)
        .map_err(|e| format!("cannot read the peer's credentials: {e}"))?
        .uid();
    if uid == 0 || uid == nix::unistd::geteuid().as_raw() {
        Ok(())
    } else {
        Err(format!("the peer runs as uid {uid}, not root"))
    }
}

/// The directory a socket path lives in, and its name there.
pub fn socket_place(socket: &Path) -> Result<(&Path, &str), String> {
    match (socket.parent(), socket.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) => Ok((dir, name)),
        _ => Err(format!("{} names no socket", socket.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_leases::LeaseState;

    fn lease() -> Lease {
        Lease {
            network: "mgmt".into(),
            domain: None,
            address: "10.20.30.241".parse().unwrap(),
            prefix_len: 24,
            range_index: Some(0),
            container_id: "c1".into(),
            ifname: "net1".into(),
            pod: PodRef::new("ns", "train-0", "u1"),
            node: Some("gpu-1".into()),
            state: LeaseState::Leased,
            since: 1_700_000_000,
            version: Some("uid/42".into()),
        }
    }

    #[test]
    fn frames_round_trip() {
        let msgs = [
            Request::Claim {
                new: lease(),
                expected: None,
            },
            Request::ByPod {
                scope: Scope::new("mgmt", Some("rail-1".into())),
                pod: PodRef::new("ns", "p", "u"),
            },
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            write_frame(&mut buf, m).unwrap();
        }
        let mut r = buf.as_slice();
        for m in &msgs {
            assert_eq!(
                read_frame::<Request>(&mut r, MAX_REQUEST).unwrap().as_ref(),
                Some(m)
            );
        }
        assert_eq!(read_frame::<Request>(&mut r, MAX_REQUEST).unwrap(), None);
    }

    #[test]
    fn an_oversized_or_broken_frame_is_refused_before_it_is_read() {
        let mut big = (MAX_REQUEST as u32 + 1).to_be_bytes().to_vec();
        big.extend_from_slice(b"{}");
        let e = read_frame::<Request>(&mut big.as_slice(), MAX_REQUEST).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let mut cut = 10u32.to_be_bytes().to_vec();
        cut.extend_from_slice(b"{\"op\"");
        let e = read_frame::<Request>(&mut cut.as_slice(), MAX_REQUEST).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        let mut junk = 2u32.to_be_bytes().to_vec();
        junk.extend_from_slice(b"{}");
        let e = read_frame::<Request>(&mut junk.as_slice(), MAX_REQUEST).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
