//! Every input under regressions/<target>/ (crashes found by `make fuzz`, plus hand-written edge
//! cases) replayed through its target's property on stable Rust, as part of `make test`.

use std::path::Path;

fn replay(target: &str, f: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == ".keep") {
            continue;
        }
        f(&std::fs::read(&path).unwrap());
        n += 1;
    }
    assert!(n > 0, "no regression inputs for {target}");
}

#[test]
fn netconf() {
    replay("netconf", tether_fuzz::netconf);
}
#[test]
fn cni_args() {
    replay("cni_args", tether_fuzz::cni_args);
}
#[test]
fn range() {
    replay("range", tether_fuzz::range);
}
#[test]
fn result() {
    replay("result", tether_fuzz::result);
}
#[test]
fn store_file() {
    replay("store_file", tether_fuzz::store_file);
}
