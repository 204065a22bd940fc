//! The commit and the target of this build, as compile-time variables of the library:
//! `TETHER_COMMIT` when set (a release built from a source tarball has no `.git`), else the
//! workspace's own checkout (`HEAD`, with `-dirty` when tracked files differ from it), else
//! `unknown`.
//!
//! Rerun when `HEAD`, the branch it points to or the index change (a commit, a checkout, a `git
//! add`), not on every edit: an edit not yet added shows as `-dirty` once the index changes.
//! Release builds come from a clean checkout or set `TETHER_COMMIT`, so theirs is exact.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TETHER_COMMIT");
    let commit = match std::env::var("TETHER_COMMIT") {
        Ok(c) if !c.is_empty() => checked(&c),
        _ => from_git(&workspace_root()).unwrap_or_else(|| "unknown".to_string()),
    };
    let target = std::env::var("TARGET").expect("cargo sets TARGET for build scripts");
    println!("cargo:rustc-env=TETHER_BUILD_COMMIT={commit}");
    println!(
        "cargo:rustc-env=TETHER_BUILD_COMMIT_SHORT={}",
        short(&commit)
    );
    println!("cargo:rustc-env=TETHER_BUILD_TARGET={target}");
}

/// This crate is `crates/build-info` of the workspace.
fn workspace_root() -> PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// A commit a release build names: 40 hex digits, `-dirty` allowed, or `unknown`. Anything else
/// fails the build, rather than a release that reports a wrong commit.
fn checked(commit: &str) -> String {
    let c = commit.trim().to_ascii_lowercase();
    let hex = c.strip_suffix("-dirty").unwrap_or(&c);
    if c == "unknown" || (hex.len() == 40 && hex.bytes().all(|b| b.is_ascii_hexdigit())) {
        return c;
    }
    panic!(
        "TETHER_COMMIT={commit:?} is not a commit: 40 hex digits (optionally -dirty), or unknown"
    );
}

/// What `tether version`'s text shows: 12 hex digits, and `-dirty`.
fn short(commit: &str) -> String {
    match commit.split_once('-') {
        Some((hex, rest)) => format!("{}-{rest}", &hex[..hex.len().min(12)]),
        None => commit[..commit.len().min(12)].to_string(),
    }
}

/// `HEAD` of the workspace's own checkout, `None` without one. Only a `.git` at the workspace's
/// root counts (a directory, or a worktree's file): sources unpacked inside another repository
/// must not take that repository's commit.
fn from_git(root: &Path) -> Option<String> {
    if !root.join(".git").exists() {
        return None;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            // Set when cargo runs from a git hook: they would point git at another tree.
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env_remove("GIT_INDEX_FILE")
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        out.status.success().then(|| text.trim().to_string())
    };
    watch(root, &git);
    let head = git(&["rev-parse", "--verify", "-q", "HEAD"])?;
    if head.len() != 40 || !head.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    // --no-optional-locks: status must not rewrite the index it is rerun on.
    let status = git(&[
        "--no-optional-locks",
        "status",
        "--porcelain",
        "--untracked-files=no",
    ]);
    Some(match status {
        Some(s) if !s.is_empty() => format!("{head}-dirty"),
        _ => head,
    })
}

/// Rerun on `HEAD`, the index (both per worktree) and the branch `HEAD` names (shared by the
/// worktrees: a loose ref, else `packed-refs` and the directory a new loose ref would appear in).
/// Only paths that exist: cargo reruns every build on one that does not.
fn watch(root: &Path, git: &dyn Fn(&[&str]) -> Option<String>) {
    let dir = |arg: &str| git(&["rev-parse", arg]).map(|d| root.join(d));
    let (Some(git_dir), Some(common)) = (dir("--git-dir"), dir("--git-common-dir")) else {
        return;
    };
    let mut paths = vec![git_dir.join("HEAD"), git_dir.join("index")];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        let loose = common.join(&branch);
        if loose.exists() {
            paths.push(loose);
        } else if let Some(parent) = loose.parent() {
            paths.push(parent.to_path_buf());
        }
        paths.push(common.join("packed-refs"));
    }
    for p in paths.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
