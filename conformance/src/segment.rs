//! A layer-2 segment for conflict-probing tests, packet capture on it, a "slow rogue" that answers
//! ARP probes late, and tether-ipam helpers (first pool candidate, reading the lease state file).
//!
//! ```text
//!   [rogue ns] r0 ==veth== vr0 ┐
//!   [host  ns] h0 ==veth== vh0 ┤ br0  [node ns]  10.1.2.1/24  fd00:1:2::1/64   (the master)
//!                              └ macvlan/ipvlan slaves of br0 → pod netns
//! ```
//!
//! Everything lives in namespaces created here (unique names, deleted on drop), so tests run in
//! parallel with identical addresses, and no frame ever leaves them.

use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cmd::CmdOutput;
use crate::netns::NetNs;
use crate::paths::TempDir;
use crate::plugin::{PluginExec, tether_binary};

/// The segment's IPv4 prefix; the node's bridge holds `.1`.
pub const GATEWAY4: &str = "10.1.2.1";
/// The segment's IPv6 prefix; the node's bridge holds `::1`.
pub const GATEWAY6: &str = "fd00:1:2::1";

/// A bridge `br0` in a "node" netns, the master, plus a "rogue" netns on the segment.
#[derive(Debug)]
pub struct Segment {
    pub node: NetNs,
    pub rogue: NetNs,
    /// The master's name in `node` (`br0`).
    pub master: String,
    hosts: Mutex<usize>,
}

impl Segment {
    /// The node with `br0` (STP off, multicast snooping off so NDP multicast floods), addresses
    /// 10.1.2.1/24 and fd00:1:2::1/64 (nodad), and the rogue attached as `r0` without addresses.
    #[track_caller]
    pub fn new(tag: &str) -> Segment {
        let node = NetNs::new(&format!("{tag}-node"));
        node.ip_ok(&[
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "stp_state",
            "0",
            "forward_delay",
            "0",
            "mcast_snooping",
            "0",
        ]);
        node.link_up("br0");
        node.addr_add("br0", &format!("{GATEWAY4}/24"));
        node.ip_ok(&[
            "addr",
            "add",
            &format!("{GATEWAY6}/64"),
            "dev",
            "br0",
            "nodad",
        ]);
        let rogue = NetNs::new(&format!("{tag}-rogue"));
        let seg = Segment {
            node,
            rogue,
            master: "br0".into(),
            hosts: Mutex::new(0),
        };
        seg.plug(&seg.rogue, "r0");
        seg
    }

    /// Connect `ns` to the bridge with a veth whose end in `ns` is `ifname` (up, no address).
    #[track_caller]
    pub fn plug(&self, ns: &NetNs, ifname: &str) {
        let port = {
            let mut n = self.hosts.lock().unwrap();
            *n += 1;
            format!("vp{}", *n)
        };
        self.node.ip_ok(&[
            "link",
            "add",
            &port,
            "type",
            "veth",
            "peer",
            "name",
            ifname,
            "netns",
            ns.name(),
        ]);
        self.node.ip_ok(&["link", "set", &port, "master", "br0"]);
        self.node.link_up(&port);
        ns.link_up(ifname);
    }

    /// A new netns plugged into the segment as `h0`.
    #[track_caller]
    pub fn host(&self, tag: &str) -> NetNs {
        let ns = NetNs::new(tag);
        self.plug(&ns, "h0");
        ns
    }

    /// The rogue takes `addr` (IPv6 without DAD, so it answers at once).
    #[track_caller]
    pub fn rogue_holds(&self, addr: IpAddr) {
        hold(&self.rogue, "r0", addr);
    }

    /// The rogue gives `addr` up.
    #[track_caller]
    pub fn rogue_drops(&self, addr: IpAddr) {
        let cidr = if addr.is_ipv4() {
            format!("{addr}/24")
        } else {
            format!("{addr}/64")
        };
        self.rogue.ip_ok(&["addr", "del", &cidr, "dev", "r0"]);
    }

    pub fn rogue_mac(&self) -> String {
        mac(&self.rogue, "r0")
    }

    pub fn master_mac(&self) -> String {
        mac(&self.node, &self.master)
    }

    /// tether-ipam, executed inside the node netns (where the master is), CNI_PATH unset.
    pub fn ipam(&self) -> PluginExec {
        PluginExec::new(tether_binary("tether-ipam")).run_in(&self.node)
    }
}

/// `ns` takes `addr` on `ifname` (/24 or /64; IPv6 `nodad`).
#[track_caller]
pub fn hold(ns: &NetNs, ifname: &str, addr: IpAddr) {
    match addr {
        IpAddr::V4(_) => ns.addr_add(ifname, &format!("{addr}/24")),
        IpAddr::V6(_) => {
            ns.ip_ok(&["addr", "add", &format!("{addr}/64"), "dev", ifname, "nodad"]);
        }
    }
}

