//! The dispatcher every tether binary runs: read the environment and stdin, validate, call the plugin
//! for the verb, print exactly one Result or one error on stdout.

use std::any::Any;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use crate::call_spool::{CallRecord, Spool};
use crate::config::{NetConf, sniff_version};
use crate::delegate::Delegation;
use crate::env::{Command, Env};
use crate::error::{CniError, code};
use crate::result::CniResult;
use crate::version::{self, LATEST, SUPPORTED, Version};

/// One validated invocation.
#[derive(Debug)]
pub struct Request {
    pub env: Env,
    pub conf: NetConf,
    /// The whole environment, for handing to a delegate unchanged.
    pub vars: HashMap<String, String>,
}

impl Request {
    pub fn delegation(&self) -> Delegation<'_> {
        Delegation {
            path: &self.env.path,
            vars: &self.vars,
            stdin: &self.conf.raw,
        }
    }
}

/// What a successful ADD hands the dispatcher, by value.
pub struct Added {
    pub result: CniResult,
    /// Addresses of `result` probed on the wire and found unused: printed under
    /// [`crate::result::PROBED_KEY`], the one note from tether-ipam to tether-ipvlan (runtimes ignore
    /// unknown keys).
    pub probed: Vec<IpAddr>,
    /// Dropped by [`run_main`] only once the reply is written and stdout and stderr are closed:
    /// what would delay the caller to release (tether-ipam's probe sockets, each close waiting out
    /// an RCU grace period; tether-ipvlan acts on the Result as soon as it reads EOF).
    pub linger: Option<Box<dyn Any>>,
}

impl From<CniResult> for Added {
    fn from(result: CniResult) -> Added {
        Added {
            result,
            probed: Vec::new(),
            linger: None,
        }
    }
}

/// A CNI plugin: one method per verb. VERSION and all input validation are handled by [`dispatch`].
pub trait Plugin {
    /// Binary name, for logs and the "about" line.
    fn name(&self) -> &'static str;
    fn add(&self, req: &Request) -> Result<Added, CniError>;
    fn del(&self, req: &Request) -> Result<(), CniError>;
    fn check(&self, req: &Request) -> Result<(), CniError>;
    fn status(&self, req: &Request) -> Result<(), CniError>;
    fn gc(&self, req: &Request) -> Result<(), CniError>;
}

/// Run as a CNI plugin with the process's environment and standard streams, then exit.
pub fn run_main<P: Plugin>(plugin: &P) -> ! {
    let started = Instant::now();
    crate::logging::install(plugin.name());
    // A panic becomes a CNI error below; the hook only logs it, without a backtrace on the runtime's stderr.
    std::panic::set_hook(Box::new(|info| log::error!("internal error: {info}")));
    let vars: HashMap<String, String> = std::env::vars().collect();
    let served = serve(
        plugin,
        &vars,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr(),
    );
    close_output();
    // Timed to the reply; recorded once the caller has it.
    let seconds = started.elapsed().as_secs_f64();
    drop(served.linger);
    if let Some(call) = served.call {
        spool_record(call.record(plugin.name(), seconds));
    }
    std::process::exit(served.status)
}

/// Leave the call's record for the node-agent's metrics; a failure here never fails the call.
fn spool_record(record: CallRecord) {
    let Some(path) = crate::call_spool::spool_path() else {
        return;
    };
    match Spool::existing(&path).and_then(|s| s.map(|s| s.write(&record)).transpose()) {
        Ok(_) => {}
        Err(e) => log::debug!("not recording this call for the node-agent: {e}"),
    }
}

/// What one invocation was, for its record: known once the dispatcher is done.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    verb: &'static str,
    /// Empty until the configuration was read.
    network: String,
    code: u32,
}

impl Call {
    fn record(self, plugin: &str, seconds: f64) -> CallRecord {
        CallRecord {
            plugin: plugin.to_string(),
            verb: self.verb.to_string(),
            network: self.network,
            code: self.code,
            seconds,
        }
    }
}

/// What [`serve`] did: the exit status, what a successful ADD keeps until the reply is out, and
/// the call (`None` when there was no CNI_COMMAND: a person asking what this is).
struct Served {
    status: i32,
    linger: Option<Box<dyn Any>>,
    call: Option<Call>,
}

