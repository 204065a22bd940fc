//! The `routes`, `dns`, `probe`, `kubernetes`, `dataDir` and `isolated_fabric` sections of
//! the `ipam` object.

use std::path::PathBuf;

use ipnet::IpNet;
use serde_json::{Map, Value};

use super::{
    ConfigError, DEFAULT_DATA_DIR, DEFAULT_PROBE_ATTEMPTS, DEFAULT_PROBE_TIMEOUT_MS, Dns,
    KubeconfigSource, KubernetesConfig, ProbeConfig, Route, ip_value, opt_str, opt_u64,
};
use crate::range;

pub(super) fn parse_routes(ipam: &Map<String, Value>) -> Result<Vec<Route>, ConfigError> {
    let mut routes = Vec::new();
    match ipam.get("routes") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let path = format!("ipam.routes[{i}]");
                let obj = item.as_object().ok_or_else(|| {
                    ConfigError::invalid(&path, item, "expected an object {\"dst\", \"gw\"}")
                })?;
                let dst_key = format!("{path}.dst");
                let dst_s = opt_str(obj, "dst", &dst_key)?
                    .ok_or_else(|| ConfigError::invalid(&path, item, "has no \"dst\""))?;
                let dst: IpNet = dst_s
                    .trim()
                    .parse()
                    .map_err(|_| ConfigError::invalid(&dst_key, &obj["dst"], "not a CIDR"))?;
                let gw_key = format!("{path}.gw");
                let gw = match opt_str(obj, "gw", &gw_key)? {
                    Some(g) => Some(ip_value(&gw_key, &obj["gw"], g)?),
                    None => None,
                };
                if let Some(g) = gw
                    && range::Family::of(g) != range::Family::of(dst.addr())
                {
                    return Err(ConfigError::invalid(
                        &gw_key,
                        &obj["gw"],
                        format!("mixes IPv4 and IPv6 with dst {dst}"),
                    ));
                }
                let num = |key: &str, max: u64| -> Result<Option<u64>, ConfigError> {
                    let p = format!("{path}.{key}");
                    match opt_u64(obj, key, &p)? {
                        Some(n) if n > max => Err(ConfigError::invalid(
                            &p,
                            &obj[key],
                            format!("must be at most {max}"),
                        )),
                        n => Ok(n),
                    }
                };
                let u32_of = |key: &str| num(key, u32::MAX.into()).map(|n| n.map(|n| n as u32));
                routes.push(Route {
                    dst,
                    gw,
                    mtu: u32_of("mtu")?,
                    adv_mss: u32_of("advmss")?,
                    priority: u32_of("priority")?,
                    table: u32_of("table")?,
                    scope: num("scope", u8::MAX.into())?.map(|n| n as u8),
                });
            }
        }
        Some(other) => {
            return Err(ConfigError::invalid(
                "ipam.routes",
                other,
                "expected a list",
            ));
        }
    }
    Ok(routes)
}

pub(super) fn parse_dns(ipam: &Map<String, Value>) -> Result<Dns, ConfigError> {
    let obj = match ipam.get("dns") {
        None | Some(Value::Null) => return Ok(Dns::default()),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(ConfigError::invalid(
                "ipam.dns",
                other,
                "expected an object",
            ));
        }
    };
    let list = |key: &str| -> Result<Vec<String>, ConfigError> {
        let path = format!("ipam.dns.{key}");
        match obj.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        ConfigError::invalid(&format!("{path}[{i}]"), v, "expected a string")
                    })
                })
                .collect(),
            Some(other) => Err(ConfigError::invalid(
                &path,
                other,
                "expected a list of strings",
            )),
        }
    };
    Ok(Dns {
        nameservers: list("nameservers")?,
        domain: opt_str(obj, "domain", "ipam.dns.domain")?.map(str::to_string),
        search: list("search")?,
        options: list("options")?,
    })
}