/// The MAC of `ifname` in `ns`.
#[track_caller]
pub fn mac(ns: &NetNs, ifname: &str) -> String {
    ns.link(ifname)
        .and_then(|l| l["address"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no {ifname} in {}", ns.name()))
}

/// Every neighbour entry of `ns` (`ip -j neigh show` for both families), as (address, state) pairs.
#[track_caller]
pub fn neighbours(ns: &NetNs) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for fam in ["-4", "-6"] {
        for n in ns
            .ip_json(&[fam, "neigh", "show"])
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let st = n["state"]
                .as_array()
                .map(|s| {
                    s.iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            out.push((n["dst"].as_str().unwrap_or_default().to_string(), st));
        }
    }
    out
}

/// A running `tcpdump` inside a netns, printing one line per frame (`-e -nn -l`).
pub struct Capture {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Capture {
    /// Start capturing on `ifname` in `ns` with the pcap `filter`; returns once tcpdump listens.
    #[track_caller]
    pub fn start(ns: &NetNs, ifname: &str, filter: &str) -> Capture {
        let mut child = ns
            .command("tcpdump")
            .args([
                "-i",
                ifname,
                "-e",
                "-nn",
                "-l",
                "--immediate-mode",
                "-Q",
                "inout",
            ])
            .arg(filter)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump (apt-get install tcpdump)");
        let stderr = child.stderr.take().unwrap();
        let mut err = BufReader::new(stderr);
        let mut line = String::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            line.clear();
            if err.read_line(&mut line).unwrap_or(0) == 0 || Instant::now() > deadline {
                let _ = child.kill();
                panic!("tcpdump did not start on {ifname} in {}: {line}", ns.name());
            }
            if line.contains("listening on") {
                break;
            }
        }
        // Drain stderr so tcpdump never blocks on it.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while err.read_line(&mut sink).unwrap_or(0) > 0 {
                sink.clear();
            }
        });
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let l2 = lines.clone();
        let reader = std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                l2.lock().unwrap().push(l);
            }
        });
        Capture {
            child,
            lines,
            reader: Some(reader),
        }
    }

    /// Frames so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Wait `settle` for stragglers, stop tcpdump, return every frame line.
    pub fn stop(mut self, settle: Duration) -> Vec<String> {
        std::thread::sleep(settle);
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        self.lines()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const SLOW_ROGUE_PY: &str = r#"
import socket, struct, sys, time, fcntl
iface, target, delay = sys.argv[1], socket.inet_aton(sys.argv[2]), float(sys.argv[3]) / 1000.0
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
s.bind((iface, 0x0806))
info = fcntl.ioctl(s.fileno(), 0x8927, struct.pack('256s', iface.encode()[:15]))
me = info[18:24]
print("ready", flush=True)
while True:
    f, addr = s.recvfrom(2048)
    if addr[2] == socket.PACKET_OUTGOING or len(f) < 42:
        continue
    op, sha, spa, tpa = struct.unpack('!H', f[20:22])[0], f[22:28], f[28:32], f[38:42]
    if op != 1 or tpa != target:
        continue
    time.sleep(delay)
    arp = struct.pack('!HHBBH', 1, 0x0800, 6, 4, 2) + me + target + sha + spa
    s.send(sha + me + b'\x08\x06' + arp)
    print("answered", flush=True)
"#;

/// A host that answers ARP requests for one IPv4 address only after a delay (no netem needed): a
/// userspace responder on a packet socket. The kernel of its netns does not hold the address.
pub struct SlowRogue {
    child: Child,
}

impl SlowRogue {
    /// Answer requests for `addr` on `ifname` in `ns`, `delay` after each arrives.
    #[track_caller]
    pub fn start(ns: &NetNs, ifname: &str, addr: IpAddr, delay: Duration) -> SlowRogue {
        let mut child = ns
            .command("/usr/bin/python3")
            .args([
                "-u",
                "-c",
                SLOW_ROGUE_PY,
                ifname,
                &addr.to_string(),
                &delay.as_millis().to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "slow rogue did not start");
        SlowRogue { child }
    }
}

impl Drop for SlowRogue {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The addresses a fresh pool walk hands `(container_id, ifname)` under `ipam` (one per range, in
/// range order): tether-ipam itself, run with probing off on an empty scratch store. With an empty
/// store this is exactly the first candidate the real ADD will probe.
#[track_caller]
pub fn first_candidates(ipam: &Value, container_id: &str, ifname: &str) -> Vec<IpAddr> {
    let scratch = TempDir::new("firstcand");
    let mut ipam = ipam.clone();
    ipam["probe"] = json!(false);
    ipam["dataDir"] = json!(scratch.path());
    let conf = json!({"cniVersion": "1.1.0", "name": "firstcand", "ipam": ipam});
    let out = PluginExec::new(tether_binary("tether-ipam"))
        .var("CNI_CONTAINERID", container_id)
        .var("CNI_IFNAME", ifname)
        .var("CNI_NETNS", "/nonexistent")
        .call_json("ADD", &conf);
    out.assert_success();
    result_ips(&out)
}

/// `ips[].address` of a Result (without prefixes).
#[track_caller]
pub fn result_ips(out: &CmdOutput) -> Vec<IpAddr> {
    out.json()["ips"]
        .as_array()
        .unwrap_or_else(|| panic!("no ips: {out}"))
        .iter()
        .map(|i| {
            i["address"]
                .as_str()
                .unwrap()
                .split('/')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}

/// A network's records in tether-ipam's file store: the state file of the cluster-wide domain
/// (`<dataDir>/@cluster.json`), which every network of the data dir without an isolated fabric
/// shares.
#[derive(Debug, Clone)]
pub struct LeaseState {
    path: PathBuf,
    network: String,
}

impl LeaseState {
    pub fn new(data_dir: &Path, network: &str) -> LeaseState {
        LeaseState {
            path: data_dir.join("@cluster.json"),
            network: network.to_string(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every record of the network (empty if the file does not exist yet).
    #[track_caller]
    pub fn records(&self) -> Vec<Value> {
        match std::fs::read(&self.path) {
            Ok(b) => {
                let v: Value = serde_json::from_slice(&b)
                    .unwrap_or_else(|e| panic!("{}: {e}", self.path.display()));
                let all = v["leases"].as_array().cloned().unwrap_or_default();
                all.into_iter()
                    .filter(|r| r["network"] == self.network.as_str())
                    .collect()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("{}: {e}", self.path.display()),
        }
    }

    pub fn record(&self, addr: IpAddr) -> Option<Value> {
        self.records()
            .into_iter()
            .find(|r| r["address"].as_str().and_then(|a| a.parse::<IpAddr>().ok()) == Some(addr))
    }

    /// Addresses in state `leased`.
    pub fn leased(&self) -> Vec<IpAddr> {
        self.of_kind("leased")
    }

    /// Addresses in state `quarantined`, with the MAC recorded.
    pub fn quarantined(&self) -> Vec<(IpAddr, String)> {
        self.records()
            .into_iter()
            .filter(|r| r["state"]["kind"] == "quarantined")
            .map(|r| {
                (
                    r["address"].as_str().unwrap().parse().unwrap(),
                    r["state"]["mac"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    fn of_kind(&self, kind: &str) -> Vec<IpAddr> {
        self.records()
            .into_iter()
            .filter(|r| r["state"]["kind"] == kind)
            .map(|r| r["address"].as_str().unwrap().parse().unwrap())
            .collect()
    }
}

const ARP_PROBE_PY: &str = r#"
import socket, struct, sys, time, fcntl, select
iface, target, timeout = sys.argv[1], socket.inet_aton(sys.argv[2]), float(sys.argv[3]) / 1000.0
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0806))
s.bind((iface, 0x0806))
me = fcntl.ioctl(s.fileno(), 0x8927, struct.pack('256s', iface.encode()[:15]))[18:24]
arp = struct.pack('!HHBBH', 1, 0x0800, 6, 4, 1) + me + bytes(4) + bytes(6) + target
s.send(b'\xff' * 6 + me + b'\x08\x06' + arp)
deadline = time.time() + timeout
while True:
    left = deadline - time.time()
    if left <= 0:
        print("none")
        break
    r, _, _ = select.select([s], [], [], left)
    if not r:
        continue
    f, addr = s.recvfrom(2048)
    if addr[2] == socket.PACKET_OUTGOING or len(f) < 42:
        continue
    if f[28:32] == target:
        print(':'.join('%02x' % b for b in f[22:28]))
        break
"#;

/// Send one RFC 5227 ARP probe (sender IP 0.0.0.0) for `target` from `ifname` in `ns` with a plain
/// packet socket, independent of tether, and return the MAC of whoever answered within `timeout`.
#[track_caller]
pub fn raw_arp_probe(
    ns: &NetNs,
    ifname: &str,
    target: IpAddr,
    timeout: Duration,
) -> Option<String> {
    let out = ns.exec(
        "/usr/bin/python3",
        &[
            "-c",
            ARP_PROBE_PY,
            ifname,
            &target.to_string(),
            &timeout.as_millis().to_string(),
        ],
    );
    out.assert_success();
    match out.stdout.trim() {
        "none" => None,
        m => Some(m.to_string()),
    }
}
