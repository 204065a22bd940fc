//! The attacher's keys, compatible with the reference ipvlan plugin's config.

use serde::Deserialize;
use serde_json::Value;
use tether_cni::result::Dns;
use tether_cni::{CniResult, MasterKeys, NetConf};
use tether_link::{IpvlanFlag, IpvlanMode};

use crate::error::AttachError;

#[derive(Debug, Clone, Deserialize)]
struct Raw {
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    flags: Option<String>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    ipam: Option<Value>,
    #[serde(default)]
    dns: Option<Dns>,
}

/// When the IPAM plugin's ADD starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpamStart {
    /// Beside the link's creation: the plugin only allocates. Most of an ADD is the IPAM's exec
    /// and probe, and the link then costs nothing.
    WithLink,
    /// Once the link exists in the pod, as under the reference plugin: dhcp talks through it, and a
    /// plugin tether does not know may too.
    AfterLink,
}

impl IpamStart {
    /// The IPAM plugins known to only allocate. tether-ipam does only while `master` is set: without
    /// it, it finds the link it probes through as CNI_IFNAME's parent, so that link must exist.
    fn of(plugin: Option<&str>, keys: &MasterKeys) -> IpamStart {
        match plugin {
            Some("tether-ipam") if keys.master.is_some() => IpamStart::WithLink,
            Some("host-local" | "static" | "whereabouts") => IpamStart::WithLink,
            _ => IpamStart::AfterLink,
        }
    }
}

/// The validated config. Nothing here has touched the kernel.
#[derive(Debug, Clone)]
pub struct IpvlanConfig {
    /// `None`: derive it (chained prevResult, else the default route's interface).
    pub master: Option<String>,
    pub mode: IpvlanMode,
    pub flag: IpvlanFlag,
    /// 0 or absent: inherit the master's.
    pub mtu: Option<u32>,
    /// The master lives in the pod netns (e.g. an SR-IOV VF moved there earlier in a chain).
    pub link_in_container: bool,
    /// `ipam.type`, when an IPAM plugin is configured.
    pub ipam_type: Option<String>,
    /// When that plugin's ADD may start: decided here, from its type, so the ADD only follows it.
    pub ipam_start: IpamStart,
    pub dns: Option<Dns>,
}

impl IpvlanConfig {
    pub fn from_conf(conf: &NetConf) -> Result<IpvlanConfig, AttachError> {
        let raw: Raw = conf.plugin_config().map_err(AttachError::Cni)?;
        let mode = match raw.mode.as_deref().unwrap_or("l2") {
            "" | "l2" => IpvlanMode::L2,
            "l3" => IpvlanMode::L3,
            "l3s" => IpvlanMode::L3s,
            other => {
                return Err(AttachError::Config(format!(
                    "unknown ipvlan mode {other:?} (mode is one of l2, l3, l3s)"
                )));
            }
        };
        let flag = match raw.flags.as_deref().unwrap_or("bridge") {
            "" | "bridge" => IpvlanFlag::Bridge,
            "private" => IpvlanFlag::Private,
            "vepa" => IpvlanFlag::Vepa,
            other => {
                return Err(AttachError::Config(format!(
                    "unknown ipvlan flags {other:?} (flags is one of bridge, private, vepa)"
                )));
            }
        };
        let ipam_type = match &raw.ipam {
            Some(Value::Object(o)) => o
                .get("type")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
            Some(Value::Null) | None => None,
            Some(other) => {
                return Err(AttachError::Config(format!(
                    "ipam must be an object, got {other}"
                )));
            }
        };
        let keys = MasterKeys::from_top(&conf.value).map_err(AttachError::Cni)?;
        Ok(IpvlanConfig {
            ipam_start: IpamStart::of(ipam_type.as_deref(), &keys),
            master: keys.master,
            mode,
            flag,
            mtu: raw.mtu.filter(|m| *m != 0),
            link_in_container: keys.link_in_container,
            ipam_type,
            dns: raw.dns.filter(|d| !d.is_empty()),
        })
    }

