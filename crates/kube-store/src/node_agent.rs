//! Is tether's node-agent installed on this node? The kubeconfig it writes for the plugins says
//! so; a configuration that names no store then uses the cluster store with it
//! ([`tether_pool::StoreSource::NodeAgent`]).

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use tether_pool::{NODE_KUBECONFIG, NodeAgent};

/// The environment variable that moves [`NODE_KUBECONFIG`] (set by the runtime or a test, never
/// by a NAD, like `TETHER_LEASE_SOCKET`); set empty, no node-agent is assumed.
pub const NODE_KUBECONFIG_ENV: &str = "TETHER_NODE_KUBECONFIG";

/// tether's node-agent as this process finds it: installed when its kubeconfig
/// (`$TETHER_NODE_KUBECONFIG`, else [`NODE_KUBECONFIG`]) is a regular file, not a symlink, owned
/// by root (or by this process's user, as tether-trusted-fs allows).
pub fn node_agent() -> NodeAgent {
    node_agent_at(node_kubeconfig(std::env::var_os(NODE_KUBECONFIG_ENV)))
}

/// Where to look, given the environment variable's value: `None` when it is set empty. A relative
/// path names no file this process can trust the meaning of, so it counts as empty too.
fn node_kubeconfig(var: Option<OsString>) -> Option<PathBuf> {
    match var {
        None => Some(PathBuf::from(NODE_KUBECONFIG)),
        Some(v) => Some(PathBuf::from(v)).filter(|p| p.is_absolute()),
    }
}

fn node_agent_at(path: Option<PathBuf>) -> NodeAgent {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    match path.as_ref().map(std::fs::symlink_metadata) {
        Some(Ok(m)) if m.file_type().is_file() && (m.uid() == 0 || m.uid() == me) => {
            NodeAgent::Installed(path.expect("matched Some"))
        }
        _ => NodeAgent::Absent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_moves_or_clears_the_path() {
        assert_eq!(node_kubeconfig(None), Some(PathBuf::from(NODE_KUBECONFIG)));
        assert_eq!(node_kubeconfig(Some("".into())), None);
        assert_eq!(node_kubeconfig(Some("relative/kc".into())), None);
        assert_eq!(
            node_kubeconfig(Some("/run/test/kc".into())),
            Some(PathBuf::from("/run/test/kc"))
        );
    }

    #[test]
    fn only_a_regular_file_of_root_or_ours_counts() {
        let dir = std::env::temp_dir().join(format!("tether-node-agent-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let kc = dir.join("tether.kubeconfig");
        assert_eq!(
            node_agent_at(Some(kc.clone())),
            NodeAgent::Absent,
            "missing"
        );
        assert_eq!(node_agent_at(None), NodeAgent::Absent, "cleared");
        std::fs::write(&kc, "apiVersion: v1\n").unwrap();
        assert_eq!(
            node_agent_at(Some(kc.clone())),
            NodeAgent::Installed(kc.clone())
        );
        // A file of root's (whoever runs this test).
        let passwd = PathBuf::from("/etc/passwd");
        assert_eq!(
            node_agent_at(Some(passwd.clone())),
            NodeAgent::Installed(passwd)
        );
        let link = dir.join("link.kubeconfig");
        std::os::unix::fs::symlink(&kc, &link).unwrap();
        assert_eq!(node_agent_at(Some(link)), NodeAgent::Absent, "a symlink");
        assert_eq!(
            node_agent_at(Some(dir.clone())),
            NodeAgent::Absent,
            "a directory"
        );
        // Someone else's file (only root can make one here).
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&kc, Some(65534), None).unwrap();
            assert_eq!(node_agent_at(Some(kc)), NodeAgent::Absent, "another user's");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
