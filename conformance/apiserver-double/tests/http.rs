//! The double over plain HTTP/1.1 (a raw client, so the wire format itself is checked).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{Value, json};
use tether_apiserver_double::{ApiServerDouble, Options};

struct Resp {
    code: u16,
    body: Value,
}

fn call(d: &ApiServerDouble, method: &str, path: &str, body: Option<&Value>) -> Resp {
    let mut s = TcpStream::connect(d.addr()).unwrap();
    let b = body.map(|v| v.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
        b.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
    let code = head[9..12].parse().unwrap();
    let text = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Resp {
        code,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").unwrap();
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}

const LEASES: &str = "/apis/ipam.tether.dev/v1alpha1/ipleases";

fn lease(name: &str, net: &str) -> Value {
    json!({
        "apiVersion": "ipam.tether.dev/v1alpha1", "kind": "IPLease",
        "metadata": {"name": name, "labels": {"ipam.tether.dev/network": net}},
        "spec": {"network": net, "address": "10.0.0.1", "prefixLength": 24, "containerID": "c",
                 "ifname": "net1", "state": "Leased", "since": "2024-01-01T00:00:00Z"}
    })
}

#[test]
fn lease_lifecycle_and_status_bodies() {
    let d = ApiServerDouble::start().unwrap();
    let created = call(&d, "POST", LEASES, Some(&lease("n.a", "n")));
    assert_eq!(created.code, 201);
    let uid = created.body["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let rv1 = created.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    let dup = call(&d, "POST", LEASES, Some(&lease("n.a", "n")));
    assert_eq!(
        (dup.code, dup.body["reason"].as_str()),
        (409, Some("AlreadyExists"))
    );
    assert_eq!(dup.body["kind"], "Status");
    assert_eq!(dup.body["details"]["name"], "n.a");

    // Update with the right version, then with the stale one.
    let mut upd = created.body.clone();
    upd["spec"]["containerID"] = json!("c2");
    let ok = call(&d, "PUT", &format!("{LEASES}/n.a"), Some(&upd));
    assert_eq!(ok.code, 200);
    let rv2 = ok.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(rv2.parse::<u64>().unwrap() > rv1.parse::<u64>().unwrap());
    assert_eq!(ok.body["metadata"]["uid"], uid.as_str());
    let stale = call(&d, "PUT", &format!("{LEASES}/n.a"), Some(&upd));
    assert_eq!(
        (stale.code, stale.body["reason"].as_str()),
        (409, Some("Conflict"))
    );
    // Immutable address.
    let mut moved = ok.body.clone();
    moved["spec"]["address"] = json!("10.0.0.2");
    let inv = call(&d, "PUT", &format!("{LEASES}/n.a"), Some(&moved));
    assert_eq!(
        (inv.code, inv.body["reason"].as_str()),
        (422, Some("Invalid"))
    );
    // Setting resourceVersion on create is a server error, as on a real server.
    let mut with_rv = lease("n.b", "n");
    with_rv["metadata"]["resourceVersion"] = json!("5");
    assert_eq!(call(&d, "POST", LEASES, Some(&with_rv)).code, 500);

    // Delete preconditions.
    let bad = call(
        &d,
        "DELETE",
        &format!("{LEASES}/n.a"),
        Some(&json!({"preconditions": {"resourceVersion": rv1}})),
    );
    assert_eq!(
        (bad.code, bad.body["reason"].as_str()),
        (409, Some("Conflict"))
    );
    assert!(
        bad.body["message"]
            .as_str()
            .unwrap()
            .contains("Precondition failed")
    );
    let bad_uid = call(
        &d,
        "DELETE",
        &format!("{LEASES}/n.a"),
        Some(&json!({"preconditions": {"uid": "other"}})),
    );
    assert_eq!(bad_uid.code, 409);
    let del = call(
        &d,
        "DELETE",
        &format!("{LEASES}/n.a"),
        Some(&json!({"preconditions": {"uid": uid, "resourceVersion": rv2}})),
    );
    assert_eq!(del.code, 200);
    let gone = call(&d, "GET", &format!("{LEASES}/n.a"), None);
    assert_eq!(
        (gone.code, gone.body["reason"].as_str()),
        (404, Some("NotFound"))
    );
    assert_eq!(gone.body["details"]["name"], "n.a");

    let c = d.request_counts();
    assert_eq!(c["create ipleases"], 3);
    assert_eq!(c["update ipleases"], 3);
    assert_eq!(c["delete ipleases"], 3);
    assert_eq!(c["get ipleases"], 1);
}

#[test]
fn list_selectors_and_pagination() {
    let d = ApiServerDouble::start().unwrap();
    for i in 0..7 {
        let net = if i % 2 == 0 { "even" } else { "odd" };
        assert_eq!(
            call(&d, "POST", LEASES, Some(&lease(&format!("{net}.{i}"), net))).code,
            201
        );
    }
    let sel = "labelSelector=ipam.tether.dev%2Fnetwork%3Deven";
    let all = call(&d, "GET", &format!("{LEASES}?{sel}"), None);
    assert_eq!(all.body["items"].as_array().unwrap().len(), 4);
    assert_eq!(all.body["kind"], "IPLeaseList");
    let ne = call(
        &d,
        "GET",
        &format!("{LEASES}?labelSelector=ipam.tether.dev%2Fnetwork%21%3Deven"),
        None,
    );
    assert_eq!(ne.body["items"].as_array().unwrap().len(), 3);

    let mut names = Vec::new();
    let mut cont = String::new();
    let mut pages = 0;
    loop {
        let q = if cont.is_empty() {
            format!("{sel}&limit=3")
        } else {
            format!("{sel}&limit=3&continue={cont}")
        };
        let page = call(&d, "GET", &format!("{LEASES}?{q}"), None);
        assert_eq!(page.code, 200);
        pages += 1;
        names.extend(
            page.body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["metadata"]["name"].as_str().unwrap().to_string()),
        );
        match page.body["metadata"]["continue"].as_str() {
            Some(c) => cont = c.to_string(),
            None => break,
        }
    }
    assert_eq!(pages, 2);
    assert_eq!(names, ["even.0", "even.2", "even.4", "even.6"]);
    // Too new a resourceVersion, and Exact on an old one.
    assert_eq!(
        call(&d, "GET", &format!("{LEASES}?resourceVersion=999"), None).code,
        504
    );
    assert_eq!(
        call(
            &d,
            "GET",
            &format!("{LEASES}?resourceVersion=1&resourceVersionMatch=Exact"),
            None
        )
        .code,
        410
    );
    assert_eq!(
        call(&d, "GET", &format!("{LEASES}?resourceVersion=0"), None).code,
        200
    );
    assert_eq!(
        call(
            &d,
            "GET",
            &format!("{LEASES}?labelSelector=a+in+%28b%29"),
            None
        )
        .code,
        400
    );
}

#[test]
fn forbidden_crd_missing_version_and_crd_object() {
    let d = ApiServerDouble::start_with(Options {
        crd_installed: false,
        ..Options::default()
    })
    .unwrap();
    let r = call(&d, "GET", LEASES, None);
    assert_eq!((r.code, r.body["reason"].as_str()), (404, Some("NotFound")));
    assert_eq!(
        r.body["message"],
        "the server could not find the requested resource"
    );
    let crd = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/ipleases.ipam.tether.dev";
    assert_eq!(call(&d, "GET", crd, None).code, 404);
    d.set_crd_installed(true);
    let c = call(&d, "GET", crd, None);
    assert_eq!(c.code, 200);
    assert!(
        c.body["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Established" && c["status"] == "True")
    );
    assert_eq!(call(&d, "GET", "/version", None).body["major"], "1");

    d.forbid("create", "ipleases");
    let f = call(&d, "POST", LEASES, Some(&lease("n.x", "n")));
    assert_eq!(
        (f.code, f.body["reason"].as_str()),
        (403, Some("Forbidden"))
    );
    assert!(
        f.body["message"]
            .as_str()
            .unwrap()
            .contains("cannot create resource \"ipleases\" in API group \"ipam.tether.dev\"")
    );
    assert_eq!(
        call(&d, "GET", LEASES, None).code,
        200,
        "only create is forbidden"
    );
    d.allow_all();
    assert_eq!(call(&d, "POST", LEASES, Some(&lease("n.x", "n"))).code, 201);
}

#[test]
fn latency_is_injected() {
    let d = ApiServerDouble::start_with(Options {
        latency: Duration::from_millis(50),
        ..Options::default()
    })
    .unwrap();
    let t = std::time::Instant::now();
    call(&d, "GET", "/version", None);
    assert!(t.elapsed() >= Duration::from_millis(50));
    d.set_latency(Duration::ZERO);
    let t = std::time::Instant::now();
    call(&d, "GET", "/_double/stats", None);
    assert!(t.elapsed() < Duration::from_millis(50));
}

fn pod(ns: &str, name: &str, node: &str) -> Value {
    json!({"metadata": {"namespace": ns, "name": name, "labels": {"app": "gpu"}},
           "spec": {"nodeName": node}, "status": {"phase": "Running"}})
}

#[test]
fn pods_get_list_field_selector() {
    let d = ApiServerDouble::start().unwrap();
    d.upsert_pod(pod("a", "p1", "node-1")).unwrap();
    d.upsert_pod(pod("a", "p2", "node-2")).unwrap();
    d.upsert_pod(pod("b", "p3", "node-1")).unwrap();
    let one = call(&d, "GET", "/api/v1/namespaces/a/pods/p1", None);
    assert_eq!(one.code, 200);
    assert_eq!(one.body["kind"], "Pod");
    assert_eq!(one.body["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert_eq!(
        call(&d, "GET", "/api/v1/namespaces/a/pods/nope", None).code,
        404
    );
    let on1 = call(
        &d,
        "GET",
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1",
        None,
    );
    let names: Vec<&str> = on1.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["p1", "p3"]);
    assert_eq!(on1.body["kind"], "PodList");
    let ns_a = call(&d, "GET", "/api/v1/namespaces/a/pods", None);
    assert_eq!(ns_a.body["items"].as_array().unwrap().len(), 2);
    assert_eq!(
        call(&d, "GET", "/api/v1/pods?fieldSelector=spec.bogus%3D1", None).code,
        400
    );
    assert_eq!(
        call(
            &d,
            "POST",
            "/api/v1/namespaces/a/pods",
            Some(&pod("a", "x", "n"))
        )
        .code,
        405
    );
    assert_eq!(d.count("list", "pods"), 3);
}

#[test]
fn pods_watch_streams_json_lines() {
    let d = ApiServerDouble::start().unwrap();
    d.upsert_pod(pod("a", "p1", "node-1")).unwrap();
    d.upsert_pod(pod("a", "p2", "node-2")).unwrap();
    let mut s = TcpStream::connect(d.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /api/v1/pods?watch=true&fieldSelector=spec.nodeName%3Dnode-1&timeoutSeconds=5 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut r = BufReader::new(s);
    let mut head = String::new();
    loop {
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        if l == "\r\n" {
            break;
        }
        head.push_str(&l);
    }
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    // Read events: each chunk is one JSON line.
    let mut next_event = || -> Value {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut buf = vec![0; n + 2];
            r.read_exact(&mut buf).unwrap();
            let text = String::from_utf8(buf[..n].to_vec()).unwrap();
            if let Some(line) = text.lines().next() {
                return serde_json::from_str(line).unwrap();
            }
        }
    };
    let e = next_event();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("p1"))
    );
    d.upsert_pod(pod("a", "p3", "node-2")).unwrap(); // other node: filtered out
    d.upsert_pod(pod("a", "p4", "node-1")).unwrap();
    let e = next_event();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("p4"))
    );
    assert!(d.delete_pod("a", "p1"));
    let e = next_event();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("DELETED"), Some("p1"))
    );
    let mut p4 = pod("a", "p4", "node-1");
    p4["status"]["phase"] = json!("Succeeded");
    d.upsert_pod(p4).unwrap();
    let e = next_event();
    assert_eq!(e["type"], "MODIFIED");
    assert_eq!(e["object"]["status"]["phase"], "Succeeded");
    assert_eq!(d.count("watch", "pods"), 1);
}

