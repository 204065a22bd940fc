//! Logs go to `log_file` when the config names one, else to stderr; never to stdout, which belongs to
//! the result. Level from `log_level` (error, warn, info, debug; default warn).
//!
//! The config is someone else's (a NAD), and the plugin runs as root: `log_file` is opened once,
//! in a directory only root can write (tether-trusted-fs: never through a symlink, never under
//! /proc, /sys or /dev, never directly in /tmp), created 0600; and every control character of a
//! line (a newline in a config value quoted in a message) is escaped, so a line is always one line
//! and cannot forge others.
//!
//! A `log_file` that cannot be opened that way is ignored, with a warning on stderr (which the
//! runtime, or Multus, logs), and the logs stay on stderr: a log is never worth failing a pod's
//! ADD, DEL or CHECK over (whereabouts' own example, `/tmp/whereabouts.log`, failed every ADD). It
//! is not written "safely" where it is either: root creating a file by name in a directory every
//! user can write is safe only as far as the kernel's protected_symlinks/hardlinks/regular settings
//! and checks of a file someone may have planted first go, and tether writes only in directories
//! nobody else controls. A log is not worth the exception.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Once, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use log::{Level, LevelFilter, Log, Metadata, Record};
use serde_json::{Map, Value};

struct Sink {
    level: LevelFilter,
    file: Option<File>,
    program: &'static str,
}

static SINK: RwLock<Sink> = RwLock::new(Sink {
    level: LevelFilter::Warn,
    file: None,
    program: "tether",
});
static INSTALL: Once = Once::new();

