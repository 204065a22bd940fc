//! Issue 22, part 3: a pod re-created with the same namespace/name and interface (a StatefulSet
//! replica) gets its previous address back whenever nobody else holds it, on any node, however
//! full the pool: the cluster store finds the pod's record through an index by pod identity (the
//! `ipam.tether.dev/pod` label, one LIST the API server answers from its watch cache), not by
//! meeting it on the walk. On the real API server, with node-bound credentials.

mod reconcile_support;

use std::time::Duration;

use reconcile_support::*;
use serde_json::{Value, json};

fn call(node: &Node, verb: &str, pod: &str, sandbox: &str, conf: &Value) -> (i32, Value) {
    call_on_node(node, verb, pod, &format!("{pod}-{sandbox}"), conf)
}

#[track_caller]
fn add(node: &Node, pod: &str, sandbox: &str, conf: &Value) -> String {
    let (code, r) = call(node, "ADD", pod, sandbox, conf);
    assert_eq!(code, 0, "ADD {pod}: {r}");
    first_address(&r)
}

#[track_caller]
fn del(node: &Node, pod: &str, sandbox: &str, conf: &Value) {
    let (code, r) = call(node, "DEL", pod, sandbox, conf);
    assert_eq!(code, 0, "DEL {pod}: {r}");
}

#[test]
#[ignore = "needs a real API server: make test starts one (conformance/kube/up.sh)"]
fn statefulset_pods_keep_their_address_across_nodes_in_a_pool_that_is_90_percent_leased() {
    let env = Env::real("sticky");
    let (a, b) = (node(&env, "a"), node(&env, "b"));
    let net = env.name("mgmt");
    // 50 addresses; a 2 s cooldown (whole seconds: 1 to 2 s in effect), so that addresses other pods released become free again
    // within the test and stand in the re-created pods' walks, as in a busy pool.
    let conf = json!({"cniVersion": "1.1.0", "name": net, "type": "tether-ipvlan",
                      "ipam": {"type": "tether-ipam", "range": "10.143.0.1-10.143.0.50/24",
                               "probe": false, "cooldown_s": 2}});

    // 25 other pods on node B, then 20 trainers on node A: 45 of 50 leased.
    for i in 0..25 {
        add(&b, &format!("other-{i}"), "0", &conf);
    }
    let trainers: Vec<String> = (0..20)
        .map(|i| add(&a, &format!("trainer-{i}"), "0", &conf))
        .collect();
    // The pool turns over: 20 other pods go, their addresses cool down and are free again, 20
    // new pods arrive. Still 45 of 50 leased, and the free addresses anywhere on the walks.
    for i in 0..20 {
        del(&b, &format!("other-{i}"), "0", &conf);
    }
    std::thread::sleep(Duration::from_millis(2100));
    for i in 0..20 {
        add(&b, &format!("new-{i}"), "0", &conf);
    }

    // Each trainer is deleted on node A and re-created on node B (a new sandbox and uid). A pod
    // that arrives in between gets another address (the trainer's is cooling down), the trainer
    // its own.
    let mut kept = 0;
    for (i, old) in trainers.iter().enumerate() {
        let pod = format!("trainer-{i}");
        del(&a, &pod, "0", &conf);
        let newcomer = add(&b, "newcomer", &i.to_string(), &conf);
        assert_ne!(
            &newcomer, old,
            "another pod got {pod}'s address inside its cooldown"
        );
        // Gone again, its address released; the next newcomer (same name) takes it back.
        del(&b, "newcomer", &i.to_string(), &conf);
        let now = add(&b, &pod, "1", &conf);
        if &now == old {
            kept += 1;
        } else {
            eprintln!("{pod}: had {old}, got {now}");
        }
    }
    assert_eq!(
        kept, 20,
        "StatefulSet pods re-created on another node keep their address"
    );
}
