//! Running a delegated plugin (IPAM) the way libcni's `invoke` does: found in CNI_PATH, given the
//! original stdin bytes and the same environment, its result or error handed back unchanged.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

use crate::env::Command;
use crate::error::{CniError, code};
use crate::result::CniResult;

mod relog;

/// Where to look and what to hand over.
#[derive(Debug, Clone)]
pub struct Delegation<'a> {
    /// CNI_PATH entries.
    pub path: &'a [PathBuf],
    /// The caller's whole environment; CNI_COMMAND is replaced per call.
    pub vars: &'a HashMap<String, String>,
    /// The stdin bytes the caller received.
    pub stdin: &'a [u8],
}

impl Delegation<'_> {
    /// The first executable named `plugin` in CNI_PATH.
    pub fn find(&self, plugin: &str) -> Result<PathBuf, CniError> {
        if plugin.is_empty() || plugin.contains('/') || plugin == "." || plugin == ".." {
            return Err(CniError::invalid_config(format!(
                "plugin type {plugin:?} is not a plain binary name"
            )));
        }
        if self.path.is_empty() {
            return Err(CniError::invalid_env(format!(
                "CNI_PATH is not set; it is needed to find the {plugin:?} plugin"
            )));
        }
        self.path
            .iter()
            .map(|dir| dir.join(plugin))
            .find(|p| is_executable(p))
            .ok_or_else(|| {
                let dirs: Vec<String> = self.path.iter().map(|p| p.display().to_string()).collect();
                CniError::new(
                    code::DELEGATE_FAILED,
                    format!("plugin {plugin:?} not found in CNI_PATH"),
                )
                .with_details(format!(
                    "searched {}; install it there (e.g. /opt/cni/bin)",
                    dirs.join(":")
                ))
            })
    }

    /// Run `plugin` for `command`; Ok holds its stdout.
    pub fn exec(&self, plugin: &str, command: Command) -> Result<Vec<u8>, CniError> {
        self.spawn(plugin, command)?.wait()
    }

    /// Start `plugin` for `command` and hand it its stdin; [`Running::wait`] collects the outcome, so
    /// the caller can do other work meanwhile.
    pub fn spawn(&self, plugin: &str, command: Command) -> Result<Running, CniError> {
        let bin = self.find(plugin)?;
        let mut process = Process::new(&bin);
        process
            .env_clear()
            .envs(self.vars.iter())
            .env("CNI_COMMAND", command.as_str())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = spawn(&mut process).map_err(|e| {
            CniError::new(
                code::DELEGATE_FAILED,
                format!("cannot execute {}: {e}", bin.display()),
            )
        })?;
        // A plugin that exits without reading stdin gives EPIPE here; its exit status tells the story.
        // (A config fits the pipe's buffer, so this does not wait for the plugin.)
        let _ = child.stdin.take().expect("piped").write_all(self.stdin);
        Ok(Running {
            child,
            bin,
            plugin: plugin.to_string(),
            command,
        })
    }

    /// ADD through the delegate, reading its Result in whatever layout it printed.
    pub fn add(&self, plugin: &str) -> Result<CniResult, CniError> {
        self.spawn(plugin, Command::Add)?.result().map(|(r, _)| r)
    }
}

/// A delegated plugin under way ([`Delegation::spawn`]).
#[derive(Debug)]
pub struct Running {
    child: std::process::Child,
    bin: PathBuf,
    plugin: String,
    command: Command,
}

impl Running {
    /// Wait for the plugin; Ok holds its stdout, Err its error object (or why it could not run).
    pub fn wait(self) -> Result<Vec<u8>, CniError> {
        self.replied()?.exited()
    }

    /// Wait for an ADD and read its Result, also as printed (for keys the model does not carry).
    pub fn result(self) -> Result<(CniResult, serde_json::Value), CniError> {
        let (r, raw, exit) = self.early_result()?;
        exit.check()?;
        Ok((r, raw))
    }

