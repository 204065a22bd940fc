//! Plugins of this build for `tether doctor`'s `plugins` check: scripts that answer `--version`
//! as this build's tether-ipvlan and tether-ipam do. The tests run the doctor on a host whose
//! /opt/cni/bin holds no tether plugins, or another build's; the tether under test and these
//! tests link the same tether-build-info, so the lines match.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// `dir/plugins`, holding both scripts (made on the first call): for `--cni-bin-dir`.
pub fn plugins_of_this_build(dir: &Path) -> PathBuf {
    let bin = dir.join("plugins");
    std::fs::create_dir_all(&bin).unwrap();
    for name in ["tether-ipvlan", "tether-ipam"] {
        let p = bin.join(name);
        if !p.exists() {
            let line = tether_build_info::line(name);
            std::fs::write(&p, format!("#!/bin/sh\necho '{line}'\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    bin
}
