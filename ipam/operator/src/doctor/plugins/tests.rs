//! The `plugins` check against fake plugins: shell scripts in a temporary directory that answer
//! as this build's plugins, another build's, 0.1.0's and a stranger do.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use super::*;

/// A directory of fake plugins, removed when the test ends.
struct Tmp(PathBuf);

impl std::ops::Deref for Tmp {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmp(tag: &str) -> Tmp {
    let d = std::env::temp_dir().join(format!("tether-doctor-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Tmp(d)
}

fn script(dir: &Path, name: &str, body: &str) {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A plugin of 0.2.0 on: its version line on stdout for `--version`.
fn reporting(line: &str) -> String {
    format!("[ \"$1\" = --version ] && {{ echo '{line}'; exit 0; }}\necho 'about' >&2")
}

/// 0.1.0's tether-ipvlan: the about line whatever the arguments.
const OLD_IPVLAN: &str = "echo 'tether-ipvlan: CNI plugin 0.1.0; supported CNI versions: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0' >&2";
/// 0.1.0's tether-ipam: refuses any argument, the about line without.
const OLD_IPAM: &str = "[ $# -gt 0 ] && { echo 'tether-ipam is the CNI plugin and takes no commands' >&2; exit 2; }\n\
     echo 'tether-ipam: CNI plugin 0.1.0; supported CNI versions: 0.3.0, 1.1.0' >&2";

fn findings(dir: &Path) -> Vec<(bool, String)> {
    let mut r = Report::default();
    check(dir, &mut r);
    r.0.into_iter()
        .map(|f| {
            assert_eq!(f.check, "plugins");
            (f.ok, f.detail)
        })
        .collect()
}

#[test]
fn plugins_of_this_build_are_ok() {
    let d = tmp("same");
    for b in BINARIES {
        script(&d, b, &reporting(&tether_build_info::line(b)));
    }
    let f = findings(&d);
    assert_eq!(f.len(), 2, "{f:?}");
    for ((ok, detail), b) in f.iter().zip(BINARIES) {
        assert!(ok, "{detail}");
        assert!(
            detail.starts_with(&format!(
                "{b} in {} is {}",
                d.display(),
                tether_build_info::VERSION
            )),
            "{detail}"
        );
    }
}

#[test]
fn another_build_old_plugins_and_missing_ones_fail_with_what_to_do() {
    let d = tmp("differ");
    script(
        &d,
        "tether-ipvlan",
        &reporting("tether-ipvlan 0.1.9 (commit 0123456789ab, x86_64-unknown-linux-musl)"),
    );
    let f = findings(&d);
    assert!(
        !f[0].0
            && f[0]
                .1
                .contains("is 0.1.9 (commit 0123456789ab), but this tether is"),
        "{f:?}"
    );
    assert!(
        f[0].1.contains("restart it") && f[0].1.contains("log"),
        "{f:?}"
    );
    assert!(!f[1].0, "{f:?}");
    assert!(
        f[1].1
            .starts_with(&format!("tether-ipam is not in {}", d.display())),
        "{f:?}"
    );
    assert!(f[1].1.contains("--cni-bin-dir"), "{f:?}");

    // 0.1.0's plugins do not understand --version: each is still told apart, its version read
    // from its about line, and reported as older, not as a crash.
    script(&d, "tether-ipvlan", OLD_IPVLAN);
    script(&d, "tether-ipam", OLD_IPAM);
    for (ok, detail) in findings(&d) {
        assert!(!ok, "{detail}");
        assert!(
            detail.contains(
                "is 0.1.0, older than 0.2.0 (it does not report its commit), but this tether is"
            ),
            "{detail}"
        );
    }

    // Something else under the name.
    script(&d, "tether-ipam", "echo hello");
    let f = findings(&d);
    assert!(
        !f[1].0
            && f[1]
                .1
                .contains("does not say which version it is: older than 0.2.0, or not tether's"),
        "{f:?}"
    );
    std::fs::set_permissions(
        d.join("tether-ipam"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let f = findings(&d);
    assert!(
        !f[1].0 && f[1].1.contains("cannot be run") && f[1].1.contains("not executable"),
        "{f:?}"
    );
}

#[test]
fn the_same_version_with_an_unknown_commit_compares_the_versions() {
    let d = Path::new("/opt/cni/bin");
    let own = |commit: &str| Reported {
        version: "0.2.0".into(),
        commit: commit.into(),
        target: "x86_64-unknown-linux-musl".into(),
    };
    let reports = |v: &str, c: &str| {
        Installed::Reports(Reported {
            version: v.into(),
            ..own(c)
        })
    };
    let (ok, detail) = compare(
        "tether-ipam",
        d,
        &reports("0.2.0", "abcdef123456"),
        &own("abcdef123456"),
    );
    assert!(ok, "{detail}");
    assert_eq!(
        detail,
        "tether-ipam in /opt/cni/bin is 0.2.0 (commit abcdef123456), this tether's build"
    );
    let (ok, detail) = compare(
        "tether-ipam",
        d,
        &reports("0.2.0", "unknown"),
        &own("abcdef123456"),
    );
    assert!(
        ok && detail.contains("only the versions are compared"),
        "{detail}"
    );
    let (ok, detail) = compare(
        "tether-ipam",
        d,
        &reports("0.2.0", "abcdef123456"),
        &own("unknown"),
    );
    assert!(
        ok && detail.contains("only the versions are compared"),
        "{detail}"
    );
    // Same version, other commit (or dirty): another build.
    for c in ["0123456789ab", "abcdef123456-dirty"] {
        let (ok, detail) = compare("tether-ipam", d, &reports("0.2.0", c), &own("abcdef123456"));
        assert!(
            !ok && detail.contains(&format!(
                "is 0.2.0 (commit {c}), but this tether is 0.2.0 (commit abcdef123456)"
            )),
            "{detail}"
        );
    }
    let (ok, _) = compare(
        "tether-ipam",
        d,
        &reports("0.1.0", "unknown"),
        &own("unknown"),
    );
    assert!(!ok, "another version, whatever the commits");
}

#[test]
fn a_plugin_that_does_not_answer_is_left_behind() {
    let d = tmp("hang");
    script(&d, "tether-ipam", "exec /bin/sleep 30");
    let started = Instant::now();
    let e = run(
        &d.join("tether-ipam"),
        &["--version"],
        Duration::from_millis(200),
    );
    assert!(matches!(e, Err(QueryError::NoAnswer)), "{:?}", e.err());
    assert!(started.elapsed() < Duration::from_secs(5));
}
