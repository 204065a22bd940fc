//! Where an operator command finds the cluster when it is not told: kubectl's order (`--kubeconfig`,
//! `KUBECONFIG`, `~/.kube/config`, a pod's own service account), then the node-agent's kubeconfig
//! on a node, so `tether leases` shows what `kubectl get ipleases` shows wherever kubectl would
//! work, and also as root on a node where only tether's credential is.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use tether_kube_store::KubeSettings;
use tether_pool::NodeAgent;

/// Where credentials were found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// `--kubeconfig`.
    Flag(PathBuf),
    /// `KUBECONFIG` (its first file that exists, when it lists several).
    Env(PathBuf),
    /// `~/.kube/config`.
    Home(PathBuf),
    /// This pod's service account.
    InCluster,
    /// The plugins' kubeconfig the node-agent writes on every node.
    NodeAgent(PathBuf),
    /// `ipam.kubernetes.kubeconfig` of the network config given (`--config`).
    Config(PathBuf),
}

impl Found {
    /// The kubeconfig file, unless the credential is a pod's own.
    pub fn kubeconfig(&self) -> Option<&Path> {
        match self {
            Found::Flag(p)
            | Found::Env(p)
            | Found::Home(p)
            | Found::NodeAgent(p)
            | Found::Config(p) => Some(p),
            Found::InCluster => None,
        }
    }
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Found::Flag(p) => write!(f, "--kubeconfig {}", p.display()),
            Found::Env(p) => write!(f, "KUBECONFIG ({})", p.display()),
            Found::Home(p) => write!(f, "{}", p.display()),
            Found::InCluster => f.write_str("this pod's service account"),
            Found::NodeAgent(p) => write!(f, "this node's tether credential {}", p.display()),
            Found::Config(p) => {
                write!(f, "the config's ipam.kubernetes.kubeconfig {}", p.display())
            }
        }
    }
}

/// The places looked at, read from the process once (a seam: tests give their own).
#[derive(Debug, Clone, Default)]
pub struct Places {
    /// `KUBECONFIG`.
    pub kubeconfig_env: Option<OsString>,
    /// `HOME`.
    pub home: Option<PathBuf>,
    /// `KUBERNETES_SERVICE_HOST` is set: running in a pod.
    pub in_cluster: bool,
    /// The node-agent's kubeconfig when this node has one tether trusts.
    pub node_agent: Option<PathBuf>,
}

impl Places {
    /// This process's environment and node.
    pub fn of_this_process() -> Places {
        Places {
            kubeconfig_env: std::env::var_os("KUBECONFIG"),
            home: std::env::var_os("HOME").map(PathBuf::from),
            in_cluster: std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
            node_agent: match tether_kube_store::node_agent() {
                NodeAgent::Installed(p) => Some(p),
                NodeAgent::Absent => None,
            },
        }
    }
}

/// The cluster's credentials, or `Ok(None)` when there are none anywhere. `--context` needs a
/// kubeconfig; a `KUBECONFIG` whose files are all missing is an error (kubectl's too), not a
/// reason to look elsewhere.
pub fn find_cluster(
    flag: Option<&Path>,
    context: Option<&str>,
    places: &Places,
) -> Result<Option<(KubeSettings, Found)>, String> {
    let found = match flag {
        Some(p) => Some(Found::Flag(p.to_path_buf())),
        None => from_env(places)?
            .or_else(|| {
                let p = places.home.as_ref()?.join(".kube/config");
                p.is_file().then_some(Found::Home(p))
            })
            .or_else(|| places.in_cluster.then_some(Found::InCluster))
            .or_else(|| places.node_agent.clone().map(Found::NodeAgent)),
    };
    let Some(found) = found else {
        return match context {
            Some(c) => Err(format!(
                "--context {c}: no kubeconfig was found (--kubeconfig, KUBECONFIG, ~/.kube/config)"
            )),
            None => Ok(None),
        };
    };
    if let (Some(c), Found::InCluster | Found::NodeAgent(_) | Found::Config(_)) = (context, &found)
    {
        return Err(format!(
            "--context {c}: the credential found is {found}, which has no contexts to choose from; name a kubeconfig \
             with --kubeconfig or KUBECONFIG"
        ));
    }
    let settings = KubeSettings {
        kubeconfig: found.kubeconfig().map(Path::to_path_buf),
        context: context.map(str::to_string),
        field_manager: "tether".to_string(),
        ..KubeSettings::default()
    };
    Ok(Some((settings, found)))
}

