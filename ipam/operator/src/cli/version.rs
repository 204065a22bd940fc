//! `tether version [-o json]`: this build, as tether-build-info has it (the plugins' `--version`
//! prints the same line under their names).

use crate::output::Output;

pub(super) fn print(output: Output) {
    match output {
        Output::Table => println!("{}", tether_build_info::line("tether")),
        Output::Json => println!("{}", version_json()),
    }
}

/// `{"version": "0.2.0", "commit": "<40 hex, -dirty, or unknown>", "target":
/// "x86_64-unknown-linux-musl"}`, in that order (a struct keeps it).
fn version_json() -> String {
    #[derive(serde::Serialize)]
    struct Build {
        version: &'static str,
        commit: &'static str,
        target: &'static str,
    }
    let build = Build {
        version: tether_build_info::VERSION,
        commit: tether_build_info::COMMIT,
        target: tether_build_info::TARGET,
    };
    serde_json::to_string_pretty(&build).expect("json")
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::cli::run;
    use crate::output::{EXIT_OK, EXIT_USAGE};

    #[test]
    fn version_json_is_version_commit_target() {
        let text = version_json();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 3, "{text}");
        let at = |k: &str| text.find(&format!("\"{k}\"")).unwrap();
        assert!(
            at("version") < at("commit") && at("commit") < at("target"),
            "{text}"
        );
        assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
        let commit = v["commit"].as_str().unwrap();
        let hex = commit.strip_suffix("-dirty").unwrap_or(commit);
        assert!(
            commit == "unknown" || (hex.len() == 40 && hex.bytes().all(|b| b.is_ascii_hexdigit())),
            "{commit}"
        );
        assert!(v["target"].as_str().unwrap().contains("-linux-"), "{v}");
        let tether = |args: &[&str]| run(args.iter().map(Into::into).collect());
        assert_eq!(tether(&["tether", "version"]), EXIT_OK);
        assert_eq!(tether(&["tether", "version", "-o", "json"]), EXIT_OK);
        assert_eq!(tether(&["tether", "version", "-o", "yaml"]), EXIT_USAGE);
    }
}
