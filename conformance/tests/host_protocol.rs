//! Checklist section A (and the version gates of D, E, F) for both binaries, by direct exec the way a
//! runtime's `invoke` does. Nothing here needs ipvlan: every case is decided before a link exists.

use std::os::unix::fs::PermissionsExt;

use serde_json::{Value, json};
use tether_conformance::{PluginExec, TempDir, assert_cni_error, tether_binary};

const BINARIES: [&str; 2] = ["tether-ipvlan", "tether-ipam"];
const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn exec(bin: &str) -> PluginExec {
    PluginExec::new(tether_binary(bin))
        .var("CNI_CONTAINERID", "c0ffee")
        .var("CNI_NETNS", "/run/netns/does-not-matter")
        .var("CNI_IFNAME", "net1")
        .var("CNI_PATH", "/nonexistent")
}

fn conf(version: &str) -> Value {
    json!({"cniVersion": version, "name": "mgmt", "type": "tether-ipvlan", "master": "nosuch0",
           "ipam": {"type": "tether-ipam", "range": "10.1.2.0/29", "dataDir": "/proc/version/not-a-dir", "probe": false}})
}

#[test]
fn item1_version_echoes_input_and_lists_supported_without_attachment_env() {
    for b in BINARIES {
        let out = PluginExec::new(tether_binary(b)).call("VERSION", br#"{"cniVersion":"1.1.0"}"#);
        out.assert_success();
        let v = out.json();
        assert_eq!(v["cniVersion"], "1.1.0", "{b}");
        let list: Vec<&str> = v["supportedVersions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        for s in SUPPORTED {
            assert!(list.contains(&s), "{b} lacks {s}: {list:?}");
        }
    }
}

#[test]
fn item2_version_under_libcni_dummy_env_and_empty_stdin() {
    for b in BINARIES {
        let e = PluginExec::new(tether_binary(b))
            .var("CNI_NETNS", "dummy")
            .var("CNI_IFNAME", "dummy")
            .var("CNI_PATH", "dummy");
        for stdin in [&b""[..], br#"{"cniVersion":"1.1.0"}"#] {
            let out = e.call("VERSION", stdin);
            out.assert_success();
            assert!(out.json()["supportedVersions"].is_array(), "{b}: {out}");
        }
    }
}

#[test]
fn item3_unset_command_prints_about_on_stderr_and_unknown_is_code_4() {
    for b in BINARIES {
        let mut c = exec(b).command("X");
        c.env_remove("CNI_COMMAND");
        let out = tether_conformance::cmd::capture_with_stdin(&mut c, Some(b""));
        out.assert_success();
        assert!(out.stdout.is_empty(), "{b}: stdout must stay empty: {out}");
        assert!(
            out.stderr.contains(b) && out.stderr.contains("1.1.0"),
            "{b}: {out}"
        );
        assert_cni_error(&exec(b).call_json("FOO", &conf("1.1.0")), Some(4));
    }
}

/// Outside a CNI call, `--version` prints the build's version line on stdout (what `tether
/// doctor` compares with itself) and the "about" line starts with it; both plugins of one build
/// say the same. Within a CNI call the argument changes nothing: VERSION's JSON as ever.
#[test]
fn version_line_outside_a_cni_call_and_version_json_within() {
    let mut builds = Vec::new();
    for b in BINARIES {
        let mut c = exec(b).command("X");
        c.env_remove("CNI_COMMAND").arg("--version");
        let out = tether_conformance::cmd::capture_with_stdin(&mut c, Some(b""));
        out.assert_success();
        let line = out.stdout.trim_end();
        let prefix = format!("{b} {} (commit ", env!("CARGO_PKG_VERSION"));
        assert!(
            line.starts_with(&prefix) && line.ends_with(')'),
            "{b}: {out}"
        );
        assert_eq!(out.stdout.lines().count(), 1, "{b}: {out}");

        let mut c = exec(b).command("X");
        c.env_remove("CNI_COMMAND");
        let about = tether_conformance::cmd::capture_with_stdin(&mut c, Some(b""));
        assert!(
            about
                .stderr
                .starts_with(&format!("{line}: CNI plugin; supported CNI versions: ")),
            "{b}: {about}"
        );

        let mut c = exec(b).command("VERSION");
        c.arg("--version");
        let v =
            tether_conformance::cmd::capture_with_stdin(&mut c, Some(br#"{"cniVersion":"0.4.0"}"#));
        v.assert_success();
        assert_eq!(v.json()["cniVersion"], "0.4.0", "{b}: {v}");
        builds.push(line[b.len()..].to_string());
    }
    assert_eq!(builds[0], builds[1], "one build, one version line");
}

#[test]
fn item4_malformed_json_is_code_6_and_nothing_else_on_stdout() {
    for b in BINARIES {
        let out = exec(b).call("ADD", b"{\"cniVersion\": \"1.1.0\", oops");
        assert_cni_error(&out, Some(6));
        assert_eq!(out.stdout.trim().lines().count(), 1, "{b}: {out}");
    }
}

#[test]
fn item5_missing_or_invalid_name_is_code_7() {
    for b in BINARIES {
        for name in [None, Some("a/b"), Some(""), Some("-lead")] {
            let mut c = conf("1.1.0");
            match name {
                Some(n) => c["name"] = json!(n),
                None => {
                    c.as_object_mut().unwrap().remove("name");
                }
            }
            assert_cni_error(&exec(b).call_json("ADD", &c), Some(7));
        }
    }
}

#[test]
fn item6_unknown_version_is_code_1_listing_supported() {
    for b in BINARIES {
        let e = assert_cni_error(&exec(b).call_json("ADD", &conf("9.9.9")), Some(1));
        let details = e["details"].as_str().unwrap_or_default();
        for s in SUPPORTED {
            assert!(details.contains(s), "{b}: {e}");
        }
    }
}

#[test]
fn item7_add_without_each_variable_is_code_4_naming_it() {
    for b in BINARIES {
        for v in ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS"] {
            let e = assert_cni_error(&exec(b).unset(v).call_json("ADD", &conf("1.1.0")), Some(4));
            assert!(e["msg"].as_str().unwrap().contains(v), "{b} {v}: {e}");
        }
    }
}

#[test]
fn item8_bad_ifname_and_container_id_are_code_4() {
    for b in BINARIES {
        for ifname in ["sixteen-bytes-xx", "a/b", "a:b", "a b", ".", ".."] {
            assert_cni_error(
                &exec(b)
                    .var("CNI_IFNAME", ifname)
                    .call_json("ADD", &conf("1.1.0")),
                Some(4),
            );
        }
        for id in ["-x", "a b", "a/b", "_x"] {
            assert_cni_error(
                &exec(b)
                    .var("CNI_CONTAINERID", id)
                    .call_json("ADD", &conf("1.1.0")),
                Some(4),
            );
        }
    }
}

#[test]
fn item9_every_error_is_one_object_with_numeric_code() {
    // A sample of failures from every layer: protocol, config, kernel, store.
    for b in BINARIES {
        for (verb, stdin) in [
            ("ADD", conf("1.0.0").to_string()),
            ("DEL", "nope".to_string()),
            ("CHECK", conf("0.3.1").to_string()),
            ("STATUS", conf("1.1.0").to_string()),
        ] {
            let out = exec(b).call(verb, stdin.as_bytes());
            let e = assert_cni_error(&out, None);
            assert!(e["cniVersion"].is_string(), "{b} {verb}: {e}");
            assert!(
                !out.stdout.contains("\"ips\""),
                "{b} {verb}: a failed call printed a result: {out}"
            );
        }
    }
}

#[test]
fn item10_unknown_keys_accepted_and_ipam_gets_the_exact_bytes() {
    // GC reaches the IPAM without touching the kernel, so the delegation path is observable here.
    let dir = TempDir::new("protocol-bytes");
    let rec = dir.join("recorder");
    std::fs::write(
        &rec,
        format!(
            "#!/bin/sh\ncat > {}/stdin.$CNI_COMMAND\n",
            dir.path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Odd spacing, key order and unknown keys: all must arrive untouched.
    let stdin = r#"{ "cniVersion":"1.1.0", "name":"mgmt","type":"tether-ipvlan","deviceID":"0000:3b:00.0","pciBusID":"0000:3b:00.0",
      "args":{"cni":{"ips":["10.1.2.9"],"labels":[{"k":"v"}]}}, "cni.dev/foo":{"x":1}, "zz_unknown": [1, 2.50, "x"],
      "ipam": {"type":"recorder"}, "cni.dev/valid-attachments": [] }"#;
    let out = PluginExec::new(tether_binary("tether-ipvlan"))
        .var("CNI_PATH", dir.path().display().to_string())
        .call("GC", stdin.as_bytes());
    out.assert_success();
    assert_eq!(
        std::fs::read_to_string(dir.join("stdin.GC")).unwrap(),
        stdin
    );
}

#[test]
fn item48_54_57_verb_version_gates_are_code_1() {
    for b in BINARIES {
        for (verb, v) in [
            ("CHECK", "0.3.0"),
            ("CHECK", "0.3.1"),
            ("STATUS", "1.0.0"),
            ("STATUS", "0.4.0"),
            ("GC", "1.0.0"),
            ("GC", "0.3.1"),
        ] {
            assert_cni_error(&exec(b).call_json(verb, &conf(v)), Some(1));
        }
    }
}
