//! Logs go to `log_file` when the config names one, else to stderr; never to stdout, which belongs to
//! the result. Level from `log_level` (error, warn, info, debug; default warn).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Once, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use log::{LevelFilter, Log, Metadata, Record};
use serde_json::{Map, Value};

struct Sink {
    level: LevelFilter,
    file: Option<PathBuf>,
    program: &'static str,
}

static SINK: RwLock<Sink> = RwLock::new(Sink {
    level: LevelFilter::Warn,
    file: None,
    program: "tether",
});
static INSTALL: Once = Once::new();

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
        let line = format!(
            "{} {}[{}] {} {}\n",
            utc_now(),
            sink.program,
            std::process::id(),
            r.level(),
            r.args()
        );
        // A log line that cannot be written must not fail the operation: fall back to stderr.
        let written = sink.file.as_ref().is_some_and(|f| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(f)
                .and_then(|mut fh| fh.write_all(line.as_bytes()))
                .is_ok()
        });
        if !written {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
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

/// Apply `log_file`/`log_level` from the top level of the config, or from its `ipam` object (where
/// whereabouts users put them).
pub fn configure(conf: &Map<String, Value>) {
    let pick = |key: &str| -> Option<String> {
        conf.get(key)
            .or_else(|| conf.get("ipam").and_then(|i| i.get(key)))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let Ok(mut s) = SINK.write() else { return };
    s.file = pick("log_file").map(PathBuf::from);
    s.level = match pick("log_level")
        .as_deref()
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("error" | "panic" | "fatal") => LevelFilter::Error,
        Some("info" | "verbose") => LevelFilter::Info,
        Some("debug") => LevelFilter::Debug,
        Some("trace") => LevelFilter::Trace,
        _ => LevelFilter::Warn,
    };
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
    fn timestamp_shape() {
        let t = super::utc_now();
        assert_eq!(t.len(), 24, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z') && t.as_bytes()[10] == b'T');
    }
}
