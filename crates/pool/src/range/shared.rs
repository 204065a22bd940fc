//! What two ranges both hand out, without walking their addresses: each range's usable addresses
//! as spans (its bounds minus its holes), and the intersection of two such span lists.

use std::net::IpAddr;

use super::{IpRange, u128_to_ip};

/// The addresses two ranges may both hand out (see [`IpRange::shared_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedAddresses {
    /// The lowest.
    pub first: IpAddr,
    /// The highest (there may be unshared ones between `first` and `last`).
    pub last: IpAddr,
    /// How many (saturating; an IPv6 range can be astronomically large).
    pub count: u128,
}

impl IpRange {
    /// The usable addresses as ascending, disjoint, inclusive spans of integer values
    /// ([`super::ip_to_u128`]): the bounds minus the holes (exclusions, the gateway).
    /// O(number of holes).
    pub fn usable_spans(&self) -> Vec<(u128, u128)> {
        let mut out = Vec::with_capacity(self.holes.len() + 1);
        if self.usable == 0 {
            return out;
        }
        let mut lo = self.first;
        for &(hole_lo, hole_hi) in &self.holes {
            if hole_lo > lo {
                out.push((lo, hole_lo - 1));
            }
            match hole_hi.checked_add(1) {
                Some(next) => lo = next,
                None => return out, // the hole reaches the last value there is
            }
        }
        if lo <= self.last {
            out.push((lo, self.last));
        }
        out
    }

    /// The addresses both `self` and `other` may hand out, or `None` when they share none (other
    /// families, disjoint bounds, or only addresses one of them excludes). O(holes of both).
    pub fn shared_with(&self, other: &IpRange) -> Option<SharedAddresses> {
        if self.family() != other.family() {
            return None;
        }
        let (a, b) = (self.usable_spans(), other.usable_spans());
        let (mut i, mut j) = (0, 0);
        let mut found: Option<(u128, u128, u128)> = None;
        while i < a.len() && j < b.len() {
            let lo = a[i].0.max(b[j].0);
            let hi = a[i].1.min(b[j].1);
            if lo <= hi {
                let n = (hi - lo).saturating_add(1);
                found = Some(match found {
                    None => (lo, hi, n),
                    Some((first, _, count)) => (first, hi, count.saturating_add(n)),
                });
            }
            // The span that ends first cannot meet anything further in the other list.
            if a[i].1 < b[j].1 {
                i += 1;
            } else {
                j += 1;
            }
        }
        found.map(|(first, last, count)| SharedAddresses {
            first: u128_to_ip(self.family(), first),
            last: u128_to_ip(self.family(), last),
            count,
        })
    }
}