/// `KUBECONFIG`: its first file that exists (kubectl merges them all; the first is where the
/// current context usually is).
fn from_env(places: &Places) -> Result<Option<Found>, String> {
    let Some(v) = places.kubeconfig_env.as_ref().filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let paths: Vec<PathBuf> = std::env::split_paths(v)
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    match paths.iter().find(|p| p.exists()) {
        Some(p) => Ok(Some(Found::Env(p.clone()))),
        None => Err(format!(
            "KUBECONFIG={} names no file that exists",
            v.to_string_lossy()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[&str]) -> tempdir::Dir {
        let d = tempdir::Dir::new();
        for f in files {
            let p = d.0.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "x").unwrap();
        }
        d
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let p = std::env::temp_dir().join(format!(
                    "tether-find-cluster-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn found(flag: Option<&Path>, context: Option<&str>, places: &Places) -> Found {
        find_cluster(flag, context, places).unwrap().unwrap().1
    }

    #[test]
    fn kubectls_order_then_the_node() {
        let d = dir_with(&["home/.kube/config", "env-a", "node.kubeconfig"]);
        let home = d.0.join("home");
        let env = d.0.join("env-a");
        let node = d.0.join("node.kubeconfig");
        let all = Places {
            kubeconfig_env: Some(env.clone().into()),
            home: Some(home.clone()),
            in_cluster: true,
            node_agent: Some(node.clone()),
        };
        let flag = d.0.join("flag");
        assert_eq!(found(Some(&flag), None, &all), Found::Flag(flag.clone()));
        assert_eq!(found(None, None, &all), Found::Env(env));
        let no_env = Places {
            kubeconfig_env: None,
            ..all.clone()
        };
        assert_eq!(
            found(None, None, &no_env),
            Found::Home(home.join(".kube/config"))
        );
        let pod = Places {
            home: Some(d.0.join("nowhere")),
            ..no_env.clone()
        };
        assert_eq!(found(None, None, &pod), Found::InCluster);
        let node_only = Places {
            in_cluster: false,
            ..pod.clone()
        };
        assert_eq!(found(None, None, &node_only), Found::NodeAgent(node));
        let nothing = Places {
            node_agent: None,
            ..node_only
        };
        assert!(find_cluster(None, None, &nothing).unwrap().is_none());
    }

    #[test]
    fn kubeconfig_lists_take_the_first_file_that_exists() {
        let d = dir_with(&["b"]);
        let list = std::env::join_paths([d.0.join("a"), d.0.join("b")]).unwrap();
        let places = Places {
            kubeconfig_env: Some(list),
            ..Places::default()
        };
        assert_eq!(found(None, None, &places), Found::Env(d.0.join("b")));
        let missing = Places {
            kubeconfig_env: Some(d.0.join("a").into()),
            ..Places::default()
        };
        let e = find_cluster(None, None, &missing).unwrap_err();
        assert!(e.contains("names no file that exists"), "{e}");
    }

    #[test]
    fn a_context_needs_a_kubeconfig() {
        let pod = Places {
            in_cluster: true,
            ..Places::default()
        };
        let e = find_cluster(None, Some("prod"), &pod).unwrap_err();
        assert!(e.contains("no contexts to choose from"), "{e}");
        let e = find_cluster(None, Some("prod"), &Places::default()).unwrap_err();
        assert!(e.contains("no kubeconfig was found"), "{e}");
        let d = dir_with(&["kc"]);
        let (s, _) = find_cluster(Some(&d.0.join("kc")), Some("prod"), &pod)
            .unwrap()
            .unwrap();
        assert_eq!(s.context.as_deref(), Some("prod"));
    }
}
