//! `tether-gen-crd`: write the IPLease CRD generated from the Rust type.
//!
//! ```text
//! tether-gen-crd            # rewrite deploy/crds/ipleases.yaml in this checkout
//! tether-gen-crd -          # print it
//! tether-gen-crd --check    # exit 1 if the committed file differs from the type
//! ```

use std::path::PathBuf;

fn main() {
    let manifest =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds/ipleases.yaml");
    let yaml = tether_kube_store::crd_yaml();
    match std::env::args().nth(1).as_deref() {
        Some("-") => print!("{yaml}"),
        Some("--check") => {
            let committed = std::fs::read_to_string(&manifest).unwrap_or_default();
            if committed != yaml {
                eprintln!(
                    "{} differs from the IPLease type: run tether-gen-crd",
                    manifest.display()
                );
                std::process::exit(1);
            }
        }
        None => {
            if let Err(e) = std::fs::write(&manifest, &yaml) {
                eprintln!("cannot write {}: {e}", manifest.display());
                std::process::exit(1);
            }
            eprintln!("wrote {}", manifest.display());
        }
        Some(_) => {
            eprintln!("usage: tether-gen-crd [- | --check]");
            std::process::exit(2);
        }
    }
}
