use super::*;
use std::io::{Read, Write};
use std::os::unix::fs::{PermissionsExt, symlink};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tether-trusted-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// A fresh node: nothing of the path exists below the root it is in (no /var/lib/cni yet).
#[test]
fn creates_a_path_whose_first_directory_below_the_root_is_missing() {
    let top = std::env::temp_dir().join(format!("tether-trusted-fresh-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&top);
    let dir = top.join("cni/tether");
    let d = TrustedDir::open("ipam.dataDir", &dir, Place::State, true)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(d.path(), dir);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    std::fs::remove_dir_all(&top).unwrap();
}

#[test]
fn creates_checks_and_round_trips() {
    let d = scratch("ok");
    let t = TrustedDir::open("ipam.dataDir", &d.join("a/b"), Place::State, true).unwrap();
    assert_eq!(
        std::fs::metadata(d.join("a/b"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let mut f = t.open_file(".x.tmp", Open::Replace).unwrap();
    f.write_all(b"state").unwrap();
    drop(f);
    t.rename(".x.tmp", "x.json").unwrap();
    t.sync().unwrap();
    let mut s = String::new();
    t.read_file("x.json")
        .unwrap()
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    assert_eq!(s, "state");
    assert!(t.read_file("missing").unwrap().is_none());
    assert_eq!(t.entries().unwrap(), vec![OsString::from("x.json")]);
    t.remove("x.json").unwrap();
    t.remove("x.json").unwrap();
    assert!(t.subdir("journal", true).is_ok());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn refuses_writable_directories_symlinks_and_pseudo_filesystems() {
    let d = scratch("bad");
    // A world-writable directory (sticky or not) is not where root's files go.
    let open = d.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let e = TrustedDir::open("ipam.dataDir", &open, Place::State, true).unwrap_err();
    assert!(
        matches!(e, TrustError::Untrusted { .. }) && e.to_string().contains("writable by others"),
        "{e}"
    );
    assert!(!e.is_transient());
    // ... but a directory below a sticky one, owned by root and closed, is fine (like /tmp/x).
    assert!(TrustedDir::open("ipam.dataDir", &open.join("mine"), Place::State, true).is_ok());
    // Below a world-writable non-sticky directory: refused (it could be swapped).
    let wide = d.join("wide");
    std::fs::create_dir(&wide).unwrap();
    std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = TrustedDir::open("ipam.dataDir", &wide.join("x"), Place::State, true).unwrap_err();
    assert!(e.to_string().contains("wide"), "{e}");
    // A planted symlink in a trusted directory is never followed.
    let t = TrustedDir::open("ipam.dataDir", &d.join("data"), Place::State, true).unwrap();
    let victim = d.join("victim");
    std::fs::write(&victim, "root's file").unwrap();
    symlink(&victim, d.join("data/.n.json.tmp")).unwrap();
    let e = t.open_file(".n.json.tmp", Open::Replace).unwrap_err();
    assert!(e.to_string().contains("symlink"), "{e}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's file");
    symlink(d.join("nowhere"), d.join("data/n.lock")).unwrap();
    assert!(t.open_file("n.lock", Open::Lock).is_err());
    assert!(
        !d.join("nowhere").exists(),
        "no file created through the link"
    );
    // A directory where a file belongs; a FIFO (would block a reader).
    std::fs::create_dir(d.join("data/dir.json")).unwrap();
    assert!(t.read_file("dir.json").is_err());
    nix::unistd::mkfifo(&d.join("data/fifo.json"), Mode::from_bits_truncate(0o600)).unwrap();
    let e = t.read_file("fifo.json").unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
    for p in [
        "/proc/self",
        "/sys/kernel",
        "/dev/shm/x",
        "relative/dir",
        "/var/lib/../../etc",
    ] {
        let e = TrustedDir::open("ipam.dataDir", Path::new(p), Place::State, true).unwrap_err();
        assert!(matches!(e, TrustError::Unfit { .. }), "{p}: {e}");
        assert!(e.to_string().contains("ipam.dataDir"), "{e}");
    }
    for n in ["", ".", "..", "a/b"] {
        assert!(t.read_file(n).is_err(), "{n:?}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn only_places_of_their_kind_and_no_symlink_out_of_them() {
    let d = scratch("place");
    symlink("/etc", d.join("to-etc")).unwrap();
    let e =
        TrustedDir::open("ipam.dataDir", &d.join("to-etc/tether"), Place::State, true).unwrap_err();
    assert!(e.to_string().contains("must be below"), "{e}");
    assert!(!Path::new("/etc/tether").exists());
    for (p, place) in [
        ("/etc/tether", Place::State),
        ("/var/lib", Place::State),
        ("/var/lib/cni/tether/x.log", Place::Log),
        ("/etc/ld.so.preload", Place::Log),
    ] {
        assert!(check_place("k", Path::new(p), place).is_err(), "{p}");
    }
    for (p, place) in [
        ("/var/lib/cni/tether", Place::State),
        ("/run/tether", Place::State),
        ("/var/log/tether/cni.log", Place::Log),
        ("/tmp/x/cni.log", Place::Log),
    ] {
        assert!(check_place("k", Path::new(p), place).is_ok(), "{p}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_symlinked_configured_path_is_resolved_once() {
    let d = scratch("link");
    std::fs::create_dir(d.join("real")).unwrap();
    symlink(d.join("real"), d.join("alias")).unwrap();
    let t = TrustedDir::open("ipam.dataDir", &d.join("alias/state"), Place::State, true).unwrap();
    t.open_file("f", Open::Lock).unwrap();
    assert!(d.join("real/state/f").is_file());
    std::fs::remove_dir_all(&d).unwrap();
}

/// Measured: `log_file "/tmp/whereabouts.log"` was refused with "log_file "/tmp" ... it must be
/// below /var/log, /tmp, /var/tmp". A message never lists as allowed what it refuses.
#[test]
fn a_refusal_never_lists_the_refused_place_as_allowed() {
    for (p, place, says) in [
        (
            "/tmp/whereabouts.log",
            Place::Log,
            "not directly in /tmp, which every user can write",
        ),
        ("/var/tmp/x.log", Place::Log, "not directly in /var/tmp"),
        (
            "/var/log/syslog",
            Place::Log,
            "not directly in /var/log, which holds the system's own files",
        ),
        ("/tmp", Place::State, "must be below /tmp, not /tmp itself"),
        (
            "/var/lib",
            Place::State,
            "must be below /var/lib, not /var/lib itself",
        ),
    ] {
        let e = check_file_place("log_file", Path::new(p), place)
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{p}: {e}");
        assert!(
            e.contains(&format!("{p:?}")),
            "the configured path is named: {e}"
        );
    }
    // Through the opening function too: the file is named, not its directory.
    let e = open_in_trusted_dir(
        "log_file",
        Path::new("/tmp/whereabouts.log"),
        Place::Log,
        Open::Append(0o600),
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("log_file \"/tmp/whereabouts.log\" "), "{e}");
    assert!(!e.contains("below /var/log, /tmp"), "{e}");
    for p in ["/tmp/tether/cni.log", "/var/log/tether/cni.log"] {
        check_file_place("log_file", Path::new(p), Place::Log).unwrap();
    }
}

#[test]
fn create_new_creates_once() {
    let d = scratch("once");
    let t = TrustedDir::open("ipam.dataDir", &d.join("data"), Place::State, true).unwrap();
    assert!(t.create_new("said").unwrap().is_some());
    assert!(t.create_new("said").unwrap().is_none());
    let mode = std::fs::metadata(d.join("data/said"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    // A symlink in its place is not followed: it counts as there, and nothing is created.
    symlink(d.join("elsewhere"), d.join("data/link")).unwrap();
    assert!(t.create_new("link").unwrap().is_none());
    assert!(!d.join("elsewhere").exists());
    std::fs::remove_dir_all(&d).unwrap();
}