    /// An ADD's Result as soon as the plugin has closed its output, which tether-ipam does before
    /// its last chores (closing probe sockets waits out an RCU grace period); other plugins close it
    /// when they exit. The caller acts on the Result, then checks the exit status with
    /// [`Exit::check`] and undoes its work if that fails. An error is returned only once the plugin
    /// has exited, with its exit status considered.
    pub fn early_result(self) -> Result<(CniResult, serde_json::Value, Exit), CniError> {
        let replied = self.replied()?;
        let plugin = replied.running.plugin.clone();
        let parsed: Option<serde_json::Value> = serde_json::from_slice(&replied.stdout).ok();
        // An error object, or nothing readable: the exit status decides what to report.
        let Some(raw) = parsed.filter(|v| v.get("code").is_none()) else {
            let stdout = replied.exited()?;
            // Exit status 0 after all: an error object is still the error; anything else is unreadable.
            return Err(
                serde_json::from_slice::<CniError>(&stdout).unwrap_or_else(|e| {
                    CniError::new(
                        code::DELEGATE_FAILED,
                        format!("{plugin} ADD printed an unreadable result: {e}"),
                    )
                }),
            );
        };
        let result = CniResult::from_value(&raw).map_err(|e| {
            CniError::new(
                code::DELEGATE_FAILED,
                format!("{plugin} ADD printed an unreadable result: {e}"),
            )
        })?;
        Ok((result, raw, Exit(replied)))
    }

    /// Read stdout and stderr until the plugin closes both (at exit, or earlier), without waiting for
    /// it to exit. Both are read together, so a chatty stderr cannot block the plugin.
    fn replied(mut self) -> Result<Replied, CniError> {
        let (Some(out), Some(err)) = (self.child.stdout.take(), self.child.stderr.take()) else {
            unreachable!("spawn pipes stdout and stderr")
        };
        let (stdout, stderr) = read_both(out, err).map_err(|e| {
            CniError::new(
                code::DELEGATE_FAILED,
                format!("reading the output of {}: {e}", self.bin.display()),
            )
        })?;
        // The delegate's log lines stay logs: ours go to stderr too.
        relog::relog(&self.plugin, self.command.as_str(), &stderr);
        Ok(Replied {
            running: self,
            stdout,
            stderr,
        })
    }
}

