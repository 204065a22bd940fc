//! tether-ipam's warnings reach tether-ipvlan's log at warn level (issue 13, part 6): a rogue on the
//! segment holds the first pool candidate, tether-ipvlan ADD delegates to tether-ipam, which
//! quarantines the address and warns on its stderr; tether-ipvlan logs that warning again as its
//! own WARN line (before, it logged the delegate's stderr at debug only, dropped at the default
//! `log_level`).
//!
//! Run with `conformance/lab/run-tests.sh lab_warnings`. Ignored by a plain `cargo test`; when run,
//! every test FAILS (never skips) if ipvlan is unavailable.

use serde_json::json;
use tether_conformance::segment::{hold, result_ips};
use tether_conformance::{
    LeaseState, NetNs, PluginExec, Segment, TempDir, first_candidates, lab, tether_bin_dir,
    tether_binary,
};

const NET: &str = "labwarn";

/// tether-ipvlan's stderr lines at `level` (`<time> tether-ipvlan[<pid>] <LEVEL> <message>`).
fn ipvlan_lines<'a>(stderr: &'a str, level: &str) -> Vec<&'a str> {
    stderr
        .lines()
        .filter(|l| {
            let mut w = l.split_whitespace().skip(1);
            w.next().is_some_and(|p| p.starts_with("tether-ipvlan[")) && w.next() == Some(level)
        })
        .collect()
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_warnings"]
fn a_conflict_warning_of_tether_ipam_is_a_warning_of_tether_ipvlan() {
    lab::require_ipvlan();
    let seg = Segment::new("lw");
    let pod = NetNs::new("lw-pod");
    let data = TempDir::new("labwarn");
    let ipam = json!({"type": "tether-ipam", "range": "10.1.2.10-10.1.2.50/24", "dataDir": data.path(),
                      "cooldown_s": 0, "probe": {"timeout_ms": 200, "attempts": 1}});
    let cid = "warn-1";
    let held = first_candidates(&ipam, cid, "net1")[0];
    hold(&seg.rogue, "r0", held);
    // No log_file: both plugins log to stderr, and the delegate's stderr is tether-ipvlan's to pass on.
    let conf = json!({"cniVersion": "1.1.0", "name": NET, "type": "tether-ipvlan", "master": seg.master, "mode": "l2", "ipam": ipam});
    let ipvlan = PluginExec::new(tether_binary("tether-ipvlan"))
        .run_in(&seg.node)
        .var("CNI_CONTAINERID", cid)
        .var("CNI_IFNAME", "net1")
        .var("CNI_NETNS", pod.path().to_str().unwrap())
        .var("CNI_PATH", tether_bin_dir().to_str().unwrap())
        .var(
            "CNI_ARGS",
            "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u-1",
        );
    let out = ipvlan.call_json("ADD", &conf);
    out.assert_success();
    assert_ne!(result_ips(&out)[0], held, "{out}");

    let rogue = seg.rogue_mac();
    let warns = ipvlan_lines(&out.stderr, "WARN");
    let conflict = warns.iter().find(|l| {
        l.contains(&format!(
            "{held} answered the conflict probe from MAC {rogue}"
        ))
    });
    let conflict = conflict
        .unwrap_or_else(|| panic!("no WARN line of tether-ipvlan names {held} and {rogue}: {out}"));
    assert!(
        conflict.contains(&format!("tether-ipam ADD: network {NET}: ")),
        "{conflict}"
    );
    assert!(
        !out.stderr.contains(" DEBUG "),
        "debug records at the default log_level: {out}"
    );

    // log_level error: the same conflict for another pod, and tether-ipvlan's own level filters it.
    let mut quiet = conf.clone();
    quiet["log_level"] = json!("error");
    ipvlan.call_json("DEL", &quiet).assert_success();
    let cid2 = (2..)
        .map(|n| format!("warn-{n}"))
        .find(|c| first_candidates(&ipam, c, "net1")[0] != held)
        .unwrap();
    hold(&seg.rogue, "r0", first_candidates(&ipam, &cid2, "net1")[0]);
    let pod2 = NetNs::new("lw-pod2");
    // Another pod: the first one's released address would be its sticky choice.
    let ipvlan2 = ipvlan
        .var("CNI_CONTAINERID", &cid2)
        .var("CNI_NETNS", pod2.path().to_str().unwrap())
        .var(
            "CNI_ARGS",
            "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p2;K8S_POD_UID=u-2",
        );
    let out = ipvlan2.call_json("ADD", &quiet);
    out.assert_success();
    assert_eq!(
        LeaseState::new(data.path(), NET).quarantined().len(),
        2,
        "the second ADD met a conflict too"
    );
    assert!(ipvlan_lines(&out.stderr, "WARN").is_empty(), "{out}");
    ipvlan2.call_json("DEL", &quiet).assert_success();
}
