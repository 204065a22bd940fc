//! Which leases `tether leases` shows: `--network`, `--node`, `--pod`, `--state` and `-l`. The
//! cluster store is asked for `-l` by the API server; file-store leases are matched here against the
//! labels their objects would carry, with the equality subset of kubectl's selector syntax.

use clap::Args;
use tether_kube_store::lease_labels;
use tether_leases::Lease;

use super::lease_view::state_name;

#[derive(Args, Debug, Clone, Default)]
pub struct LeaseFilter {
    /// Only this network (the ipam `network_name`, default the network's `name`).
    #[arg(long)]
    pub network: Option<String>,
    /// Only leases of pods on this node.
    #[arg(long)]
    pub node: Option<String>,
    /// Only this pod's leases: `NAMESPACE/NAME`, or `NAME` in any namespace.
    #[arg(long)]
    pub pod: Option<String>,
    /// Only leases in this state: Leased, Released or Quarantined (any case).
    #[arg(long)]
    pub state: Option<String>,
    /// Label selector, as kubectl's `-l` (`ipam.tether.dev/node=n1,ipam.tether.dev/network!=x`).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
}

/// One term of an equality-based selector.
#[derive(Debug, PartialEq, Eq)]
enum Term {
    Is(String, String),
    IsNot(String, String),
    Has(String),
    HasNot(String),
}

impl LeaseFilter {
    /// A usage error before anything is read: an unknown state.
    pub fn check(&self) -> Result<(), String> {
        if let Some(s) = &self.state
            && !["leased", "released", "quarantined"].contains(&s.to_ascii_lowercase().as_str())
        {
            return Err(format!(
                "--state {s:?}: the states are Leased, Released and Quarantined"
            ));
        }
        Ok(())
    }

    /// Does `l` pass every filter but `-l`?
    pub fn keeps(&self, l: &Lease) -> bool {
        let pod_ok = match self.pod.as_deref().map(|p| p.split_once('/')) {
            None => true,
            Some(Some((ns, name))) => {
                l.pod.namespace.as_deref() == Some(ns) && l.pod.name.as_deref() == Some(name)
            }
            Some(None) => l.pod.name.as_deref() == self.pod.as_deref(),
        };
        self.network.as_ref().is_none_or(|n| &l.network == n)
            && self
                .node
                .as_ref()
                .is_none_or(|n| l.node.as_ref() == Some(n))
            && self
                .state
                .as_ref()
                .is_none_or(|s| s.eq_ignore_ascii_case(state_name(&l.state)))
            && pod_ok
    }
}

/// The leases of `all` whose labels match `selector` (the file store's; the cluster store's are
/// matched by the API server).
pub fn matching_labels(all: Vec<Lease>, selector: &str) -> Result<Vec<Lease>, String> {
    let terms = parse(selector)?;
    Ok(all
        .into_iter()
        .filter(|l| {
            let labels = lease_labels(l);
            terms.iter().all(|t| match t {
                Term::Is(k, v) => labels.get(k) == Some(v),
                Term::IsNot(k, v) => labels.get(k) != Some(v),
                Term::Has(k) => labels.contains_key(k),
                Term::HasNot(k) => !labels.contains_key(k),
            })
        })
        .collect())
}

fn parse(selector: &str) -> Result<Vec<Term>, String> {
    let mut out = Vec::new();
    for raw in selector.split(',') {
        let t = raw.trim();
        let bad = || {
            format!(
                "-l {selector:?}: {t:?} is not a selector term this store can match (key=value, key!=value, key, !key; \
                 set-based terms work against the cluster store)"
            )
        };
        let term = if let Some((k, v)) = t.split_once("!=") {
            Term::IsNot(k.trim().into(), v.trim().into())
        } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
            Term::Is(k.trim().into(), v.trim().into())
        } else if let Some(k) = t.strip_prefix('!') {
            Term::HasNot(k.trim().into())
        } else {
            Term::Has(t.into())
        };
        let key = match &term {
            Term::Is(k, _) | Term::IsNot(k, _) | Term::Has(k) | Term::HasNot(k) => k,
        };
        if key.is_empty() || key.contains(char::is_whitespace) || key.contains(['(', ')']) {
            return Err(bad());
        }
        out.push(term);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_leases::{LeaseState, PodRef};

    fn lease(network: &str, node: &str, pod: (&str, &str), state: LeaseState) -> Lease {
        Lease {
            network: network.into(),
            domain: None,
            address: "10.0.0.5".parse().unwrap(),
            prefix_len: 24,
            range_index: None,
            container_id: "c".into(),
            ifname: "net1".into(),
            pod: PodRef {
                namespace: Some(pod.0.into()),
                name: Some(pod.1.into()),
                uid: None,
            },
            node: Some(node.into()),
            state,
            since: 0,
            version: None,
        }
    }

    #[test]
    fn filters_combine() {
        let a = lease("mgmt", "n1", ("ml", "t-0"), LeaseState::Leased);
        let b = lease("mgmt", "n2", ("ml", "t-1"), LeaseState::Released { at: 1 });
        let f = LeaseFilter {
            node: Some("n1".into()),
            ..LeaseFilter::default()
        };
        assert!(f.keeps(&a) && !f.keeps(&b));
        let f = LeaseFilter {
            state: Some("released".into()),
            ..LeaseFilter::default()
        };
        assert!(!f.keeps(&a) && f.keeps(&b));
        let f = LeaseFilter {
            pod: Some("ml/t-1".into()),
            ..LeaseFilter::default()
        };
        assert!(!f.keeps(&a) && f.keeps(&b));
        let f = LeaseFilter {
            pod: Some("t-0".into()),
            network: Some("mgmt".into()),
            ..LeaseFilter::default()
        };
        assert!(f.keeps(&a) && !f.keeps(&b));
        assert!(
            LeaseFilter {
                state: Some("held".into()),
                ..LeaseFilter::default()
            }
            .check()
            .is_err()
        );
    }

    #[test]
    fn selectors_match_the_objects_labels() {
        let a = lease("mgmt", "n1", ("ml", "t-0"), LeaseState::Leased);
        let b = lease("compute", "n2", ("ml", "t-1"), LeaseState::Leased);
        let names = |sel: &str| -> Vec<String> {
            matching_labels(vec![a.clone(), b.clone()], sel)
                .unwrap()
                .iter()
                .map(|l| l.network.clone())
                .collect()
        };
        assert_eq!(names("ipam.tether.dev/node=n1"), ["mgmt"]);
        assert_eq!(names("ipam.tether.dev/node==n2"), ["compute"]);
        assert_eq!(names("ipam.tether.dev/network!=mgmt"), ["compute"]);
        assert_eq!(names("ipam.tether.dev/pod=ml.t-1"), ["compute"]);
        assert_eq!(names("ipam.tether.dev/pod"), ["mgmt", "compute"]);
        assert!(names("!ipam.tether.dev/pod").is_empty());
        assert!(names("ipam.tether.dev/node=n1,ipam.tether.dev/network=compute").is_empty());
        let e = matching_labels(vec![a], "tier in (x,y)").unwrap_err();
        assert!(e.contains("set-based terms"), "{e}");
    }
}