/// Point stdout and stderr at /dev/null, so the caller reads EOF now rather than at exit. (A plugin that
/// spawned children would have to close their copies too; tether's do not.)
fn close_output() {
    let _ = std::io::stdout().flush();
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return;
    };
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: dup2 onto the standard descriptors, which std keeps no state about beyond the flushed
        // buffer; `null` stays open across the calls.
        unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd) };
    }
}

/// The most a runtime may send on stdin. A real config is a few KiB; GC's list of valid
/// attachments is the large one (100,000 attachments are about 10 MiB). More is refused before it
/// is parsed, so a NAD cannot make every node's plugin hold hundreds of MiB.
pub const MAX_STDIN: usize = 16 << 20;

/// Everything [`run_main`] does, with injectable streams so it is unit-tested. Returns the exit status.
pub fn dispatch<P: Plugin>(
    plugin: &P,
    vars: &HashMap<String, String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> i32 {
    serve(plugin, vars, stdin, stdout, stderr).status
}

/// [`dispatch`], also returning what a successful ADD asked to keep until the reply is out, and
/// what the call was.
fn serve<P: Plugin>(
    plugin: &P,
    vars: &HashMap<String, String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> Served {
    let answered = |status: i32, verb: &'static str, network: String, code: u32| Served {
        status,
        linger: None,
        call: Some(Call {
            verb,
            network,
            code,
        }),
    };
    let command = match vars.get("CNI_COMMAND").map(String::as_str) {
        None | Some("") => {
            let _ = writeln!(
                stderr,
                "{}: CNI plugin {}; supported CNI versions: {}",
                plugin.name(),
                env!("CARGO_PKG_VERSION"),
                SUPPORTED.join(", ")
            );
            return Served {
                status: 0,
                linger: None,
                call: None,
            };
        }
        Some(c) => c,
    };
    let verb = Command::parse(command).map_or("unknown", Command::as_str);
    let mut raw = Vec::new();
    if let Err(e) = stdin.take(MAX_STDIN as u64 + 1).read_to_end(&mut raw) {
        let e = CniError::new(code::IO, format!("reading stdin: {e}"));
        return answered(fail(stdout, LATEST, &e), verb, String::new(), e.code);
    }
    if raw.len() > MAX_STDIN {
        let e = CniError::invalid_config(format!(
            "the network configuration on stdin is larger than {} MiB; nothing was done",
            MAX_STDIN >> 20
        ));
        return answered(fail(stdout, LATEST, &e), verb, String::new(), e.code);
    }
    let sniffed = sniff_version(&raw).filter(|v| !v.is_empty());
    let Some(command) = Command::parse(command) else {
        let e = CniError::invalid_env(format!(
            "CNI_COMMAND {command:?} is unknown; expected ADD, DEL, CHECK, STATUS, GC or VERSION"
        ));
        let status = fail(stdout, sniffed.as_deref().unwrap_or(LATEST), &e);
        return answered(status, verb, String::new(), e.code);
    };
    if command == Command::Version {
        let _ = writeln!(
            stdout,
            "{}",
            version::version_info(sniffed.as_deref().unwrap_or(LATEST))
        );
        return answered(0, verb, String::new(), 0);
    }
    // Errors are stamped with the config's version when it is one we speak, else the newest.
    let stamp = sniffed
        .as_deref()
        .filter(|v| Version::parse(v).is_ok())
        .unwrap_or(LATEST)
        .to_string();

    let (network, outcome) = run_verb(plugin, command, vars, &raw);
    match outcome {
        Ok(Some((added, v))) => {
            let mut out = added.result.to_value(v);
            crate::result::note_probed(&mut out, &added.probed);
            let _ = writeln!(stdout, "{out}");
            Served {
                linger: added.linger,
                ..answered(0, verb, network, 0)
            }
        }
        Ok(None) => answered(0, verb, network, 0),
        Err(e) => {
            log::warn!("{} {} failed: {e}", plugin.name(), command.as_str());
            answered(fail(stdout, &stamp, &e), verb, network, e.code)
        }
    }
}

/// Validate env and config for `command`, then call the plugin; a panic inside becomes an error.
/// ADD's Result comes back with the version to print it in; the network's name beside it, once
/// the config was read.
fn run_verb<P: Plugin>(
    plugin: &P,
    command: Command,
    vars: &HashMap<String, String>,
    raw: &[u8],
) -> (String, Result<Option<(Added, Version)>, CniError>) {
    let parsed = Env::from_vars(command, vars).and_then(|env| Ok((env, NetConf::parse(raw)?)));
    match parsed {
        Ok((env, conf)) => (
            conf.name.clone(),
            call_verb(plugin, command, vars, env, conf),
        ),
        Err(e) => (String::new(), Err(e)),
    }
}

fn call_verb<P: Plugin>(
    plugin: &P,
    command: Command,
    vars: &HashMap<String, String>,
    env: Env,
    conf: NetConf,
) -> Result<Option<(Added, Version)>, CniError> {
    gate_version(command, conf.version)?;
    crate::logging::configure(&conf.value).map_err(|e| CniError::invalid_config(e.0))?;
    let version = conf.version;
    let req = Request {
        env,
        conf,
        vars: vars.clone(),
    };
    let call = AssertUnwindSafe(|| match command {
        Command::Add => plugin.add(&req).map(Some),
        Command::Del => plugin.del(&req).map(|()| None),
        Command::Check => plugin.check(&req).map(|()| None),
        Command::Status => plugin.status(&req).map(|()| None),
        Command::Gc => plugin.gc(&req).map(|()| None),
        Command::Version => unreachable!("VERSION is answered before any validation"),
    });
    match catch_unwind(call) {
        Ok(r) => r.map(|o| o.map(|res| (res, version))),
        Err(panic) => Err(CniError::internal(format!(
            "{} {}: internal error: {}",
            plugin.name(),
            command.as_str(),
            panic_text(&panic)
        ))),
    }
}

/// CHECK needs 0.4.0; GC and STATUS need 1.1.0.
fn gate_version(command: Command, v: Version) -> Result<(), CniError> {
    let needs = match command {
        Command::Check => Version::V0_4_0,
        Command::Gc | Command::Status => Version::V1_1_0,
        _ => return Ok(()),
    };
    if v < needs {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "config version {v} does not allow {}; it needs cniVersion {needs} or later",
                command.as_str()
            ),
        ));
    }
    Ok(())
}

