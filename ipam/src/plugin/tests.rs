//! The plugin's own logic without root: the codes of probe faults, and what an ADD hands the
//! dispatcher from the engine's probe step.

use std::cell::RefCell;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::json;
use tether_leases::{AllocError, Candidate, ProbeError, ProbeOutcome, Probed};
use tether_pool::NodeAgent;

use super::*;

/// Answers from a list of addresses in use; keeps each call's addresses.
struct Wire {
    in_use: Vec<IpAddr>,
    steps: RefCell<Vec<Vec<IpAddr>>>,
}

impl Prober for Wire {
    fn probe(&self, candidates: &[Candidate<'_>]) -> Result<Probed, ProbeError> {
        let addresses: Vec<IpAddr> = candidates.iter().map(|c| c.address).collect();
        let outcomes = addresses
            .iter()
            .map(|a| match self.in_use.contains(a) {
                true => ProbeOutcome::InUse {
                    mac: "02:00:00:00:00:01".into(),
                },
                false => ProbeOutcome::Free,
            })
            .collect();
        self.steps.borrow_mut().push(addresses);
        Ok(Probed {
            outcomes,
            release_later: Some(Box::new("socket")),
        })
    }
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("tether-ipam-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A dual-stack network on a file store in `dir`.
fn context(dir: &Path) -> Context {
    let conf = json!({
        "cniVersion": "1.1.0", "name": "net", "type": "tether-ipvlan", "master": "eth9",
        "ipam": {"type": "tether-ipam", "dataDir": dir.join("state"), "range": "10.9.0.0/28",
                 "ipRanges": [{"range": "fd00:9::/124"}]}
    });
    let cfg = PoolConfig::from_top(conf.as_object().unwrap(), &NodeAgent::Absent).unwrap();
    let store = Store::File(FileStore::new(cfg.data_dir.clone()));
    Context { cfg, store }
}

fn request(cid: &str) -> AddRequest {
    AddRequest {
        container_id: cid.into(),
        ifname: "net1".into(),
        ..AddRequest::default()
    }
}

fn addresses(a: &Added) -> Vec<IpAddr> {
    a.result.ips.iter().map(|ip| ip.address.addr()).collect()
}

#[test]
fn a_probed_add_notes_what_the_step_proved_and_keeps_its_sockets() {
    // Where this attachment's walks start, from a store of its own.
    let (v4, v6) = {
        let dir = Scratch::new("first");
        let plain = context(&dir.0)
            .allocate(&request("c0"), &NoProbe, false)
            .unwrap();
        (addresses(&plain)[0], addresses(&plain)[1])
    };
    let dir = Scratch::new("probed");
    let ctx = context(&dir.0);
    // The IPv4 address is somebody else's on the wire: that range starts over.
    let wire = Wire {
        in_use: vec![v4],
        steps: RefCell::default(),
    };
    let added = ctx.allocate(&request("c0"), &wire, true).unwrap();
    let got = addresses(&added);
    assert_ne!(got[0], v4);
    assert_eq!(got[1], v6);
    assert_eq!(*wire.steps.borrow(), vec![vec![v4, v6], vec![got[0]]]);
    assert_eq!(added.probed, got, "both final addresses were proved unused");
    let kept = added.linger.expect("the sockets, for after the reply");
    let kept = kept.downcast_ref::<Vec<Box<dyn std::any::Any>>>().unwrap();
    assert_eq!(kept.len(), 2, "one per step");
}

#[test]
fn without_the_wire_nothing_is_noted_as_probed() {
    let dir = Scratch::new("unprobed");
    let ctx = context(&dir.0);
    let added = ctx.allocate(&request("c1"), &NoProbe, false).unwrap();
    assert_eq!(added.result.ips.len(), 2);
    assert!(added.probed.is_empty(), "{:?}", added.probed);
}

#[test]
fn probe_faults_get_the_attachers_codes() {
    let probe = |source| {
        to_cni(AllocError::Probe {
            addresses: vec!["10.9.0.1".parse().unwrap()],
            source,
        })
    };
    let down = probe(ProbeError::LinkDown {
        name: "eth9".into(),
        place: "on the host".into(),
    });
    assert_eq!(down.code, code::TRY_AGAIN_LATER, "{}", down.msg);
    let missing = probe(ProbeError::LinkMissing {
        name: "eth9".into(),
        place: "on the host".into(),
    });
    assert_eq!(missing.code, code::INVALID_CONFIG, "{}", missing.msg);
    let socket = probe(ProbeError::Failed("no packet socket".into()));
    assert_eq!(socket.code, code::IO, "{}", socket.msg);
}
