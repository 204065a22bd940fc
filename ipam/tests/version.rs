//! tether-ipam outside a CNI call: `--version` prints this build's version line on stdout (what
//! `tether doctor` compares with itself), the "about" line without arguments starts with it, any
//! other argument is refused, and a CNI call with the argument is answered as a CNI call.

use std::process::{Command, Output};

fn ipam(args: &[&str], cni_command: Option<&str>, stdin: &[u8]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tether-ipam"));
    c.args(args).env_remove("CNI_COMMAND");
    if let Some(v) = cni_command {
        c.env("CNI_COMMAND", v);
    }
    c.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn version_line_about_line_and_other_words() {
    let line = tether_build_info::line("tether-ipam");
    let o = ipam(&["--version"], None, b"");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), format!("{line}\n"));
    assert!(o.stderr.is_empty(), "{}", text(&o.stderr));

    let o = ipam(&[], None, b"");
    assert_eq!(o.status.code(), Some(0));
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    assert!(
        text(&o.stderr).starts_with(&format!(
            "{line}: CNI plugin; supported CNI versions: 0.3.0"
        )),
        "{}",
        text(&o.stderr)
    );

    let o = ipam(&["version"], None, b"");
    assert_eq!(o.status.code(), Some(2));
    let e = text(&o.stderr);
    assert!(
        e.contains("but --version") && e.contains("run `tether version`"),
        "{e}"
    );
}

#[test]
fn a_cni_call_with_the_argument_is_a_cni_call() {
    let o = ipam(
        &["--version"],
        Some("VERSION"),
        br#"{"cniVersion":"1.0.0"}"#,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["cniVersion"], "1.0.0");
    assert!(v["supportedVersions"].as_array().unwrap().len() >= 5, "{v}");
}
