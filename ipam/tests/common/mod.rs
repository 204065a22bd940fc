//! Black-box harness for `tether-ipam`: exec the binary with CNI_* variables and the config on stdin,
//! the way libcni's `invoke` does, and read the lease state file it keeps.
//!
//! Every test gets its own data directory and network name, so tests run in parallel. Nothing here
//! needs root or a network namespace: these configs set `"probe": false` (probing is covered by
//! conformance/tests/host_probe.rs on a real segment).

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};

/// The binary under test (cargo builds it for the package's integration tests).
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tether-ipam")
}

/// A unique token for names.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{n}-{:x}", std::process::id(), t & 0xffff)
}

/// A directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("tether-ipam-test-{}", unique(prefix)));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one invocation did.
#[derive(Debug)]
pub struct Out {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub what: String,
}

impl Out {
    pub fn from(what: String, o: Output) -> Out {
        Out {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            what,
        }
    }

    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// Panics unless exit 0; returns stdout as JSON (Null when empty).
    #[track_caller]
    pub fn expect_ok(&self) -> Value {
        assert!(self.ok(), "{self}");
        if self.stdout.trim().is_empty() {
            return Value::Null;
        }
        assert_eq!(
            self.stdout.trim_end().lines().count(),
            1,
            "one object on stdout: {self}"
        );
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout not JSON ({e}): {self}"))
    }

    /// Panics unless a CNI error with `code`: exit non-zero, exactly one error object on stdout.
    /// Returns the message (plus details).
    #[track_caller]
    pub fn expect_err(&self, code: u64) -> String {
        assert!(
            !self.ok() && self.code.is_some(),
            "expected CNI error {code}: {self}"
        );
        assert_eq!(
            self.stdout.trim_end().lines().count(),
            1,
            "exactly one error object: {self}"
        );
        let e: Value = serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout not JSON ({e}): {self}"));
        assert_eq!(e["code"].as_u64(), Some(code), "wrong code: {self}");
        assert!(
            e.get("ips").is_none(),
            "an error must not carry a Result: {self}"
        );
        let msg = e["msg"]
            .as_str()
            .unwrap_or_else(|| panic!("no msg: {self}"))
            .to_string();
        match e["details"].as_str() {
            Some(d) => format!("{msg}: {d}"),
            None => msg,
        }
    }

    /// `ips[].address` of an ADD result.
    #[track_caller]
    pub fn addresses(&self) -> Vec<String> {
        let v = self.expect_ok();
        v["ips"]
            .as_array()
            .unwrap_or_else(|| panic!("no ips: {self}"))
            .iter()
            .map(|i| i["address"].as_str().unwrap().to_string())
            .collect()
    }

    /// The only address of an ADD result, without the prefix.
    #[track_caller]
    pub fn ip(&self) -> IpAddr {
        let a = self.addresses();
        assert_eq!(a.len(), 1, "{self}");
        host(&a[0])
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} -> {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what,
            self.code,
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }
}

/// `10.1.2.9/24` → `10.1.2.9`.
pub fn host(cidr: &str) -> IpAddr {
    cidr.split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("not an address: {cidr}"))
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// One attachment's CNI environment.
#[derive(Debug, Clone, Default)]
pub struct Att {
    pub container_id: String,
    pub ifname: String,
    pub args: Option<String>,
}

impl Att {
    pub fn new(container_id: &str) -> Att {
        Att {
            container_id: container_id.to_string(),
            ifname: "net1".into(),
            args: None,
        }
    }
    pub fn ifname(mut self, i: &str) -> Att {
        self.ifname = i.to_string();
        self
    }
    pub fn args(mut self, a: &str) -> Att {
        self.args = Some(a.to_string());
        self
    }
    /// Multus-shaped pod identity.
    pub fn pod(self, ns: &str, name: &str, uid: &str) -> Att {
        let cid = self.container_id.clone();
        self.args(&format!("IgnoreUnknown=true;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={uid}"))
    }
}

