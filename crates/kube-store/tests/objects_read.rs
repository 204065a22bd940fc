//! `tether_api_objects_read_total` (ApiTraffic::objects_read) on a real API server: a LIST
//! counts the items it returned, a watch the events it carried, by resource, in the traffic value
//! of the client that read them and no other.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tether_cluster::{Cluster, PodEvent};
use tether_kube_store::{ApiTraffic, KubeStore, WatchEnd};
use tether_leases::LeaseStore;

fn read_by(traffic: &ApiTraffic, resource: &str) -> u64 {
    traffic
        .objects_read()
        .into_iter()
        .find(|(r, _)| r == resource)
        .map_or(0, |(_, n)| n)
}

/// POST/DELETE pods with the admin's kubeconfig (the store only reads pods).
struct Pods {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    ns: String,
}

impl Pods {
    fn new(env: &Env, ns: &str) -> Pods {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(&env.kubeconfig).unwrap();
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap();
            kube::Client::try_from(cfg).unwrap()
        });
        let p = Pods {
            rt,
            client,
            ns: ns.to_string(),
        };
        let _ = p.send(
            "POST",
            "/api/v1/namespaces",
            Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})),
        );
        p
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<String, kube::Error> {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("Content-Type", "application/json")
            .body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default())
            .unwrap();
        self.rt.block_on(self.client.request_text(req))
    }

    fn create(&self, name: &str, node: &str) {
        self.send(
            "POST",
            &format!("/api/v1/namespaces/{}/pods", self.ns),
            Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.invalid/none"}]}})),
        )
        .unwrap_or_else(|e| panic!("create pod {name}: {e}"));
    }

    fn delete(&self, name: &str) {
        self.send(
            "DELETE",
            &format!("/api/v1/namespaces/{}/pods/{name}", self.ns),
            Some(json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})),
        )
        .unwrap_or_else(|e| panic!("delete pod {name}: {e}"));
    }
}

#[test]
#[ignore = "needs a real API server: make test starts one (../shared/peers)"]
fn lists_count_their_items_and_watches_their_events() {
    let env = Env::new("objects");
    let node = env.network.clone();
    let pods = Pods::new(&env, &env.network);
    for i in 0..3 {
        pods.create(&format!("p{i}"), &node);
    }
    let store: KubeStore = env.store();
    let cluster = Cluster::new(store.api().clone());
    let read = |resource: &str| read_by(&store.settings().traffic, resource);

    // A LIST of this node's pods: its items.
    let before = read("pods");
    let mut listed = 0;
    let rv = cluster
        .visit_pods(Some(&format!("spec.nodeName={node}")), |_| listed += 1)
        .unwrap();
    assert_eq!(listed, 3);
    assert_eq!(read("pods") - before, 3);

    // A LIST of leases: its items, under their own resource.
    let node_store = env.node_store(&node);
    for a in ["10.0.0.1", "10.0.0.2"] {
        let mut l = lease(&env.network, a, &format!("c-{a}"));
        l.node = Some(node.clone());
        node_store.claim(l, None).unwrap().unwrap();
    }
    let before = read("ipleases");
    store.restart_budget();
    assert_eq!(store.list_node(&node).unwrap().len(), 2);
    assert_eq!(read("ipleases") - before, 2);
    // The other client's CREATEs and GETs are its own: no LIST of pods in its counts.
    assert_eq!(read_by(&node_store.settings().traffic, "pods"), 0);

    // A watch: every event it carried, counted as the stream went by. A pod made and deleted
    // while it runs; stopped once the deletion is seen (within seconds of a 60 s watch: no
    // bookmark comes).
    let before = read("pods");
    let events = std::sync::Mutex::new(0u64);
    let gone = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(500));
            pods.create("p-watched", &node);
            pods.delete("p-watched");
        });
        let end = cluster
            .watch_pods(
                Some(&format!("spec.nodeName={node}")),
                &rv,
                Duration::from_secs(60),
                &|| !gone.load(std::sync::atomic::Ordering::Relaxed),
                |ev| {
                    *events.lock().unwrap() += 1;
                    if matches!(ev, PodEvent::Deleted(_)) {
                        gone.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                },
            )
            .unwrap();
        assert!(matches!(end, WatchEnd::Closed { .. }), "{end:?}");
    });
    let events = *events.lock().unwrap();
    assert!(events >= 2, "an ADDED and a DELETED at least: {events}");
    assert_eq!(read("pods") - before, events);
    for i in 0..3 {
        pods.delete(&format!("p{i}"));
    }
}
