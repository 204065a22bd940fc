//! Issue 21, part 5: hostile input, as a NAD author, a local user on the node and a careless
//! operator would send it (docs/security.md has the threat model). Each case asserts the exact
//! CNI code, a message naming the key, bounded time and memory, and that nothing was left behind
//! (no file created or changed outside what the case allows).

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_conformance::{PluginExec, TempDir, assert_cni_error, target_dir, tether_binary};

/// What one call cost: its output, wall time and peak RSS.
struct Run {
    code: i32,
    stdout: String,
    elapsed: Duration,
    max_rss_kib: i64,
}

/// `bin` with `verb` and `stdin` (file store, no netns needed), measured by GNU time.
///
/// Not by our own wait4: a child's peak RSS is not reset by exec, so a child of this (large,
/// multi-threaded) test process would report the test's own peak. time's child is forked from
/// time, a small process, so its figure is the plugin's.
fn run(bin: &str, verb: &str, stdin: &[u8]) -> Run {
    run_path(&tether_binary(bin), verb, stdin)
}

fn run_path(bin: &Path, verb: &str, stdin: &[u8]) -> Run {
    use std::io::Write;
    let exec = PluginExec::new(bin)
        .var("CNI_CONTAINERID", "c0ffee")
        .var("CNI_NETNS", "/run/netns/hostile")
        .var("CNI_IFNAME", "net1")
        .var("CNI_PATH", "/nonexistent")
        .var(
            "CNI_ARGS",
            "IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u",
        )
        .command(verb);
    let report = TempDir::new("hostile-rss");
    let report_file = report.join("maxrss");
    let mut c = std::process::Command::new("/usr/bin/time");
    c.arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(&report_file)
        .arg("--")
        .arg(bin);
    for (k, v) in exec.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let t = Instant::now();
    let mut child = c
        .spawn()
        .expect("spawn /usr/bin/time (Debian package time)");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    // The plugin may stop reading early (the cap): a broken pipe is its answer, not an error.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let status = child.wait().expect("wait");
    let elapsed = t.elapsed();
    let _ = writer.join();
    let rss = std::fs::read_to_string(&report_file).expect("time wrote its report");
    Run {
        code: status.code().unwrap_or(-1),
        stdout,
        elapsed,
        max_rss_kib: rss
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("time's report: {rss:?}")),
    }
}

fn error_of(r: &Run, code: u64) -> Value {
    assert_eq!(r.code, 1, "a CNI error exits 1: {}", r.stdout);
    let e: Value =
        serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {:?}", r.stdout));
    assert_eq!(e["code"], code, "{e}");
    e
}

#[track_caller]
fn assert_refused(r: &Run, code: u64, names: &[&str]) -> Value {
    let e = error_of(r, code);
    let msg = e["msg"].as_str().unwrap();
    for n in names {
        assert!(msg.contains(n), "the message names {n:?}: {msg}");
    }
    assert!(
        r.elapsed < Duration::from_secs(2),
        "bounded time: {:?}",
        r.elapsed
    );
    assert!(
        r.max_rss_kib < 64 * 1024,
        "bounded memory: {} KiB",
        r.max_rss_kib
    );
    e
}

fn ipam(dir: &Path, extra: Value) -> Value {
    let mut ipam =
        json!({"type": "tether-ipam", "range": "10.1.2.0/29", "probe": false, "dataDir": dir});
    for (k, v) in extra.as_object().unwrap() {
        ipam[k] = v.clone();
    }
    json!({"cniVersion": "1.1.0", "name": "hostile", "type": "tether-ipvlan", "ipam": ipam})
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = walk(dir);
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let p = e.path();
        out.push(p.display().to_string());
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        }
    }
    out
}

#[test]
fn a_data_dir_others_can_write_is_refused_before_anything_is_written() {
    let tmp = TempDir::new("hostile-shared");
    let shared = tmp.join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    // What a local user plants there: the temp file and the lock as symlinks to root's files.
    let victim = tmp.join("root-owned");
    std::fs::write(&victim, "precious").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    symlink(&victim, shared.join(".@cluster.json.tmp")).unwrap();
    symlink(tmp.join("created-by-root"), shared.join("@cluster.lock")).unwrap();
    let before = listing(tmp.path());
    for verb in ["ADD", "CHECK"] {
        let r = run(
            "tether-ipam",
            verb,
            ipam(&shared, json!({})).to_string().as_bytes(),
        );
        assert_refused(
            &r,
            7,
            &["ipam.dataDir", "writable by others", "only root can write"],
        );
    }
    // DEL has nothing to release under a configuration no ADD can work with, and succeeds (a
    // runtime replays the ADD's configuration in every DEL): without touching the directory.
    let r = run(
        "tether-ipam",
        "DEL",
        ipam(&shared, json!({})).to_string().as_bytes(),
    );
    assert_eq!((r.code, r.stdout.as_str()), (0, ""), "DEL");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert_eq!(
        std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777,
        0o644
    );
    assert!(!tmp.join("created-by-root").exists());
    assert_eq!(listing(tmp.path()), before, "nothing created or removed");
}

