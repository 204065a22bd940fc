//! Requested ("static") addresses: `10.1.2.9` or `10.1.2.9/24`, matched to the range that holds
//! them. The binary collects them from `runtimeConfig.ips`, `args.cni.ips` or `CNI_ARGS IP=`.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::range::{Family, IpRange, Unusable};

/// Errors about a requested address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Not `ip` or `ip/prefix`.
    #[error("requested address \"{text}\" is not an IP address or address/prefix")]
    Unparsable {
        /// The text as given.
        text: String,
    },
    /// The prefix length is too long for the family.
    #[error(
        "requested address \"{text}\": prefix length {prefix} is too long for the address family"
    )]
    BadPrefix {
        /// The text as given.
        text: String,
        /// The prefix length.
        prefix: u8,
    },
    /// No configured range's subnet holds the address.
    #[error("requested address {address} is not inside any configured range ({ranges})")]
    NotInAnyRange {
        /// The address.
        address: IpAddr,
        /// The configured ranges, comma-separated.
        ranges: String,
    },
    /// A range's subnet holds the address, but it may not be handed out.
    #[error("requested address {address} cannot be allocated from range {range}: {reason}")]
    NotUsable {
        /// The address.
        address: IpAddr,
        /// The range whose subnet holds it.
        range: String,
        /// Why it is not usable.
        reason: Unusable,
    },
}

/// A requested address, with the prefix length if one was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestedIp {
    /// The address.
    pub address: IpAddr,
    /// The prefix length given with it (`None` → the range's prefix).
    pub prefix_len: Option<u8>,
}

impl RequestedIp {
    /// Parse `10.1.2.9`, `10.1.2.9/24`, `fd00::9`, `fd00::9/64` (whitespace trimmed).
    pub fn parse(text: &str) -> Result<RequestedIp, RequestError> {
        let t = text.trim();
        let unparsable = || RequestError::Unparsable {
            text: text.to_string(),
        };
        let (addr, prefix) = match t.split_once('/') {
            Some((a, p)) => {
                let p: u8 = p.parse().map_err(|_| unparsable())?;
                (a, Some(p))
            }
            None => (t, None),
        };
        let address: IpAddr = addr.parse().map_err(|_| unparsable())?;
        if let Some(p) = prefix
            && p > Family::of(address).bits()
        {
            return Err(RequestError::BadPrefix {
                text: text.to_string(),
                prefix: p,
            });
        }
        Ok(RequestedIp {
            address,
            prefix_len: prefix,
        })
    }

    /// The index of the first range that may hand out this address.
    pub fn find_range(&self, ranges: &[IpRange]) -> Result<usize, RequestError> {
        find_range(ranges, self.address)
    }
}

impl FromStr for RequestedIp {
    type Err = RequestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RequestedIp::parse(s)
    }
}

impl fmt::Display for RequestedIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.prefix_len {
            Some(p) => write!(f, "{}/{}", self.address, p),
            None => write!(f, "{}", self.address),
        }
    }
}

/// Comma-separated display of ranges for error messages.
pub fn describe_ranges(ranges: &[IpRange]) -> String {
    if ranges.is_empty() {
        return "no ranges configured".to_string();
    }
    ranges
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The index of the first range in which `address` is usable. When no range may hand it out,
/// the error says why: outside every range, or e.g. "it is the gateway" of the range holding it.
pub fn find_range(ranges: &[IpRange], address: IpAddr) -> Result<usize, RequestError> {
    if let Some(i) = ranges.iter().position(|r| r.contains(address)) {
        return Ok(i);
    }
    for r in ranges {
        if r.subnet_contains(address)
            && let Some(reason) = r.unusable_reason(address)
        {
            return Err(RequestError::NotUsable {
                address,
                range: r.to_string(),
                reason,
            });
        }
    }
    Err(RequestError::NotInAnyRange {
        address,
        ranges: describe_ranges(ranges),
    })
}

/// Parse `text` and find its range: `(range index, parsed request)`.
pub fn locate(ranges: &[IpRange], text: &str) -> Result<(usize, RequestedIp), RequestError> {
    let req = RequestedIp::parse(text)?;
    Ok((req.find_range(ranges)?, req))
}
