//! Lab tests of `tether-ipvlan` on a real kernel with ipvlan.
//!
//! Run with `conformance/lab/run-tests.sh lab_ipvlan` (boots the lab VM unless
//! the running kernel has ipvlan), four tests at a time (the line below: the VM has two vCPUs, and
//! a test waits for the kernel or a child much of its time; 322 s instead of 360 s with two);
//! `TETHER_LAB_TEST_THREADS=N` runs N.
//!
//! lab-test-threads: 4
//! Ignored by a plain `cargo test`; when run, every test FAILS (never
//! skips) if ipvlan is unavailable.
//!
//! Lifecycle cases go through the real libcni (`target/libcni-driver`, run in
//! the "host" netns like a runtime would); protocol and failure cases exec the
//! plugin directly (CNI_* environment, config on stdin), also in the host netns.
//!
//! Topology, private to each test (so tests run in parallel and can all use
//! the same addresses):
//!
//! ```text
//!   [peer ns] p0 10.1.2.1/24 fd00:1:2::1/64 ==veth== m0 [host ns] --ipvlan--> net1 [pod ns]
//! ```
//!
//! IPAM: see [`IPAM`] — `tether-ipam` (the reference `host-local` before it
//! existed; every test passes with both). Everything IPAM-specific (config,
//! binary, CNI_PATH, lease inspection) is in the "IPAM switch" section below;
//! `TETHER_LAB_IPAM=tether-ipam|host-local` overrides the default for one run.
//! The last section always uses tether-ipam (runtimeConfig.ips, IP=, STATUS
//! and GC through the real IPAM).
//!
//! "Nothing left behind" ([`Lab::assert_unchanged`] + [`assert_no_lease`]) means:
//! the set of link names in the host and pod netns is exactly what it was
//! before the call (so no `net1`, no temporary `tth*` link anywhere), and the
//! IPAM store holds no lease for the attachment.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tether_conformance::{
    CmdOutput, FakeIpam, Libcni, NetNs, PluginExec, TempDir, assert_cni_error, eventually, lab,
    multus_cni_args, reference_plugins_dir, tether_binary, veth_pair,
};

// ---------------------------------------------------------------------------
// IPAM switch: the only place that knows which IPAM plugin the tests use.
// ---------------------------------------------------------------------------

/// Which IPAM plugin tether-ipvlan delegates to in these tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ipam {
    /// The Debian reference `host-local` (CNI ≤ 1.0.0, leases = files in dataDir).
    HostLocal,
    /// `tether-ipam` (CNI ≤ 1.1.0, leases in `<dataDir>/<network>.json`).
    Tether,
}

/// The default (`Ipam::HostLocal` until tether-ipam worked; all tests pass with both).
const IPAM: Ipam = Ipam::Tether;

fn ipam_kind() -> Ipam {
    match std::env::var("TETHER_LAB_IPAM").as_deref() {
        Ok("tether-ipam") => Ipam::Tether,
        Ok("host-local") => Ipam::HostLocal,
        Ok("") | Err(_) => IPAM,
        Ok(other) => panic!("TETHER_LAB_IPAM={other:?}: expected tether-ipam or host-local"),
    }
}

/// The `ipam.type`.
fn ipam_type() -> &'static str {
    match ipam_kind() {
        Ipam::HostLocal => "host-local",
        Ipam::Tether => "tether-ipam",
    }
}

/// The IPAM binary itself (for calling it directly, e.g. to release a lease).
fn ipam_binary() -> PathBuf {
    match ipam_kind() {
        Ipam::HostLocal => reference_plugins_dir().join("host-local"),
        Ipam::Tether => bin_dir().join("tether-ipam"),
    }
}

/// Where the tests take tether-ipvlan and tether-ipam from: a private copy,
/// made once per test process, of the binaries cargo built (or of
/// `$TETHER_BIN_DIR`). Two reasons: other people's `cargo build` replaces
/// `target/debug/*` while a lab run executes them (seen: a SIGSEGV of a
/// binary swapped under the VM's 9p mount), and inside the VM `/tmp` is in
/// RAM, so exec does not page a 170 MB debug binary in over 9p every time.
/// Copies of earlier, finished test processes are removed.
fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = std::env::temp_dir();
        let prefix = "tether-lab-bin-";
        for e in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(prefix)
                && !Path::new("/proc").join(pid).exists()
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let dir = tmp.join(format!("{prefix}{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for b in ["tether-ipvlan", "tether-ipam"] {
            let src = tether_binary(b);
            let tmp = dir.join(format!(".{b}.tmp"));
            std::fs::copy(&src, &tmp)
                .unwrap_or_else(|e| panic!("copying {} to {}: {e}", src.display(), dir.display()));
            std::fs::rename(&tmp, dir.join(b)).unwrap();
        }
        dir
    })
}

/// CNI_PATH: where tether-ipvlan and the IPAM plugin are found.
fn cni_path() -> String {
    format!(
        "{}:{}",
        bin_dir().display(),
        reference_plugins_dir().display()
    )
}

/// Highest config version the IPAM plugin speaks (host-local stops at 1.0.0).
fn versions() -> &'static [&'static str] {
    match ipam_kind() {
        Ipam::HostLocal => &["0.3.0", "0.3.1", "0.4.0", "1.0.0"],
        Ipam::Tether => &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"],
    }
}

/// The `ipam` section: one address per entry of `ranges`, each written
/// whereabouts-style `first-last/prefix` (e.g. `10.1.2.10-10.1.2.50/24`),
/// plus static `routes` (dst, gw), with its store in `data_dir`.
fn ipam(ranges: &[&str], routes: &[(&str, &str)], data_dir: &Path) -> Value {
    let routes: Vec<Value> = routes
        .iter()
        .map(|(dst, gw)| json!({"dst": dst, "gw": gw}))
        .collect();
    match ipam_kind() {
        Ipam::HostLocal => {
            let sets: Vec<Value> = ranges
                .iter()
                .map(|r| {
                    let (first, last, prefix) = split_range(r);
                    json!([{
                        "subnet": format!("{}/{prefix}", network_of(first, prefix)),
                        "rangeStart": first.to_string(),
                        "rangeEnd": last.to_string(),
                    }])
                })
                .collect();
            let mut v = json!({"type": "host-local", "ranges": sets, "dataDir": data_dir});
            if !routes.is_empty() {
                v["routes"] = Value::Array(routes);
            }
            v
        }
        Ipam::Tether => {
            let mut v = json!({
                "type": "tether-ipam",
                "range": ranges[0],
                "dataDir": data_dir,
                // Tests reuse addresses at once (ADD -> DEL -> ADD, exhaustion).
                "cooldown_s": 0,
            });
            if ranges.len() > 1 {
                v["ipRanges"] = ranges[1..].iter().map(|r| json!({"range": r})).collect();
            }
            if !routes.is_empty() {
                v["routes"] = Value::Array(routes);
            }
            v
        }
    }
}

/// One lease as the IPAM store shows it.
#[derive(Debug, Clone, PartialEq)]
struct Lease {
    ip: IpAddr,
    container_id: String,
    ifname: String,
}

/// Every live lease in `data_dir` (all networks), in either store layout
/// (so a test may use tether-ipam explicitly whatever [`IPAM`] says):
/// - host-local: `<dataDir>/<network>/<ip>` holding `<containerID>\r\n<ifname>`;
/// - tether-ipam: `<dataDir>/<stem>.json` = `{"leases": [{address, container_id,
///   ifname, state: {kind}}]}`, live = kind `leased`.
fn leases(data_dir: &Path) -> Vec<Lease> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(data_dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            for f in std::fs::read_dir(&path).unwrap().flatten() {
                let Ok(ip) = f.file_name().to_string_lossy().parse::<IpAddr>() else {
                    continue; // lock, last_reserved_ip.N
                };
                let text = std::fs::read_to_string(f.path()).unwrap_or_default();
                let mut lines = text.lines().map(str::trim);
                out.push(Lease {
                    ip,
                    container_id: lines.next().unwrap_or_default().to_string(),
                    ifname: lines.next().unwrap_or_default().to_string(),
                });
            }
        } else if path.extension().is_some_and(|x| x == "json") {
            let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap())
                .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
            for l in v["leases"].as_array().into_iter().flatten() {
                if l["state"]["kind"] != "leased" {
                    continue;
                }
                out.push(Lease {
                    ip: l["address"].as_str().unwrap().parse().unwrap(),
                    container_id: l["container_id"].as_str().unwrap_or_default().into(),
                    ifname: l["ifname"].as_str().unwrap_or_default().into(),
                });
            }
        }
    }
    out
}

/// Addresses leased to (container_id, ifname).
fn leased_to(data_dir: &Path, container_id: &str, ifname: &str) -> Vec<IpAddr> {
    leases(data_dir)
        .into_iter()
        .filter(|l| l.container_id == container_id && l.ifname == ifname)
        .map(|l| l.ip)
        .collect()
}

/// No lease held by `container_id` (any ifname).
#[track_caller]
fn assert_no_lease(data_dir: &Path, container_id: &str) {
    let held: Vec<_> = leases(data_dir)
        .into_iter()
        .filter(|l| l.container_id == container_id)
        .collect();
    assert!(
        held.is_empty(),
        "leases still held by {container_id}: {held:?}"
    );
}

// ---------------------------------------------------------------------------
// Range text helpers (only the host-local translation needs them).
// ---------------------------------------------------------------------------

fn split_range(r: &str) -> (IpAddr, IpAddr, u8) {
    let (span, prefix) = r.rsplit_once('/').expect("first-last/prefix");
    let (first, last) = span.split_once('-').expect("first-last/prefix");
    (
        first.parse().unwrap(),
        last.parse().unwrap(),
        prefix.parse().unwrap(),
    )
}

