//! deploy/crds/ipleases.yaml is generated from the Rust type and must never drift from it.

use std::path::PathBuf;

#[test]
fn committed_crd_matches_the_rust_type() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds/ipleases.yaml");
    let committed =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let generated = tether_kube_store::crd_yaml();
    assert!(
        committed == generated,
        "{} differs from the IPLease type in crates/kube-store/src/crd.rs; regenerate it with \
         `cargo run -p tether-kube-store --bin tether-gen-crd`",
        path.display()
    );
}

#[test]
fn manifest_is_the_documented_crd() {
    let generated = tether_kube_store::crd_yaml();
    for needle in [
        "name: ipleases.ipam.tether.dev",
        "scope: Cluster",
        "kind: IPLease",
        "plural: ipleases",
        "jsonPath: .spec.network",
        "jsonPath: .metadata.creationTimestamp",
        "rule: self == oldSelf",
    ] {
        assert!(generated.contains(needle), "missing {needle:?}");
    }
}
