//! `tether doctor` on a real segment of this kernel: a rogue host answering ARP for a pool
//! address is reported with its MAC, and a missing master is reported with what to do (issue 7).
//! The plugins it checks are the ones built beside it, which answer as its build.

use std::net::IpAddr;

use serde_json::json;
use tether_conformance::{Segment, TempDir, tether_bin_dir, tether_binary};

fn doctor(seg: &Segment, conf: &serde_json::Value, dir: &TempDir) -> tether_conformance::CmdOutput {
    let path = dir.join("nad.json");
    std::fs::write(&path, conf.to_string()).unwrap();
    let mut c = seg.node.command(tether_binary("tether").to_str().unwrap());
    c.args([
        "doctor",
        "--config",
        path.to_str().unwrap(),
        "--max-probes",
        "16",
        "--cni-bin-dir",
        tether_bin_dir().to_str().unwrap(),
    ]);
    tether_conformance::capture(&mut c)
}

#[test]
fn doctor_reports_a_rogue_answering_for_a_pool_address_and_a_missing_master() {
    let seg = Segment::new("doctor");
    let dir = TempDir::new("doctor");
    let rogue_addr: IpAddr = "10.1.2.5".parse().unwrap();
    seg.rogue_holds(rogue_addr);
    let conf = json!({"cniVersion": "1.1.0", "name": "mgmt", "type": "tether-ipvlan", "master": seg.master,
                      "ipam": {"type": "tether-ipam", "range": "10.1.2.2-10.1.2.9/24", "dataDir": dir.join("leases")}});
    let out = doctor(&seg, &conf, &dir);
    assert_eq!(out.code(), Some(1), "a conflict is a problem: {out}");
    let fail: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("FAIL"))
        .collect();
    assert_eq!(fail.len(), 1, "{out}");
    assert!(
        fail[0].contains("conflicts")
            && fail[0].contains("10.1.2.5")
            && fail[0].contains(&seg.rogue_mac()),
        "{out}"
    );
    for check in ["plugins", "config", "master", "store", "pool"] {
        assert!(
            out.stdout
                .lines()
                .any(|l| l.starts_with("OK") && l.contains(check)),
            "{check} not OK: {out}"
        );
    }

    // The rogue leaves: all clean.
    seg.rogue_drops(rogue_addr);
    let out = doctor(&seg, &conf, &dir);
    assert_eq!(out.code(), Some(0), "{out}");

    // A master this node lacks: FAIL naming it and what to do.
    let mut bad = conf.clone();
    bad["master"] = json!("enp99s0");
    let out = doctor(&seg, &bad, &dir);
    assert_eq!(out.code(), Some(1), "{out}");
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("FAIL") && l.contains("master"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        line.contains("enp99s0") && line.contains("ip -br link"),
        "{line}"
    );
}
