//! `tether_nad_overlaps{kind}`: the leading controller's count of overlap findings among the
//! cluster's NADs ([`crate::overlap`]), by kind; absent on agents and standby replicas.

use std::collections::BTreeMap;

use super::{Registry, State, labels};
use crate::overlap::{Finding, Kind};

impl Registry {
    /// The findings of the last check (`None`: this process does not check: no samples).
    pub fn set_nad_overlaps(&self, findings: Option<&[Finding]>) {
        self.state().nad_overlaps = findings.map(|found| {
            let mut counts: BTreeMap<&'static str, u64> =
                Kind::ALL.iter().map(|k| (k.label(), 0)).collect();
            for f in found {
                *counts.entry(f.kind.label()).or_insert(0) += 1;
            }
            counts
        });
    }
}

/// The samples of the family: one per kind, when checked.
pub(super) fn samples(s: &State) -> Vec<(String, f64)> {
    s.nad_overlaps
        .iter()
        .flatten()
        .map(|(kind, n)| (labels(&[("kind", kind)]), *n as f64))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tether_pool::PoolConfig;

    use super::*;
    use crate::nads::NadNetwork;
    use crate::overlap::findings;

    #[test]
    fn counts_by_kind_only_where_checked() {
        let r = Registry::default();
        assert!(
            !r.render().contains("tether_nad_overlaps{"),
            "not checked, no samples"
        );
        let net = |nad: &str, fabric: Option<&str>| NadNetwork {
            nad: nad.into(),
            master: None,
            attacher: None,
            cfg: PoolConfig::from_value(
                &json!({"name": nad, "ipam": {"range": "10.30.0.0/24", "isolated_fabric": fabric}}),
                &tether_pool::NodeAgent::on_every_node(),
            )
            .unwrap(),
        };
        let found = findings(&[net("a/x", None), net("b/y", Some("rail"))]);
        r.set_nad_overlaps(Some(&found));
        let t = r.render();
        assert!(
            t.contains("# TYPE tether_nad_overlaps gauge\n")
                && t.contains("tether_nad_overlaps{kind=\"domains_on_one_master\"} 1\n")
                && t.contains("tether_nad_overlaps{kind=\"inconsistent_subnet\"} 0\n"),
            "{t}"
        );
        r.set_nad_overlaps(None);
        assert!(!r.render().contains("tether_nad_overlaps{"));
    }
}
