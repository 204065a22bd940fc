//! The CNI error object and the codes tether uses.
//!
//! Every failure a runtime sees is one of these, printed once on stdout. Library crates keep their own
//! `thiserror` enums; each binary maps them to a [`CniError`] in one place.

use serde::{Deserialize, Serialize};

/// Error codes: the spec's (0–99 are reserved by it) and tether's own (100+).
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in the network configuration; the message names key and value.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Container unknown or does not exist; the runtime need not clean up.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid or missing environment variables; the message names them.
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure.
    pub const IO: u32 = 5;
    /// Failed to decode content (malformed JSON).
    pub const DECODE: u32 = 6;
    /// Invalid network configuration.
    pub const INVALID_CONFIG: u32 = 7;
    /// Transient: try again later.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot serve ADD now.
    pub const NOT_AVAILABLE: u32 = 50;
    /// STATUS: not available, existing containers may have limited connectivity.
    pub const NOT_AVAILABLE_LIMITED: u32 = 51;

    // tether's own codes.
    /// A delegated plugin (IPAM) could not be found or executed.
    pub const DELEGATE_FAILED: u32 = 100;
    /// The kernel refused a link, address or route operation.
    pub const KERNEL: u32 = 101;
    /// No free address is left in a range.
    pub const POOL_EXHAUSTED: u32 = 102;
    /// An address is in use on the wire (answered an ARP/NDP probe).
    pub const ADDRESS_IN_USE: u32 = 103;
    /// A requested address is held by another attachment.
    pub const ADDRESS_TAKEN: u32 = 104;
    /// The lease store cannot be read or written.
    pub const STORE: u32 = 105;
    /// A CHECK found the attachment different from what ADD produced.
    pub const CHECK_FAILED: u32 = 106;
    /// A bug: a panic or an impossible state. Same number as Go's ErrInternal so operators recognise it.
    pub const INTERNAL: u32 = 999;
}

/// A CNI error as printed on stdout: `{cniVersion, code, msg, details}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{msg}{}", if details.is_empty() { String::new() } else { format!(": {details}") })]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    pub fn invalid_config(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_CONFIG, msg)
    }

    pub fn invalid_env(msg: impl Into<String>) -> Self {
        Self::new(code::INVALID_ENV, msg)
    }

    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(code::INTERNAL, msg)
    }

    /// The JSON object for stdout, stamped with the version the runtime asked for.
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            details: &'a str,
        }
        serde_json::to_string(&Wire {
            cni_version,
            code: self.code,
            msg: &self.msg,
            details: &self.details,
        })
        .expect("serialising plain strings cannot fail")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_version_code_msg_and_optional_details() {
        let e = CniError::new(7, "bad").with_details("more");
        let v: serde_json::Value = serde_json::from_str(&e.to_json("1.1.0")).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"cniVersion":"1.1.0","code":7,"msg":"bad","details":"more"})
        );
        let v: serde_json::Value =
            serde_json::from_str(&CniError::new(4, "x").to_json("0.4.0")).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"cniVersion":"0.4.0","code":4,"msg":"x"})
        );
    }
}
