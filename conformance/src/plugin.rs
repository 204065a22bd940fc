//! Executing a CNI plugin directly, the way a runtime's `invoke` does (CNI_*
//! variables in the environment, the config on stdin), and a scriptable fake
//! IPAM plugin that records every call.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd::{CmdOutput, capture_with_stdin};
use crate::netns::NetNs;
use crate::paths::{TempDir, target_dir};

/// The directory cargo put this workspace's binaries in, for the profile the
/// test itself was built with (`target/debug` or `target/release`).
/// `$TETHER_BIN_DIR` overrides it.
pub fn tether_bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TETHER_BIN_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    target_dir().join(if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    })
}

/// `<bin dir>/<name>` (e.g. `tether-ipvlan`); panics with a hint when missing.
#[track_caller]
pub fn tether_binary(name: &str) -> PathBuf {
    let p = tether_bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} missing: build it first (cargo build --workspace --bins)",
        p.display()
    );
    p
}

/// CNI variables a direct invocation sets; everything else of ours is removed
/// so the caller's environment cannot leak into the plugin.
pub const CNI_VARS: &[&str] = &[
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
    "CNI_NETNS_OVERRIDE",
];

/// One plugin binary plus the CNI environment to run it with.
///
/// Unset variables are removed from the child's environment (not inherited).
/// `call(verb, stdin)` sets CNI_COMMAND and runs it, optionally inside a netns
/// (`ip netns exec`), e.g. the "host" namespace holding the master.
#[derive(Debug, Clone)]
pub struct PluginExec {
    bin: PathBuf,
    run_in: Option<String>,
    vars: BTreeMap<String, String>,
}

impl PluginExec {
    pub fn new(bin: impl Into<PathBuf>) -> PluginExec {
        PluginExec {
            bin: bin.into(),
            run_in: None,
            vars: BTreeMap::new(),
        }
    }

    /// Run inside `ns` (`ip netns exec <ns>`).
    pub fn run_in(mut self, ns: &NetNs) -> Self {
        self.run_in = Some(ns.name().to_string());
        self
    }

    /// Set an environment variable (e.g. `CNI_CONTAINERID`).
    pub fn var(mut self, key: impl Into<String>, val: impl Into<String>) -> Self {
        self.vars.insert(key.into(), val.into());
        self
    }

    /// Remove a variable set earlier (the child will not have it at all).
    pub fn unset(mut self, key: &str) -> Self {
        self.vars.remove(key);
        self
    }

