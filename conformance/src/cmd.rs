//! Running external commands and capturing what they did.

use std::fmt;
use std::io::Write;
use std::process::{Command, ExitStatus, Stdio};

/// What a finished command did: its command line, exit status and output.
#[derive(Debug, Clone)]
pub struct CmdOutput {
    /// The command line, shell-ish quoted, for messages.
    pub cmdline: String,
    pub status: ExitStatus,
    /// Stdout, lossily decoded as UTF-8.
    pub stdout: String,
    /// Stderr, lossily decoded as UTF-8.
    pub stderr: String,
}

impl CmdOutput {
    /// Exit code (`None` when killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Panics (printing everything) unless the command exited 0.
    #[track_caller]
    pub fn assert_success(&self) -> &Self {
        if !self.success() {
            panic!("command failed: {self}");
        }
        self
    }

    /// Panics (printing everything) if the command exited 0.
    #[track_caller]
    pub fn assert_failure(&self) -> &Self {
        if self.success() {
            panic!("command unexpectedly succeeded: {self}");
        }
        self
    }

    /// Stdout parsed as JSON; panics with the full output when it is not.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self}"))
    }
}

impl fmt::Display for CmdOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "`{}` -> {}", self.cmdline, self.status)?;
        writeln!(f, "--- stdout ---\n{}", self.stdout.trim_end())?;
        write!(f, "--- stderr ---\n{}", self.stderr.trim_end())
    }
}

fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `cmd` rendered as a command line (env overrides first), for messages.
pub fn cmdline(cmd: &Command) -> String {
    let mut parts: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| {
            v.map(|v| quote(&format!("{}={}", k.to_string_lossy(), v.to_string_lossy())))
        })
        .collect();
    parts.push(quote(&cmd.get_program().to_string_lossy()));
    parts.extend(cmd.get_args().map(|a| quote(&a.to_string_lossy())));
    parts.join(" ")
}

/// Runs `cmd` to completion (stdin = /dev/null) and captures its output.
/// Panics only when the program cannot be started at all.
#[track_caller]
pub fn capture(cmd: &mut Command) -> CmdOutput {
    capture_with_stdin(cmd, None)
}

/// Like [`capture`], feeding `stdin` (if any) to the command.
#[track_caller]
pub fn capture_with_stdin(cmd: &mut Command, stdin: Option<&[u8]>) -> CmdOutput {
    let line = cmdline(cmd);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{line}`: {e}"));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin piped");
        let input = input.to_vec();
        // Write from a thread so a child that does not read cannot deadlock us.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("waiting for `{line}`: {e}"));
    CmdOutput {
        cmdline: line,
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs `program args...` and captures its output (no panic on failure).
#[track_caller]
pub fn run(program: &str, args: &[&str]) -> CmdOutput {
    capture(Command::new(program).args(args))
}

/// Runs `program args...`; panics with everything it printed unless it exits 0.
#[track_caller]
pub fn run_ok(program: &str, args: &[&str]) -> CmdOutput {
    let out = run(program, args);
    out.assert_success();
    out
}
