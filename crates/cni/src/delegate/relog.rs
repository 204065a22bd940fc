//! The delegate's stderr, logged again by the calling plugin: its warnings and errors at their own
//! level, so that an IPAM's "10.1.2.245 answered the conflict probe from MAC …; quarantining it" is
//! seen wherever the caller's warnings go (at the default `log_level` the rest would be dropped);
//! everything else at debug, as one record.

use log::Level;

/// Log `stderr` of `plugin` `verb` through the `log` facade.
pub(super) fn relog(plugin: &str, verb: &str, stderr: &[u8]) {
    relog_to(plugin, verb, stderr, &mut |level, msg| {
        log::log!(level, "{msg}")
    });
}

/// [`relog`] into `emit`. Lines without a level continue the record before them (a message with
/// newlines); lines before any record, and records below warn, go to the one debug record.
fn relog_to(plugin: &str, verb: &str, stderr: &[u8], emit: &mut dyn FnMut(Level, &str)) {
    let text = String::from_utf8_lossy(stderr);
    let mut rest: Vec<&str> = Vec::new();
    let mut current: Option<(Level, String)> = None;
    for line in text.lines() {
        match level_of(line) {
            Some((level, msg)) => {
                if let Some((l, m)) = current.take() {
                    emit(l, &m);
                }
                if level <= Level::Warn {
                    current = Some((level, format!("{plugin} {verb}: {msg}")));
                } else {
                    rest.push(line);
                }
            }
            None => match &mut current {
                Some((_, m)) => {
                    m.push('\n');
                    m.push_str(line);
                }
                None => rest.push(line),
            },
        }
    }
    if let Some((l, m)) = current {
        emit(l, &m);
    }
    let rest = rest.join("\n");
    if !rest.trim().is_empty() {
        emit(
            Level::Debug,
            &format!("{plugin} {verb}: {}", rest.trim_end()),
        );
    }
}

/// The level of a log line and the message after it: the level is one of the first three words,
/// written as tether's logger writes it (`<time> tether-ipam[<pid>] WARN <message>`), upper case
/// (`ERROR:`), bracketed (`[warning]`, whereabouts) or logfmt (`level=warn`). A plain lower-case
/// word is text ("no error found"), not a level.
fn level_of(line: &str) -> Option<(Level, &str)> {
    let mut pos = 0;
    for _ in 0..3 {
        let s = &line[pos..];
        let start = pos + (s.len() - s.trim_start().len());
        let end = line[start..]
            .find(char::is_whitespace)
            .map_or(line.len(), |e| start + e);
        if start == end {
            return None;
        }
        if let Some(level) = level_word(&line[start..end]) {
            return Some((level, line[end..].trim()));
        }
        pos = end;
    }
    None
}

fn level_word(word: &str) -> Option<Level> {
    let word = word.strip_suffix(':').unwrap_or(word);
    let name = if let Some(v) = word.strip_prefix("level=") {
        v.trim_matches('"').to_ascii_uppercase()
    } else if let Some(v) = word.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
        v.to_ascii_uppercase()
    } else if word.bytes().all(|b| b.is_ascii_uppercase()) {
        word.to_string()
    } else {
        return None;
    };
    Some(match name.as_str() {
        "ERROR" | "ERR" | "FATAL" | "PANIC" | "CRITICAL" => Level::Error,
        "WARN" | "WARNING" => Level::Warn,
        "INFO" | "VERBOSE" => Level::Info,
        "DEBUG" => Level::Debug,
        "TRACE" => Level::Trace,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(stderr: &str) -> Vec<(Level, String)> {
        let mut out = Vec::new();
        relog_to("tether-ipam", "ADD", stderr.as_bytes(), &mut |l, m| {
            out.push((l, m.to_string()))
        });
        out
    }

    #[test]
    fn tether_ipam_warnings_and_errors_keep_their_level() {
        let stderr = "2025-01-02T03:04:05.678Z tether-ipam[4242] WARN network mgmt: 10.1.2.245 answered the conflict probe from MAC 02:00:00:00:00:01; quarantining it for 600s\n\
                      2025-01-02T03:04:05.700Z tether-ipam[4242] INFO network mgmt: picked 10.1.2.246\n\
                      2025-01-02T03:04:05.800Z tether-ipam[4242] ERROR network mgmt: rollback of 10.1.2.246 failed: store\n\
                      second line of the error\n";
        assert_eq!(
            records(stderr),
            vec![
                (
                    Level::Warn,
                    "tether-ipam ADD: network mgmt: 10.1.2.245 answered the conflict probe from MAC 02:00:00:00:00:01; quarantining it for 600s".to_string()
                ),
                (Level::Error, "tether-ipam ADD: network mgmt: rollback of 10.1.2.246 failed: store\nsecond line of the error".to_string()),
                (Level::Debug, "tether-ipam ADD: 2025-01-02T03:04:05.700Z tether-ipam[4242] INFO network mgmt: picked 10.1.2.246".to_string()),
            ]
        );
    }

    #[test]
    fn other_plugins_formats() {
        let got = records(
            "2025-01-02T03:04:05Z [error] cannot reach the API\ntime=now level=warning msg=\"pool 90% full\"\nWARNING: slow\n",
        );
        let levels: Vec<Level> = got.iter().map(|(l, _)| *l).collect();
        assert_eq!(levels, vec![Level::Error, Level::Warn, Level::Warn]);
        assert_eq!(got[0].1, "tether-ipam ADD: cannot reach the API");
        assert_eq!(got[2].1, "tether-ipam ADD: slow");
    }

    #[test]
    fn free_text_stays_at_debug() {
        assert_eq!(
            records("no error found\nthread 'main' panicked at src/x.rs:1:1\n"),
            vec![(
                Level::Debug,
                "tether-ipam ADD: no error found\nthread 'main' panicked at src/x.rs:1:1"
                    .to_string()
            )]
        );
        assert!(records("").is_empty() && records("\n\n").is_empty());
        // A word must be a level, not start like one.
        assert_eq!(level_of("x y WARNINGS z"), None);
        assert_eq!(
            level_of("a b c ERROR d"),
            None,
            "only the first three words"
        );
    }
}
