//! CNI 1.1 protocol core shared by `tether-ipvlan` and `tether-ipam`.
//!
//! - [`env`]: the `CNI_*` variables, validated per verb; `CNI_ARGS`.
//! - [`config`]: the network configuration on stdin, raw bytes kept for delegation.
//! - [`master`]: `master` / `linkInContainer`, read alike by the attacher, the IPAM's probe and doctor.
//! - [`result`]: the Result model, printed in the layout of the config's `cniVersion`.
//! - [`error`]: the error object and every code tether uses.
//! - [`delegate`]: running the IPAM plugin as libcni does.
//! - [`plugin`]: the dispatcher binaries call: one Result or one error on stdout, panics included.
//! - [`logging`]: `log_file` / `log_level`, never stdout.
//! - [`call_spool`]: each call's record (verb, network, code, duration) for the node-agent's metrics.
//!
//! Why not rscni-types/rscni-plugin: see docs/design.md.

pub mod call_spool;
pub mod config;
pub mod delegate;
pub mod env;
pub mod error;
pub mod logging;
pub mod master;
pub mod plugin;
pub mod result;
pub mod version;

pub use config::NetConf;
pub use env::{Command, Env};
pub use error::{CniError, code};
pub use master::MasterKeys;
pub use plugin::{Added, Plugin, Request, asks_version, dispatch, run_main};
pub use result::CniResult;
pub use version::Version;
