//! Driving plugins through the real libcni (`target/libcni-driver`), the way
//! a runtime / Multus does.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cmd::{CmdOutput, capture};
use crate::netns::NetNs;
use crate::paths::{TempDir, libcni_driver, reference_plugins_dir, unique_token};

/// Multus-shaped CNI_ARGS:
/// `IgnoreUnknown=true;K8S_POD_NAMESPACE=..;K8S_POD_NAME=..;K8S_POD_INFRA_CONTAINER_ID=..;K8S_POD_UID=..`
pub fn multus_cni_args(
    pod_namespace: &str,
    pod_name: &str,
    infra_container_id: &str,
    pod_uid: &str,
) -> String {
    format!(
        "IgnoreUnknown=true;K8S_POD_NAMESPACE={pod_namespace};K8S_POD_NAME={pod_name};\
         K8S_POD_INFRA_CONTAINER_ID={infra_container_id};K8S_POD_UID={pod_uid}"
    )
}

/// One network (a conflist) plus the runtime parameters to drive it with
/// `libcni-driver add|check|del`.
///
/// Owns a scratch dir holding `net.d/<name>.conflist` (NETCONFPATH) and the
/// libcni cache dir (`cache/`, CNI_CACHE_DIR), removed on drop. Defaults:
/// CNI_PATH = the reference plugins dir, CNI_IFNAME = eth0, a unique
/// CNI_CONTAINERID, no CNI_ARGS / CAP_ARGS, driver run in the caller's netns.
#[derive(Debug)]
pub struct Libcni {
    dir: TempDir,
    name: String,
    cni_path: String,
    ifname: String,
    container_id: String,
    cni_args: Option<String>,
    cap_args: Option<serde_json::Value>,
    cache_dir: PathBuf,
    run_in: Option<String>,
    extra_env: Vec<(String, String)>,
}

impl Libcni {
    /// Writes `conflist` (its `name` field names the network) into a fresh
    /// NETCONFPATH. Panics if it has no string `name`.
    #[track_caller]
    pub fn new(conflist: &serde_json::Value) -> Libcni {
        let name = conflist["name"]
            .as_str()
            .expect("conflist needs a string \"name\"")
            .to_string();
        let dir = TempDir::new("libcni");
        let netd = dir.join("net.d");
        std::fs::create_dir_all(&netd).unwrap();
        std::fs::write(
            netd.join(format!("{name}.conflist")),
            serde_json::to_vec_pretty(conflist).unwrap(),
        )
        .unwrap();
        let cache_dir = dir.join("cache");
        Libcni {
            dir,
            name,
            cni_path: reference_plugins_dir().to_string_lossy().into_owned(),
            ifname: "eth0".into(),
            container_id: format!("tether-{}", unique_token()),
            cni_args: None,
            cap_args: None,
            cache_dir,
            run_in: None,
            extra_env: Vec::new(),
        }
    }

    /// CNI_PATH (colon-separated dirs).
    pub fn cni_path(mut self, path: impl Into<String>) -> Self {
        self.cni_path = path.into();
        self
    }
    /// CNI_IFNAME.
    pub fn ifname(mut self, ifname: impl Into<String>) -> Self {
        self.ifname = ifname.into();
        self
    }
    /// CNI_CONTAINERID.
    pub fn container_id(mut self, id: impl Into<String>) -> Self {
        self.container_id = id.into();
        self
    }
    /// CNI_ARGS (`K=V;...`), see [`multus_cni_args`].
    pub fn cni_args(mut self, args: impl Into<String>) -> Self {
        self.cni_args = Some(args.into());
        self
    }
    /// CAP_ARGS (a JSON object of capability args -> runtimeConfig).
    pub fn cap_args(mut self, args: serde_json::Value) -> Self {
        self.cap_args = Some(args);
        self
    }
    /// CNI_CACHE_DIR (default: a private dir inside the scratch dir).
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = dir.into();
        self
    }
    /// Run the driver (hence the plugins) inside `ns` (`ip netns exec`), e.g.
    /// the "host" namespace that holds the master interface.
    pub fn run_in(mut self, ns: &NetNs) -> Self {
        self.run_in = Some(ns.name().to_string());
        self
    }
    /// An extra environment variable for the driver (and so the plugins).
    pub fn env(mut self, key: impl Into<String>, val: impl Into<String>) -> Self {
        self.extra_env.push((key.into(), val.into()));
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn container_id_value(&self) -> &str {
        &self.container_id
    }
    pub fn ifname_value(&self) -> &str {
        &self.ifname
    }
    /// NETCONFPATH.
    pub fn netconf_dir(&self) -> PathBuf {
        self.dir.join("net.d")
    }
    /// A scratch dir owned by this value (removed on drop), e.g. for a
    /// host-local `dataDir`: `scratch().join("ipam")`.
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }
    /// libcni's cached result for this attachment:
    /// `<cache>/results/<network>-<containerID>-<ifname>`.
    pub fn cache_file(&self) -> PathBuf {
        self.cache_dir.join("results").join(format!(
            "{}-{}-{}",
            self.name, self.container_id, self.ifname
        ))
    }

    /// The `libcni-driver <verb> <network> <netns>` command, env set.
    pub fn command(&self, verb: &str, netns: &Path) -> Command {
        let driver = libcni_driver();
        let mut c = match &self.run_in {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&driver);
                c
            }
            None => Command::new(&driver),
        };
        c.arg(verb).arg(&self.name).arg(netns);
        c.env("NETCONFPATH", self.netconf_dir())
            .env("CNI_PATH", &self.cni_path)
            .env("CNI_IFNAME", &self.ifname)
            .env("CNI_CONTAINERID", &self.container_id)
            .env("CNI_CACHE_DIR", &self.cache_dir);
        match &self.cni_args {
            Some(a) => c.env("CNI_ARGS", a),
            None => c.env_remove("CNI_ARGS"),
        };
        match &self.cap_args {
            Some(a) => c.env("CAP_ARGS", a.to_string()),
            None => c.env_remove("CAP_ARGS"),
        };
        for (k, v) in &self.extra_env {
            c.env(k, v);
        }
        c
    }

    /// Runs `verb` (add/check/del) against `netns` (a path, e.g. [`NetNs::path`]).
    #[track_caller]
    pub fn invoke(&self, verb: &str, netns: &Path) -> CmdOutput {
        capture(&mut self.command(verb, netns))
    }
    /// `add`; stdout is the result JSON on success.
    #[track_caller]
    pub fn add(&self, netns: &Path) -> CmdOutput {
        self.invoke("add", netns)
    }
    #[track_caller]
    pub fn check(&self, netns: &Path) -> CmdOutput {
        self.invoke("check", netns)
    }
    #[track_caller]
    pub fn del(&self, netns: &Path) -> CmdOutput {
        self.invoke("del", netns)
    }
}
