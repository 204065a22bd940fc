//! The dispatcher every tether binary runs: read the environment and stdin, validate, call the plugin
//! for the verb, print exactly one Result or one error on stdout.

use std::any::Any;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use crate::call_spool::Call;
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
    /// The build's version line (`tether-ipam 0.2.0 (commit …, TARGET)`, from tether-build-info,
    /// which this crate does not link: a new commit rebuilds only the crates above it): the
    /// "about" line starts with it and `--version` prints it.
    fn version(&self) -> String;
    fn add(&self, req: &Request) -> Result<Added, CniError>;
    fn del(&self, req: &Request) -> Result<(), CniError>;
    fn check(&self, req: &Request) -> Result<(), CniError>;
    fn status(&self, req: &Request) -> Result<(), CniError>;
    fn gc(&self, req: &Request) -> Result<(), CniError>;
}

/// Run as a CNI plugin with the process's environment and standard streams, then exit.
pub fn run_main<P: Plugin>(plugin: &P) -> ! {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if asks_version(std::env::var_os("CNI_COMMAND").as_deref(), &args) {
        println!("{}", plugin.version());
        std::process::exit(0)
    }
    let started = Instant::now();
    crate::logging::install(plugin.name());
    // A panic becomes a CNI error below; the hook only logs it, without a backtrace on the runtime's stderr.
    std::panic::set_hook(Box::new(|info| log::error!("internal error: {info}")));
    let vars = environment();
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
        call.leave_record(plugin.name(), seconds);
    }
    std::process::exit(served.status)
}

/// `PLUGIN --version` outside a CNI call (no CNI_COMMAND): a person, or `tether doctor` comparing
/// the installed plugins with itself, asking which build this is. A runtime never passes
/// arguments, so a CNI call is never one.
pub fn asks_version(cni_command: Option<&std::ffi::OsStr>, args: &[std::ffi::OsString]) -> bool {
    cni_command.is_none_or(|c| c.is_empty()) && args.len() == 1 && args[0] == "--version"
}

/// The process's environment as text, for reading and for a delegate. `std::env::vars` panics on
/// a variable that is not UTF-8, before any reply could be printed; such a value is taken with its
/// invalid bytes replaced (U+FFFD) instead: a CNI variable so spoilt is refused with code 4
/// ([`Env::from_vars`]), any other reaches a delegate so.
fn environment() -> HashMap<String, String> {
    std::env::vars_os()
        .map(|(k, v)| {
            let text = |s: std::ffi::OsString| s.to_string_lossy().into_owned();
            (text(k), text(v))
        })
        .collect()
}

/// What [`serve`] did: the exit status, what a successful ADD keeps until the reply is out, and
/// the call (`None` when there was no CNI_COMMAND: a person asking what this is).
struct Served {
    status: i32,
    linger: Option<Box<dyn Any>>,
    call: Option<Call>,
}

impl Served {
    /// No CNI call: the "about" line was printed.
    fn about() -> Served {
        let (status, linger, call) = (0, None, None);
        Served {
            status,
            linger,
            call,
        }
    }

    /// A CNI call answered with `status`, and what it was.
    fn answered(status: i32, verb: &'static str, network: String, code: u32) -> Served {
        let call = Some(Call {
            verb,
            network,
            code,
        });
        Served {
            status,
            linger: None,
            call,
        }
    }
}

/// Stdin, refused past [`MAX_STDIN`] before it is parsed.
fn read_stdin(stdin: &mut dyn Read) -> Result<Vec<u8>, CniError> {
    let mut raw = Vec::new();
    stdin
        .take(MAX_STDIN as u64 + 1)
        .read_to_end(&mut raw)
        .map_err(|e| CniError::new(code::IO, format!("reading stdin: {e}")))?;
    if raw.len() > MAX_STDIN {
        return Err(CniError::invalid_config(format!(
            "the network configuration on stdin is larger than {} MiB; nothing was done",
            MAX_STDIN >> 20
        )));
    }
    Ok(raw)
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
    let answered = Served::answered;
    let command = match vars.get("CNI_COMMAND").map(String::as_str) {
        None | Some("") => {
            let _ = writeln!(
                stderr,
                "{}: CNI plugin; supported CNI versions: {}",
                plugin.version(),
                SUPPORTED.join(", ")
            );
            return Served::about();
        }
        Some(c) => c,
    };
    let verb = Command::parse(command).map_or("unknown", Command::as_str);
    let raw = match read_stdin(stdin) {
        Ok(raw) => raw,
        Err(e) => return answered(fail(stdout, LATEST, &e), verb, String::new(), e.code),
    };
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
mod tests;