#[test]
fn a_symlink_inside_a_trusted_data_dir_is_never_followed() {
    let tmp = TempDir::new("hostile-planted");
    let data = tmp.join("data");
    std::fs::create_dir(&data).unwrap();
    let victim = tmp.join("root-owned");
    std::fs::write(&victim, "precious").unwrap();
    symlink(&victim, data.join(".@cluster.json.tmp")).unwrap();
    let r = run(
        "tether-ipam",
        "ADD",
        ipam(&data, json!({})).to_string().as_bytes(),
    );
    let e = assert_refused(&r, 7, &[".@cluster.json.tmp", "symlink"]);
    assert!(e["msg"].as_str().unwrap().contains("remove it"), "{e}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    // The lease it had taken (in memory) is not on disk: the state file was never written.
    assert!(!data.join("@cluster.json").exists());
}

#[test]
fn pseudo_filesystems_and_directories_where_files_belong_are_permanent_errors() {
    // Places the system reads: a NAD author must not make root create files there.
    for dir in ["/etc/tether", "/root/tether", "/usr/lib/tether", "/var/lib"] {
        let r = run(
            "tether-ipam",
            "ADD",
            ipam(Path::new(dir), json!({})).to_string().as_bytes(),
        );
        assert_refused(&r, 7, &["ipam.dataDir", dir, "must be below"]);
        if dir != "/var/lib" {
            assert!(!Path::new(dir).exists(), "{dir} was not created");
        }
    }
    for dir in ["/proc/self", "/sys/kernel", "/dev/shm/tether"] {
        let r = run(
            "tether-ipam",
            "ADD",
            ipam(Path::new(dir), json!({})).to_string().as_bytes(),
        );
        assert_refused(&r, 7, &["ipam.dataDir", dir]);
    }
    let tmp = TempDir::new("hostile-lockdir");
    let data = tmp.join("data");
    std::fs::create_dir_all(data.join("@cluster.lock")).unwrap();
    let r = run(
        "tether-ipam",
        "ADD",
        ipam(&data, json!({})).to_string().as_bytes(),
    );
    assert_refused(&r, 7, &["@cluster.lock", "not a regular file"]);
}

#[test]
fn log_lines_never_carry_raw_control_characters_and_the_log_is_private() {
    let tmp = TempDir::new("hostile-log");
    let log = tmp.join("logs/tether.log");
    let conf = ipam(
        &tmp.join("data"),
        json!({"range": "10.1.0.0/24\n* * * * * root touch /tmp/x #", "log_file": log, "log_level": "debug"}),
    );
    let r = run("tether-ipam", "ADD", conf.to_string().as_bytes());
    assert_refused(&r, 7, &["ipam.range"]);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.is_empty(), "the failure was logged");
    for line in text.lines() {
        assert!(
            line.starts_with("20") && line.contains(" tether-ipam["),
            "every line is one log line: {line:?}"
        );
    }
    assert!(
        text.contains("\\n* * * * * root"),
        "the newline is escaped: {text}"
    );
    assert_eq!(
        std::fs::metadata(&log).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // A log line in /etc/ld.so.preload would load a library of the NAD author's choosing into
    // every process: a log goes in a directory of its own below /var/log (or /tmp), nowhere else.
    // A log_file elsewhere is ignored (a warning on stderr), never a failed ADD; one that is not
    // a string is a broken config.
    let preload = std::fs::metadata("/etc/ld.so.preload")
        .ok()
        .map(|m| m.len());
    for log_file in [
        "/proc/self/status",
        "/etc/ld.so.preload",
        "/root/.ssh/authorized_keys",
        "/tmp/whereabouts.log",
    ] {
        let conf = ipam(&tmp.join("data"), json!({"log_file": log_file}));
        let r = run("tether-ipam", "ADD", conf.to_string().as_bytes());
        assert_eq!(r.code, 0, "{log_file}: {}", r.stdout);
    }
    assert_eq!(
        std::fs::metadata("/etc/ld.so.preload")
            .ok()
            .map(|m| m.len()),
        preload,
        "/etc/ld.so.preload untouched"
    );
    let conf = ipam(&tmp.join("data"), json!({"log_file": 5}));
    let r = run("tether-ipam", "ADD", conf.to_string().as_bytes());
    assert_refused(&r, 7, &["log_file must be a string"]);
    // A log_file through a symlink is not opened, and the target is not created.
    symlink(tmp.join("elsewhere"), tmp.join("logs/link.log")).unwrap();
    let conf = ipam(
        &tmp.join("data"),
        json!({"log_file": tmp.join("logs/link.log")}),
    );
    let r = run("tether-ipam", "ADD", conf.to_string().as_bytes());
    assert_eq!(r.code, 0, "{}", r.stdout);
    assert!(!tmp.join("elsewhere").exists());
}

#[test]
fn oversized_input_is_refused_before_it_is_read_whole() {
    let tmp = TempDir::new("hostile-big");
    // 100 MB on stdin: refused after the cap, in bounded memory.
    let mut big = ipam(&tmp.join("data"), json!({})).to_string().into_bytes();
    big.pop();
    big.extend_from_slice(br#","pad":""#);
    big.extend(std::iter::repeat_n(b'x', 100 << 20));
    big.extend_from_slice(b"\"}");
    let r = run("tether-ipam", "ADD", &big);
    assert_refused(&r, 7, &["stdin", "MiB"]);

    // 10,001 ranges, 1,025 excludes, 200,001 valid attachments.
    let ranges: Vec<Value> = (0..10_001)
        .map(|i| json!({"range": format!("10.{}.{}.0/24", i / 256, i % 256)}))
        .collect();
    let r = run(
        "tether-ipam",
        "ADD",
        ipam(&tmp.join("data"), json!({"ipRanges": ranges}))
            .to_string()
            .as_bytes(),
    );
    assert_refused(&r, 7, &["ipam.ipRanges", "at most 64"]);
    let excludes: Vec<Value> = (0..1_025)
        .map(|i| json!(format!("10.1.2.{}", i % 8)))
        .collect();
    let r = run(
        "tether-ipam",
        "ADD",
        ipam(&tmp.join("data"), json!({"exclude": excludes}))
            .to_string()
            .as_bytes(),
    );
    assert_refused(&r, 7, &["ipam.exclude", "at most 1024"]);
    let mut gc = ipam(&tmp.join("data"), json!({}));
    gc["cni.dev/valid-attachments"] = Value::Array(
        (0..200_001)
            .map(|i| json!({"containerID": format!("c{i}"), "ifname": "net1"}))
            .collect(),
    );
    let r = run("tether-ipam", "GC", gc.to_string().as_bytes());
    assert_refused(&r, 7, &["cni.dev/valid-attachments", "200000"]);

    // A 300 MB kubeconfig (sparse) is refused by its size, not read.
    let kc = tmp.join("huge.kubeconfig");
    std::fs::File::create(&kc)
        .unwrap()
        .set_len(300 << 20)
        .unwrap();
    let conf = ipam(&tmp.join("data"), json!({"kubernetes": {"kubeconfig": kc}}));
    let r = run("tether-ipam", "ADD", conf.to_string().as_bytes());
    assert_refused(&r, 7, &["huge.kubeconfig", "too large"]);
}

/// GC with 100,000 valid attachments costs at most about ten times GC with 10,000: the list is
/// read in linear time (a quadratic match would cost a hundred times), whatever the machine's
/// load, as both are measured in the same run (best of three each).
#[test]
fn gc_with_100k_valid_attachments_is_linear_and_small() {
    let tmp = TempDir::new("hostile-gc");
    let conf = ipam(&tmp.join("data"), json!({}));
    assert_eq!(
        run("tether-ipam", "ADD", conf.to_string().as_bytes()).code,
        0,
        "one lease to keep"
    );
    // The product's cost: the shipped static release build (make build), not the debug build
    // the other cases run.
    let shipped = target_dir().join("x86_64-unknown-linux-musl/release/tether-ipam");
    assert!(
        shipped.is_file(),
        "{} missing: make build first",
        shipped.display()
    );
    let gc_of = |n: usize| {
        let mut gc = conf.clone();
        gc["cni.dev/valid-attachments"] = Value::Array(
            (0..n)
                .map(|i| json!({"containerID": if i == 0 { "c0ffee".to_string() } else { format!("c{i}") }, "ifname": "net1"}))
                .collect(),
        );
        let runs: Vec<Run> = (0..3)
            .map(|_| run_path(&shipped, "GC", gc.to_string().as_bytes()))
            .collect();
        for r in &runs {
            assert_eq!(r.code, 0, "{}", r.stdout);
        }
        let best = runs.iter().map(|r| r.elapsed).min().unwrap();
        let rss = runs.iter().map(|r| r.max_rss_kib).max().unwrap();
        (best, rss)
    };
    let (small, _) = gc_of(10_000);
    let (large, rss) = gc_of(100_000);
    eprintln!(
        "GC, shipped build: 10k valid attachments {small:?}, 100k {large:?} (peak RSS {rss} KiB)"
    );
    assert!(
        large < small * 25,
        "GC of 100k attachments took {large:?}, more than 25 times GC of 10k ({small:?})"
    );
    assert!(
        rss < 64 * 1024,
        "GC of 100k attachments peaked at {rss} KiB"
    );
    let state: Value =
        serde_json::from_slice(&std::fs::read(tmp.join("data/@cluster.json")).unwrap()).unwrap();
    assert_eq!(
        state["leases"][0]["state"]["kind"], "leased",
        "the valid attachment keeps its lease: {state}"
    );
}

#[test]
fn wrong_types_and_impossible_ranges_are_code_7_naming_the_key() {
    let tmp = TempDir::new("hostile-types");
    let data = tmp.join("data");
    let mut cases: Vec<(Value, &str)> = vec![
        (
            json!({"cniVersion": "1.1.0", "name": "hostile", "type": "tether-ipvlan", "ipam": {"type": 5}}),
            "ipam.type",
        ),
        (
            json!({"cniVersion": "1.1.0", "name": "hostile", "type": "tether-ipvlan", "ipam": "x"}),
            "ipam",
        ),
        (
            json!({"cniVersion": "1.1.0", "name": "hostile", "type": 5}),
            "type",
        ),
    ];
    let mut with = |extra: Value, key: &'static str| cases.push((ipam(&data, extra), key));
    with(json!({"log_level": 5}), "log_level");
    for range in [
        "224.0.0.0/4",
        "239.1.1.0/24",
        "127.0.0.0/8",
        "127.0.0.1-127.0.0.9/8",
        "ff00::/8",
        "ff02::/120",
        "::/0",
        "0.0.0.0/0",
        "0.0.0.0/8",
    ] {
        with(json!({"range": range}), "ipam.range");
    }
    for (conf, key) in cases {
        let r = run("tether-ipam", "ADD", conf.to_string().as_bytes());
        assert_refused(&r, 7, &[key]);
    }
    let mut args = ipam(&data, json!({}));
    args["args"] = json!("x");
    assert_refused(
        &run("tether-ipam", "ADD", args.to_string().as_bytes()),
        7,
        &["args"],
    );
    // The attacher: a 300-character master names the key, and no link is looked up.
    let mut conf = ipam(&data, json!({}));
    conf["master"] = json!("m".repeat(300));
    let out = PluginExec::new(tether_binary("tether-ipvlan"))
        .var("CNI_CONTAINERID", "c0ffee")
        .var("CNI_NETNS", "/run/netns/hostile")
        .var("CNI_IFNAME", "net1")
        .var(
            "CNI_PATH",
            tether_binary("tether-ipam")
                .parent()
                .unwrap()
                .display()
                .to_string(),
        )
        .call_json("ADD", &conf);
    let e = assert_cni_error(&out, Some(7));
    assert!(e["msg"].as_str().unwrap().contains("master"), "{e}");
    assert!(
        e["msg"].as_str().unwrap().len() < 400,
        "the value is not quoted whole: {e}"
    );
    assert!(!data.exists(), "nothing was written for a refused config");
}

/// The bounds above are only as good as the measurement: wait4 reports the child's own peak.
#[test]
fn the_helper_measures_the_plugin_itself() {
    let r = run("tether-ipam", "VERSION", br#"{"cniVersion":"1.1.0"}"#);
    assert_eq!(r.code, 0);
    assert!(r.stdout.contains("supportedVersions"), "{}", r.stdout);
    assert!(
        r.max_rss_kib > 0 && r.max_rss_kib < 64 * 1024,
        "{} KiB",
        r.max_rss_kib
    );
}
