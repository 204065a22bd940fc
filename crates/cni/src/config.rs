//! The network configuration on stdin: the keys every plugin shares, the raw bytes for delegation, and
//! typed access to each plugin's own keys.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::env::is_spec_identifier;
use crate::error::{CniError, code};
use crate::result::CniResult;
use crate::version::Version;

/// One attachment a runtime still uses, from GC's `cni.dev/valid-attachments`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Attachment {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// A parsed network configuration. `raw` is exactly what arrived on stdin, so a delegate gets the same
/// bytes (runtimeConfig, args and keys tether does not know included).
#[derive(Debug, Clone)]
pub struct NetConf {
    pub version: Version,
    /// As given; `version` is its parsed form.
    pub cni_version: String,
    pub name: String,
    pub plugin_type: String,
    pub raw: Vec<u8>,
    pub value: Map<String, Value>,
    pub prev_result: Option<CniResult>,
    /// GC only: `cni.dev/valid-attachments`, or the legacy `cni.dev/attachments`.
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// Pull `cniVersion` out of bytes that may not parse fully, for stamping an error.
pub fn sniff_version(raw: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct V {
        #[serde(rename = "cniVersion")]
        v: String,
    }
    serde_json::from_slice::<V>(raw).ok().map(|v| v.v)
}

impl NetConf {
    pub fn parse(raw: &[u8]) -> Result<NetConf, CniError> {
        let (value, attachment_lists) = split_top(raw)?;
        let cni_version = match value.get("cniVersion") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(CniError::invalid_config(format!(
                    "cniVersion {other} is not a string"
                )));
            }
            None => String::new(),
        };
        let version = Version::parse(&cni_version)?;
        let name = network_name(&value)?;
        check_shapes(&value)?;
        let plugin_type = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let prev_result = match value.get("prevResult") {
            None | Some(Value::Null) => None,
            Some(v) => Some(CniResult::from_value(v).map_err(|e| {
                CniError::invalid_config(format!("prevResult cannot be read: {e}"))
            })?),
        };
        let valid_attachments = valid_attachments(attachment_lists)?;
        Ok(NetConf {
            version,
            cni_version,
            name,
            plugin_type,
            raw: raw.to_vec(),
            value,
            prev_result,
            valid_attachments,
        })
    }

    /// Deserialize the plugin's own view of the config. Unknown keys are ignored (serde's default); a
    /// value of the wrong shape is code 7 naming the key path and what was wrong.
    pub fn plugin_config<T: DeserializeOwned>(&self) -> Result<T, CniError> {
        let value = Value::Object(self.value.clone());
        serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            CniError::invalid_config(format!("invalid value for \"{path}\": {}", e.inner()))
        })
    }

    /// `runtimeConfig.<key>`, which libcni fills only for capabilities the config declares.
    pub fn runtime_config(&self, key: &str) -> Option<&Value> {
        self.value
            .get("runtimeConfig")
            .and_then(|rc| rc.get(key))
            .filter(|v| !v.is_null())
    }

    /// `args.cni.<key>` (the `args` convention).
    pub fn args_cni(&self, key: &str) -> Option<&Value> {
        self.value
            .get("args")
            .and_then(|a| a.get("cni"))
            .and_then(|c| c.get(key))
            .filter(|v| !v.is_null())
    }

    /// The `type` of the `ipam` object, if any.
    pub fn ipam_type(&self) -> Option<&str> {
        self.value
            .get("ipam")
            .and_then(|i| i.get("type"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    }
}

/// GC's attachment lists under their keys, still unparsed.
type AttachmentLists<'a> = Vec<(String, &'a RawValue)>;

/// The top level of `raw`, each value but GC's attachment lists parsed. Those (up to
/// [`MAX_VALID_ATTACHMENTS`] entries) go straight into their typed form later, never through a
/// `Value` tree, which would cost several times their size in memory.
fn split_top(raw: &[u8]) -> Result<(Map<String, Value>, AttachmentLists<'_>), CniError> {
    let top: BTreeMap<String, &RawValue> = serde_json::from_slice(raw).map_err(|e| {
        CniError::new(
            code::DECODE,
            if e.classify() == serde_json::error::Category::Data {
                "the network configuration on stdin is not a JSON object".to_string()
            } else {
                format!("the network configuration on stdin is not valid JSON: {e}")
            },
        )
    })?;
    let mut value = Map::new();
    let mut attachment_lists = Vec::new();
    for (k, v) in top {
        if ATTACHMENT_KEYS.contains(&k.as_str()) {
            attachment_lists.push((k, v));
        } else {
            // Already checked to be valid JSON by the pass above.
            let v: Value = serde_json::from_str(v.get())
                .map_err(|e| CniError::new(code::DECODE, format!("{k:?} cannot be read: {e}")))?;
            value.insert(k, v);
        }
    }
    Ok((value, attachment_lists))
}

/// `name`, which the spec requires and restricts.
fn network_name(value: &Map<String, Value>) -> Result<String, CniError> {
    match value.get("name") {
        Some(Value::String(s)) if is_spec_identifier(s) => Ok(s.clone()),
        Some(Value::String(s)) => Err(CniError::invalid_config(format!(
            "network name {s:?} is invalid: it must start with a letter or digit followed by letters, digits, '_', '.' or '-'"
        ))),
        Some(other) => Err(CniError::invalid_config(format!(
            "network name {other} is not a string"
        ))),
        None => Err(CniError::invalid_config(
            "the network configuration has no \"name\"",
        )),
    }
}

