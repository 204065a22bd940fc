//! The plugin's way to the node-agent's lease service, and the protocol both ends speak.
//!
//! A CNI plugin is a fresh process per call: on the direct path every ADD pays a kubeconfig
//! parse, a TLS handshake with the API server and the authentication of a new connection, on
//! both sides, for one or two requests. The node-agent already runs on every node: it keeps one
//! connection and a watch of each network its pods use, and serves the plugins' lease-store
//! requests over a root-only unix socket (the tether-lease-service crate, which no plugin links).
//! The plugin asks it first and falls back to the direct path by itself whenever it is absent,
//! slow, stopping or breaks mid-call ([`client`]), so no pod waits for, or fails because of, the
//! agent. Both paths send the same conditional requests as the same node-bound identity
//! ([`protocol`]).

pub mod client;
pub mod protocol;

pub use client::{AgentConnection, ServedStore, open_served};
pub use protocol::{DEFAULT_SOCKET, SOCKET_ENV, socket_path};
