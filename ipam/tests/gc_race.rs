//! Checklist 58: GC running while ADD and DEL run for other containers. The spec forbids that
//! overlap, so which leases GC releases may be arbitrary; what must hold is that the store is never
//! left corrupted: it opens cleanly, holds no address twice, and everything can be released.

mod common;

use std::collections::BTreeSet;

use common::{Att, Net};
use serde_json::json;

#[test]
fn item58_gc_during_add_and_del_never_corrupts_the_store() {
    let net = Net::new(json!({"range": "10.58.0.0/24", "cooldown_s": 0}));
    let keep = Att::new("keeper");
    net.add(&keep).expect_ok();
    let gc_conf = net.conf_with(
        json!({"cni.dev/valid-attachments": [{"containerID": "keeper", "ifname": "net1"}]}),
    );
    for round in 0..4 {
        let atts: Vec<Att> = (0..24)
            .map(|i| Att::new(&format!("r{round}-c{i}")))
            .collect();
        let mut children: Vec<_> = atts.iter().map(|a| net.spawn("ADD", a)).collect();
        // GCs interleaved with the ADDs, then with the DELs of half of them.
        for _ in 0..3 {
            let mut gc = net.command("GC", None);
            gc.stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            let mut g = gc.spawn().unwrap();
            std::io::Write::write_all(&mut g.stdin.take().unwrap(), gc_conf.to_string().as_bytes())
                .unwrap();
            children.push(g);
        }
        children.extend(atts.iter().step_by(2).map(|a| net.spawn("DEL", a)));
        for c in children {
            let _ = c.wait_with_output().unwrap();
        }
        // The store opens and answers after every round; no address is leased twice (leased()
        // itself panics on a duplicate).
        net.status();
        let leased = net.leased();
        let unique: BTreeSet<_> = leased.keys().collect();
        assert_eq!(unique.len(), leased.len());
        assert!(
            leased.values().any(|(c, _)| c == "keeper"),
            "a listed attachment was released by GC"
        );
    }
    // Everything can still be released and the whole range allocated again.
    let gc_all = net.conf_with(json!({"cni.dev/valid-attachments": []}));
    net.call_conf("GC", None, &gc_all).expect_ok();
    assert!(net.leased().is_empty());
    for i in 0..8 {
        net.add(&Att::new(&format!("after-{i}"))).expect_ok();
    }
}