#[test]
fn watch_from_a_resource_version_replays_history() {
    let d = ApiServerDouble::start().unwrap();
    d.upsert_pod(pod("a", "p1", "n")).unwrap();
    let rv = d.resource_version();
    d.upsert_pod(pod("a", "p2", "n")).unwrap();
    let r = call(
        &d,
        "GET",
        &format!("/api/v1/pods?watch=1&resourceVersion={rv}&timeoutSeconds=1"),
        None,
    );
    let events: Vec<Value> = match r.body {
        Value::String(text) => text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
        one => vec![one], // a single JSON line parses as one object
    };
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "p2");
}

#[test]
fn nodes_access_reviews_and_metadata_only() {
    let d = ApiServerDouble::start().unwrap();
    d.upsert_node(json!({"metadata": {"name": "n1", "labels": {"gpu": "true"}}}))
        .unwrap();
    d.upsert_node(json!({"metadata": {"name": "n2"}})).unwrap();
    let r = call(&d, "GET", "/api/v1/nodes", None);
    assert_eq!(r.code, 200);
    assert_eq!(r.body["kind"], "NodeList");
    assert_eq!(r.body["items"].as_array().unwrap().len(), 2);
    let r = call(&d, "GET", "/api/v1/nodes?labelSelector=gpu%3Dtrue", None);
    assert_eq!(r.body["items"].as_array().unwrap().len(), 1);
    assert!(d.delete_node("n2"));
    assert_eq!(call(&d, "GET", "/api/v1/nodes/n2", None).code, 404);

    // Access reviews follow the 403 knob.
    let review = |verb: &str, resource: &str| {
        let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                          "spec": {"resourceAttributes": {"verb": verb, "group": "", "resource": resource}}});
        call(
            &d,
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            Some(&body),
        )
    };
    let r = review("list", "pods");
    assert_eq!(
        (r.code, r.body["status"]["allowed"].clone()),
        (201, json!(true))
    );
    d.forbid("list", "pods");
    assert_eq!(
        review("list", "pods").body["status"]["allowed"],
        json!(false)
    );
    d.forbid("create", "selfsubjectaccessreviews");
    assert_eq!(review("get", "pods").code, 403);
    d.allow_all();

    // Metadata-only lists.
    d.upsert_pod(json!({"metadata": {"namespace": "ns", "name": "p"}, "spec": {"nodeName": "n1", "containers": []}})).unwrap();
    let raw = http_get_with_accept(
        &d,
        "/api/v1/pods",
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
    );
    let v: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(v["kind"], "PartialObjectMetadataList");
    assert_eq!(v["items"][0]["metadata"]["name"], "p");
    assert!(v["items"][0].get("spec").is_none());
}

