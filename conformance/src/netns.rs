//! Named network namespaces (`ip netns`) with a Drop guard, and link helpers.
//!
//! Every namespace gets a unique name `tether-<prefix>-<pid>-<n>-<t>`, so tests
//! can run in parallel and leftovers are recognisable (`ip netns | grep ^tether-`).

use std::path::PathBuf;
use std::process::Command;

use crate::cmd::{CmdOutput, capture, run};
use crate::paths::unique_token;

/// A named network namespace, deleted (`ip netns del`) on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates `tether-<prefix>-<unique>` and brings its `lo` up.
    /// Panics if `ip netns add` fails.
    #[track_caller]
    pub fn new(prefix: &str) -> NetNs {
        let name = format!("tether-{prefix}-{}", unique_token());
        run("ip", &["netns", "add", &name]).assert_success();
        let ns = NetNs { name };
        ns.ip_ok(&["link", "set", "lo", "up"]);
        ns
    }

    /// Whether a namespace called `name` exists (`/run/netns/<name>`).
    pub fn exists(name: &str) -> bool {
        PathBuf::from("/run/netns").join(name).exists()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`: what a runtime passes as CNI_NETNS.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `ip netns exec <name> <program>`: add args/env and run it with
    /// [`crate::cmd::capture`].
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Runs `program args...` inside the namespace.
    #[track_caller]
    pub fn exec(&self, program: &str, args: &[&str]) -> CmdOutput {
        capture(self.command(program).args(args))
    }

    /// Like [`exec`](Self::exec); panics unless it exits 0.
    #[track_caller]
    pub fn exec_ok(&self, program: &str, args: &[&str]) -> CmdOutput {
        let out = self.exec(program, args);
        out.assert_success();
        out
    }

    /// `ip -n <name> args...`.
    #[track_caller]
    pub fn ip(&self, args: &[&str]) -> CmdOutput {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        run("ip", &a)
    }

    /// `ip -n <name> args...`; panics unless it exits 0.
    #[track_caller]
    pub fn ip_ok(&self, args: &[&str]) -> CmdOutput {
        let out = self.ip(args);
        out.assert_success();
        out
    }

    /// `ip -n <name> -j args...` parsed (panics on failure).
    #[track_caller]
    pub fn ip_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["-j"];
        a.extend_from_slice(args);
        self.ip_ok(&a).json()
    }

    /// `ip -d -j link show dev <ifname>`'s object, or `None` if there is no
    /// such link. Interesting keys: `ifindex`, `address`, `mtu`, `operstate`,
    /// `linkinfo.info_kind`, `linkinfo.info_data`, `link` / `link_index` /
    /// `link_netnsid` (the parent).
    #[track_caller]
    pub fn link(&self, ifname: &str) -> Option<serde_json::Value> {
        let out = self.ip(&["-d", "-j", "link", "show", "dev", ifname]);
        if !out.success() {
            return None;
        }
        match out.json() {
            serde_json::Value::Array(mut v) if !v.is_empty() => Some(v.remove(0)),
            _ => None,
        }
    }

    pub fn has_link(&self, ifname: &str) -> bool {
        self.link(ifname).is_some()
    }

    /// The ifindex of `ifname` (panics if absent).
    #[track_caller]
    pub fn ifindex(&self, ifname: &str) -> u64 {
        self.link(ifname)
            .and_then(|l| l["ifindex"].as_u64())
            .unwrap_or_else(|| panic!("no link {ifname} in netns {}", self.name))
    }

    /// `ip link set <ifname> up`.
    #[track_caller]
    pub fn link_up(&self, ifname: &str) {
        self.ip_ok(&["link", "set", ifname, "up"]);
    }

    /// `ip addr add <cidr> dev <ifname>`.
    #[track_caller]
    pub fn addr_add(&self, ifname: &str, cidr: &str) {
        self.ip_ok(&["addr", "add", cidr, "dev", ifname]);
    }

    /// The global-scope IPv4/IPv6 addresses (`addr/prefix`) on `ifname`
    /// (link-local fe80:: ones are left out).
    #[track_caller]
    pub fn addrs(&self, ifname: &str) -> Vec<String> {
        let v = self.ip_json(&["addr", "show", "dev", ifname, "scope", "global"]);
        v.as_array()
            .into_iter()
            .flatten()
            .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
            .filter_map(|a| {
                Some(format!(
                    "{}/{}",
                    a["local"].as_str()?,
                    a["prefixlen"].as_u64()?
                ))
            })
            .collect()
    }

    /// Pings `dst` from inside the namespace (`count` probes, 1 s apart, each
    /// waiting at most 2 s).
    #[track_caller]
    pub fn ping(&self, dst: &str, count: u32) -> CmdOutput {
        let c = count.to_string();
        self.exec("ping", &["-c", &c, "-i", "0.2", "-W", "2", dst])
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let out = run("ip", &["netns", "del", &self.name]);
        if !out.success() && Self::exists(&self.name) {
            eprintln!("warning: could not delete netns {}: {out}", self.name);
        }
    }
}

/// Creates a veth pair `a_if` (in `a`) <-> `b_if` (in `b`) and sets both up.
/// Interface names are limited to 15 bytes by the kernel.
#[track_caller]
pub fn veth_pair(a: &NetNs, a_if: &str, b: &NetNs, b_if: &str) {
    a.ip_ok(&[
        "link",
        "add",
        a_if,
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.name(),
    ]);
    a.link_up(a_if);
    b.link_up(b_if);
}
