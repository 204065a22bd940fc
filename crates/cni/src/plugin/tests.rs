//! The dispatcher's contract, with a fake plugin: one object on stdout, codes, versions, panics.

use super::*;
use crate::result::IpConfig;
use serde_json::Value;

/// Answers ADD with one address, panics when the config asks it to, fails DEL with code 7.
struct Fake;

impl Plugin for Fake {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn version(&self) -> String {
        "fake 9.8.7 (commit 0123456789ab, x86_64-unknown-linux-musl)".into()
    }
    fn add(&self, req: &Request) -> Result<Added, CniError> {
        if req.conf.value.contains_key("panic") {
            panic!("boom at {}", req.env.ifname());
        }
        let result = CniResult {
            ips: vec![IpConfig {
                address: "10.1.2.9/24".parse().unwrap(),
                gateway: None,
                interface: None,
            }],
            ..Default::default()
        };
        Ok(Added {
            result,
            probed: vec!["10.1.2.9".parse().unwrap()],
            linger: Some(Box::new("probe sockets")),
        })
    }
    fn del(&self, _: &Request) -> Result<(), CniError> {
        Err(CniError::invalid_config("nope"))
    }
    fn check(&self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn status(&self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
    fn gc(&self, _: &Request) -> Result<(), CniError> {
        Ok(())
    }
}

struct Out {
    status: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        assert_eq!(
            self.stdout.lines().count(),
            1,
            "exactly one object on stdout: {:?}",
            self.stdout
        );
        serde_json::from_str(&self.stdout).unwrap()
    }
}

/// A runtime's variables for `cmd` (none: CNI_COMMAND unset) on container c1, net1.
fn vars(cmd: Option<&str>) -> HashMap<String, String> {
    let mut vars: HashMap<String, String> = [
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/run/netns/p"),
        ("CNI_IFNAME", "net1"),
        ("CNI_PATH", "/opt/cni/bin"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if let Some(c) = cmd {
        vars.insert("CNI_COMMAND".into(), c.into());
    }
    vars
}

fn run(cmd: Option<&str>, extra: &[(&str, &str)], stdin: &str) -> Out {
    let mut vars = vars(cmd);
    for (k, v) in extra {
        if v.is_empty() {
            vars.remove(*k);
        } else {
            vars.insert(k.to_string(), v.to_string());
        }
    }
    let (mut o, mut e) = (Vec::new(), Vec::new());
    let status = dispatch(&Fake, &vars, &mut stdin.as_bytes(), &mut o, &mut e);
    Out {
        status,
        stdout: String::from_utf8(o).unwrap(),
        stderr: String::from_utf8(e).unwrap(),
    }
}

fn conf(v: &str) -> String {
    format!(r#"{{"cniVersion":"{v}","name":"mgmt","type":"fake"}}"#)
}

#[test]
fn version_echoes_input_and_needs_no_attachment_env() {
    let o = run(
        Some("VERSION"),
        &[
            ("CNI_CONTAINERID", ""),
            ("CNI_NETNS", ""),
            ("CNI_IFNAME", ""),
        ],
        r#"{"cniVersion":"1.1.0"}"#,
    );
    assert_eq!(o.status, 0);
    let v = o.json();
    assert_eq!(v["cniVersion"], "1.1.0");
    let sup: Vec<&str> = v["supportedVersions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    for s in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        assert!(sup.contains(&s));
    }
    let o = run(
        Some("VERSION"),
        &[
            ("CNI_NETNS", "dummy"),
            ("CNI_IFNAME", "dummy"),
            ("CNI_PATH", "dummy"),
        ],
        "",
    );
    assert_eq!(
        (o.status, o.json()["cniVersion"].as_str().unwrap()),
        (0, "1.1.0")
    );
    let o = run(Some("VERSION"), &[], r#"{"cniVersion":"0.4.0"}"#);
    assert_eq!(o.json()["cniVersion"], "0.4.0");
}

#[test]
fn unset_command_prints_about_on_stderr_only() {
    let o = run(None, &[], "");
    assert_eq!(o.status, 0);
    assert!(o.stdout.is_empty());
    assert!(
        o.stderr.starts_with(
            "fake 9.8.7 (commit 0123456789ab, x86_64-unknown-linux-musl): CNI plugin;"
        ) && o.stderr.contains("1.1.0"),
        "{}",
        o.stderr
    );
}

#[test]
fn only_version_alone_outside_a_cni_call_asks_for_the_version() {
    let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
    let none = None;
    let empty = Some(std::ffi::OsStr::new(""));
    let add = Some(std::ffi::OsStr::new("ADD"));
    assert!(asks_version(none, &args(&["--version"])));
    assert!(asks_version(empty, &args(&["--version"])));
    // A CNI call is answered as one, whatever its arguments; other words are not the question.
    assert!(!asks_version(add, &args(&["--version"])));
    assert!(!asks_version(none, &args(&[])));
    assert!(!asks_version(none, &args(&["version"])));
    assert!(!asks_version(none, &args(&["--version", "x"])));
}

#[test]
fn unknown_command_is_code_4() {
    let o = run(Some("FOO"), &[], &conf("1.1.0"));
    assert_ne!(o.status, 0);
    assert_eq!(o.json()["code"], 4);
    assert!(o.json()["msg"].as_str().unwrap().contains("FOO"));
}

#[test]
fn add_prints_result_in_config_layout() {
    for v in SUPPORTED {
        let o = run(Some("ADD"), &[], &conf(v));
        assert_eq!(o.status, 0, "{}", o.stdout);
        let r = o.json();
        assert_eq!(r["cniVersion"], *v);
        assert_eq!(
            r["ips"][0].get("version").is_some(),
            v.starts_with('0'),
            "{v}"
        );
        assert_eq!(
            r[crate::result::PROBED_KEY],
            serde_json::json!(["10.1.2.9"]),
            "the probed note"
        );
    }
}

#[test]
fn what_an_add_keeps_comes_back_for_after_the_reply() {
    let vars = vars(Some("ADD"));
    let (mut o, mut e) = (Vec::new(), Vec::new());
    let Served { status, linger, .. } =
        serve(&Fake, &vars, &mut conf("1.1.0").as_bytes(), &mut o, &mut e);
    assert_eq!(status, 0);
    assert!(
        !o.is_empty(),
        "the reply is written before the linger is handed back"
    );
    let kept = linger.expect("the ADD's linger");
    assert_eq!(kept.downcast_ref::<&str>(), Some(&"probe sockets"));
}

#[test]
fn each_call_says_what_it_was_for_its_record() {
    let call = |cmd: Option<&str>, stdin: &str| {
        let vars = vars(cmd);
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let served = serve(&Fake, &vars, &mut stdin.as_bytes(), &mut o, &mut e);
        served.call.map(|c| (c.verb, c.network, c.code))
    };
    let named = |verb, code| Some((verb, "mgmt".to_string(), code));
    assert_eq!(call(Some("ADD"), &conf("1.1.0")), named("ADD", 0));
    assert_eq!(call(Some("DEL"), &conf("1.1.0")), named("DEL", 7));
    assert_eq!(call(Some("CHECK"), &conf("0.3.1")), named("CHECK", 1));
    let panicked = r#"{"cniVersion":"1.0.0","name":"mgmt","panic":true}"#;
    assert_eq!(call(Some("ADD"), panicked), named("ADD", 999));
    // Before the config is read the network is not known; the verb and code still are.
    assert_eq!(
        call(Some("ADD"), "{not json"),
        Some(("ADD", String::new(), 6))
    );
    assert_eq!(
        call(Some("FOO"), &conf("1.1.0")),
        Some(("unknown", String::new(), 4))
    );
    assert_eq!(
        call(Some("VERSION"), "{}"),
        Some(("VERSION", String::new(), 0))
    );
    assert_eq!(call(None, ""), None, "no command: no CNI call to record");
}

#[test]
fn errors_are_one_object_with_code_and_version() {
    let o = run(Some("ADD"), &[], "{not json");
    assert_eq!((o.status, o.json()["code"].as_i64()), (1, Some(6)));
    assert_eq!(o.json()["cniVersion"], LATEST);
    let o = run(Some("ADD"), &[], r#"{"cniVersion":"9.9.9","name":"n"}"#);
    assert_eq!(o.json()["code"], 1);
    assert!(o.json()["details"].as_str().unwrap().contains("1.1.0"));
    let o = run(Some("ADD"), &[("CNI_IFNAME", "")], &conf("0.4.0"));
    assert_eq!(o.json()["code"], 4);
    assert_eq!(o.json()["cniVersion"], "0.4.0");
    assert!(o.json()["msg"].as_str().unwrap().contains("CNI_IFNAME"));
    let o = run(Some("DEL"), &[], &conf("1.0.0"));
    assert_eq!((o.status, o.json()["code"].as_i64()), (1, Some(7)));
}

#[test]
fn verb_version_gates_are_code_1() {
    for (cmd, below) in [
        ("CHECK", "0.3.1"),
        ("GC", "1.0.0"),
        ("STATUS", "1.0.0"),
        ("STATUS", "0.4.0"),
    ] {
        let o = run(Some(cmd), &[], &conf(below));
        assert_eq!(o.json()["code"], 1, "{cmd} at {below}");
    }
    for (cmd, ok) in [("CHECK", "0.4.0"), ("GC", "1.1.0"), ("STATUS", "1.1.0")] {
        // GC and STATUS run without any attachment variables.
        let unset: &[(&str, &str)] = if cmd == "CHECK" {
            &[]
        } else {
            &[
                ("CNI_CONTAINERID", ""),
                ("CNI_NETNS", ""),
                ("CNI_IFNAME", ""),
            ]
        };
        let o = run(Some(cmd), unset, &conf(ok));
        assert_eq!((o.status, o.stdout.as_str()), (0, ""), "{cmd}");
    }
}

#[test]
fn panic_becomes_internal_error() {
    let o = run(
        Some("ADD"),
        &[],
        r#"{"cniVersion":"1.0.0","name":"n","panic":true}"#,
    );
    assert_eq!(o.status, 1);
    let e = o.json();
    assert_eq!(e["code"], 999);
    assert!(e["msg"].as_str().unwrap().contains("boom at net1"), "{e}");
}