/// GC's list of attachments still in use: the spec's key first, the legacy one only without
/// it (libcni sends either).
fn valid_attachments(mut lists: AttachmentLists<'_>) -> Result<Option<Vec<Attachment>>, CniError> {
    lists.sort_by_key(|(k, _)| ATTACHMENT_KEYS.iter().position(|a| a == k));
    lists
        .first()
        .map(|(k, v)| {
            let list: Vec<Attachment> = serde_json::from_str(v.get()).map_err(|e| {
                CniError::invalid_config(format!(
                    "{k} must be a list of {{containerID, ifname}}: {e}"
                ))
            })?;
            if list.len() > MAX_VALID_ATTACHMENTS {
                return Err(CniError::invalid_config(format!(
                    "{k} has {} entries; at most {MAX_VALID_ATTACHMENTS} are accepted",
                    list.len()
                )));
            }
            Ok(list)
        })
        .transpose()
}

/// The keys every plugin reads have the JSON type they must have: a config that gets one wrong is
/// refused naming the key, instead of the key being ignored.
fn check_shapes(value: &Map<String, Value>) -> Result<(), CniError> {
    type Shape = (&'static str, fn(&Value) -> bool, &'static str);
    const SHAPES: [Shape; 7] = [
        ("type", Value::is_string, "a string"),
        ("ipam", Value::is_object, "an object"),
        ("ipam.type", Value::is_string, "a string"),
        ("args", Value::is_object, "an object"),
        ("args.cni", Value::is_object, "an object"),
        ("runtimeConfig", Value::is_object, "an object"),
        ("capabilities", Value::is_object, "an object"),
    ];
    for (at, ok, what) in SHAPES {
        let mut keys = at.split('.');
        let first = value.get(keys.next().unwrap_or_default());
        // A missing or null key is fine here; a parent of the wrong type was refused first.
        match keys.try_fold(first, |v, k| Some(v?.get(k))).flatten() {
            Some(v) if !v.is_null() && !ok(v) => {
                return Err(CniError::invalid_config(format!(
                    "{at} must be {what}, not {}",
                    json_type(v)
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The keys GC's attachment list may come under: the spec's, then the legacy one.
const ATTACHMENT_KEYS: [&str; 2] = ["cni.dev/valid-attachments", "cni.dev/attachments"];

/// GC's `cni.dev/valid-attachments` longer than this is refused (a node runs a few hundred
/// containers; this leaves room for any real one and bounds what a GC holds).
pub const MAX_VALID_ATTACHMENTS: usize = 200_000;

/// What kind of JSON value `v` is, for messages ("must be a string, not a number").
pub fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<NetConf, CniError> {
        NetConf::parse(s.as_bytes())
    }

    #[test]
    fn malformed_json_is_code_6() {
        assert_eq!(parse("{not json").unwrap_err().code, 6);
        assert_eq!(parse("[1,2]").unwrap_err().code, 6);
        assert_eq!(parse("").unwrap_err().code, 6);
    }

    #[test]
    fn version_checked_before_name() {
        let e = parse(r#"{"cniVersion":"9.9.9","name":"n/bad"}"#).unwrap_err();
        assert_eq!(e.code, 1);
        assert_eq!(parse(r#"{"name":"n"}"#).unwrap_err().code, 1);
    }

    #[test]
    fn name_missing_or_invalid_is_code_7() {
        assert_eq!(parse(r#"{"cniVersion":"1.1.0"}"#).unwrap_err().code, 7);
        assert_eq!(
            parse(r#"{"cniVersion":"1.1.0","name":"a/b"}"#)
                .unwrap_err()
                .code,
            7
        );
        assert_eq!(
            parse(r#"{"cniVersion":"1.1.0","name":""}"#)
                .unwrap_err()
                .code,
            7
        );
        assert_eq!(
            parse(r#"{"cniVersion":"1.1.0","name":5}"#)
                .unwrap_err()
                .code,
            7
        );
    }

    #[test]
    fn keeps_raw_bytes_and_unknown_keys() {
        let s = r#"{"cniVersion":"1.1.0","name":"mgmt","type":"tether-ipvlan","deviceID":"0000:3b:00.0","pciBusID":"x","cni.dev/foo":1,"args":{"cni":{"ips":["10.1.2.9"]}},"runtimeConfig":{"ips":["10.1.2.8/24"]},"ipam":{"type":"tether-ipam"}}"#;
        let c = parse(s).unwrap();
        assert_eq!(c.raw, s.as_bytes());
        assert_eq!(c.name, "mgmt");
        assert_eq!(c.ipam_type(), Some("tether-ipam"));
        assert_eq!(c.runtime_config("ips").unwrap()[0], "10.1.2.8/24");
        assert_eq!(c.args_cni("ips").unwrap()[0], "10.1.2.9");
        assert!(c.value.contains_key("pciBusID"));
    }

    #[test]
    fn gc_attachments_either_key() {
        for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
            let s = format!(
                r#"{{"cniVersion":"1.1.0","name":"n","{key}":[{{"containerID":"c1","ifname":"net1"}}]}}"#
            );
            let c = parse(&s).unwrap();
            assert_eq!(
                c.valid_attachments.unwrap(),
                vec![Attachment {
                    container_id: "c1".into(),
                    ifname: "net1".into()
                }]
            );
        }
    }

    #[test]
    fn plugin_config_names_the_bad_key() {
        #[derive(Debug, Deserialize)]
        struct P {
            #[allow(dead_code)]
            mtu: Option<u32>,
        }
        let c = parse(r#"{"cniVersion":"1.1.0","name":"n","mtu":"big"}"#).unwrap();
        let e = c.plugin_config::<P>().unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("\"mtu\""), "{}", e.msg);
    }
}