#[test]
fn forbid_in_one_namespace_only() {
    let d = ApiServerDouble::start().unwrap();
    d.upsert_pod(
        json!({"metadata": {"namespace": "kube-system", "name": "agent", "labels": {"app": "a"}},
                        "spec": {"nodeName": "n1"}}),
    )
    .unwrap();
    d.upsert_pod(json!({"metadata": {"namespace": "ns", "name": "p"}, "spec": {"nodeName": "n1"}}))
        .unwrap();
    d.forbid_in("list", "pods", "kube-system");
    let r = call(
        &d,
        "GET",
        "/api/v1/namespaces/kube-system/pods?labelSelector=app%3Da",
        None,
    );
    assert_eq!(r.code, 403, "{:?}", r.body);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("in the namespace \"kube-system\""),
        "{:?}",
        r.body
    );
    assert_eq!(
        call(&d, "GET", "/api/v1/namespaces/ns/pods", None).code,
        200
    );
    assert_eq!(
        call(&d, "GET", "/api/v1/pods", None).code,
        200,
        "cluster-wide list still served"
    );
    assert_eq!(
        call(&d, "GET", "/api/v1/namespaces/kube-system/pods/agent", None).code,
        200,
        "only list"
    );
    d.allow_all();
    let r = call(
        &d,
        "GET",
        "/api/v1/namespaces/kube-system/pods?labelSelector=app%3Da",
        None,
    );
    assert_eq!(r.code, 200);
    assert_eq!(r.body["items"][0]["spec"]["nodeName"], "n1");
    // The same over the control endpoint: a third element names the namespace.
    let r = call(
        &d,
        "POST",
        "/_double/config",
        Some(&json!({"forbid": [["list", "pods", "kube-system"]]})),
    );
    assert_eq!(r.code, 200);
    assert_eq!(
        call(&d, "GET", "/api/v1/namespaces/kube-system/pods", None).code,
        403
    );
    assert_eq!(
        call(&d, "GET", "/api/v1/namespaces/ns/pods", None).code,
        200
    );
}

/// A GET with an `Accept` header; the body (not chunked: lists are answered whole).
fn http_get_with_accept(d: &ApiServerDouble, path: &str, accept: &str) -> String {
    let mut s = TcpStream::connect(d.addr()).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}
