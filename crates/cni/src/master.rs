//! `master` and `linkInContainer`: the link an attachment hangs from. The attacher creates its
//! sub-interface on it, tether-ipam probes the wire through it and `tether doctor` checks it, so all
//! three read the keys here and cannot disagree on what a value means.

use serde_json::{Map, Value};

use crate::config::json_type;
use crate::error::CniError;

/// The two keys, validated. Nothing here has touched the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MasterKeys {
    /// `None` (absent or ""): derived by the reader (chained prevResult, the default route's
    /// interface, or the pod interface's parent).
    pub master: Option<String>,
    /// The master lives in the pod netns (e.g. an SR-IOV VF moved there earlier in a chain).
    pub link_in_container: bool,
}

impl MasterKeys {
    /// From a network config's top-level keys. A value of the wrong type, or a `master` the kernel
    /// would never take as a link name, is code 7 naming the key.
    pub fn from_top(top: &Map<String, Value>) -> Result<MasterKeys, CniError> {
        let master = match top.get("master") {
            None | Some(Value::Null) => None,
            Some(Value::String(m)) if m.is_empty() => None,
            Some(Value::String(m)) if is_ifname(m) => Some(m.clone()),
            Some(Value::String(m)) => {
                let shown: String = m.chars().take(32).collect();
                return Err(CniError::invalid_config(format!(
                    "master {shown:?}{} is not an interface name: at most 15 bytes, no '/', ':' or \
                     whitespace (see `ip -br link` on the node)",
                    if shown.len() < m.len() { "…" } else { "" }
                )));
            }
            Some(other) => {
                return Err(CniError::invalid_config(format!(
                    "master must be a string (an interface name), not {}",
                    json_type(other)
                )));
            }
        };
        let link_in_container = match top.get("linkInContainer") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(CniError::invalid_config(format!(
                    "linkInContainer must be true or false, not {}",
                    json_type(other)
                )));
            }
        };
        Ok(MasterKeys {
            master,
            link_in_container,
        })
    }
}

/// A name the kernel would take for a link (IFNAMSIZ less the NUL; no '/', ':', whitespace).
fn is_ifname(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 15
        && n != "."
        && n != ".."
        && !n
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b.is_ascii_control())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(json: &str) -> Result<MasterKeys, CniError> {
        MasterKeys::from_top(
            serde_json::from_str::<Value>(json)
                .unwrap()
                .as_object()
                .unwrap(),
        )
    }

    #[test]
    fn absent_or_empty_master_is_derived_later() {
        assert_eq!(keys("{}").unwrap(), MasterKeys::default());
        assert_eq!(
            keys(r#"{"master":"","linkInContainer":null}"#).unwrap(),
            MasterKeys::default()
        );
        assert_eq!(
            keys(r#"{"master":"bond0","linkInContainer":true}"#).unwrap(),
            MasterKeys {
                master: Some("bond0".into()),
                link_in_container: true
            }
        );
    }

    #[test]
    fn a_bad_value_is_code_7_naming_the_key() {
        for (json, says) in [
            (r#"{"master":"a/b"}"#, "\"a/b\" is not an interface name"),
            (r#"{"master":"sixteen-bytes-xx"}"#, "at most 15 bytes"),
            (r#"{"master":".."}"#, "not an interface name"),
            (r#"{"master":7}"#, "master must be a string"),
            (
                r#"{"linkInContainer":"yes"}"#,
                "linkInContainer must be true or false",
            ),
        ] {
            let e = keys(json).unwrap_err();
            assert_eq!(e.code, 7, "{json}");
            assert!(e.msg.contains(says), "{json}: {}", e.msg);
        }
        let long = format!(r#"{{"master":"{}"}}"#, "x".repeat(40));
        assert!(keys(&long).unwrap_err().msg.contains("…"));
    }
}
