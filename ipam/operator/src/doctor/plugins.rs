//! `tether doctor`'s `plugins` check: the plugins in the CNI bin directory are this tether's build.
//! The node-agent copies its image's plugins there when it starts, so on a node whose agent runs
//! they match; a mismatch is an agent that could not install them, an upgrade still rolling, or
//! plugins installed by hand from another build. Each plugin is asked with `--version` (0.2.0 on);
//! 0.1.0 answered only with its "about" line, which has a version and no commit.

use std::fmt;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tether_build_info::Reported;

use super::Report;
use crate::agent::BINARIES;

const CHECK: &str = "plugins";
/// The first version whose plugins answer `--version`.
const FIRST_REPORTING: &str = "0.2.0";
/// A plugin answers at once; one that does not is reported, not waited for.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);
/// More output than a version line needs is not read.
const MAX_OUTPUT: u64 = 64 << 10;

/// What an installed plugin says it is.
#[derive(Debug, PartialEq, Eq)]
enum Installed {
    /// Its version line.
    Reports(Reported),
    /// 0.1.0's "about" line: a version, no commit.
    Old { version: String },
    /// Neither: not a tether plugin, or a build older than any release.
    Unknown,
}

/// Why a plugin could not be asked.
#[derive(Debug)]
enum QueryError {
    Missing,
    Run(std::io::Error),
    NoAnswer,
}

impl fmt::Display for QueryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueryError::Missing => write!(f, "it is not there"),
            QueryError::Run(e) => {
                let hint = match e.raw_os_error() {
                    Some(libc::ENOEXEC) => " (a binary for another architecture?)",
                    Some(libc::EACCES) => " (not executable, or on a noexec mount)",
                    _ => "",
                };
                write!(f, "it cannot be run: {e}{hint}")
            }
            QueryError::NoAnswer => {
                write!(f, "it did not answer within {} s", ANSWER_WITHIN.as_secs())
            }
        }
    }
}

/// One line per plugin of the node-agent's set (`crate::agent::BINARIES`) in `dir`.
pub(super) fn check(dir: &Path, r: &mut Report) {
    let own = Reported::this_build();
    for name in BINARIES {
        let (ok, detail) = match query(&dir.join(name), name) {
            Ok(installed) => compare(name, dir, &installed, &own),
            Err(QueryError::Missing) => (
                false,
                format!(
                    "{name} is not in {}: the node-agent installs it when it starts; check that this node's \
                     agent pod runs and read its log (with Multus' binDir elsewhere, pass that directory as \
                     --cni-bin-dir)",
                    dir.display()
                ),
            ),
            Err(e) => (false, format!("{name} in {}: {e}", dir.display())),
        };
        if ok {
            r.ok(CHECK, detail);
        } else {
            r.fail(CHECK, detail);
        }
    }
}

/// The finding for `name` in `dir` against this build (`own`): OK with the same version and
/// commit (the commit not compared where a build does not know it), else what to do.
fn compare(name: &str, dir: &Path, installed: &Installed, own: &Reported) -> (bool, String) {
    let dir = dir.display();
    let mine = format!("{} (commit {})", own.version, own.commit);
    let theirs = match installed {
        Installed::Reports(p) if p.version == own.version && p.commit == own.commit => {
            return (
                true,
                format!("{name} in {dir} is {mine}, this tether's build"),
            );
        }
        Installed::Reports(p)
            if p.version == own.version && !(p.commit_known() && own.commit_known()) =>
        {
            return (
                true,
                format!(
                    "{name} in {dir} is {} (commit {}) and this tether {mine}: the same version; a commit is \
                     unknown, so only the versions are compared",
                    p.version, p.commit
                ),
            );
        }
        Installed::Reports(p) => format!("is {} (commit {})", p.version, p.commit),
        Installed::Old { version } => {
            format!("is {version}, older than {FIRST_REPORTING} (it does not report its commit)")
        }
        Installed::Unknown => format!(
            "does not say which version it is: older than {FIRST_REPORTING}, or not tether's"
        ),
    };
    (
        false,
        format!(
            "{name} in {dir} {theirs}, but this tether is {mine}: the node-agent installs its image's \
             plugins when it starts, so check its log (kubectl -n kube-system logs <agent pod>) and whether \
             something replaced them since (another tether installation, a hand install), then restart it \
             (kubectl -n kube-system delete pod <agent pod>); a tether run outside the agent's pod must come \
             from the same release as the plugins"
        ),
    )
}

/// Ask the plugin at `path` which build it is: `--version`, else 0.1.0's "about" line (printed
/// with no CNI_COMMAND, whatever the arguments for tether-ipvlan, without any for tether-ipam).
fn query(path: &Path, name: &str) -> Result<Installed, QueryError> {
    if !path.try_exists().unwrap_or(false) {
        return Err(QueryError::Missing);
    }
    let answer = run(path, &["--version"], ANSWER_WITHIN)?;
    if let Some(r) = Reported::parse(name, &answer.stdout) {
        return Ok(Installed::Reports(r));
    }
    let about = match old_about(name, &answer.stderr) {
        Some(v) => Some(v),
        None => old_about(name, &run(path, &[], ANSWER_WITHIN)?.stderr),
    };
    Ok(match about {
        Some(version) => Installed::Old { version },
        None => Installed::Unknown,
    })
}

/// The version in 0.1.0's "about" line, `NAME: CNI plugin 0.1.0; supported CNI versions: …`.
fn old_about(name: &str, stderr: &str) -> Option<String> {
    let rest = stderr.lines().next()?.strip_prefix(name)?;
    let version = rest
        .strip_prefix(": CNI plugin ")?
        .split(';')
        .next()?
        .trim();
    (!version.is_empty() && !version.contains(' ')).then(|| version.to_string())
}

/// What a plugin printed.
struct Answer {
    stdout: String,
    stderr: String,
}

/// Run `path args` as no runtime would (no CNI_COMMAND, nothing of this environment, nothing on
/// stdin), for at most `within`.
fn run(path: &Path, args: &[&str], within: Duration) -> Result<Answer, QueryError> {
    let mut child = spawn(path, args)?;
    let mut out = child.stdout.take().map(reader);
    let mut err = child.stderr.take().map(reader);
    let deadline = Instant::now() + within;
    let status: Option<ExitStatus> = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => break None,
        }
    };
    if status.is_none() {
        // Unreaped until the wait below, so the pid is still this child's.
        let _ = child.kill();
        let _ = child.wait();
        return Err(QueryError::NoAnswer);
    }
    let text = |r: Option<std::thread::JoinHandle<Vec<u8>>>| {
        let bytes = r.and_then(|h| h.join().ok()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Ok(Answer {
        stdout: text(out.take()),
        stderr: text(err.take()),
    })
}

fn spawn(path: &Path, args: &[&str]) -> Result<Child, QueryError> {
    let mut tries = 0;
    loop {
        let spawned = Command::new(path)
            .args(args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match spawned {
            // ETXTBSY: the file is open for writing somewhere: a copy still being written, or a
            // child another thread forked and has not yet exec'd. Such a moment passes.
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(QueryError::Run(e)),
            Ok(c) => return Ok(c),
        }
    }
}

/// Read a pipe to its end (at most [`MAX_OUTPUT`]) on a thread of its own, so a plugin is never
/// stuck writing to a full pipe while the other is read.
fn reader(pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.take(MAX_OUTPUT).read_to_end(&mut bytes);
        bytes
    })
}

#[cfg(test)]
mod tests;