pub(super) fn parse_probe(ipam: &Map<String, Value>) -> Result<ProbeConfig, ConfigError> {
    match ipam.get("probe") {
        None | Some(Value::Null) | Some(Value::Bool(true)) => Ok(ProbeConfig::default()),
        Some(Value::Bool(false)) => Ok(ProbeConfig::Disabled),
        Some(Value::Object(o)) => {
            let timeout_ms = opt_u64(o, "timeout_ms", "ipam.probe.timeout_ms")?
                .unwrap_or(DEFAULT_PROBE_TIMEOUT_MS);
            if timeout_ms == 0 {
                return Err(ConfigError::invalid(
                    "ipam.probe.timeout_ms",
                    &o["timeout_ms"],
                    "must be at least 1",
                ));
            }
            let attempts = opt_u64(o, "attempts", "ipam.probe.attempts")?
                .unwrap_or(DEFAULT_PROBE_ATTEMPTS as u64);
            if attempts == 0 || attempts > u32::MAX as u64 {
                return Err(ConfigError::invalid(
                    "ipam.probe.attempts",
                    &o["attempts"],
                    "must be between 1 and 4294967295",
                ));
            }
            Ok(ProbeConfig::Enabled {
                timeout_ms,
                attempts: attempts as u32,
            })
        }
        Some(other) => Err(ConfigError::invalid(
            "ipam.probe",
            other,
            "expected false, true or {\"timeout_ms\": N, \"attempts\": N}",
        )),
    }
}

/// `kubernetes`: the kubeconfig, and every other key as it came (the store reads them).
pub(super) fn parse_kubernetes(
    ipam: &Map<String, Value>,
) -> Result<Option<KubernetesConfig>, ConfigError> {
    match ipam.get("kubernetes") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(k)) => {
            let kubeconfig =
                opt_str(k, "kubeconfig", "ipam.kubernetes.kubeconfig")?.map(PathBuf::from);
            let mut extra = k.clone();
            extra.remove("kubeconfig");
            Ok(Some(KubernetesConfig {
                kubeconfig,
                source: KubeconfigSource::Config,
                extra,
            }))
        }
        Some(other) => Err(ConfigError::invalid(
            "ipam.kubernetes",
            other,
            "expected an object",
        )),
    }
}

/// `dataDir`, which must be absolute; absent: [`DEFAULT_DATA_DIR`].
pub(super) fn parse_data_dir(ipam: &Map<String, Value>) -> Result<PathBuf, ConfigError> {
    match opt_str(ipam, "dataDir", "ipam.dataDir")? {
        Some(d) if PathBuf::from(d).is_absolute() => Ok(PathBuf::from(d)),
        Some(_) => Err(ConfigError::invalid(
            "ipam.dataDir",
            &ipam["dataDir"],
            "must be an absolute path",
        )),
        None => Ok(PathBuf::from(DEFAULT_DATA_DIR)),
    }
}

/// The longest `isolated_fabric` name: it becomes part of every lease object's name.
pub const MAX_FABRIC_NAME: usize = 40;

/// `isolated_fabric`: a lowercase DNS label that starts with a letter (it ends the name of every
/// lease object of the domain, `<address>.<fabric>`), and that does not read as an IPv6 address
/// once its dashes are colons (so no such name can be taken for an address part).
pub(super) fn parse_isolated_fabric(
    ipam: &Map<String, Value>,
) -> Result<Option<String>, ConfigError> {
    const KEY: &str = "ipam.isolated_fabric";
    let Some(name) = opt_str(ipam, "isolated_fabric", KEY)? else {
        return Ok(None);
    };
    let raw = &ipam["isolated_fabric"];
    let b = name.as_bytes();
    let label = b.len() <= MAX_FABRIC_NAME
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1].is_ascii_alphanumeric();
    if !label {
        return Err(ConfigError::invalid(
            KEY,
            raw,
            format!(
                "must be a lowercase name of at most {MAX_FABRIC_NAME} letters, digits and '-', starting with a \
                 letter and ending with a letter or digit (it names the isolated fabric, e.g. \"rail-3\")"
            ),
        ));
    }
    if name.replace('-', ":").parse::<std::net::Ipv6Addr>().is_ok() {
        return Err(ConfigError::invalid(
            KEY,
            raw,
            "reads as an IPv6 address; choose a name that does not (e.g. \"rail-3\")",
        ));
    }
    Ok(Some(name.to_string()))
}