/// One test network: a private data dir, a unique network name and an `ipam` section.
pub struct Net {
    pub dir: TempDir,
    pub name: String,
    pub version: String,
    pub ipam: Value,
    /// Extra top-level keys (runtimeConfig, args, ...).
    pub top: serde_json::Map<String, Value>,
}

impl Net {
    /// `ipam` holds everything but `type` and `dataDir`, which are filled in; probing off.
    pub fn new(ipam: Value) -> Net {
        let dir = TempDir::new("net");
        let name = unique("n").replace('-', "_");
        let mut ipam = ipam;
        let o = ipam.as_object_mut().expect("ipam object");
        o.insert("type".into(), json!("tether-ipam"));
        o.entry("dataDir")
            .or_insert(json!(dir.path().join("state")));
        o.entry("probe").or_insert(json!(false));
        Net {
            dir,
            name,
            version: "1.1.0".into(),
            ipam,
            top: Default::default(),
        }
    }

    pub fn version(mut self, v: &str) -> Net {
        self.version = v.to_string();
        self
    }

    pub fn data_dir(&self) -> PathBuf {
        PathBuf::from(self.ipam["dataDir"].as_str().unwrap())
    }

    /// The state file of this network's uniqueness domain (`ipam.isolated_fabric`, else the
    /// cluster's), which the network shares with the others of its domain on this data dir.
    pub fn state_path(&self) -> PathBuf {
        let fabric = self.ipam.get("isolated_fabric").and_then(Value::as_str);
        tether_leases::FileStore::new(self.data_dir()).state_path(fabric)
    }

    /// The network configuration, with `extra` top-level keys merged in.
    pub fn conf_with(&self, extra: Value) -> Value {
        let mut c = json!({"cniVersion": self.version, "name": self.name, "type": "tether-ipam", "ipam": self.ipam});
        let o = c.as_object_mut().unwrap();
        for (k, v) in &self.top {
            o.insert(k.clone(), v.clone());
        }
        if let Value::Object(m) = extra {
            for (k, v) in m {
                o.insert(k, v);
            }
        }
        c
    }

    pub fn conf(&self) -> Value {
        self.conf_with(json!({}))
    }

    /// The command for `verb` on `att` (None: STATUS/GC-style, no attachment variables).
    pub fn command(&self, verb: &str, att: Option<&Att>) -> Command {
        let mut c = Command::new(bin());
        for v in [
            "CNI_COMMAND",
            "CNI_CONTAINERID",
            "CNI_NETNS",
            "CNI_IFNAME",
            "CNI_ARGS",
            "CNI_PATH",
            "NODE_NAME",
        ] {
            c.env_remove(v);
        }
        // These configs name no store: the node-local one, as on a host without tether's
        // node-agent, whatever this host has.
        c.env("CNI_COMMAND", verb)
            .env("CNI_PATH", "/nonexistent")
            .env("NODE_NAME", "node-a")
            .env("TETHER_NODE_KUBECONFIG", "")
            // No call records into this host's spool (tests/verbs.rs reads its own).
            .env("TETHER_CALL_SPOOL", "");
        if let Some(a) = att {
            c.env("CNI_CONTAINERID", &a.container_id)
                .env("CNI_IFNAME", &a.ifname);
            if verb != "DEL" {
                // Probing is off, so the netns is never opened.
                c.env("CNI_NETNS", "/var/run/netns/tether-ipam-test-unused");
            }
            if let Some(args) = &a.args {
                c.env("CNI_ARGS", args);
            }
        }
        c
    }

    /// Run `verb` with `conf` on stdin.
    pub fn call_conf(&self, verb: &str, att: Option<&Att>, conf: &Value) -> Out {
        let mut c = self.command(verb, att);
        let what = format!(
            "{verb} {}",
            att.map(|a| format!("{}/{}", a.container_id, a.ifname))
                .unwrap_or_default()
        );
        Out::from(what, run_with_stdin(&mut c, conf.to_string().as_bytes()))
    }

    pub fn call(&self, verb: &str, att: Option<&Att>) -> Out {
        self.call_conf(verb, att, &self.conf())
    }