    /// The same invocation (netns, variables) of another binary, e.g. the
    /// IPAM plugin a CNI plugin delegates to.
    pub fn with_binary(&self, bin: impl Into<PathBuf>) -> Self {
        PluginExec {
            bin: bin.into(),
            ..self.clone()
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars.get(key).map(String::as_str)
    }

    /// The command for `verb` (CNI_COMMAND), environment set, not yet run.
    pub fn command(&self, verb: &str) -> Command {
        let mut c = match &self.run_in {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        for v in CNI_VARS {
            c.env_remove(v);
        }
        c.env("CNI_COMMAND", verb);
        for (k, v) in &self.vars {
            c.env(k, v);
        }
        c
    }

    /// Runs `verb` with `stdin`.
    #[track_caller]
    pub fn call(&self, verb: &str, stdin: &[u8]) -> CmdOutput {
        capture_with_stdin(&mut self.command(verb), Some(stdin))
    }

    /// Runs `verb` with `config` serialised as stdin.
    #[track_caller]
    pub fn call_json(&self, verb: &str, config: &serde_json::Value) -> CmdOutput {
        self.call(verb, config.to_string().as_bytes())
    }
}

/// Asserts `out` is a CNI error: non-zero exit and exactly one JSON object on
/// stdout with a numeric `code` and a string `msg`; when `code` is given, the
/// error's code must equal it. Returns the error object.
#[track_caller]
pub fn assert_cni_error(out: &CmdOutput, code: Option<u64>) -> serde_json::Value {
    out.assert_failure();
    let e = out.json();
    let got = e["code"]
        .as_u64()
        .unwrap_or_else(|| panic!("error without a numeric code: {out}"));
    assert!(e["msg"].is_string(), "error without msg: {out}");
    if let Some(want) = code {
        assert_eq!(got, want, "wrong error code: {out}");
    }
    e
}

/// One recorded call of a [`FakeIpam`].
#[derive(Debug, Clone)]
pub struct FakeCall {
    pub command: String,
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    /// The config it received on stdin (`Null` if it was not JSON).
    pub stdin: serde_json::Value,
}

/// A fake IPAM plugin: a `/bin/sh` script named `name` in its own directory
/// (put [`FakeIpam::dir`] in CNI_PATH) that appends every call to a log and
/// answers each verb with a configurable shell snippet. Defaults: ADD prints
/// one address (`10.1.2.77/24`); every other verb succeeds silently; VERSION
/// lists 0.3.0–1.1.0.
#[derive(Debug)]
pub struct FakeIpam {
    dir: TempDir,
    name: String,
    answers: BTreeMap<String, String>,
}

impl FakeIpam {
    pub fn new(name: &str) -> FakeIpam {
        let mut f = FakeIpam {
            dir: TempDir::new("fakeipam"),
            name: name.to_string(),
            answers: BTreeMap::new(),
        };
        f.answers.insert(
            "ADD".into(),
            Self::print(&serde_json::json!({
                "cniVersion": "1.0.0",
                "ips": [{"address": "10.1.2.77/24"}]
            })),
        );
        f.answers.insert(
            "VERSION".into(),
            Self::print(&serde_json::json!({
                "cniVersion": "1.1.0",
                "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
            })),
        );
        f.write();
        f
    }

    /// A snippet that prints `v` on stdout and exits 0.
    pub fn print(v: &serde_json::Value) -> String {
        format!("printf '%s\\n' '{}'", v.to_string().replace('\'', r"'\''"))
    }

    /// A snippet that prints the CNI error `{code, msg}` and exits 1.
    pub fn fail(code: u32, msg: &str) -> String {
        format!(
            "{}; exit 1",
            Self::print(&serde_json::json!({"cniVersion": "1.0.0", "code": code, "msg": msg}))
        )
    }

    /// Answer `verb` (ADD, DEL, CHECK, STATUS, GC, VERSION) with the shell
    /// `snippet` (see [`print`](Self::print), [`fail`](Self::fail)).
    pub fn answer(mut self, verb: &str, snippet: impl Into<String>) -> Self {
        self.answers.insert(verb.to_string(), snippet.into());
        self.write();
        self
    }

    fn write(&self) {
        let log = self.log_path();
        let mut s = String::from("#!/bin/sh\n# fake IPAM written by tether-conformance\n");
        s += "in=$(cat)\n";
        s += &format!(
            "printf '%s\\t%s\\t%s\\t%s\\t%s\\n' \"$CNI_COMMAND\" \"$CNI_CONTAINERID\" \"$CNI_IFNAME\" \"$CNI_NETNS\" \
             \"$(printf '%s' \"$in\" | tr -d '\\n\\t')\" >>'{}'\n",
            log.display()
        );
        s += "case \"$CNI_COMMAND\" in\n";
        for (verb, snippet) in &self.answers {
            s += &format!("{verb})\n{snippet}\n;;\n");
        }
        s += "esac\nexit 0\n";
        let p = self.path();
        let tmp = self.dir.join(format!(".{}.tmp", self.name));
        std::fs::write(&tmp, s).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
    }

    /// The directory holding the script (for CNI_PATH).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The `type` to put in `ipam`.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("calls.log")
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<FakeCall> {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        text.lines()
            .map(|l| {
                let f: Vec<&str> = l.splitn(5, '\t').collect();
                let get = |i: usize| f.get(i).copied().unwrap_or_default().to_string();
                FakeCall {
                    command: get(0),
                    container_id: get(1),
                    ifname: get(2),
                    netns: get(3),
                    stdin: serde_json::from_str(&get(4)).unwrap_or(serde_json::Value::Null),
                }
            })
            .collect()
    }

    /// The verbs called so far, in order (e.g. `["ADD", "DEL"]`).
    pub fn verbs(&self) -> Vec<String> {
        self.calls().into_iter().map(|c| c.command).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_ipam_answers_and_records_calls() {
        let fake = FakeIpam::new("fake-ipam").answer("DEL", FakeIpam::fail(11, "it's busy"));
        let exec = PluginExec::new(fake.path())
            .var("CNI_CONTAINERID", "c1")
            .var("CNI_IFNAME", "net1");
        let add = exec.call_json(
            "ADD",
            &serde_json::json!({"cniVersion": "1.0.0", "name": "n"}),
        );
        assert_eq!(add.json()["ips"][0]["address"], "10.1.2.77/24");
        let del = exec.unset("CNI_IFNAME").call("DEL", b"{\"a\":\n1}");
        let e = assert_cni_error(&del, Some(11));
        assert_eq!(e["msg"], "it's busy");
        let calls = fake.calls();
        assert_eq!(fake.verbs(), ["ADD", "DEL"]);
        assert_eq!(
            (calls[0].container_id.as_str(), calls[0].ifname.as_str()),
            ("c1", "net1")
        );
        assert_eq!(calls[0].stdin["name"], "n");
        assert_eq!(
            (calls[1].ifname.as_str(), &calls[1].stdin),
            ("", &serde_json::json!({"a": 1}))
        );
    }
}
