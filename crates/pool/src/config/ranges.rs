//! The address ranges of the `ipam` object: `range` (with `range_start`, `range_end`, `exclude`)
//! and every `ipRanges` entry.

use std::net::IpAddr;

use serde_json::{Map, Value};

use super::{ConfigError, MAX_EXCLUDES, MAX_RANGES, check_pod_subnet, ip_value, is_blank, opt_str};
use crate::range::{self, Bound, IpRange, RangeError};

/// `range` first, then the `ipRanges` entries, each with its own gateway or the top-level one.
pub(super) fn parse_ranges(
    ipam: &Map<String, Value>,
    gateway: Option<IpAddr>,
) -> Result<Vec<IpRange>, ConfigError> {
    let mut ranges = Vec::new();
    if let Some(text) = opt_str(ipam, "range", "ipam.range")? {
        ranges.push(parse_entry(ipam, "ipam", text, gateway)?);
    }
    let items = match ipam.get("ipRanges") {
        None | Some(Value::Null) => return Ok(ranges),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ConfigError::invalid(
                "ipam.ipRanges",
                other,
                "expected a list",
            ));
        }
    };
    if ranges.len() + items.len() > MAX_RANGES {
        return Err(ConfigError::invalid(
            "ipam.ipRanges",
            &Value::from(format!("{} entries", items.len())),
            format!("at most {MAX_RANGES} ranges (with \"range\") are allowed per network"),
        ));
    }
    for (i, item) in items.iter().enumerate() {
        let path = format!("ipam.ipRanges[{i}]");
        let obj = item
            .as_object()
            .ok_or_else(|| ConfigError::invalid(&path, item, "expected an object"))?;
        let Some(text) = opt_str(obj, "range", &format!("{path}.range"))? else {
            return Err(ConfigError::invalid(&path, item, "has no \"range\""));
        };
        let gw = match opt_str(obj, "gateway", &format!("{path}.gateway"))? {
            Some(g) => Some(ip_value(&format!("{path}.gateway"), &obj["gateway"], g)?),
            None => gateway,
        };
        ranges.push(parse_entry(obj, &path, text, gw)?);
    }
    Ok(ranges)
}

/// The keys of one entry, as error paths.
struct Keys {
    range: String,
    start: String,
    end: String,
}

/// Parse one range entry (the top-level ipam object or an `ipRanges` item) at `path`; `text` is
/// its `range`.
fn parse_entry(
    obj: &Map<String, Value>,
    path: &str,
    text: &str,
    gateway: Option<IpAddr>,
) -> Result<IpRange, ConfigError> {
    let keys = Keys {
        range: format!("{path}.range"),
        start: format!("{path}.range_start"),
        end: format!("{path}.range_end"),
    };
    let range_val = &obj["range"];
    let (subnet, first, last) = range::parse_range_text(text)
        .map_err(|e| ConfigError::invalid(&keys.range, range_val, e))?;
    check_pod_subnet(&subnet).map_err(|e| ConfigError::invalid(&keys.range, range_val, e))?;
    let dashed = first.is_some();

    let (mut start, mut end) = (first, last);
    if !dashed {
        if let Some(s) = opt_str(obj, "range_start", &keys.start)? {
            start = Some(ip_value(&keys.start, &obj["range_start"], s)?);
        }
        if let Some(e) = opt_str(obj, "range_end", &keys.end)? {
            end = Some(ip_value(&keys.end, &obj["range_end"], e)?);
        }
    } else if obj.get("range_start").is_some_and(|v| !is_blank(v))
        || obj.get("range_end").is_some_and(|v| !is_blank(v))
    {
        log::warn!(
            "{} is a first-last range; range_start/range_end are ignored (as whereabouts does)",
            keys.range
        );
    }

    let excludes = parse_excludes(obj, path)?;
    let gateway = gateway.filter(|g| subnet.contains(g));
    IpRange::new(subnet, start, end, gateway, excludes).map_err(|e| {
        let key = blamed_key(&e, dashed, obj, &keys);
        let value = key
            .rsplit('.')
            .next()
            .and_then(|k| obj.get(k))
            .unwrap_or(range_val);
        ConfigError::invalid(key, value, e)
    })
}

/// The entry's `exclude` list: CIDRs or single addresses, at most [`MAX_EXCLUDES`].
fn parse_excludes(obj: &Map<String, Value>, path: &str) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    let exclude_key = format!("{path}.exclude");
    let items = match obj.get("exclude") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ConfigError::invalid(
                &exclude_key,
                other,
                "expected a list of CIDRs or addresses",
            ));
        }
    };
    if items.len() > MAX_EXCLUDES {
        return Err(ConfigError::invalid(
            &exclude_key,
            &Value::from(format!("{} entries", items.len())),
            format!("at most {MAX_EXCLUDES} excludes are allowed per range"),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let key = format!("{exclude_key}[{i}]");
            let s = item.as_str().ok_or_else(|| {
                ConfigError::invalid(&key, item, "expected a string (CIDR or address)")
            })?;
            range::parse_exclude(s).map_err(|e| ConfigError::invalid(&key, item, e))
        })
        .collect()
}

/// The key that holds the value a range error is about: a first-last `range` is one value; else
/// the bound named by the error, or the `range` itself.
fn blamed_key<'k>(
    e: &RangeError,
    dashed: bool,
    obj: &Map<String, Value>,
    keys: &'k Keys,
) -> &'k str {
    if dashed {
        return &keys.range;
    }
    match e {
        RangeError::Outside { bound, .. } | RangeError::MixedFamily { bound, .. } => match bound {
            Bound::Start => &keys.start,
            Bound::End => &keys.end,
        },
        RangeError::StartAfterEnd { .. } if obj.get("range_end").is_some() => &keys.end,
        RangeError::StartAfterEnd { .. } => &keys.start,
        _ => &keys.range,
    }
}
