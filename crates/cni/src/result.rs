//! The Result of ADD, held in the 1.x shape and printed in the layout of the config's version.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::version::Version;

/// Top-level key of tether-ipam's ADD Result listing the addresses it probed on the wire and found
/// unused (`["10.1.2.9", "fd00::9"]`). tether-ipvlan then adds those IPv6 addresses with `nodad`
/// instead of sitting out the kernel's DAD too, and leaves the key out of its own Result.
pub const PROBED_KEY: &str = "tetherProbed";

/// Note `probed` in a printed Result under [`PROBED_KEY`] (nothing when empty): the writer of the key
/// whose reader is [`probed_addresses`].
pub fn note_probed(out: &mut Value, probed: &[IpAddr]) {
    if let (Some(o), false) = (out.as_object_mut(), probed.is_empty()) {
        let list = probed.iter().map(|a| Value::from(a.to_string())).collect();
        o.insert(PROBED_KEY.to_string(), Value::Array(list));
    }
}

/// The addresses a delegate's raw Result lists under [`PROBED_KEY`] (none when absent or malformed).
pub fn probed_addresses(raw: &Value) -> Vec<IpAddr> {
    raw.get(PROBED_KEY)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    #[serde(
        default,
        rename = "socketPath",
        skip_serializing_if = "Option::is_none"
    )]
    pub socket_path: Option<String>,
    #[serde(default, rename = "pciID", skip_serializing_if = "Option::is_none")]
    pub pci_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Address with the prefix length of its subnet, e.g. `10.1.2.9/24`.
    pub address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`; IPAM results leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, rename = "advmss", skip_serializing_if = "Option::is_none")]
    pub adv_mss: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        *self == Dns::default()
    }
}

/// A Result in the 1.x model. Reading accepts the 0.3.x/0.4.0 layout too (`ips[].version` is derived
/// from the address family, so it is dropped on the way in and recomputed on the way out).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniResult {
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    #[serde(default)]
    pub routes: Vec<Route>,
    #[serde(default)]
    pub dns: Dns,
}

impl CniResult {
    /// Read a Result printed in any supported layout (the delegate's, or a prevResult).
    pub fn from_value(v: &Value) -> Result<CniResult, serde_json::Error> {
        // `dns: {}` and `dns: null` both mean none; serde's default handles absent keys.
        let mut v = v.clone();
        if let Some(obj) = v.as_object_mut() {
            for key in ["interfaces", "ips", "routes", "dns"] {
                if obj.get(key).is_some_and(Value::is_null) {
                    obj.remove(key);
                }
            }
        }
        serde_json::from_value(v)
    }

    pub fn from_slice(raw: &[u8]) -> Result<CniResult, serde_json::Error> {
        Self::from_value(&serde_json::from_slice(raw)?)
    }

    /// The Result as the runtime expects it for `version`.
    pub fn to_value(&self, version: Version) -> Value {
        let legacy = version.is_legacy_layout();
        let mut out = serde_json::Map::new();
        out.insert("cniVersion".into(), json!(version.as_str()));
        if !self.interfaces.is_empty() {
            let ifaces: Vec<Value> = self
                .interfaces
                .iter()
                .map(|i| {
                    if legacy {
                        // 0.3.x/0.4.0 interfaces know only name, mac and sandbox.
                        let mut o = serde_json::Map::new();
                        o.insert("name".into(), json!(i.name));
                        if let Some(m) = &i.mac {
                            o.insert("mac".into(), json!(m));
                        }
                        if let Some(s) = &i.sandbox {
                            o.insert("sandbox".into(), json!(s));
                        }
                        Value::Object(o)
                    } else {
                        serde_json::to_value(i).expect("plain struct")
                    }
                })
                .collect();
            out.insert("interfaces".into(), Value::Array(ifaces));
        }
        if !self.ips.is_empty() {
            let ips: Vec<Value> = self
                .ips
                .iter()
                .map(|ip| {
                    let mut v = serde_json::to_value(ip).expect("plain struct");
                    if legacy {
                        let family = if ip.address.addr().is_ipv4() {
                            "4"
                        } else {
                            "6"
                        };
                        v.as_object_mut()
                            .expect("struct is an object")
                            .insert("version".into(), json!(family));
                    }
                    v
                })
                .collect();
            out.insert("ips".into(), Value::Array(ips));
        }
        if !self.routes.is_empty() {
            out.insert(
                "routes".into(),
                serde_json::to_value(&self.routes).expect("plain struct"),
            );
        }
        if !self.dns.is_empty() {
            out.insert(
                "dns".into(),
                serde_json::to_value(&self.dns).expect("plain struct"),
            );
        }
        Value::Object(out)
    }

    pub fn to_json(&self, version: Version) -> String {
        self.to_value(version).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![Interface {
                name: "net1".into(),
                mac: Some("02:00:00:00:00:01".into()),
                mtu: Some(9000),
                sandbox: Some("/run/netns/p".into()),
                socket_path: Some("/s".into()),
                pci_id: Some("0000:3b:00.0".into()),
            }],
            ips: vec![
                IpConfig {
                    address: "10.1.2.9/24".parse().unwrap(),
                    gateway: Some("10.1.2.1".parse().unwrap()),
                    interface: Some(0),
                },
                IpConfig {
                    address: "fd00::9/64".parse().unwrap(),
                    gateway: None,
                    interface: Some(0),
                },
            ],
            routes: vec![Route {
                dst: "10.2.0.0/16".parse().unwrap(),
                gw: Some("10.1.2.1".parse().unwrap()),
                mtu: None,
                adv_mss: None,
                priority: Some(5),
                table: None,
                scope: None,
            }],
            dns: Dns {
                nameservers: vec!["10.1.2.53".into()],
                ..Default::default()
            },
        }
    }

    #[test]
    fn one_x_layout_has_no_ip_version_and_keeps_interface_extras() {
        for v in [Version::V1_0_0, Version::V1_1_0] {
            let out = sample().to_value(v);
            assert_eq!(out["cniVersion"], v.as_str());
            assert!(out["ips"][0].get("version").is_none());
            assert_eq!(out["ips"][0]["address"], "10.1.2.9/24");
            assert_eq!(out["ips"][0]["interface"], 0);
            assert_eq!(out["interfaces"][0]["mtu"], 9000);
            assert_eq!(out["interfaces"][0]["pciID"], "0000:3b:00.0");
            assert_eq!(out["routes"][0]["priority"], 5);
            assert_eq!(out["dns"]["nameservers"][0], "10.1.2.53");
        }
    }

    #[test]
    fn legacy_layout_has_ip_version_and_bare_interfaces() {
        for v in [Version::V0_3_0, Version::V0_3_1, Version::V0_4_0] {
            let out = sample().to_value(v);
            assert_eq!(out["cniVersion"], v.as_str());
            assert_eq!(out["ips"][0]["version"], "4");
            assert_eq!(out["ips"][1]["version"], "6");
            let iface = out["interfaces"][0].as_object().unwrap();
            let mut keys: Vec<_> = iface.keys().cloned().collect();
            keys.sort();
            assert_eq!(keys, ["mac", "name", "sandbox"]);
        }
    }

    #[test]
    fn round_trips_through_every_layout() {
        for v in [
            Version::V0_3_0,
            Version::V0_3_1,
            Version::V0_4_0,
            Version::V1_0_0,
            Version::V1_1_0,
        ] {
            let back = CniResult::from_value(&sample().to_value(v)).unwrap();
            let mut expect = sample();
            if v.is_legacy_layout() {
                let i = &mut expect.interfaces[0];
                (i.mtu, i.socket_path, i.pci_id) = (None, None, None);
            }
            assert_eq!(back, expect, "{v}");
        }
    }

    #[test]
    fn empty_parts_are_omitted_and_nulls_read_as_empty() {
        let r = CniResult {
            ips: sample().ips,
            ..Default::default()
        };
        let out = r.to_value(Version::V1_1_0);
        assert!(out.get("interfaces").is_none());
        assert!(out.get("dns").is_none());
        assert!(out.get("routes").is_none());
        let parsed =
            CniResult::from_value(&json!({"cniVersion":"1.0.0","ips":null,"dns":null})).unwrap();
        assert_eq!(parsed, CniResult::default());
    }

    #[test]
    fn probed_addresses_are_read_and_ignored_by_the_model() {
        let raw = json!({"cniVersion":"1.1.0","ips":[{"address":"10.1.2.9/24"}],"tetherProbed":["10.1.2.9","fd00::9","junk",7]});
        assert_eq!(
            probed_addresses(&raw),
            vec![
                "10.1.2.9".parse::<IpAddr>().unwrap(),
                "fd00::9".parse().unwrap()
            ]
        );
        assert!(probed_addresses(&json!({"tetherProbed":"10.1.2.9"})).is_empty());
        // The Result model drops the key, so a plugin never passes it on.
        let r = CniResult::from_value(&raw).unwrap();
        assert!(r.to_value(Version::V1_1_0).get(PROBED_KEY).is_none());
    }

    #[test]
    fn a_noted_probe_reads_back_and_none_writes_no_key() {
        let probed: Vec<IpAddr> = vec!["10.1.2.9".parse().unwrap(), "fd00::9".parse().unwrap()];
        let mut out = sample().to_value(Version::V1_1_0);
        note_probed(&mut out, &probed);
        assert_eq!(probed_addresses(&out), probed);
        assert_eq!(CniResult::from_value(&out).unwrap(), sample());
        let mut none = sample().to_value(Version::V1_1_0);
        note_probed(&mut none, &[]);
        assert!(none.get(PROBED_KEY).is_none(), "{none}");
    }

    #[test]
    fn reads_prefix_with_host_bits() {
        let r = CniResult::from_value(&json!({"ips":[{"address":"10.1.2.9/24","version":"4"}]}))
            .unwrap();
        assert_eq!(r.ips[0].address.addr().to_string(), "10.1.2.9");
        assert_eq!(r.ips[0].address.prefix_len(), 24);
        assert!(CniResult::from_value(&json!({"ips":[{"address":"nonsense"}]})).is_err());
    }
}
