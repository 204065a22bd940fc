//! What this build is: the workspace's version, the commit it was built from and the target it
//! was built for (`build.rs` says where the commit comes from). One crate for all three binaries,
//! so `tether version`, the plugins' `--version` and `tether doctor`, which compares the installed
//! plugins with itself, write and read one format.

/// The workspace's version: of the binaries, the image tag and the chart (docs/releasing.md).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// 40 hex digits, with `-dirty` when tracked files differed from it; or `unknown`.
pub const COMMIT: &str = env!("TETHER_BUILD_COMMIT");
/// [`COMMIT`] in 12 hex digits (and `-dirty`), as the version line shows it.
pub const SHORT_COMMIT: &str = env!("TETHER_BUILD_COMMIT_SHORT");
/// The Rust target triple, e.g. `x86_64-unknown-linux-musl`.
pub const TARGET: &str = env!("TETHER_BUILD_TARGET");
/// What follows a program's name in its version line: `0.2.0 (commit abcdef123456, TARGET)`.
pub const DESCRIBE: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TETHER_BUILD_COMMIT_SHORT"),
    ", ",
    env!("TETHER_BUILD_TARGET"),
    ")"
);

/// The version line of `program`: `tether-ipam 0.2.0 (commit abcdef123456, x86_64-unknown-linux-musl)`.
pub fn line(program: &str) -> String {
    format!("{program} {DESCRIBE}")
}

/// A version line read back: what another binary says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    pub version: String,
    /// As the line shows it: [`SHORT_COMMIT`]'s form, or `unknown`.
    pub commit: String,
    pub target: String,
}

impl Reported {
    /// This build, as its version line shows it.
    pub fn this_build() -> Reported {
        Reported {
            version: VERSION.to_string(),
            commit: SHORT_COMMIT.to_string(),
            target: TARGET.to_string(),
        }
    }

    /// The first line of `text` when it is `program`'s version line as [`line`] writes it.
    pub fn parse(program: &str, text: &str) -> Option<Reported> {
        let rest = text
            .lines()
            .next()?
            .strip_prefix(program)?
            .strip_prefix(' ')?;
        let (version, rest) = rest.split_once(" (commit ")?;
        let (commit, target) = rest.strip_suffix(')')?.split_once(", ")?;
        let word = |s: &str| !s.is_empty() && !s.contains(char::is_whitespace);
        (word(version) && word(commit) && word(target)).then(|| Reported {
            version: version.to_string(),
            commit: commit.to_string(),
            target: target.to_string(),
        })
    }

    /// Whether the commit is known (a build without `.git` or `TETHER_COMMIT` does not know it).
    pub fn commit_known(&self) -> bool {
        self.commit != "unknown"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_reads_back_as_this_build() {
        let l = line("tether-ipam");
        assert!(
            l.starts_with(&format!("tether-ipam {VERSION} (commit ")),
            "{l}"
        );
        assert!(l.ends_with(&format!(", {TARGET})")), "{l}");
        assert_eq!(
            Reported::parse("tether-ipam", &l),
            Some(Reported::this_build())
        );
        // Another program's line, or trailing words: not this program's version line.
        assert_eq!(Reported::parse("tether-ipvlan", &l), None);
        assert_eq!(Reported::parse("tether", &l), None);
        assert_eq!(
            Reported::parse("tether-ipam", &format!("{l}: CNI plugin")),
            None
        );
        assert_eq!(Reported::parse("tether-ipam", ""), None);
    }

    #[test]
    fn the_commit_is_40_hex_maybe_dirty_or_unknown() {
        let hex = COMMIT.strip_suffix("-dirty").unwrap_or(COMMIT);
        if COMMIT == "unknown" {
            assert_eq!(SHORT_COMMIT, "unknown");
        } else {
            assert_eq!(hex.len(), 40, "{COMMIT}");
            assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()), "{COMMIT}");
            assert!(COMMIT.starts_with(&SHORT_COMMIT[..12]), "{SHORT_COMMIT}");
            assert_eq!(SHORT_COMMIT.ends_with("-dirty"), COMMIT.ends_with("-dirty"));
        }
        assert!(!TARGET.is_empty() && !TARGET.contains(' '), "{TARGET}");
    }

    #[test]
    fn old_and_foreign_lines_are_not_version_lines() {
        // What 0.1.0 printed without CNI_COMMAND, and an unrelated program.
        for text in [
            "tether-ipam: CNI plugin 0.1.0; supported CNI versions: 0.3.0, 1.1.0",
            "tether-ipam 0.2.0",
            "tether-ipam 0.2.0 (commit , x)",
            "tether-ipam 0.2.0 (commit abc x86_64)",
        ] {
            assert_eq!(Reported::parse("tether-ipam", text), None, "{text}");
        }
        let r = Reported::parse(
            "tether-ipam",
            "tether-ipam 0.3.1 (commit unknown, aarch64-unknown-linux-musl)\n",
        )
        .unwrap();
        assert_eq!((r.version.as_str(), r.commit_known()), ("0.3.1", false));
    }
}
