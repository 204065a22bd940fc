//! Spec versions tether speaks, and which verbs each allows.

use crate::error::{CniError, code};

/// Every version tether accepts, oldest first. 0.1.0/0.2.0 are not offered: their result layout
/// (`ip4`/`ip6`) cannot describe an attachment with an interface, and no current runtime needs them.
pub const SUPPORTED: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The newest version; used where the runtime gave none we can echo.
pub const LATEST: &str = "1.1.0";

/// A supported spec version. Ordered, so `v >= Version::V0_4_0` reads as the spec does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl Version {
    /// Exact string match, as libcni does.
    pub fn parse(s: &str) -> Result<Version, CniError> {
        Ok(match s {
            "0.3.0" => Version::V0_3_0,
            "0.3.1" => Version::V0_3_1,
            "0.4.0" => Version::V0_4_0,
            "1.0.0" => Version::V1_0_0,
            "1.1.0" => Version::V1_1_0,
            other => return Err(unsupported(other)),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_3_0 => "0.3.0",
            Version::V0_3_1 => "0.3.1",
            Version::V0_4_0 => "0.4.0",
            Version::V1_0_0 => "1.0.0",
            Version::V1_1_0 => "1.1.0",
        }
    }

    /// 0.3.x and 0.4.0 carry `ips[].version` and only name/mac/sandbox on interfaces.
    pub fn is_legacy_layout(self) -> bool {
        self < Version::V1_0_0
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn unsupported(given: &str) -> CniError {
    let shown = if given.is_empty() {
        "(none; a config without cniVersion means 0.1.0)".to_string()
    } else {
        format!("{given:?}")
    };
    CniError::new(
        code::INCOMPATIBLE_VERSION,
        format!("unsupported cniVersion {shown}"),
    )
    .with_details(format!("supported versions: {}", SUPPORTED.join(", ")))
}

/// The VERSION answer: echo the runtime's version, list ours.
pub fn version_info(echo: &str) -> String {
    serde_json::json!({ "cniVersion": echo, "supportedVersions": SUPPORTED }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_supported_and_orders_them() {
        let parsed: Vec<Version> = SUPPORTED
            .iter()
            .map(|s| Version::parse(s).unwrap())
            .collect();
        let mut sorted = parsed.clone();
        sorted.sort();
        assert_eq!(parsed, sorted);
        for (v, s) in parsed.iter().zip(SUPPORTED) {
            assert_eq!(v.as_str(), *s);
        }
    }

    #[test]
    fn unknown_version_is_code_1_listing_supported() {
        let e = Version::parse("9.9.9").unwrap_err();
        assert_eq!(e.code, 1);
        assert!(e.msg.contains("9.9.9"));
        for s in SUPPORTED {
            assert!(e.details.contains(s), "{s} missing from {}", e.details);
        }
        assert_eq!(Version::parse("0.2.0").unwrap_err().code, 1);
        assert_eq!(Version::parse("1.1").unwrap_err().code, 1);
    }
}