/// A delegate that has closed its output; it may still be running.
#[derive(Debug)]
struct Replied {
    running: Running,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Replied {
    /// Reap the plugin; Ok holds its stdout when it exited 0, Err its error object (or why it failed).
    fn exited(self) -> Result<Vec<u8>, CniError> {
        let Replied {
            running:
                Running {
                    mut child,
                    bin,
                    plugin,
                    command,
                },
            stdout,
            stderr,
        } = self;
        let status = child.wait().map_err(|e| {
            CniError::new(
                code::DELEGATE_FAILED,
                format!("waiting for {}: {e}", bin.display()),
            )
        })?;
        if status.success() {
            return Ok(stdout);
        }
        // The delegate's error object goes back unchanged: its code and message are the useful part.
        if let Ok(e) = serde_json::from_slice::<CniError>(&stdout) {
            return Err(e);
        }
        let text = if stdout.is_empty() { &stderr } else { &stdout };
        Err(CniError::new(
            code::DELEGATE_FAILED,
            format!("{plugin} {} failed ({status})", command.as_str()),
        )
        .with_details(String::from_utf8_lossy(text).trim().to_string()))
    }
}

/// The exit of a delegate whose Result was read early ([`Running::early_result`]). Dropping it
/// unchecked leaves the plugin to finish on its own.
#[derive(Debug)]
pub struct Exit(Replied);

impl Exit {
    /// Wait for the plugin to exit: Err when it failed after printing its Result.
    pub fn check(self) -> Result<(), CniError> {
        self.0.exited().map(drop)
    }
}

/// One read from a ready pipe into `into`; false at its end.
fn read_some(
    pipe: &mut impl std::io::Read,
    buf: &mut [u8],
    into: &mut Vec<u8>,
) -> std::io::Result<bool> {
    match pipe.read(buf) {
        Ok(0) => Ok(false),
        Ok(n) => {
            into.extend_from_slice(&buf[..n]);
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(true),
        Err(e) => Err(e),
    }
}

/// Read two pipes to their ends at once.
fn read_both(
    mut out: std::process::ChildStdout,
    mut err: std::process::ChildStderr,
) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    use std::os::fd::AsRawFd;
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let (mut out_open, mut err_open) = (true, true);
    let mut buf = [0u8; 8192];
    while out_open || err_open {
        let mut fds = [
            libc::pollfd {
                fd: if out_open { out.as_raw_fd() } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if err_open { err.as_raw_fd() } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfd entries (a negative fd is ignored by poll).
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if out_open && fds[0].revents != 0 {
            out_open = read_some(&mut out, &mut buf, &mut stdout)?;
        }
        if err_open && fds[1].revents != 0 {
            err_open = read_some(&mut err, &mut buf, &mut stderr)?;
        }
    }
    Ok((stdout, stderr))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Start a delegate. A binary some process still holds open for writing (ETXTBSY: an installer
/// mid-copy, or a concurrent fork that inherited the writer's descriptor) is retried briefly, as
/// libcni retries it.
fn spawn(process: &mut Process) -> std::io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match process.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 10 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, name: &str, body: &str) {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tether-delegate-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn passes_stdin_and_env_and_reads_result() {
        let d = tempdir("ok");
        // Echo stdin back as part of a result, proving the bytes arrived unchanged.
        script(
            &d,
            "fake",
            r#"in=$(cat); [ "$CNI_COMMAND" = ADD ] || exit 9; [ "$CNI_CONTAINERID" = c1 ] || exit 8; printf '{"cniVersion":"1.1.0","ips":[{"address":"10.0.0.2/24"}],"dns":{"domain":"%s"}}' "$(printf %s "$in" | md5sum | cut -c1-8)""#,
        );
        let vars: HashMap<String, String> =
            [("CNI_CONTAINERID".to_string(), "c1".to_string())].into();
        let stdin = br#"{"odd": "bytes",   "kept":true}"#;
        let path = vec![PathBuf::from("/nonexistent"), d.clone()];
        let r = Delegation {
            path: &path,
            vars: &vars,
            stdin,
        }
        .add("fake")
        .unwrap();
        assert_eq!(r.ips[0].address.to_string(), "10.0.0.2/24");
        let expect = {
            let out = Process::new("sh")
                .arg("-c")
                .arg("printf %s \"$0\" | md5sum | cut -c1-8")
                .arg(std::str::from_utf8(stdin).unwrap())
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        assert_eq!(r.dns.domain.as_deref(), Some(expect.as_str()));
    }

    #[test]
    fn delegate_error_comes_back_unchanged() {
        let d = tempdir("err");
        script(
            &d,
            "fake",
            r#"cat >/dev/null; echo '{"cniVersion":"1.1.0","code":102,"msg":"range 10.0.0.0/30 exhausted","details":"2 leased"}'; exit 1"#,
        );
        let vars = HashMap::new();
        let path = vec![d.clone()];
        let e = Delegation {
            path: &path,
            vars: &vars,
            stdin: b"{}",
        }
        .add("fake")
        .unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str(), e.details.as_str()),
            (102, "range 10.0.0.0/30 exhausted", "2 leased")
        );
        script(&d, "crash", "echo boom >&2; exit 3");
        let e = Delegation {
            path: &path,
            vars: &vars,
            stdin: b"{}",
        }
        .exec("crash", Command::Del)
        .unwrap_err();
        assert_eq!(e.code, code::DELEGATE_FAILED);
        assert!(e.details.contains("boom"));
    }

    #[test]
    fn early_result_comes_at_eof_and_the_exit_is_checked_after() {
        let d = tempdir("early");
        let done = d.join("exited");
        // Prints its Result, closes its output, and only exits when the caller lets it (a fifo), so
        // the Result cannot have been waited for with the exit.
        let gate = d.join("gate");
        assert!(
            Process::new("mkfifo")
                .arg(&gate)
                .status()
                .unwrap()
                .success()
        );
        let body = format!(
            r#"cat >/dev/null; echo '{{"cniVersion":"1.1.0","ips":[{{"address":"10.0.0.2/24"}}]}}'; exec >&- 2>&-; read x <'{}'; touch '{}'; exit "$x""#,
            gate.display(),
            done.display()
        );
        script(&d, "fake", &body);
        let vars = HashMap::new();
        let path = vec![d.clone()];
        for (status, ok) in [("0", true), ("4", false)] {
            let _ = std::fs::remove_file(&done);
            let running = Delegation {
                path: &path,
                vars: &vars,
                stdin: b"{}",
            }
            .spawn("fake", Command::Add)
            .unwrap();
            let (r, _, exit) = running.early_result().unwrap();
            assert_eq!(r.ips[0].address.to_string(), "10.0.0.2/24");
            assert!(!done.exists(), "the Result came before the plugin exited");
            std::fs::write(&gate, format!("{status}\n")).unwrap();
            let checked = exit.check();
            assert!(done.exists());
            match checked {
                Ok(()) => assert!(ok),
                Err(e) => assert!(
                    !ok && e.code == code::DELEGATE_FAILED && e.msg.contains("exit status: 4"),
                    "{e:?}"
                ),
            }
        }
    }

    #[test]
    fn early_result_of_a_failed_add_is_its_error() {
        let d = tempdir("earlyerr");
        script(
            &d,
            "fake",
            r#"cat >/dev/null; echo '{"cniVersion":"1.1.0","code":102,"msg":"exhausted"}'; exit 1"#,
        );
        script(&d, "garbage", "cat >/dev/null; echo not-json");
        script(
            &d,
            "zero",
            r#"cat >/dev/null; echo '{"cniVersion":"1.1.0","code":11,"msg":"try later"}'"#,
        );
        let vars = HashMap::new();
        let path = vec![d.clone()];
        let e = Delegation {
            path: &path,
            vars: &vars,
            stdin: b"{}",
        }
        .spawn("fake", Command::Add)
        .unwrap()
        .early_result()
        .unwrap_err();
        assert_eq!((e.code, e.msg.as_str()), (102, "exhausted"));
        let e = Delegation {
            path: &path,
            vars: &vars,
            stdin: b"{}",
        }
        .spawn("zero", Command::Add)
        .unwrap()
        .early_result()
        .unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (11, "try later"),
            "an error object with exit status 0 is still the error"
        );
        let e = Delegation {
            path: &path,
            vars: &vars,
            stdin: b"{}",
        }
        .spawn("garbage", Command::Add)
        .unwrap()
        .early_result()
        .unwrap_err();
        assert!(
            e.code == code::DELEGATE_FAILED && e.msg.contains("unreadable result"),
            "{e:?}"
        );
    }

    #[test]
    fn missing_plugin_names_it_and_the_path() {
        let vars = HashMap::new();
        let path = vec![PathBuf::from("/nonexistent-dir")];
        let e = Delegation {
            path: &path,
            vars: &vars,
            stdin: b"{}",
        }
        .find("tether-ipam")
        .unwrap_err();
        assert_eq!(e.code, code::DELEGATE_FAILED);
        assert!(e.msg.contains("tether-ipam") && e.details.contains("/nonexistent-dir"));
        assert_eq!(
            Delegation {
                path: &[],
                vars: &vars,
                stdin: b"{}"
            }
            .find("x")
            .unwrap_err()
            .code,
            4
        );
        assert_eq!(
            Delegation {
                path: &path,
                vars: &vars,
                stdin: b"{}"
            }
            .find("../x")
            .unwrap_err()
            .code,
            7
        );
    }
}