fn fail(stdout: &mut dyn Write, stamp: &str, e: &CniError) -> i32 {
    let _ = writeln!(stdout, "{}", e.to_json(stamp));
    1
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::IpConfig;
    use serde_json::Value;

    /// Answers ADD with one address, panics when the config asks it to, fails DEL with code 7.
    struct Fake;

    impl Plugin for Fake {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn add(&self, req: &Request) -> Result<Added, CniError> {
            if req.conf.value.contains_key("panic") {
                panic!("boom at {}", req.env.ifname());
            }
            let result = CniResult {
                ips: vec![IpConfig {
                    address: "10.1.2.9/24".parse().unwrap(),
                    gateway: None,
                    interface: None,
                }],
                ..Default::default()
            };
            Ok(Added {
                result,
                probed: vec!["10.1.2.9".parse().unwrap()],
                linger: Some(Box::new("probe sockets")),
            })
        }
        fn del(&self, _: &Request) -> Result<(), CniError> {
            Err(CniError::invalid_config("nope"))
        }
        fn check(&self, _: &Request) -> Result<(), CniError> {
            Ok(())
        }
        fn status(&self, _: &Request) -> Result<(), CniError> {
            Ok(())
        }
        fn gc(&self, _: &Request) -> Result<(), CniError> {
            Ok(())
        }
    }

    struct Out {
        status: i32,
        stdout: String,
        stderr: String,
    }

    impl Out {
        fn json(&self) -> Value {
            assert_eq!(
                self.stdout.lines().count(),
                1,
                "exactly one object on stdout: {:?}",
                self.stdout
            );
            serde_json::from_str(&self.stdout).unwrap()
        }
    }

    fn run(cmd: Option<&str>, extra: &[(&str, &str)], stdin: &str) -> Out {
        let mut vars: HashMap<String, String> = [
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/p"),
            ("CNI_IFNAME", "net1"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Some(c) = cmd {
            vars.insert("CNI_COMMAND".into(), c.into());
        }
        for (k, v) in extra {
            if v.is_empty() {
                vars.remove(*k);
            } else {
                vars.insert(k.to_string(), v.to_string());
            }
        }
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let status = dispatch(&Fake, &vars, &mut stdin.as_bytes(), &mut o, &mut e);
        Out {
            status,
            stdout: String::from_utf8(o).unwrap(),
            stderr: String::from_utf8(e).unwrap(),
        }
    }

    fn conf(v: &str) -> String {
        format!(r#"{{"cniVersion":"{v}","name":"mgmt","type":"fake"}}"#)
    }

    #[test]
    fn version_echoes_input_and_needs_no_attachment_env() {
        let o = run(
            Some("VERSION"),
            &[
                ("CNI_CONTAINERID", ""),
                ("CNI_NETNS", ""),
                ("CNI_IFNAME", ""),
            ],
            r#"{"cniVersion":"1.1.0"}"#,
        );
        assert_eq!(o.status, 0);
        let v = o.json();
        assert_eq!(v["cniVersion"], "1.1.0");
        let sup: Vec<&str> = v["supportedVersions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        for s in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
            assert!(sup.contains(&s));
        }
        let o = run(
            Some("VERSION"),
            &[
                ("CNI_NETNS", "dummy"),
                ("CNI_IFNAME", "dummy"),
                ("CNI_PATH", "dummy"),
            ],
            "",
        );
        assert_eq!(
            (o.status, o.json()["cniVersion"].as_str().unwrap()),
            (0, "1.1.0")
        );
        let o = run(Some("VERSION"), &[], r#"{"cniVersion":"0.4.0"}"#);
        assert_eq!(o.json()["cniVersion"], "0.4.0");
    }

    #[test]
    fn unset_command_prints_about_on_stderr_only() {
        let o = run(None, &[], "");
        assert_eq!(o.status, 0);
        assert!(o.stdout.is_empty());
        assert!(
            o.stderr.contains("fake") && o.stderr.contains("1.1.0"),
            "{}",
            o.stderr
        );
    }

    #[test]
    fn unknown_command_is_code_4() {
        let o = run(Some("FOO"), &[], &conf("1.1.0"));
        assert_ne!(o.status, 0);
        assert_eq!(o.json()["code"], 4);
        assert!(o.json()["msg"].as_str().unwrap().contains("FOO"));
    }

    #[test]
    fn add_prints_result_in_config_layout() {
        for v in SUPPORTED {
            let o = run(Some("ADD"), &[], &conf(v));
            assert_eq!(o.status, 0, "{}", o.stdout);
            let r = o.json();
            assert_eq!(r["cniVersion"], *v);
            assert_eq!(
                r["ips"][0].get("version").is_some(),
                v.starts_with('0'),
                "{v}"
            );
            assert_eq!(
                r[crate::result::PROBED_KEY],
                serde_json::json!(["10.1.2.9"]),
                "the probed note"
            );
        }
    }

    #[test]
    fn what_an_add_keeps_comes_back_for_after_the_reply() {
        let vars: HashMap<String, String> = [
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "c1"),
            ("CNI_NETNS", "/run/netns/p"),
            ("CNI_IFNAME", "net1"),
            ("CNI_PATH", "/opt/cni/bin"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (mut o, mut e) = (Vec::new(), Vec::new());
        let Served { status, linger, .. } =
            serve(&Fake, &vars, &mut conf("1.1.0").as_bytes(), &mut o, &mut e);
        assert_eq!(status, 0);
        assert!(
            !o.is_empty(),
            "the reply is written before the linger is handed back"
        );
        let kept = linger.expect("the ADD's linger");
        assert_eq!(kept.downcast_ref::<&str>(), Some(&"probe sockets"));
    }

    #[test]
    fn each_call_says_what_it_was_for_its_record() {
        let call = |cmd: Option<&str>, stdin: &str| {
            let mut vars: HashMap<String, String> = [
                ("CNI_CONTAINERID", "c1"),
                ("CNI_NETNS", "/run/netns/p"),
                ("CNI_IFNAME", "net1"),
                ("CNI_PATH", "/opt/cni/bin"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            if let Some(c) = cmd {
                vars.insert("CNI_COMMAND".into(), c.into());
            }
            let (mut o, mut e) = (Vec::new(), Vec::new());
            let served = serve(&Fake, &vars, &mut stdin.as_bytes(), &mut o, &mut e);
            served.call.map(|c| (c.verb, c.network, c.code))
        };
        let named = |verb, code| Some((verb, "mgmt".to_string(), code));
        assert_eq!(call(Some("ADD"), &conf("1.1.0")), named("ADD", 0));
        assert_eq!(call(Some("DEL"), &conf("1.1.0")), named("DEL", 7));
        assert_eq!(call(Some("CHECK"), &conf("0.3.1")), named("CHECK", 1));
        let panicked = r#"{"cniVersion":"1.0.0","name":"mgmt","panic":true}"#;
        assert_eq!(call(Some("ADD"), panicked), named("ADD", 999));
        // Before the config is read the network is not known; the verb and code still are.
        assert_eq!(
            call(Some("ADD"), "{not json"),
            Some(("ADD", String::new(), 6))
        );
        assert_eq!(
            call(Some("FOO"), &conf("1.1.0")),
            Some(("unknown", String::new(), 4))
        );
        assert_eq!(
            call(Some("VERSION"), "{}"),
            Some(("VERSION", String::new(), 0))
        );
        assert_eq!(call(None, ""), None, "no command: no CNI call to record");
    }

    #[test]
    fn errors_are_one_object_with_code_and_version() {
        let o = run(Some("ADD"), &[], "{not json");
        assert_eq!((o.status, o.json()["code"].as_i64()), (1, Some(6)));
        assert_eq!(o.json()["cniVersion"], LATEST);
        let o = run(Some("ADD"), &[], r#"{"cniVersion":"9.9.9","name":"n"}"#);
        assert_eq!(o.json()["code"], 1);
        assert!(o.json()["details"].as_str().unwrap().contains("1.1.0"));
        let o = run(Some("ADD"), &[("CNI_IFNAME", "")], &conf("0.4.0"));
        assert_eq!(o.json()["code"], 4);
        assert_eq!(o.json()["cniVersion"], "0.4.0");
        assert!(o.json()["msg"].as_str().unwrap().contains("CNI_IFNAME"));
        let o = run(Some("DEL"), &[], &conf("1.0.0"));
        assert_eq!((o.status, o.json()["code"].as_i64()), (1, Some(7)));
    }

    #[test]
    fn verb_version_gates_are_code_1() {
        for (cmd, below) in [
            ("CHECK", "0.3.1"),
            ("GC", "1.0.0"),
            ("STATUS", "1.0.0"),
            ("STATUS", "0.4.0"),
        ] {
            let o = run(Some(cmd), &[], &conf(below));
            assert_eq!(o.json()["code"], 1, "{cmd} at {below}");
        }
        for (cmd, ok) in [("CHECK", "0.4.0"), ("GC", "1.1.0"), ("STATUS", "1.1.0")] {
            // GC and STATUS run without any attachment variables.
            let unset: &[(&str, &str)] = if cmd == "CHECK" {
                &[]
            } else {
                &[
                    ("CNI_CONTAINERID", ""),
                    ("CNI_NETNS", ""),
                    ("CNI_IFNAME", ""),
                ]
            };
            let o = run(Some(cmd), unset, &conf(ok));
            assert_eq!((o.status, o.stdout.as_str()), (0, ""), "{cmd}");
        }
    }

    #[test]
    fn panic_becomes_internal_error() {
        let o = run(
            Some("ADD"),
            &[],
            r#"{"cniVersion":"1.0.0","name":"n","panic":true}"#,
        );
        assert_eq!(o.status, 1);
        let e = o.json();
        assert_eq!(e["code"], 999);
        assert!(e["msg"].as_str().unwrap().contains("boom at net1"), "{e}");
    }
}
