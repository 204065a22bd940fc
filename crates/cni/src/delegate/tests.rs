//! Delegation with shell-script plugins: stdin and environment handed over, results and errors
//! back unchanged, early results, large inputs.

use super::*;
use std::os::unix::fs::PermissionsExt;

fn script(dir: &Path, name: &str, body: &str) {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tether-delegate-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn passes_stdin_and_env_and_reads_result() {
    let d = tempdir("ok");
    // Echo stdin back as part of a result, proving the bytes arrived unchanged.
    script(
        &d,
        "fake",
        r#"in=$(cat); [ "$CNI_COMMAND" = ADD ] || exit 9; [ "$CNI_CONTAINERID" = c1 ] || exit 8; printf '{"cniVersion":"1.1.0","ips":[{"address":"10.0.0.2/24"}],"dns":{"domain":"%s"}}' "$(printf %s "$in" | md5sum | cut -c1-8)""#,
    );
    let vars: HashMap<String, String> = [("CNI_CONTAINERID".to_string(), "c1".to_string())].into();
    let stdin = br#"{"odd": "bytes",   "kept":true}"#;
    let path = vec![PathBuf::from("/nonexistent"), d.clone()];
    let r = Delegation {
        path: &path,
        vars: &vars,
        stdin,
    }
    .spawn("fake", Command::Add)
    .and_then(|r| r.result().map(|(r, _)| r))
    .unwrap();
    assert_eq!(r.ips[0].address.to_string(), "10.0.0.2/24");
    let expect = {
        let out = Process::new("sh")
            .arg("-c")
            .arg("printf %s \"$0\" | md5sum | cut -c1-8")
            .arg(std::str::from_utf8(stdin).unwrap())
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    assert_eq!(r.dns.domain.as_deref(), Some(expect.as_str()));
}

#[test]
fn a_large_stdin_and_a_delegate_that_writes_stderr_first_do_not_stall() {
    let d = tempdir("big");
    // 256 KiB on stderr before it reads stdin: more than any pipe holds at once.
    script(
        &d,
        "chatty",
        r#"head -c 262144 /dev/zero | tr '\0' x >&2; n=$(wc -c); printf '{"cniVersion":"1.1.0","n":%s}' "$n""#,
    );
    let (done, finished) = std::sync::mpsc::channel();
    let path = vec![d];
    std::thread::spawn(move || {
        let vars = HashMap::new();
        let stdin = vec![b' '; 4 << 20];
        let out = Delegation {
            path: &path,
            vars: &vars,
            stdin: &stdin,
        }
        .exec("chatty", Command::Gc);
        let _ = done.send(out);
    });
    let out = finished
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the delegation stalled: stdin and stderr waited for each other")
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["n"], 4 << 20, "every stdin byte reached the delegate");
}

#[test]
fn delegate_error_comes_back_unchanged() {
    let d = tempdir("err");
    script(
        &d,
        "fake",
        r#"cat >/dev/null; echo '{"cniVersion":"1.1.0","code":102,"msg":"range 10.0.0.0/30 exhausted","details":"2 leased"}'; exit 1"#,
    );
    let vars = HashMap::new();
    let path = vec![d.clone()];
    let e = Delegation {
        path: &path,
        vars: &vars,
        stdin: b"{}",
    }
    .spawn("fake", Command::Add)
    .and_then(|r| r.result().map(|(r, _)| r))
    .unwrap_err();
    assert_eq!(
        (e.code, e.msg.as_str(), e.details.as_str()),
        (102, "range 10.0.0.0/30 exhausted", "2 leased")
    );
    script(&d, "crash", "echo boom >&2; exit 3");
    let e = Delegation {
        path: &path,
        vars: &vars,
        stdin: b"{}",
    }
    .exec("crash", Command::Del)
    .unwrap_err();
    assert_eq!(e.code, code::DELEGATE_FAILED);
    assert!(e.details.contains("boom"));
}

#[test]
fn early_result_comes_at_eof_and_the_exit_is_checked_after() {
    let d = tempdir("early");
    let done = d.join("exited");
    // Prints its Result, closes its output, and only exits when the caller lets it (a fifo), so
    // the Result cannot have been waited for with the exit.
    let gate = d.join("gate");
    assert!(
        Process::new("mkfifo")
            .arg(&gate)
            .status()
            .unwrap()
            .success()
    );
    let body = format!(
        r#"cat >/dev/null; echo '{{"cniVersion":"1.1.0","ips":[{{"address":"10.0.0.2/24"}}]}}'; exec >&- 2>&-; read x <'{}'; touch '{}'; exit "$x""#,
        gate.display(),
        done.display()
    );
    script(&d, "fake", &body);
    let vars = HashMap::new();
    let path = vec![d.clone()];
    for (status, ok) in [("0", true), ("4", false)] {
        let _ = std::fs::remove_file(&done);
        let running = Delegation {
            path: &path,
            vars: &vars,
            stdin: b"{}",
        }
        .spawn("fake", Command::Add)
        .unwrap();
        let (r, _, exit) = running.early_result().unwrap();
        assert_eq!(r.ips[0].address.to_string(), "10.0.0.2/24");
        assert!(!done.exists(), "the Result came before the plugin exited");
        std::fs::write(&gate, format!("{status}\n")).unwrap();
        let checked = exit.check();
        assert!(done.exists());
        match checked {
            Ok(()) => assert!(ok),
            Err(e) => assert!(
                !ok && e.code == code::DELEGATE_FAILED && e.msg.contains("exit status: 4"),
                "{e:?}"
            ),
        }
    }
}

#[test]
fn early_result_of_a_failed_add_is_its_error() {
    let d = tempdir("earlyerr");
    script(
        &d,
        "fake",
        r#"cat >/dev/null; echo '{"cniVersion":"1.1.0","code":102,"msg":"exhausted"}'; exit 1"#,
    );
    script(&d, "garbage", "cat >/dev/null; echo not-json");
    script(
        &d,
        "zero",
        r#"cat >/dev/null; echo '{"cniVersion":"1.1.0","code":11,"msg":"try later"}'"#,
    );
    let vars = HashMap::new();
    let path = vec![d.clone()];
    let e = Delegation {
        path: &path,
        vars: &vars,
        stdin: b"{}",
    }
    .spawn("fake", Command::Add)
    .unwrap()
    .early_result()
    .unwrap_err();
    assert_eq!((e.code, e.msg.as_str()), (102, "exhausted"));
    let e = Delegation {
        path: &path,
        vars: &vars,
        stdin: b"{}",
    }
    .spawn("zero", Command::Add)
    .unwrap()
    .early_result()
    .unwrap_err();
    assert_eq!(
        (e.code, e.msg.as_str()),
        (11, "try later"),
        "an error object with exit status 0 is still the error"
    );
    let e = Delegation {
        path: &path,
        vars: &vars,
        stdin: b"{}",
    }
    .spawn("garbage", Command::Add)
    .unwrap()
    .early_result()
    .unwrap_err();
    assert!(
        e.code == code::DELEGATE_FAILED && e.msg.contains("unreadable result"),
        "{e:?}"
    );
}

#[test]
fn missing_plugin_names_it_and_the_path() {
    let vars = HashMap::new();
    let path = vec![PathBuf::from("/nonexistent-dir")];
    let e = Delegation {
        path: &path,
        vars: &vars,
        stdin: b"{}",
    }
    .find("tether-ipam")
    .unwrap_err();
    assert_eq!(e.code, code::DELEGATE_FAILED);
    assert!(e.msg.contains("tether-ipam") && e.details.contains("/nonexistent-dir"));
    assert_eq!(
        Delegation {
            path: &[],
            vars: &vars,
            stdin: b"{}"
        }
        .find("x")
        .unwrap_err()
        .code,
        4
    );
    assert_eq!(
        Delegation {
            path: &path,
            vars: &vars,
            stdin: b"{}"
        }
        .find("../x")
        .unwrap_err()
        .code,
        7
    );
}