fn network_of(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let mask = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix)
            };
            IpAddr::V4((u32::from(v4) & mask).into())
        }
        IpAddr::V6(v6) => {
            let mask = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - prefix)
            };
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

// ---------------------------------------------------------------------------
// Lab topology and attachments.
// ---------------------------------------------------------------------------

const RANGE4: &str = "10.1.2.10-10.1.2.50/24";
const RANGE6: &str = "fd00:1:2::10-fd00:1:2::50/64";
const PEER4: &str = "10.1.2.1";
const PEER6: &str = "fd00:1:2::1";
const NET: &str = "tnet";

/// Fails the test (once per process, cached) unless ipvlan works here.
fn require_ipvlan() {
    static OK: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(why) = OK.get_or_init(lab::ipvlan_available) {
        panic!(
            "needs a kernel with ipvlan; {} cannot: {why}; run conformance/lab/run-tests.sh lab_ipvlan",
            lab::kernel_release()
        );
    }
}

/// host ns (master m0) <-veth-> peer ns (p0 with PEER4/PEER6); pod ns empty.
struct Lab {
    host: NetNs,
    peer: NetNs,
    pod: NetNs,
    /// IPAM store (dataDir) of this test.
    data: TempDir,
}

/// The link names of the host and pod netns at one moment.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    host: Vec<String>,
    pod: Vec<String>,
}

fn link_names(ns: &NetNs) -> Vec<String> {
    let mut v: Vec<String> = ns
        .ip_json(&["link", "show"])
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["ifname"].as_str().map(str::to_string))
        .collect();
    v.sort();
    v
}

impl Lab {
    fn new(tag: &str) -> Lab {
        require_ipvlan();
        let host = NetNs::new(&format!("{tag}-h"));
        let peer = NetNs::new(&format!("{tag}-x"));
        let pod = NetNs::new(&format!("{tag}-p"));
        veth_pair(&host, "m0", &peer, "p0");
        peer.addr_add("p0", &format!("{PEER4}/24"));
        peer.ip_ok(&["addr", "add", &format!("{PEER6}/64"), "dev", "p0", "nodad"]);
        Lab {
            host,
            peer,
            pod,
            data: TempDir::new("ipam"),
        }
    }

    fn snapshot(&self) -> Snapshot {
        self.snapshot_of(&self.pod)
    }

    fn snapshot_of(&self, pod: &NetNs) -> Snapshot {
        Snapshot {
            host: link_names(&self.host),
            pod: link_names(pod),
        }
    }

    /// The host and pod netns have exactly the links of `before`.
    #[track_caller]
    fn assert_unchanged(&self, before: &Snapshot) {
        self.assert_unchanged_of(&self.pod, before);
    }

    #[track_caller]
    fn assert_unchanged_of(&self, pod: &NetNs, before: &Snapshot) {
        let now = self.snapshot_of(pod);
        assert_eq!(now, *before, "links changed (left behind or removed)");
        for n in now.host.iter().chain(&now.pod) {
            assert!(!n.starts_with("tth"), "temporary link {n} left behind");
        }
    }

    /// The tether-ipvlan config: l2 on m0, IPAM over RANGE4, then `overrides`
    /// merged in (a `null` value removes the key).
    fn conf(&self, version: &str, overrides: Value) -> Value {
        let mut c = json!({
            "cniVersion": version,
            "name": NET,
            "type": "tether-ipvlan",
            "master": "m0",
            "mode": "l2",
            "ipam": ipam(&[RANGE4], &[], self.data.path()),
        });
        merge(&mut c, overrides);
        c
    }

    /// A direct-exec attachment of `conf` to the pod as net1, run in the host ns.
    fn att(&self, conf: Value) -> Att {
        self.att_in(&self.pod, conf)
    }

    fn att_in(&self, pod: &NetNs, conf: Value) -> Att {
        let cid = format!("c{}", tether_conformance::paths::unique_token());
        let exec = PluginExec::new(bin_dir().join("tether-ipvlan"))
            .run_in(&self.host)
            .var("CNI_CONTAINERID", &cid)
            .var("CNI_NETNS", pod.path().to_str().unwrap())
            .var("CNI_IFNAME", "net1")
            .var("CNI_PATH", cni_path())
            .var("CNI_ARGS", pod_args(&cid));
        Att { exec, conf, cid }
    }

    /// A libcni-driven attachment: conflist `{cniVersion, name, plugins:[plugin]}`
    /// (the plugin entry has no name: libcni injects it), ifname net1,
    /// Multus-shaped CNI_ARGS, driver run in the host ns.
    fn libcni(&self, plugin: &Value) -> Libcni {
        let mut p = plugin.clone();
        let obj = p.as_object_mut().unwrap();
        let version = obj.remove("cniVersion").unwrap_or(json!("1.0.0"));
        let name = obj.remove("name").unwrap_or(json!(NET));
        let cid = format!("c{}", tether_conformance::paths::unique_token());
        Libcni::new(&json!({"cniVersion": version, "name": name, "plugins": [p]}))
            .cni_path(cni_path())
            .run_in(&self.host)
            .ifname("net1")
            .container_id(&cid)
            .cni_args(pod_args(&cid))
    }

    /// A second master m1 <-veth-> p1 (peer: 192.168.100.1/24).
    fn add_second_master(&self) {
        veth_pair(&self.host, "m1", &self.peer, "p1");
        self.peer.addr_add("p1", "192.168.100.1/24");
    }
}

/// Multus-shaped CNI_ARGS for a pod of its own: every attachment in these
/// tests is a different pod (same namespace/name/UID would be one pod whose
/// sandbox was re-created, which an IPAM may treat as the same owner).
fn pod_args(cid: &str) -> String {
    multus_cni_args("ns", &format!("pod-{cid}"), cid, &format!("uid-{cid}"))
}