    /// The master named by a chained prevResult: its only named interface (as the reference plugin does).
    pub fn chained_master(prev: Option<&CniResult>) -> Result<Option<String>, AttachError> {
        let Some(prev) = prev else { return Ok(None) };
        let named: Vec<&str> = prev
            .interfaces
            .iter()
            .map(|i| i.name.as_str())
            .filter(|n| !n.is_empty())
            .collect();
        match named.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one.to_string())),
            many => Err(AttachError::Config(format!(
                "prevResult has {} interfaces ({}); set \"master\" to say which one the ipvlan goes on",
                many.len(),
                many.join(", ")
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(extra: &str) -> NetConf {
        NetConf::parse(
            format!(r#"{{"cniVersion":"1.1.0","name":"n","type":"tether-ipvlan"{extra}}}"#)
                .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn reference_plugin_config_is_accepted() {
        let c = IpvlanConfig::from_conf(&conf(r#","master":"enp5s0","mode":"l3s","mtu":1500,"ipam":{"type":"tether-ipam","range":"10.1.2.0/24"}"#)).unwrap();
        assert_eq!(c.master.as_deref(), Some("enp5s0"));
        assert_eq!(c.mode, IpvlanMode::L3s);
        assert_eq!(c.ipam_type.as_deref(), Some("tether-ipam"));
        assert_eq!(c.ipam_start, IpamStart::WithLink);
        let c = IpvlanConfig::from_conf(&conf("")).unwrap();
        assert_eq!(
            (c.mode, c.flag, c.master, c.mtu),
            (IpvlanMode::L2, IpvlanFlag::Bridge, None, None)
        );
    }

    #[test]
    fn only_plugins_known_to_only_allocate_start_with_the_link() {
        let start = |extra: &str| IpvlanConfig::from_conf(&conf(extra)).unwrap().ipam_start;
        assert_eq!(
            start(r#","ipam":{"type":"host-local"}"#),
            IpamStart::WithLink
        );
        assert_eq!(
            start(r#","ipam":{"type":"whereabouts"}"#),
            IpamStart::WithLink
        );
        assert_eq!(start(r#","ipam":{"type":"dhcp"}"#), IpamStart::AfterLink);
        assert_eq!(
            start(r#","ipam":{"type":"tether-ipam"}"#),
            IpamStart::AfterLink
        );
        assert_eq!(
            start(r#","master":"eth0","ipam":{"type":"tether-ipam"}"#),
            IpamStart::WithLink
        );
        assert_eq!(start(""), IpamStart::AfterLink);
    }

    #[test]
    fn bad_mode_and_flags_name_the_value() {
        let e = IpvlanConfig::from_conf(&conf(r#","mode":"l4""#)).unwrap_err();
        assert!(e.to_string().contains("\"l4\""));
        assert_eq!(e.code(), 7);
        let e = IpvlanConfig::from_conf(&conf(r#","flags":"open""#)).unwrap_err();
        assert!(e.to_string().contains("\"open\""));
        let e = IpvlanConfig::from_conf(&conf(r#","mtu":"x""#)).unwrap_err();
        assert_eq!(e.code(), 7);
        assert!(e.to_string().contains("mtu"));
    }

    #[test]
    fn chained_master_needs_exactly_one_named_interface() {
        let r = |v: &str| CniResult::from_value(&serde_json::from_str(v).unwrap()).unwrap();
        assert_eq!(IpvlanConfig::chained_master(None).unwrap(), None);
        assert_eq!(
            IpvlanConfig::chained_master(Some(&r(r#"{"interfaces":[{"name":"eth5"}]}"#)))
                .unwrap()
                .as_deref(),
            Some("eth5")
        );
        let e =
            IpvlanConfig::chained_master(Some(&r(r#"{"interfaces":[{"name":"a"},{"name":"b"}]}"#)))
                .unwrap_err();
        assert_eq!(e.code(), 7);
    }
}
