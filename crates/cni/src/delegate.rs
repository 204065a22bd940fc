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
        // What the pipe takes now is written now; the rest (a GC's list of attachments can be
        // MiB) while the replies are read, so a delegate that writes to stderr before it reads
        // stdin cannot stall with us. A plugin that exits without reading stdin gives EPIPE:
        // its exit status tells the story.
        let feed = Feed::start(child.stdin.take().expect("piped"), self.stdin);
        Ok(Running {
            child,
            feed,
            bin,
            plugin: plugin.to_string(),
            command,
        })
    }
}

/// A delegated plugin under way ([`Delegation::spawn`]).
#[derive(Debug)]
pub struct Running {
    child: std::process::Child,
    /// Stdin still to write, if the pipe did not take it all at the start.
    feed: Option<Feed>,
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
        let (stdout, stderr) = exchange(self.feed.take(), out, err).map_err(|e| {
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
                    ..
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

/// A delegate's stdin still to write: the pipe, non-blocking, and what is left.
#[derive(Debug)]
struct Feed {
    pipe: std::process::ChildStdin,
    rest: Vec<u8>,
}

impl Feed {
    /// Write what the pipe takes now; the rest, if any, to be written by [`exchange`].
    fn start(mut pipe: std::process::ChildStdin, bytes: &[u8]) -> Option<Feed> {
        use std::os::fd::AsRawFd;
        let fd = pipe.as_raw_fd();
        // SAFETY: F_GETFL/F_SETFL on a descriptor `pipe` owns.
        let nonblocking = unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        if !nonblocking {
            // Cannot happen on a fresh pipe; blocking is what the caller had before.
            let _ = pipe.write_all(bytes);
            return None;
        }
        let mut feed = Feed {
            pipe,
            rest: bytes.to_vec(),
        };
        feed.write_some().then_some(feed)
    }

    /// Write as much as the pipe takes; true while something is left to write.
    fn write_some(&mut self) -> bool {
        while !self.rest.is_empty() {
            match self.pipe.write(&self.rest) {
                Ok(n) => drop(self.rest.drain(..n)),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                // EPIPE: the plugin stopped reading; its exit status says why.
                Err(_) => return false,
            }
        }
        false
    }
}

/// Write the rest of stdin (closing it when done, so the plugin sees its end) while reading
/// stdout and stderr to their ends, all at once.
fn exchange(
    mut feed: Option<Feed>,
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
            libc::pollfd {
                fd: feed.as_ref().map_or(-1, |f| f.pipe.as_raw_fd()),
                events: libc::POLLOUT,
                revents: 0,
            },
        ];
        // SAFETY: three valid pollfd entries (a negative fd is ignored by poll).
        if unsafe { libc::poll(fds.as_mut_ptr(), 3, -1) } < 0 {
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
        if fds[2].revents != 0 && !feed.as_mut().is_some_and(Feed::write_some) {
            // All written (dropped: the plugin reads its end), or it stopped reading.
            feed = None;
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
mod tests;