impl Sink {
    /// One line, to the file or else stderr, whatever the level.
    fn write(&self, level: Level, text: &str) {
        let line = format!(
            "{} {}[{}] {} {}\n",
            utc_now(),
            self.program,
            std::process::id(),
            level,
            one_line(text)
        );
        // A log line that cannot be written must not fail the operation: fall back to stderr.
        let written = self
            .file
            .as_ref()
            .is_some_and(|mut f| f.write_all(line.as_bytes()).is_ok());
        if !written {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

struct Logger;

impl Log for Logger {
    fn enabled(&self, m: &Metadata) -> bool {
        SINK.read().map(|s| m.level() <= s.level).unwrap_or(false)
    }

    fn log(&self, r: &Record) {
        let Ok(sink) = SINK.read() else { return };
        if r.level() > sink.level {
            return;
        }
        sink.write(r.level(), &r.args().to_string());
    }

    fn flush(&self) {}
}

/// Install the logger (once per process) with defaults; `configure` refines it from the config.
pub fn install(program: &'static str) {
    INSTALL.call_once(|| {
        let _ = log::set_logger(&Logger);
    });
    if let Ok(mut s) = SINK.write() {
        s.program = program;
    }
    log::set_max_level(LevelFilter::Debug);
}

/// `text` with every control character escaped (`\n` → `\\n`, others `\u{..}`).
pub fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// What `configure` refuses: a `log_file` or `log_level` that is not a string. The message names
/// the key; the caller answers with code 7. (A `log_file` that cannot be opened is not refused: see
/// the module docs.)
#[derive(Debug)]
pub struct LogConfigError(pub String);

/// Apply `log_file`/`log_level` from the top level of the config, or from its `ipam` object (where
/// whereabouts users put them).
pub fn configure(conf: &Map<String, Value>) -> Result<(), LogConfigError> {
    let file = pick(conf, "log_file")?;
    let level = pick(conf, "log_level")?;
    let level = match level.map(|(l, _)| l.to_ascii_lowercase()).as_deref() {
        Some("error" | "panic" | "fatal") => LevelFilter::Error,
        Some("info" | "verbose") => LevelFilter::Info,
        Some("debug") => LevelFilter::Debug,
        Some("trace") => LevelFilter::Trace,
        _ => LevelFilter::Warn,
    };
    let (file, ignored) = match file {
        Some((path, key)) => match open_log_file(&key, Path::new(&path)) {
            Ok(f) => (Some(f), None),
            Err(why) => (None, Some(why)),
        },
        None => (None, None),
    };
    if let Ok(mut s) = SINK.write() {
        s.level = level;
        s.file = file;
        // Whatever log_level says: it is about where the lines it asks for go.
        if let Some(why) = ignored {
            s.write(
                Level::Warn,
                &format!("{why}; it is ignored and the log goes to stderr"),
            );
        }
    }
    Ok(())
}

/// What [`configure`] refuses, checked without applying anything (`tether validate`).
pub fn check_log_keys(conf: &Map<String, Value>) -> Result<(), LogConfigError> {
    pick(conf, "log_file")?;
    pick(conf, "log_level")?;
    Ok(())
}

/// Why the config's `log_file` names a place the plugins never open (they ignore it), checked
/// without touching the filesystem (`tether validate`): `None` for none, or one they would try.
pub fn unfit_log_file(conf: &Map<String, Value>) -> Option<String> {
    let (path, key) = pick(conf, "log_file").ok()??;
    tether_trusted_fs::check_file_place(&key, Path::new(&path), tether_trusted_fs::Place::Log)
        .err()
        .map(|e| e.to_string())
}

/// The string value of `key` at the top level, else in `ipam`, and the key path that held it.
fn pick(conf: &Map<String, Value>, key: &str) -> Result<Option<(String, String)>, LogConfigError> {
    let (v, at) = match conf.get(key) {
        Some(v) => (v, key.to_string()),
        None => match conf.get("ipam").and_then(|i| i.get(key)) {
            Some(v) => (v, format!("ipam.{key}")),
            None => return Ok(None),
        },
    };
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s.is_empty() => Ok(None),
        Value::String(s) => Ok(Some((s.clone(), at))),
        other => Err(LogConfigError(format!(
            "{at} must be a string, not {}",
            crate::config::json_type(other)
        ))),
    }
}

/// The `log_file` named by `key`, opened for appending in a trusted directory (created 0600), or
/// why not.
fn open_log_file(key: &str, path: &Path) -> Result<File, String> {
    tether_trusted_fs::open_in_trusted_dir(
        key,
        path,
        tether_trusted_fs::Place::Log,
        tether_trusted_fs::Open::Append(0o600),
    )
    .map_err(|e| e.to_string())
}

/// RFC 3339 UTC timestamp without pulling in a date crate.
fn utc_now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn lines_stay_one_line() {
        let injected =
            "range \"10.1.0.0/24\n* * * * * root touch /tmp/x #\" is not valid\r\u{1b}[2J";
        let l = super::one_line(injected);
        assert!(
            !l.contains('\n') && !l.contains('\r') && !l.contains('\u{1b}'),
            "{l}"
        );
        assert!(l.contains("\\n* * * * *"), "the text stays readable: {l}");
        assert_eq!(super::one_line("plain ünïcode"), "plain ünïcode");
    }

    /// whereabouts' own example, at the top level and in `ipam`, and other places the plugin
    /// refuses: ignored (the warning goes to stderr), never an error.
    #[test]
    fn a_log_file_that_cannot_be_opened_is_ignored() {
        use serde_json::json;
        for (conf, key) in [
            (json!({"log_file": "/tmp/whereabouts.log"}), "log_file"),
            (
                json!({"ipam": {"log_file": "/tmp/whereabouts.log"}}),
                "ipam.log_file",
            ),
            (
                json!({"ipam": {"log_file": "/etc/ld.so.preload"}}),
                "ipam.log_file",
            ),
            (json!({"log_file": "relative.log"}), "log_file"),
        ] {
            let path = conf.pointer("/log_file").or(conf.pointer("/ipam/log_file"));
            let why =
                super::open_log_file(key, std::path::Path::new(path.unwrap().as_str().unwrap()))
                    .unwrap_err();
            assert!(why.starts_with(&format!("{key} ")), "{why}");
            assert!(
                super::configure(conf.as_object().unwrap()).is_ok(),
                "{conf}"
            );
        }
        let e =
            super::configure(json!({"ipam": {"log_file": 5}}).as_object().unwrap()).unwrap_err();
        assert_eq!(e.0, "ipam.log_file must be a string, not a number");
    }

    #[test]
    fn timestamp_shape() {
        let t = super::utc_now();
        assert_eq!(t.len(), 24, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z') && t.as_bytes()[10] == b'T');
    }
}