/// Merges `over` into `base`: objects recursively, `null` deletes.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                if v.is_null() {
                    b.remove(&k);
                } else if let (Some(bv @ Value::Object(_)), Value::Object(_)) = (b.get_mut(&k), &v)
                {
                    merge(bv, v);
                } else {
                    b.insert(k, v);
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// One attachment driven by direct exec.
struct Att {
    exec: PluginExec,
    conf: Value,
    cid: String,
}

impl Att {
    fn var(mut self, k: &str, v: impl Into<String>) -> Self {
        self.exec = self.exec.var(k, v);
        self
    }
    fn unset(mut self, k: &str) -> Self {
        self.exec = self.exec.unset(k);
        self
    }
    fn call(&self, verb: &str, conf: &Value) -> CmdOutput {
        self.exec.call_json(verb, conf)
    }
    fn add(&self) -> CmdOutput {
        self.call("ADD", &self.conf)
    }
    /// ADD that must succeed; returns the Result.
    #[track_caller]
    fn add_ok(&self) -> Value {
        let out = self.add();
        out.assert_success();
        out.json()
    }
    fn del(&self) -> CmdOutput {
        self.call("DEL", &self.conf)
    }
    fn with_prev(&self, prev: &Value) -> Value {
        let mut c = self.conf.clone();
        c["prevResult"] = prev.clone();
        c
    }
    fn del_with(&self, prev: &Value) -> CmdOutput {
        self.call("DEL", &self.with_prev(prev))
    }
    fn check(&self, prev: &Value) -> CmdOutput {
        self.call("CHECK", &self.with_prev(prev))
    }
    /// The same call, made to the IPAM plugin itself (same env and stdin).
    fn ipam_call(&self, verb: &str) -> CmdOutput {
        self.exec
            .with_binary(ipam_binary())
            .call_json(verb, &self.conf)
    }
}

/// Success with nothing on stdout (DEL, CHECK, STATUS, GC).
#[track_caller]
fn assert_silent_ok(out: &CmdOutput) {
    out.assert_success();
    assert!(out.stdout.trim().is_empty(), "stdout not empty: {out}");
}

fn ips_of(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .unwrap_or_else(|| panic!("no ips in {result}"))
        .iter()
        .map(|i| i["address"].as_str().unwrap().to_string())
        .collect()
}

fn bare(cidr: &str) -> &str {
    cidr.split('/').next().unwrap()
}

/// `cat /proc/sys/net/<family>/conf/<ifname>/<key>` inside `ns`.
fn sysctl(ns: &NetNs, family: &str, ifname: &str, key: &str) -> String {
    let p = format!("/proc/sys/net/{family}/conf/{ifname}/{key}");
    ns.exec_ok("cat", &[&p]).stdout.trim().to_string()
}

/// Main-table routes in `ns` not installed by the kernel (connected routes
/// and fe80::/64 are `proto kernel`), as (dst, gateway).
fn static_routes(ns: &NetNs) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for fam in ["-4", "-6"] {
        let v = ns.ip_json(&[fam, "route", "show", "table", "main"]);
        for r in v.as_array().unwrap() {
            if r["protocol"] == "kernel" {
                continue;
            }
            out.push((
                r["dst"].as_str().unwrap_or_default().to_string(),
                r["gateway"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    out.sort();
    out
}

fn flags(link: &Value) -> Vec<String> {
    link["flags"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f.as_str().map(str::to_string))
        .collect()
}

/// The result of an ADD on `pod` has net1 as its one interface with the
/// master's MAC and the pod as sandbox, and every IP points at it.
#[track_caller]
fn assert_result_shape(res: &Value, lab: &Lab, pod: &NetNs, master: &str) {
    let ifaces = res["interfaces"].as_array().expect("interfaces");
    assert_eq!(ifaces.len(), 1, "exactly one interface: {res}");
    let i = &ifaces[0];
    assert_eq!(i["name"], "net1", "{res}");
    let mac = lab.host.link(master).unwrap()["address"].clone();
    assert_eq!(i["mac"], mac, "mac is the master's: {res}");
    assert_eq!(i["sandbox"], pod.path().to_str().unwrap(), "{res}");
    for ip in res["ips"].as_array().expect("ips") {
        assert_eq!(ip["interface"], 0, "ips[].interface: {res}");
    }
}

/// In `pod`, net1 is an ipvlan in `mode` whose parent is the host's `master`,
/// UP, carrying exactly `addrs`.
#[track_caller]
fn assert_link(lab: &Lab, pod: &NetNs, master: &str, mode: &str, addrs: &[String]) {
    let link = pod.link("net1").expect("net1 missing in the pod netns");
    assert_eq!(link["linkinfo"]["info_kind"], "ipvlan", "{link:#}");
    assert_eq!(link["linkinfo"]["info_data"]["mode"], mode, "{link:#}");
    assert_eq!(
        link["link_index"],
        lab.host.link(master).unwrap()["ifindex"],
        "parent is not {master}: {link:#}"
    );
    assert!(
        link.get("link_netnsid").is_some(),
        "the parent should be in another netns: {link:#}"
    );
    assert!(flags(&link).iter().any(|f| f == "UP"), "not UP: {link:#}");
    let mut have = pod.addrs("net1");
    have.sort();
    let mut want = addrs.to_vec();
    want.sort();
    assert_eq!(have, want, "addresses on net1");
}

// ---------------------------------------------------------------------------
// ADD: result and link, per mode
// ---------------------------------------------------------------------------

/// libcni ADD in `mode`, with IPAM routes and plugin dns; checks the Result
/// and the link; returns (lab, libcni, result).
fn add_in_mode(mode: &str) -> (Lab, Libcni, Value) {
    let lab = Lab::new(&format!("mode{mode}"));
    let dns =
        json!({"nameservers": ["10.1.2.53"], "domain": "gpu.example", "search": ["gpu.example"]});
    let plugin = lab.conf(
        "1.0.0",
        json!({
            "mode": mode,
            "dns": dns,
            "ipam": ipam(&[RANGE4], &[("10.9.0.0/16", PEER4)], lab.data.path()),
        }),
    );
    let net = lab.libcni(&plugin);
    let out = net.add(&lab.pod.path());
    out.assert_success();
    let res = out.json();
    assert_eq!(res["cniVersion"], "1.0.0", "{out}");
    assert_result_shape(&res, &lab, &lab.pod, "m0");
    let ips = ips_of(&res);
    assert_eq!(ips.len(), 1, "{res}");
    assert!(
        ips[0].starts_with("10.1.2.") && ips[0].ends_with("/24"),
        "{res}"
    );
    assert_eq!(
        res["routes"],
        json!([{"dst": "10.9.0.0/16", "gw": PEER4}]),
        "routes as IPAM returned them"
    );
    assert_eq!(res["dns"], dns, "dns as configured");

    assert_link(&lab, &lab.pod, "m0", mode, &ips);
    assert!(!lab.host.has_link("net1"));
    assert_eq!(
        static_routes(&lab.pod),
        vec![("10.9.0.0/16".to_string(), PEER4.to_string())],
        "routes in the pod"
    );
    assert_eq!(sysctl(&lab.pod, "ipv4", "net1", "arp_notify"), "1");
    assert_eq!(sysctl(&lab.pod, "ipv6", "net1", "ndisc_notify"), "1");
    assert_eq!(
        leased_to(lab.data.path(), net.container_id_value(), "net1"),
        vec![bare(&ips[0]).parse::<IpAddr>().unwrap()]
    );
    (lab, net, res)
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item11_12_add_l2_result_link_sysctls_and_ping_peer() {
    let (lab, net, res) = add_in_mode("l2");
    let ip = bare(res["ips"][0]["address"].as_str().unwrap()).to_string();
    lab.pod.ping(PEER4, 2).assert_success();
    lab.peer.ping(&ip, 1).assert_success();
    net.check(&lab.pod.path()).assert_success();
    net.del(&lab.pod.path()).assert_success();
    assert!(!lab.pod.has_link("net1"));
    assert_no_lease(lab.data.path(), net.container_id_value());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item12_add_l3_creates_l3_mode_link() {
    let (lab, net, _) = add_in_mode("l3");
    net.check(&lab.pod.path()).assert_success();
    net.del(&lab.pod.path()).assert_success();
    assert!(!lab.pod.has_link("net1"));
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item12_add_l3s_creates_l3s_mode_link() {
    let (lab, net, _) = add_in_mode("l3s");
    net.check(&lab.pod.path()).assert_success();
    net.del(&lab.pod.path()).assert_success();
    assert!(!lab.pod.has_link("net1"));
}

// ---------------------------------------------------------------------------
// MTU
// ---------------------------------------------------------------------------

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item13_mtu_set_is_the_link_mtu() {
    let lab = Lab::new("mtuset");
    let a = lab.att(lab.conf("1.0.0", json!({"mtu": 1400})));
    a.add_ok();
    assert_eq!(lab.pod.link("net1").unwrap()["mtu"], 1400);
    // (Interface `mtu` in the Result is a CNI 1.1.0 field: see result_layout_*.)
    assert_silent_ok(&a.del());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item13_mtu_omitted_inherits_the_masters() {
    let lab = Lab::new("mtuinh");
    lab.host.ip_ok(&["link", "set", "m0", "mtu", "9000"]);
    let a = lab.att(lab.conf("1.0.0", json!({})));
    a.add_ok();
    assert_eq!(lab.pod.link("net1").unwrap()["mtu"], 9000);
    assert_silent_ok(&a.del());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item13_mtu_above_the_masters_is_code_7_without_side_effects() {
    let lab = Lab::new("mtubig");
    let before = lab.snapshot();
    let a = lab.att(lab.conf("1.0.0", json!({"mtu": 9000})));
    let e = assert_cni_error(&a.add(), Some(7));
    assert!(e["msg"].as_str().unwrap().contains("9000"), "{e}");
    lab.assert_unchanged(&before);
    assert_no_lease(lab.data.path(), &a.cid);
}

// ---------------------------------------------------------------------------
// Master selection
// ---------------------------------------------------------------------------

/// m9 <-> p9 with the host's default route on m9 (m0 stays, without one).
fn add_default_route_master(lab: &Lab) {
    veth_pair(&lab.host, "m9", &lab.peer, "p9");
    lab.host.ip_ok(&["route", "add", "default", "dev", "m9"]);
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item14_master_omitted_uses_the_default_route_interface() {
    let lab = Lab::new("defmaster");
    add_default_route_master(&lab);
    let a = lab.att(lab.conf("1.0.0", json!({"master": null})));
    let res = a.add_ok();
    assert_result_shape(&res, &lab, &lab.pod, "m9");
    assert_link(&lab, &lab.pod, "m9", "l2", &ips_of(&res));
    // CHECK resolves the master the same way.
    assert_silent_ok(&a.check(&res));
    assert_silent_ok(&a.del());
    assert!(!lab.pod.has_link("net1"));
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item14_master_omitted_without_default_route_fails_before_side_effects() {
    let lab = Lab::new("nodefault");
    let before = lab.snapshot();
    let a = lab.att(lab.conf("1.0.0", json!({"master": null})));
    let e = assert_cni_error(&a.add(), Some(7));
    assert!(e["msg"].as_str().unwrap().contains("default route"), "{e}");
    lab.assert_unchanged(&before);
    assert_no_lease(lab.data.path(), &a.cid);
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item15_link_in_container_uses_a_master_inside_the_pod() {
    let lab = Lab::new("linkin");
    // The master lives in the pod (as after an SR-IOV VF was moved there).
    veth_pair(&lab.pod, "pm0", &lab.peer, "pp0");
    lab.peer.addr_add("pp0", "10.1.3.1/24");
    let host_before = link_names(&lab.host);
    let a = lab.att(lab.conf(
        "1.0.0",
        json!({"master": "pm0", "linkInContainer": true,
               "ipam": ipam(&["10.1.3.10-10.1.3.50/24"], &[], lab.data.path())}),
    ));
    let res = a.add_ok();
    let link = lab.pod.link("net1").expect("net1 in the pod");
    assert_eq!(link["linkinfo"]["info_kind"], "ipvlan");
    assert_eq!(link["link"], "pm0", "parent is the pod's pm0: {link:#}");
    assert!(link.get("link_netnsid").is_none(), "{link:#}");
    assert_eq!(
        res["interfaces"][0]["mac"],
        lab.pod.link("pm0").unwrap()["address"]
    );
    assert_eq!(link_names(&lab.host), host_before, "host netns touched");
    lab.pod.ping("10.1.3.1", 2).assert_success();
    assert_silent_ok(&a.check(&res));
    assert_silent_ok(&a.del());
    assert!(!lab.pod.has_link("net1") && lab.pod.has_link("pm0"));
    assert_no_lease(lab.data.path(), &a.cid);
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item16_chained_without_ipam_uses_prev_result_ips_and_interface() {
    let lab = Lab::new("chained");
    let prev = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "m0"}],
        "ips": [{"address": "10.1.2.88/24", "interface": 0}],
    });
    let a = lab.att(lab.conf("1.0.0", json!({"master": null, "ipam": null})));
    let out = a.call("ADD", &a.with_prev(&prev));
    out.assert_success();
    let res = out.json();
    assert_result_shape(&res, &lab, &lab.pod, "m0");
    assert_eq!(ips_of(&res), vec!["10.1.2.88/24"]);
    assert_link(&lab, &lab.pod, "m0", "l2", &["10.1.2.88/24".into()]);
    lab.pod.ping(PEER4, 2).assert_success();
    assert_silent_ok(&a.check(&res));
    assert_silent_ok(&a.del_with(&res));
    assert!(!lab.pod.has_link("net1"));
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item16_chained_with_two_interfaces_and_no_master_is_code_7() {
    let lab = Lab::new("chained2");
    lab.add_second_master();
    let before = lab.snapshot();
    let prev = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "m0"}, {"name": "m1"}],
        "ips": [{"address": "10.1.2.88/24", "interface": 0}],
    });
    let a = lab.att(lab.conf("1.0.0", json!({"master": null, "ipam": null})));
    assert_cni_error(&a.call("ADD", &a.with_prev(&prev)), Some(7));
    lab.assert_unchanged(&before);
}

// ---------------------------------------------------------------------------
// Config failures: nothing created, IPAM not called
// ---------------------------------------------------------------------------

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item17_no_ipam_and_no_prev_result_is_code_7_without_link() {
    let lab = Lab::new("noipam");
    let before = lab.snapshot();
    let a = lab.att(lab.conf("1.0.0", json!({"ipam": null})));
    let e = assert_cni_error(&a.add(), Some(7));
    assert!(e["msg"].as_str().unwrap().contains("ipam"), "{e}");
    lab.assert_unchanged(&before);
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item18_nonexistent_master_fails_without_side_effects_or_ipam_call() {
    let lab = Lab::new("nomaster");
    let fake = FakeIpam::new("fake-ipam");
    let before = lab.snapshot();
    let a = lab
        .att(lab.conf(
            "1.0.0",
            json!({"master": "nosuch0", "ipam": {"type": fake.name()}}),
        ))
        .var("CNI_PATH", fake.dir().to_str().unwrap());
    let e = assert_cni_error(&a.add(), None);
    assert!(e["msg"].as_str().unwrap().contains("nosuch0"), "{e}");
    lab.assert_unchanged(&before);
    assert!(
        fake.verbs().is_empty(),
        "IPAM was called: {:?}",
        fake.verbs()
    );
    // Same with the real IPAM: nothing leased.
    let a = lab.att(lab.conf("1.0.0", json!({"master": "nosuch0"})));
    assert_cni_error(&a.add(), None);
    lab.assert_unchanged(&before);
    assert!(leases(lab.data.path()).is_empty());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item19_unknown_mode_is_code_7_without_side_effects() {
    let lab = Lab::new("badmode");
    let before = lab.snapshot();
    let a = lab.att(lab.conf("1.0.0", json!({"mode": "l4"})));
    let e = assert_cni_error(&a.add(), Some(7));
    assert!(e["msg"].as_str().unwrap().contains("l4"), "{e}");
    lab.assert_unchanged(&before);
    assert!(leases(lab.data.path()).is_empty());
}

/// Waits until no tether-ipam runs for `cid` any more: an ADD killed while its IPAM ran leaves
/// that child to finish by itself (it was not ours to kill: the runtime kills one process).
fn wait_for_orphans(cid: &str) {
    let needle = format!("CNI_CONTAINERID={cid}");
    let running = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                std::fs::read(e.path().join("environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
                    && std::fs::read_link(e.path().join("exe"))
                        .is_ok_and(|x| x.ends_with("tether-ipam"))
            })
    };
    let t = Instant::now();
    while running() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "tether-ipam of {cid} still running"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 22: an ADD killed (SIGKILL, as a runtime's timeout or the OOM killer would) right after
/// each of its steps leaves something in the pod; the DEL the runtime sends next removes all of
/// it: the link under its temporary name, a renamed net1 with or without addresses, the lease.
/// And an ADD retried without a DEL in between replaces the link a killed one left.
#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn killed_add_at_every_step_then_del_leaves_nothing() {
    use std::os::unix::process::ExitStatusExt;
    let lab = Lab::new("killed");
    let before = lab.snapshot();
    for step in ["create", "rename", "ipam", "configure"] {
        let a = lab.att(lab.conf("1.1.0", json!({})));
        let out = a
            .exec
            .clone()
            .var("TETHER_TEST_KILL_AFTER", step)
            .call_json("ADD", &a.conf);
        assert_eq!(
            out.status.signal(),
            Some(9),
            "ADD killed after {step}: {out}"
        );
        wait_for_orphans(&a.cid);
        let left = link_names(&lab.pod);
        // Before the rename the link has tether's temporary name (tth + 12 hex digits).
        let expected = if step == "create" { "tth" } else { "net1" };
        assert!(
            left.iter().any(|n| n.starts_with(expected)),
            "after a kill at {step}, {expected} is in the pod: {left:?}"
        );
        if step != "create" && step != "rename" {
            assert!(
                !leased_to(lab.data.path(), &a.cid, "net1").is_empty(),
                "after a kill at {step} the lease is held"
            );
        }
        assert_silent_ok(&a.del());
        lab.assert_unchanged(&before);
        assert_no_lease(lab.data.path(), &a.cid);
    }
    // A retry of the ADD, no DEL in between: the killed one's temporary link is replaced.
    let a = lab.att(lab.conf("1.1.0", json!({})));
    let out = a
        .exec
        .clone()
        .var("TETHER_TEST_KILL_AFTER", "create")
        .call_json("ADD", &a.conf);
    assert_eq!(out.status.signal(), Some(9), "{out}");
    wait_for_orphans(&a.cid);
    a.add_ok();
    assert!(
        link_names(&lab.pod).iter().all(|n| !n.starts_with("tth")),
        "{:?}",
        link_names(&lab.pod)
    );
    assert_silent_ok(&a.del());
    lab.assert_unchanged(&before);
    assert_no_lease(lab.data.path(), &a.cid);
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item20_ifname_already_in_the_pod_fails_leaving_nothing() {
    let lab = Lab::new("ifexists");
    lab.pod.ip_ok(&[
        "link", "add", "net1", "type", "veth", "peer", "name", "other0",
    ]);
    let before = lab.snapshot();
    let a = lab.att(lab.conf("1.0.0", json!({})));
    let e = assert_cni_error(&a.add(), None);
    assert!(e["msg"].as_str().unwrap().contains("net1"), "{e}");
    lab.assert_unchanged(&before);
    assert_eq!(
        lab.pod.link("net1").unwrap()["linkinfo"]["info_kind"],
        "veth",
        "the existing net1 was replaced"
    );
    assert_no_lease(lab.data.path(), &a.cid);
    // The DEL that follows a failed ADD leaves the foreign net1 alone.
    assert_silent_ok(&a.del());
    assert!(lab.pod.has_link("net1"));
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item21_ifname_equal_to_a_host_interface_name_succeeds() {
    let lab = Lab::new("hostname");
    let a = lab
        .att(lab.conf("1.0.0", json!({})))
        .var("CNI_IFNAME", "m0");
    let res = a.add_ok();
    assert_eq!(res["interfaces"][0]["name"], "m0");
    let link = lab.pod.link("m0").expect("m0 in the pod");
    assert_eq!(link["linkinfo"]["info_kind"], "ipvlan");
    assert_eq!(link["link_index"], lab.host.link("m0").unwrap()["ifindex"]);
    assert_eq!(
        lab.host.link("m0").unwrap()["linkinfo"]["info_kind"],
        "veth",
        "host's m0 untouched"
    );
    lab.pod.ping(PEER4, 1).assert_success();
    assert_silent_ok(&a.check(&res));
    assert_silent_ok(&a.del());
    assert!(!lab.pod.has_link("m0") && lab.host.has_link("m0"));
}

// ---------------------------------------------------------------------------
// IPAM failures: link removed, lease released
// ---------------------------------------------------------------------------

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item22_ipam_exhausted_fails_with_ipam_error_and_rolls_back() {
    let lab = Lab::new("exhaust");
    let conf = lab.conf(
        "1.0.0",
        json!({"ipam": ipam(&["10.1.2.10-10.1.2.10/24"], &[], lab.data.path())}),
    );
    let first = lab.att(conf.clone());
    first.add_ok();
    let pod2 = NetNs::new("exhaust-p2");
    let before = lab.snapshot_of(&pod2);
    let second = lab.att_in(&pod2, conf);
    let e = assert_cni_error(&second.add(), None);
    lab.assert_unchanged_of(&pod2, &before);
    assert_no_lease(lab.data.path(), &second.cid);
    // What the IPAM says for the same request, word for word.
    let direct = second.ipam_call("ADD");
    let want = assert_cni_error(&direct, None);
    assert_eq!(e["code"], want["code"], "code not preserved");
    assert_eq!(e["msg"], want["msg"], "message not preserved");
    // The DEL that follows (Multus rollback) succeeds and spares the other lease.
    assert_silent_ok(&second.del());
    assert_eq!(leased_to(lab.data.path(), &first.cid, "net1").len(), 1);
    assert_silent_ok(&first.del());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item23_ipam_binary_missing_fails_and_removes_the_link() {
    let lab = Lab::new("ipammiss");
    let empty = TempDir::new("emptypath");
    let before = lab.snapshot();
    let a = lab
        .att(lab.conf("1.0.0", json!({})))
        .var("CNI_PATH", empty.path().to_str().unwrap());
    let e = assert_cni_error(&a.add(), None);
    assert!(e["msg"].as_str().unwrap().contains(ipam_type()), "{e}");
    lab.assert_unchanged(&before);
    assert!(leases(lab.data.path()).is_empty());
}

/// ADD through a fake IPAM answering ADD with `add_answer`: fails, IPAM DEL
/// follows the IPAM ADD, and nothing is left.
fn assert_ipam_answer_rolled_back(tag: &str, add_answer: Value) -> Value {
    assert_ipam_rolled_back(tag, FakeIpam::print(&add_answer))
}

/// ADD through a fake IPAM answering ADD with the shell `add_snippet`: fails,
/// IPAM DEL follows the IPAM ADD, and nothing is left.
fn assert_ipam_rolled_back(tag: &str, add_snippet: String) -> Value {
    let lab = Lab::new(tag);
    let fake = FakeIpam::new("fake-ipam").answer("ADD", add_snippet);
    let before = lab.snapshot();
    let a = lab
        .att(lab.conf("1.0.0", json!({"ipam": {"type": fake.name()}})))
        .var("CNI_PATH", fake.dir().to_str().unwrap());
    let e = assert_cni_error(&a.add(), None);
    lab.assert_unchanged(&before);
    assert_eq!(fake.verbs(), ["ADD", "DEL"], "IPAM DEL must follow: {e}");
    let del = &fake.calls()[1];
    assert_eq!(
        (del.container_id.as_str(), del.ifname.as_str()),
        (a.cid.as_str(), "net1")
    );
    e
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item24_ipam_returning_zero_ips_fails_calls_ipam_del_and_removes_link() {
    assert_ipam_answer_rolled_back("zeroips", json!({"cniVersion": "1.0.0", "ips": []}));
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn address_add_failure_rolls_back_link_and_lease() {
    // The same address twice: the kernel refuses the second (EEXIST).
    assert_ipam_answer_rolled_back(
        "dupaddr",
        json!({"cniVersion": "1.0.0",
               "ips": [{"address": "10.1.2.77/24"}, {"address": "10.1.2.77/24"}]}),
    );
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn route_add_failure_rolls_back_link_and_lease() {
    // A gateway that is not on any connected network: ENETUNREACH.
    assert_ipam_answer_rolled_back(
        "badroute",
        json!({"cniVersion": "1.0.0",
               "ips": [{"address": "10.1.2.77/24"}],
               "routes": [{"dst": "10.9.0.0/16", "gw": "192.168.99.1"}]}),
    );
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn ipam_failing_after_printing_its_result_rolls_back_link_and_lease() {
    // tether-ipvlan acts on the Result at EOF and checks the exit status after
    // configuring the link: a nonzero status still undoes everything.
    let add =
        FakeIpam::print(&json!({"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.77/24"}]}));
    let e = assert_ipam_rolled_back(
        "failafter",
        format!("{add}; exec >&- 2>&-; sleep 0.2; exit 4"),
    );
    assert!(e["msg"].as_str().unwrap().contains("exit status: 4"), "{e}");
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn ipam_result_is_used_as_soon_as_the_ipam_closes_its_output() {
    // The fake IPAM prints its Result, closes its output, and exits only once
    // it sees its address on the pod's interface (or gives up after 20 s and
    // fails): an attacher that waited for the IPAM's exit would fail here.
    let lab = Lab::new("earlyres");
    let add =
        FakeIpam::print(&json!({"cniVersion": "1.0.0", "ips": [{"address": "10.1.2.77/24"}]}));
    let wait = r#"exec >&- 2>&-
i=0
until nsenter --net="$CNI_NETNS" ip -o addr show dev "$CNI_IFNAME" 2>/dev/null | grep -q ' 10.1.2.77/'; do
  i=$((i + 1)); [ $i -lt 200 ] || exit 7; sleep 0.1
done
exit 0"#;
    let fake = FakeIpam::new("fake-ipam").answer("ADD", format!("{add}\n{wait}"));
    let a = lab
        .att(lab.conf("1.0.0", json!({"ipam": {"type": fake.name()}})))
        .var("CNI_PATH", fake.dir().to_str().unwrap());
    let out = a.add_ok();
    assert_eq!(out["ips"][0]["address"], "10.1.2.77/24", "{out}");
    assert_eq!(fake.verbs(), ["ADD"]);
    assert_silent_ok(&a.del());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn ipv6_address_failing_dad_rolls_back_link_and_lease() {
    // IPAM hands out the peer's own IPv6 address: the peer defends it, the
    // kernel marks it dadfailed, ADD must fail and undo everything.
    let lab = Lab::new("dadfail");
    let fake = FakeIpam::new("fake-ipam").answer(
        "ADD",
        FakeIpam::print(&json!({"cniVersion": "1.0.0",
                                "ips": [{"address": format!("{PEER6}/64")}]})),
    );
    let before = lab.snapshot();
    let a = lab
        .att(lab.conf("1.0.0", json!({"ipam": {"type": fake.name()}})))
        .var("CNI_PATH", fake.dir().to_str().unwrap());
    let e = assert_cni_error(&a.add(), None);
    assert!(e["msg"].as_str().unwrap().contains(PEER6), "{e}");
    lab.assert_unchanged(&before);
    assert_eq!(fake.verbs(), ["ADD", "DEL"]);
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn rename_failure_leaves_no_temporary_link() {
    // The kernel refuses to name a link "all" (it would clash with
    // /proc/sys/net/*/conf/all), so the rename after creation fails.
    let lab = Lab::new("renamefail");
    let probe = lab
        .pod
        .ip(&["link", "add", "all", "type", "veth", "peer", "name", "x0"]);
    assert!(
        !probe.success(),
        "this kernel accepts a link named all: {probe}"
    );
    let before = lab.snapshot();
    let a = lab
        .att(lab.conf("1.0.0", json!({})))
        .var("CNI_IFNAME", "all");
    assert_cni_error(&a.add(), None);
    lab.assert_unchanged(&before);
    assert_no_lease(lab.data.path(), &a.cid);
}

// ---------------------------------------------------------------------------
// Environment failures
// ---------------------------------------------------------------------------

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item25_netns_path_missing_fails_without_side_effects() {
    let lab = Lab::new("nsmissing");
    let fake = FakeIpam::new("fake-ipam");
    let before = lab.snapshot();
    let gone = format!(
        "/run/netns/tether-gone-{}",
        tether_conformance::paths::unique_token()
    );
    let a = lab
        .att(lab.conf("1.0.0", json!({"ipam": {"type": fake.name()}})))
        .var("CNI_PATH", fake.dir().to_str().unwrap())
        .var("CNI_NETNS", &gone);
    assert_cni_error(&a.add(), None);
    lab.assert_unchanged(&before);
    assert!(fake.verbs().is_empty(), "IPAM called: {:?}", fake.verbs());
    // CNI_NETNS not set at all: code 4 naming it.
    let e = assert_cni_error(&a.unset("CNI_NETNS").add(), Some(4));
    assert!(e["msg"].as_str().unwrap().contains("CNI_NETNS"), "{e}");
    lab.assert_unchanged(&before);
    assert!(fake.verbs().is_empty());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item25_netns_plain_directory_fails_without_side_effects() {
    let lab = Lab::new("nsdir");
    let fake = FakeIpam::new("fake-ipam");
    let dir = TempDir::new("notnetns");
    let before = lab.snapshot();
    let a = lab
        .att(lab.conf("1.0.0", json!({"ipam": {"type": fake.name()}})))
        .var("CNI_PATH", fake.dir().to_str().unwrap())
        .var("CNI_NETNS", dir.path().to_str().unwrap());
    assert_cni_error(&a.add(), None);
    lab.assert_unchanged(&before);
    assert!(fake.verbs().is_empty(), "IPAM called: {:?}", fake.verbs());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item28_runtime_config_mac_is_code_2_without_side_effects() {
    let lab = Lab::new("rcmac");
    let before = lab.snapshot();
    // Through libcni: the capability turns CAP_ARGS into runtimeConfig.mac.
    let net = lab
        .libcni(&lab.conf("1.0.0", json!({"capabilities": {"mac": true}})))
        .cap_args(json!({"mac": "02:11:22:33:44:55"}));
    let out = net.add(&lab.pod.path());
    let e = assert_cni_error(&out, Some(2));
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("runtimeConfig.mac") && msg.contains("02:11:22:33:44:55"),
        "{e}"
    );
    lab.assert_unchanged(&before);
    assert!(leases(lab.data.path()).is_empty());
    // And directly.
    let a = lab.att(lab.conf(
        "1.0.0",
        json!({"runtimeConfig": {"mac": "02:11:22:33:44:55"}}),
    ));
    assert_cni_error(&a.add(), Some(2));
    lab.assert_unchanged(&before);
    assert!(leases(lab.data.path()).is_empty());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item28_cni_args_mac_is_code_2_without_side_effects() {
    let lab = Lab::new("argsmac");
    let before = lab.snapshot();
    let a = lab.att(lab.conf("1.0.0", json!({})));
    let args = format!("{};MAC=02:11:22:33:44:66", a.exec.get("CNI_ARGS").unwrap());
    let a = a.var("CNI_ARGS", args);
    let e = assert_cni_error(&a.add(), Some(2));
    let msg = e["msg"].as_str().unwrap();
    assert!(
        msg.contains("MAC") && msg.contains("02:11:22:33:44:66"),
        "{e}"
    );
    lab.assert_unchanged(&before);
    assert!(leases(lab.data.path()).is_empty());
}

// ---------------------------------------------------------------------------
// Result layouts per version
// ---------------------------------------------------------------------------

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item29_result_layout_follows_the_config_version() {
    let lab = Lab::new("versions");
    for v in versions() {
        let a = lab.att(lab.conf(v, json!({})));
        let out = a.add();
        out.assert_success();
        let res = out.json();
        assert_eq!(res["cniVersion"], *v, "{out}");
        let legacy = v.starts_with("0.");
        for ip in res["ips"].as_array().unwrap() {
            if legacy {
                assert_eq!(ip["version"], "4", "{v}: {res}");
            } else {
                assert!(ip.get("version").is_none(), "{v}: {res}");
            }
            assert_eq!(ip["interface"], 0, "{v}: {res}");
        }
        let iface = res["interfaces"][0].as_object().unwrap();
        if legacy {
            assert!(!iface.contains_key("mtu"), "{v}: {res}");
        }
        if *v == "1.1.0" {
            assert_eq!(iface["mtu"], 1500, "1.1.0 interfaces carry the mtu: {res}");
        }
        assert_eq!(iface["sandbox"], lab.pod.path().to_str().unwrap());
        if *v != "0.3.0" && *v != "0.3.1" {
            assert_silent_ok(&a.check(&res));
        }
        assert_silent_ok(&a.del_with(&res));
        assert!(!lab.pod.has_link("net1"), "{v}");
        assert_no_lease(lab.data.path(), &a.cid);
    }
}

// ---------------------------------------------------------------------------
// IPv6 / dual-stack
// ---------------------------------------------------------------------------

/// `(address, tentative or dadfailed)` of the global IPv6 addresses on net1.
fn v6_states(pod: &NetNs) -> Vec<(String, bool)> {
    let v = pod.ip_json(&["-6", "addr", "show", "dev", "net1", "scope", "global"]);
    v.as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        // iproute2 prints `{}` for addresses the family filter dropped.
        .filter(|a| a.get("local").is_some())
        .map(|a| {
            let bad = a.get("tentative").is_some() || a.get("dadfailed").is_some();
            (
                format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]),
                bad,
            )
        })
        .collect()
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item30_dual_stack_ipv6_usable_on_return_and_no_route_added() {
    let lab = Lab::new("dual");
    let a = lab.att(lab.conf(
        "1.0.0",
        json!({"ipam": ipam(&[RANGE4, RANGE6], &[], lab.data.path())}),
    ));
    let res = a.add_ok();
    // Read the flags before anything else can pass time.
    let v6 = v6_states(&lab.pod);
    let ips = ips_of(&res);
    assert_eq!(ips.len(), 2, "{res}");
    let six = ips
        .iter()
        .find(|i| i.contains(':'))
        .expect("an IPv6 address");
    assert_eq!(
        v6,
        vec![(six.clone(), false)],
        "IPv6 address tentative after ADD"
    );
    assert_link(&lab, &lab.pod, "m0", "l2", &ips);
    assert!(
        res.get("routes").is_none() || res["routes"] == json!([]),
        "{res}"
    );
    assert_eq!(
        static_routes(&lab.pod),
        vec![],
        "routes IPAM did not return"
    );
    lab.pod.ping(PEER6, 1).assert_success();
    lab.pod.ping(PEER4, 1).assert_success();
    assert_silent_ok(&a.check(&res));
    assert_silent_ok(&a.del());
    assert_no_lease(lab.data.path(), &a.cid);
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item30_dual_stack_installs_exactly_the_ipam_routes() {
    let lab = Lab::new("dualrt");
    let routes = [("10.9.0.0/16", PEER4), ("fd00:9::/64", PEER6)];
    let a = lab.att(lab.conf(
        "1.0.0",
        json!({"ipam": ipam(&[RANGE4, RANGE6], &routes, lab.data.path())}),
    ));
    let res = a.add_ok();
    assert!(v6_states(&lab.pod).iter().all(|(_, bad)| !bad));
    let mut want: Vec<(String, String)> = routes
        .iter()
        .map(|(d, g)| (d.to_string(), g.to_string()))
        .collect();
    want.sort();
    assert_eq!(static_routes(&lab.pod), want);
    assert_silent_ok(&a.check(&res));
    assert_silent_ok(&a.del());
}

// ---------------------------------------------------------------------------
// Concurrency and re-ADD
// ---------------------------------------------------------------------------

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item31_parallel_adds_get_distinct_addresses() {
    const N: usize = 8;
    let lab = Lab::new("par");
    let conf = lab.conf("1.0.0", json!({}));
    let pods: Vec<NetNs> = (0..N).map(|i| NetNs::new(&format!("par{i}"))).collect();
    let nets: Vec<Libcni> = (0..N).map(|_| lab.libcni(&conf)).collect();
    let t0 = Instant::now();
    let results: Vec<CmdOutput> = std::thread::scope(|s| {
        let hs: Vec<_> = pods
            .iter()
            .zip(&nets)
            .map(|(p, n)| s.spawn(move || n.add(&p.path())))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    eprintln!("{N} parallel ADDs took {:?}", t0.elapsed());
    let mut addrs = Vec::new();
    for (i, out) in results.iter().enumerate() {
        out.assert_success();
        let ips = ips_of(&out.json());
        assert_eq!(pods[i].addrs("net1"), ips, "pod {i}");
        addrs.extend(ips);
    }
    let mut uniq = addrs.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), N, "duplicate addresses: {addrs:?}");
    assert_eq!(leases(lab.data.path()).len(), N);
    // Pods reach each other and the peer through the shared master.
    pods[0].ping(bare(&addrs[1]), 1).assert_success();
    std::thread::scope(|s| {
        for (p, n) in pods.iter().zip(&nets) {
            s.spawn(move || {
                n.del(&p.path()).assert_success();
            });
        }
    });
    assert!(leases(lab.data.path()).is_empty());
    assert!(pods.iter().all(|p| !p.has_link("net1")));
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item32_add_del_add_same_attachment_succeeds() {
    let lab = Lab::new("readd");
    let net = lab.libcni(&lab.conf("1.0.0", json!({})));
    net.add(&lab.pod.path()).assert_success();
    net.del(&lab.pod.path()).assert_success();
    assert!(!lab.pod.has_link("net1"));
    let out = net.add(&lab.pod.path());
    out.assert_success();
    assert_eq!(lab.pod.addrs("net1"), ips_of(&out.json()));
    net.check(&lab.pod.path()).assert_success();
    net.del(&lab.pod.path()).assert_success();
    assert_no_lease(lab.data.path(), net.container_id_value());
}

// ---------------------------------------------------------------------------
// DEL
// ---------------------------------------------------------------------------

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item34_del_after_add_removes_link_and_lease_silently() {
    let lab = Lab::new("del");
    let before = lab.snapshot();
    let a = lab.att(lab.conf("1.0.0", json!({})));
    let res = a.add_ok();
    let ip = ips_of(&res)[0].clone();
    assert_eq!(leased_to(lab.data.path(), &a.cid, "net1").len(), 1);
    assert_silent_ok(&a.del_with(&res));
    lab.assert_unchanged(&before);
    assert_no_lease(lab.data.path(), &a.cid);
    // Released means leasable again: ask the IPAM for exactly that address.
    let again = lab.att(lab.conf(
        "1.0.0",
        json!({"ipam": ipam(&[&format!("{0}-{0}/24", bare(&ip))], &[], lab.data.path())}),
    ));
    assert_eq!(ips_of(&again.add_ok()), vec![ip]);
    assert_silent_ok(&again.del());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item35_del_twice_succeeds_both_times() {
    let lab = Lab::new("deltwice");
    let net = lab.libcni(&lab.conf("1.0.0", json!({})));
    net.add(&lab.pod.path()).assert_success();
    net.del(&lab.pod.path()).assert_success();
    net.del(&lab.pod.path()).assert_success();
    let a = lab.att(lab.conf("1.0.0", json!({})));
    a.add_ok();
    assert_silent_ok(&a.del());
    assert_silent_ok(&a.del());
    assert!(!lab.pod.has_link("net1"));
    assert!(leases(lab.data.path()).is_empty());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item36_del_of_never_added_attachment_succeeds() {
    let lab = Lab::new("delnever");
    let before = lab.snapshot();
    let a = lab.att(lab.conf("1.0.0", json!({})));
    assert_silent_ok(&a.del());
    lab.assert_unchanged(&before);
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item37_del_without_netns_releases_the_lease() {
    let lab = Lab::new("delnons");
    for how in ["unset", "empty"] {
        let a = lab.att(lab.conf("1.0.0", json!({})));
        a.add_ok();
        let d = match how {
            "unset" => lab.att(lab.conf("1.0.0", json!({}))).unset("CNI_NETNS"),
            _ => lab.att(lab.conf("1.0.0", json!({}))).var("CNI_NETNS", ""),
        }
        .var("CNI_CONTAINERID", &a.cid)
        .var("CNI_ARGS", a.exec.get("CNI_ARGS").unwrap());
        assert_silent_ok(&d.del());
        assert_no_lease(lab.data.path(), &a.cid);
        // The link dies with the netns; here it is still there, so clean up.
        assert_silent_ok(&a.del());
        assert!(!lab.pod.has_link("net1"), "{how}");
    }
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item38_del_with_netns_gone_succeeds_and_releases() {
    let lab = Lab::new("delgone");
    let pod2 = NetNs::new("delgone-p2");
    let a = lab.att_in(&pod2, lab.conf("1.0.0", json!({})));
    let res = a.add_ok();
    drop(pod2);
    assert_silent_ok(&a.del_with(&res));
    assert_no_lease(lab.data.path(), &a.cid);
    // The host side is as before: the slave died with the netns.
    assert!(eventually(Duration::from_secs(10), || link_names(
        &lab.host
    ) == vec![
        "lo".to_string(),
        "m0".to_string()
    ]));
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item39_del_link_in_container_master_omitted_netns_gone_succeeds() {
    let lab = Lab::new("dellic");
    let pod2 = NetNs::new("dellic-p2");
    veth_pair(&pod2, "pm0", &lab.peer, "pp0");
    pod2.ip_ok(&["route", "add", "default", "dev", "pm0"]);
    let a = lab.att_in(
        &pod2,
        lab.conf("1.0.0", json!({"master": null, "linkInContainer": true})),
    );
    let res = a.add_ok();
    let link = pod2.link("net1").unwrap();
    assert_eq!(link["link"], "pm0", "{link:#}");
    drop(pod2);
    assert_silent_ok(&a.del_with(&res));
    assert_silent_ok(&a.del());
    assert_no_lease(lab.data.path(), &a.cid);
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item40_del_master_omitted_without_default_route_succeeds() {
    let lab = Lab::new("delnodef");
    add_default_route_master(&lab);
    let a = lab.att(lab.conf("1.0.0", json!({"master": null})));
    a.add_ok();
    lab.host.ip_ok(&["route", "del", "default"]);
    // No prevResult to name the master, no default route to find it.
    assert_silent_ok(&a.del());
    assert!(!lab.pod.has_link("net1"));
    assert_no_lease(lab.data.path(), &a.cid);
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item41_del_with_and_without_prev_result_agree() {
    let lab = Lab::new("delprev");
    let pod2 = NetNs::new("delprev-p2");
    let with = lab.libcni(&lab.conf("1.0.0", json!({})));
    let without = lab.libcni(&lab.conf("1.0.0", json!({})));
    with.add(&lab.pod.path()).assert_success();
    without.add(&pod2.path()).assert_success();
    // libcni sends no prevResult when its cache entry is gone.
    std::fs::remove_file(without.cache_file()).unwrap();
    let o1 = with.del(&lab.pod.path());
    let o2 = without.del(&pod2.path());
    assert_eq!((o1.code(), o2.code()), (Some(0), Some(0)), "{o1}\n{o2}");
    for (pod, net) in [(&lab.pod, &with), (&pod2, &without)] {
        assert!(!pod.has_link("net1"));
        assert_no_lease(lab.data.path(), net.container_id_value());
    }
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item42_del_after_link_removed_out_of_band_releases_the_lease() {
    let lab = Lab::new("deloob");
    let a = lab.att(lab.conf("1.0.0", json!({})));
    let res = a.add_ok();
    lab.pod.ip_ok(&["link", "del", "net1"]);
    assert_silent_ok(&a.del_with(&res));
    assert_no_lease(lab.data.path(), &a.cid);
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item43_del_right_after_failed_add_succeeds_leaving_nothing() {
    let lab = Lab::new("delfail");
    let fake = FakeIpam::new("fake-ipam").answer(
        "ADD",
        FakeIpam::print(&json!({"cniVersion": "1.0.0", "ips": []})),
    );
    let before = lab.snapshot();
    let a = lab
        .att(lab.conf("1.0.0", json!({"ipam": {"type": fake.name()}})))
        .var("CNI_PATH", fake.dir().to_str().unwrap());
    assert_cni_error(&a.add(), None);
    assert_silent_ok(&a.del());
    lab.assert_unchanged(&before);
    // Also after a failure of the real IPAM (master MTU refused first).
    let b = lab.att(lab.conf("1.0.0", json!({"mtu": 65000})));
    assert_cni_error(&b.add(), Some(7));
    assert_silent_ok(&b.del());
    lab.assert_unchanged(&before);
    assert!(leases(lab.data.path()).is_empty());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item44_del_deletes_the_link_even_when_ipam_del_fails_then_reports_it() {
    let lab = Lab::new("delipamerr");
    let fake = FakeIpam::new("fake-ipam").answer("DEL", FakeIpam::fail(11, "store busy"));
    let a = lab
        .att(lab.conf("1.0.0", json!({"ipam": {"type": fake.name()}})))
        .var("CNI_PATH", fake.dir().to_str().unwrap());
    let res = a.add_ok();
    assert!(lab.pod.has_link("net1"));
    let e = assert_cni_error(&a.del_with(&res), Some(11));
    assert_eq!(e["msg"], "store busy");
    assert!(
        !lab.pod.has_link("net1"),
        "link kept because IPAM DEL failed"
    );
    assert_eq!(fake.verbs(), ["ADD", "DEL"]);
}

// ---------------------------------------------------------------------------
// CHECK
// ---------------------------------------------------------------------------

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item45_check_after_add_succeeds_silently() {
    let lab = Lab::new("check");
    let a = lab.att(lab.conf(
        "1.0.0",
        json!({"ipam": ipam(&[RANGE4], &[("10.9.0.0/16", PEER4)], lab.data.path())}),
    ));
    let res = a.add_ok();
    assert_silent_ok(&a.check(&res));
    // And through libcni (prevResult from its cache).
    let net = lab.libcni(&lab.conf("0.4.0", json!({})));
    let pod2 = NetNs::new("check-p2");
    net.add(&pod2.path()).assert_success();
    net.check(&pod2.path()).assert_success();
    net.del(&pod2.path()).assert_success();
    assert_silent_ok(&a.del());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item46_check_with_master_omitted_succeeds() {
    let lab = Lab::new("checkdef");
    add_default_route_master(&lab);
    let net = lab.libcni(&lab.conf("1.0.0", json!({"master": null})));
    net.add(&lab.pod.path()).assert_success();
    net.check(&lab.pod.path()).assert_success();
    net.del(&lab.pod.path()).assert_success();
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item47_check_without_prev_result_fails() {
    let lab = Lab::new("checknoprev");
    let a = lab.att(lab.conf("1.0.0", json!({})));
    a.add_ok();
    let e = assert_cni_error(&a.call("CHECK", &a.conf), None);
    assert!(e["msg"].as_str().unwrap().contains("prevResult"), "{e}");
    assert_silent_ok(&a.del());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item48_check_below_0_4_0_is_code_1() {
    let lab = Lab::new("checkold");
    let a = lab.att(lab.conf("0.3.1", json!({})));
    let res = a.add_ok();
    assert_cni_error(&a.check(&res), Some(1));
    assert_silent_ok(&a.del());
}

/// ADD (with an IPAM route), break it with `breakage`, CHECK must fail.
/// The error message must mention `why` (case-insensitive; `{ip}` stands for
/// the attachment's IPv4 address), so each CHECK fails for the breakage made,
/// not for something else.
fn assert_check_catches(tag: &str, why: &str, breakage: impl FnOnce(&Lab, &mut Value)) {
    let lab = Lab::new(tag);
    let a = lab.att(lab.conf(
        "1.0.0",
        json!({"ipam": ipam(&[RANGE4], &[("10.9.0.0/16", PEER4)], lab.data.path())}),
    ));
    let mut res = a.add_ok();
    assert_silent_ok(&a.check(&res));
    breakage(&lab, &mut res);
    let e = assert_cni_error(&a.check(&res), None);
    let why = why.replace("{ip}", bare(&ips_of(&res)[0])).to_lowercase();
    let msg = e["msg"].as_str().unwrap().to_lowercase();
    assert!(
        msg.contains(&why),
        "CHECK failed for another reason than {why:?}: {e}"
    );
    assert_silent_ok(&a.del());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item49_check_fails_when_link_deleted() {
    assert_check_catches("chkdel", "net1", |lab, _| {
        lab.pod.ip_ok(&["link", "del", "net1"]);
    });
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item49_check_fails_when_link_recreated_in_another_mode() {
    assert_check_catches("chkmode", "mode", |lab, res| {
        lab.pod.ip_ok(&["link", "del", "net1"]);
        lab.host.ip_ok(&[
            "link",
            "add",
            "link",
            "m0",
            "name",
            "net1",
            "netns",
            lab.pod.name(),
            "type",
            "ipvlan",
            "mode",
            "l3",
        ]);
        for ip in ips_of(res) {
            lab.pod.addr_add("net1", &ip);
        }
        lab.pod.link_up("net1");
        lab.pod
            .ip_ok(&["route", "add", "10.9.0.0/16", "via", PEER4, "dev", "net1"]);
    });
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item49_check_fails_when_address_removed() {
    assert_check_catches("chkaddr", "{ip}", |lab, res| {
        let ip = ips_of(res)[0].clone();
        lab.pod.ip_ok(&["addr", "del", &ip, "dev", "net1"]);
    });
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item49_check_fails_when_route_removed() {
    assert_check_catches("chkroute", "10.9.0.0", |lab, _| {
        lab.pod.ip_ok(&["route", "del", "10.9.0.0/16"]);
    });
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item49_check_fails_when_prev_result_mac_differs() {
    assert_check_catches("chkmac", "mac", |_, res| {
        res["interfaces"][0]["mac"] = json!("02:de:ad:be:ef:01");
    });
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item49_check_fails_when_prev_result_sandbox_differs() {
    assert_check_catches("chksandbox", "sandbox", |_, res| {
        res["interfaces"][0]["sandbox"] = json!("/run/netns/some-other-pod");
    });
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item50_check_fails_when_ipam_holds_no_lease() {
    let lab = Lab::new("chklease");
    let a = lab.att(lab.conf("1.0.0", json!({})));
    let res = a.add_ok();
    // Release the lease behind tether's back, through the IPAM itself.
    a.ipam_call("DEL").assert_success();
    assert_no_lease(lab.data.path(), &a.cid);
    assert_cni_error(&a.check(&res), None);
    assert_silent_ok(&a.del());
}

// ---------------------------------------------------------------------------
// STATUS and GC (CNI 1.1.0: a fake IPAM, host-local cannot speak 1.1.0)
// ---------------------------------------------------------------------------

/// STATUS/GC invocation: no CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME.
fn no_attachment(a: Att) -> Att {
    a.unset("CNI_CONTAINERID")
        .unset("CNI_NETNS")
        .unset("CNI_IFNAME")
        .unset("CNI_ARGS")
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item51_status_ready_with_master_and_ipam_ready() {
    let lab = Lab::new("status");
    let fake = FakeIpam::new("fake-ipam");
    let a = no_attachment(
        lab.att(lab.conf("1.1.0", json!({"ipam": {"type": fake.name()}})))
            .var("CNI_PATH", fake.dir().to_str().unwrap()),
    );
    assert_silent_ok(&a.call("STATUS", &a.conf));
    assert_eq!(fake.verbs(), ["STATUS"], "STATUS forwarded to IPAM");
    // Without ipam, the master alone decides.
    let b = no_attachment(lab.att(lab.conf("1.1.0", json!({"ipam": null}))));
    assert_silent_ok(&b.call("STATUS", &b.conf));
    // IPAM not ready -> not ready.
    let fake2 = FakeIpam::new("fake-ipam").answer("STATUS", FakeIpam::fail(50, "range full"));
    let c = no_attachment(
        lab.att(lab.conf("1.1.0", json!({"ipam": {"type": fake2.name()}})))
            .var("CNI_PATH", fake2.dir().to_str().unwrap()),
    );
    assert_cni_error(&c.call("STATUS", &c.conf), Some(50));
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item52_status_with_master_missing_is_code_50() {
    let lab = Lab::new("statusnm");
    let fake = FakeIpam::new("fake-ipam");
    let a = no_attachment(
        lab.att(lab.conf(
            "1.1.0",
            json!({"master": "nosuch0", "ipam": {"type": fake.name()}}),
        ))
        .var("CNI_PATH", fake.dir().to_str().unwrap()),
    );
    let e = assert_cni_error(&a.call("STATUS", &a.conf), Some(50));
    assert!(e["msg"].as_str().unwrap().contains("nosuch0"), "{e}");
    // Master omitted and no default route: not ready either.
    let b = no_attachment(lab.att(lab.conf("1.1.0", json!({"master": null, "ipam": null}))));
    assert_cni_error(&b.call("STATUS", &b.conf), Some(50));
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item55_gc_is_forwarded_to_ipam_and_touches_no_interface() {
    let lab = Lab::new("gc");
    let fake = FakeIpam::new("fake-ipam");
    let conf = lab.conf("1.1.0", json!({"ipam": {"type": fake.name()}}));
    let a = lab
        .att(conf.clone())
        .var("CNI_PATH", fake.dir().to_str().unwrap());
    let res = a.add_ok();
    let before = lab.snapshot();
    let valid = json!([{"containerID": a.cid, "ifname": "net1"}, {"containerID": "other", "ifname": "net2"}]);
    let mut gc_conf = conf.clone();
    gc_conf["cni.dev/valid-attachments"] = valid.clone();
    let g = no_attachment(
        lab.att(gc_conf)
            .var("CNI_PATH", fake.dir().to_str().unwrap()),
    );
    assert_silent_ok(&g.call("GC", &g.conf));
    let calls = fake.calls();
    let gc: Vec<_> = calls.iter().filter(|c| c.command == "GC").collect();
    assert_eq!(gc.len(), 1, "{calls:?}");
    assert_eq!(gc[0].stdin["cni.dev/valid-attachments"], valid);
    lab.assert_unchanged(&before);
    assert_eq!(lab.pod.addrs("net1"), ips_of(&res));
    assert_silent_ok(&a.del());
}

// ---------------------------------------------------------------------------
// Multus shape
// ---------------------------------------------------------------------------

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item33_multus_shaped_two_networks_net1_net2() {
    let lab = Lab::new("multus");
    lab.add_second_master();
    let infra = format!("{:0>64}", "5eed");
    let args = multus_cni_args(
        "gpu-jobs",
        "trainer-0",
        &infra,
        "6f1c1a5e-0000-4000-8000-000000000042",
    );
    let data2 = TempDir::new("ipam2");
    // NAD-shaped plugin configs: no "name" (libcni injects the conflist's).
    let mgmt = json!({"type": "tether-ipvlan", "master": "m0",
                      "ipam": ipam(&[RANGE4], &[], lab.data.path())});
    let compute = json!({"type": "tether-ipvlan", "master": "m1", "mode": "l2",
                         "ipam": ipam(&["192.168.100.10-192.168.100.250/24"], &[], data2.path())});
    let net = |name: &str, plugin: &Value, ifname: &str| {
        Libcni::new(&json!({"cniVersion": "1.0.0", "name": name, "plugins": [plugin]}))
            .cni_path(cni_path())
            .run_in(&lab.host)
            .ifname(ifname)
            .container_id(&infra)
            .cni_args(&args)
    };
    let n1 = net("mgmt", &mgmt, "net1");
    let n2 = net("compute", &compute, "net2");
    let mut addrs = Vec::new();
    for (n, ifname, master) in [(&n1, "net1", "m0"), (&n2, "net2", "m1")] {
        let out = n.add(&lab.pod.path());
        out.assert_success();
        let res = out.json();
        // What network-status needs: the pod-side interface with sandbox, IPs pointing at it.
        let i = &res["interfaces"][0];
        assert_eq!(i["name"], ifname, "{res}");
        assert_eq!(i["sandbox"], lab.pod.path().to_str().unwrap());
        assert_eq!(i["mac"], lab.host.link(master).unwrap()["address"]);
        for ip in res["ips"].as_array().unwrap() {
            assert_eq!(ip["interface"], 0);
        }
        assert!(n.cache_file().is_file());
        assert_eq!(lab.pod.addrs(ifname), ips_of(&res));
        addrs.push(ips_of(&res)[0].clone());
    }
    assert!(addrs[1].starts_with("192.168.100."), "{addrs:?}");
    lab.pod.ping(PEER4, 1).assert_success();
    lab.pod.ping("192.168.100.1", 1).assert_success();
    n1.check(&lab.pod.path()).assert_success();
    n2.check(&lab.pod.path()).assert_success();
    n2.del(&lab.pod.path()).assert_success();
    n1.del(&lab.pod.path()).assert_success();
    assert_eq!(link_names(&lab.pod), vec!["lo"]);
    assert!(leases(lab.data.path()).is_empty() && leases(data2.path()).is_empty());
}

// ---------------------------------------------------------------------------
// tether-ipvlan + tether-ipam together (always tether-ipam, whatever IPAM says)
// ---------------------------------------------------------------------------

/// A tether-ipam `ipam` section (cooldown 0 so tests can reuse addresses).
fn tether_ipam(ranges: &[&str], data_dir: &Path) -> Value {
    let mut v =
        json!({"type": "tether-ipam", "range": ranges[0], "dataDir": data_dir, "cooldown_s": 0});
    if ranges.len() > 1 {
        v["ipRanges"] = ranges[1..].iter().map(|r| json!({"range": r})).collect();
    }
    v
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item53_status_with_tether_ipam_ready_then_exhausted_is_code_50() {
    let lab = Lab::new("tstatus");
    let conf = lab.conf(
        "1.1.0",
        json!({"ipam": tether_ipam(&["10.1.2.10-10.1.2.10/24"], lab.data.path())}),
    );
    let s = no_attachment(lab.att(conf.clone()));
    assert_silent_ok(&s.call("STATUS", &s.conf));
    let a = lab.att(conf);
    a.add_ok();
    let e = assert_cni_error(&s.call("STATUS", &s.conf), Some(50));
    eprintln!("exhausted: {e}");
    assert_silent_ok(&a.del());
    assert_silent_ok(&s.call("STATUS", &s.conf));
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item55_gc_with_tether_ipam_releases_only_unlisted_and_touches_no_link() {
    let lab = Lab::new("tgc");
    let pod2 = NetNs::new("tgc-p2");
    let conf = lab.conf(
        "1.1.0",
        json!({"ipam": tether_ipam(&[RANGE4], lab.data.path())}),
    );
    let keep = lab.att(conf.clone());
    let gone = lab.att_in(&pod2, conf.clone());
    keep.add_ok();
    gone.add_ok();
    let before = (lab.snapshot(), link_names(&pod2));
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": keep.cid, "ifname": "net1"}]);
    let g = no_attachment(lab.att(gc));
    assert_silent_ok(&g.call("GC", &g.conf));
    assert_eq!(
        leased_to(lab.data.path(), &keep.cid, "net1").len(),
        1,
        "listed lease kept"
    );
    assert_no_lease(lab.data.path(), &gone.cid);
    assert_eq!(
        (lab.snapshot(), link_names(&pod2)),
        before,
        "GC touched links"
    );
    assert_silent_ok(&keep.del());
    assert_silent_ok(&gone.del());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item26_runtime_config_ips_through_libcni_gives_exactly_that_address() {
    let lab = Lab::new("tips");
    let plugin = lab.conf(
        "1.0.0",
        json!({"capabilities": {"ips": true},
               "ipam": tether_ipam(&[RANGE4], lab.data.path())}),
    );
    let net = lab
        .libcni(&plugin)
        .cap_args(json!({"ips": ["10.1.2.33/24"]}));
    let out = net.add(&lab.pod.path());
    out.assert_success();
    assert_eq!(ips_of(&out.json()), vec!["10.1.2.33/24"]);
    assert_eq!(lab.pod.addrs("net1"), vec!["10.1.2.33/24"]);
    net.check(&lab.pod.path()).assert_success();
    net.del(&lab.pod.path()).assert_success();
    // A requested address outside every range: error, nothing left.
    let before = lab.snapshot();
    let net = lab
        .libcni(&plugin)
        .cap_args(json!({"ips": ["10.7.7.7/24"]}));
    let e = assert_cni_error(&net.add(&lab.pod.path()), None);
    assert!(e["msg"].as_str().unwrap().contains("10.7.7.7"), "{e}");
    lab.assert_unchanged(&before);
    assert!(leases(lab.data.path()).is_empty());
}

#[test]
#[ignore = "lab: run via conformance/lab/run-tests.sh lab_ipvlan"]
fn item27_multus_ip_arg_gives_both_addresses_and_runtime_config_wins() {
    let lab = Lab::new("tiparg");
    let conf = lab.conf(
        "1.0.0",
        json!({"ipam": tether_ipam(&[RANGE4, RANGE6], lab.data.path())}),
    );
    let a = lab.att(conf.clone());
    let args = format!(
        "{};IP=10.1.2.29/24,fd00:1:2::29/64",
        a.exec.get("CNI_ARGS").unwrap()
    );
    let a = a.var("CNI_ARGS", &args);
    let res = a.add_ok();
    let mut got = ips_of(&res);
    got.sort();
    assert_eq!(got, vec!["10.1.2.29/24", "fd00:1:2::29/64"]);
    assert_silent_ok(&a.check(&res));
    assert_silent_ok(&a.del());
    // runtimeConfig.ips present too: it wins over IP=.
    let mut c = conf.clone();
    c["runtimeConfig"] = json!({"ips": ["10.1.2.19/24", "fd00:1:2::19/64"]});
    let b = lab.att(c).var("CNI_ARGS", &args);
    let mut got = ips_of(&b.add_ok());
    got.sort();
    assert_eq!(got, vec!["10.1.2.19/24", "fd00:1:2::19/64"]);
    assert_silent_ok(&b.del());
}