    pub fn add(&self, att: &Att) -> Out {
        self.call("ADD", Some(att))
    }
    pub fn add_with(&self, att: &Att, extra: Value) -> Out {
        self.call_conf("ADD", Some(att), &self.conf_with(extra))
    }
    pub fn del(&self, att: &Att) -> Out {
        self.call("DEL", Some(att))
    }
    pub fn check(&self, att: &Att) -> Out {
        self.call("CHECK", Some(att))
    }
    pub fn status(&self) -> Out {
        self.call("STATUS", None)
    }

    /// Spawn `verb` for `att` without waiting (stdin written and closed).
    pub fn spawn(&self, verb: &str, att: &Att) -> Child {
        let mut c = self.command(verb, Some(att));
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawn tether-ipam");
        let mut stdin = child.stdin.take().unwrap();
        // Small config: fits the pipe buffer, so this never blocks.
        stdin.write_all(self.conf().to_string().as_bytes()).unwrap();
        drop(stdin);
        child
    }

    /// Allocate with fresh attachments until ADD fails; returns every address handed out and the
    /// final error message (code 102).
    #[track_caller]
    pub fn exhaust(&self, tag: &str) -> (BTreeSet<IpAddr>, String) {
        let mut got = BTreeSet::new();
        for n in 0.. {
            let att = Att::new(&format!("{tag}{n}"));
            let out = self.add(&att);
            if !out.ok() {
                let msg = out.expect_err(102);
                return (got, msg);
            }
            let v = out.expect_ok();
            for i in v["ips"].as_array().unwrap() {
                assert!(
                    got.insert(host(i["address"].as_str().unwrap())),
                    "address handed out twice: {out}"
                );
            }
            assert!(n < 100_000, "never exhausted");
        }
        unreachable!()
    }

    /// The state file as JSON (panics if missing or not JSON).
    #[track_caller]
    pub fn state(&self) -> Value {
        let p = self.state_path();
        let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        serde_json::from_slice(&b).unwrap_or_else(|e| panic!("{} is not JSON: {e}", p.display()))
    }

    /// Every record of the state file (empty when there is none yet).
    pub fn records(&self) -> Vec<Value> {
        if !self.state_path().exists() {
            return Vec::new();
        }
        self.state()["leases"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Leased records: address → (container_id, ifname).
    pub fn leased(&self) -> BTreeMap<IpAddr, (String, String)> {
        let mut m = BTreeMap::new();
        for r in self
            .records()
            .into_iter()
            .filter(|r| r["state"]["kind"] == "leased")
        {
            let a = ip(r["address"].as_str().unwrap());
            let prev = m.insert(
                a,
                (
                    r["container_id"].as_str().unwrap().to_string(),
                    r["ifname"].as_str().unwrap().to_string(),
                ),
            );
            assert!(prev.is_none(), "two leased records for {a}");
        }
        m
    }

    /// The record of `addr`, if any.
    pub fn record(&self, addr: IpAddr) -> Option<Value> {
        self.records()
            .into_iter()
            .find(|r| ip(r["address"].as_str().unwrap()) == addr)
    }

    /// Leased addresses of one attachment.
    pub fn leased_by(&self, att: &Att) -> Vec<IpAddr> {
        self.leased()
            .into_iter()
            .filter(|(_, (c, i))| *c == att.container_id && *i == att.ifname)
            .map(|(a, _)| a)
            .collect()
    }
}

pub fn run_with_stdin(c: &mut Command, input: &[u8]) -> Output {
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn tether-ipam");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let w = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    let _ = w.join();
    out
}

/// Every address from `first` to `last` inclusive (same family).
pub fn span(first: &str, last: &str) -> BTreeSet<IpAddr> {
    let (a, b) = (ip(first), ip(last));
    let v = |x: IpAddr| match x {
        IpAddr::V4(v) => u32::from(v) as u128,
        IpAddr::V6(v) => u128::from(v),
    };
    (v(a)..=v(b))
        .map(|n| match a {
            IpAddr::V4(_) => IpAddr::V4((n as u32).into()),
            IpAddr::V6(_) => IpAddr::V6(n.into()),
        })
        .collect()
}
