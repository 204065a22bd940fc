//! The networks the cluster's NetworkAttachmentDefinitions give tether-ipam: each tether-ipam
//! configuration of each NAD, parsed, with its NAD and the attacher's `master`. Read by the pool
//! metrics, by the move of records named by network into their domains (which domain a network
//! is in), and by the overlap checks ([`crate::overlap`]), which also take config files.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use tether_cluster::NadConfig;
use tether_pool::{NodeAgent, PoolConfig};

use crate::manifests::plugins_of;
use crate::store_access::{NetworkFile, read_network_file};

/// One tether-ipam configuration of a NAD.
#[derive(Debug, Clone)]
pub struct NadNetwork {
    /// `namespace/name` of the NAD (for a config file that is no NAD object: the file's path).
    pub nad: String,
    /// The IPAM configuration.
    pub cfg: PoolConfig,
    /// The attacher's `master` (`None`: the interface of the default route, or the chained one).
    pub master: Option<String>,
    /// The attacher's `type` (`tether-ipvlan`, `macvlan`…), when the config names one.
    pub attacher: Option<String>,
}

/// Every tether-ipam configuration of `nads`, in NAD order (namespace, name), read as the plugin
/// reads it on a node of this cluster, where tether's node-agent runs (so a configuration naming
/// no store is the cluster store's). One that does not parse is skipped (logged at debug): the
/// plugin refuses it on its own, and `tether validate` says why.
pub fn nad_networks(nads: &[NadConfig]) -> Vec<NadNetwork> {
    let mut sorted: Vec<&NadConfig> = nads.iter().collect();
    sorted.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let mut out = Vec::new();
    for nad in sorted {
        let name = format!("{}/{}", nad.namespace, nad.name);
        for raw in tether_ipam_configs(&nad.config, &nad.name) {
            match PoolConfig::from_value(&raw, &NodeAgent::on_every_node()) {
                Ok(cfg) => out.push(NadNetwork {
                    nad: name.clone(),
                    master: master_of(&raw),
                    attacher: attacher_of(&raw),
                    cfg,
                }),
                Err(e) => log::debug!("NAD {name}: {e}"),
            }
        }
    }
    out
}

/// The network of a config file as `tether validate` and `tether doctor` read it (see
/// [`read_network_file`]): named after its NAD when the file is a NAD object, else after the file.
pub fn file_network(path: &Path, agent: &NodeAgent) -> Result<NadNetwork, String> {
    network_of(read_network_file(path)?, path, agent)
}

/// [`file_network`] of a file already read (a pipe reads only once).
pub fn network_of(file: NetworkFile, path: &Path, agent: &NodeAgent) -> Result<NadNetwork, String> {
    let cfg = PoolConfig::from_value(&file.config, agent).map_err(|e| e.to_string())?;
    Ok(NadNetwork {
        nad: file.nad.unwrap_or_else(|| path.display().to_string()),
        master: master_of(&file.config),
        attacher: attacher_of(&file.config),
        cfg,
    })
}

/// `cluster`'s networks without those of the NADs that `files` stand for (a file is its NAD as
/// it is about to be), then `files`.
pub fn with_files(cluster: Vec<NadNetwork>, files: &[NadNetwork]) -> Vec<NadNetwork> {
    let mut out: Vec<NadNetwork> = cluster
        .into_iter()
        .filter(|c| !files.iter().any(|f| f.nad == c.nad))
        .collect();
    out.extend(files.iter().cloned());
    out
}

/// The attacher's `master` of a network configuration, if it names one.
pub(crate) fn master_of(config: &Value) -> Option<String> {
    config
        .get("master")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_string)
}

/// The attacher's `type` of a network configuration, if it names one.
pub(crate) fn attacher_of(config: &Value) -> Option<String> {
    config
        .get("type")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The uniqueness domain of each network, as its NADs give it (the first NAD's, by namespace and
/// name, when they disagree: the overlap checks report that).
pub fn domains(nets: &[NadNetwork]) -> BTreeMap<String, Option<String>> {
    let mut out = BTreeMap::new();
    for n in nets {
        out.entry(n.cfg.network_name.clone())
            .or_insert_with(|| n.cfg.domain.clone());
    }
    out
}

/// The network configurations in a NAD's `spec.config` whose IPAM is tether-ipam: the config
/// itself, or each plugin of a conflist (with the list's `name` and `cniVersion`). Without a
/// `name`, the NAD's name is the network's, as Multus makes it.
pub fn tether_ipam_configs(text: &str, nad_name: &str) -> Vec<Value> {
    ipam_configs(text, nad_name, "tether-ipam")
}

/// [`tether_ipam_configs`] for the IPAM plugin `ipam_type` (`whereabouts`, for the import).
pub fn ipam_configs(text: &str, nad_name: &str, ipam_type: &str) -> Vec<Value> {
    let Ok(mut v) = serde_json::from_str::<Value>(text) else {
        return Vec::new();
    };
    if let Some(obj) = v.as_object_mut()
        && !obj.contains_key("name")
    {
        obj.insert("name".into(), Value::from(nad_name));
    }
    let ours = |p: &Value| p.pointer("/ipam/type").and_then(Value::as_str) == Some(ipam_type);
    plugins_of(&v).into_iter().filter(ours).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nad(ns: &str, name: &str, config: &str) -> NadConfig {
        NadConfig {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            config: config.into(),
        }
    }

    #[test]
    fn networks_domains_and_masters_of_the_nads() {
        let nads = [
            nad(
                "b",
                "rail",
                r#"{"type":"tether-ipvlan","master":"enp6s0","ipam":{"type":"tether-ipam","range":"10.9.0.0/24","isolated_fabric":"rail-1"}}"#,
            ),
            nad(
                "a",
                "pool",
                r#"{"plugins":[{"type":"tether-ipvlan","ipam":{"type":"tether-ipam","range":"10.8.0.0/24"}}],"name":"mgmt"}"#,
            ),
            nad(
                "a",
                "other",
                r#"{"type":"macvlan","ipam":{"type":"host-local"}}"#,
            ),
            nad(
                "a",
                "broken",
                r#"{"ipam":{"type":"tether-ipam","range":"x"}}"#,
            ),
        ];
        let nets = nad_networks(&nads);
        assert_eq!(nets.len(), 2);
        assert_eq!(
            (nets[0].nad.as_str(), nets[0].cfg.network_name.as_str()),
            ("a/pool", "mgmt")
        );
        assert_eq!(nets[0].master, None);
        assert_eq!(nets[1].master.as_deref(), Some("enp6s0"));
        let d = domains(&nets);
        assert_eq!(d["mgmt"], None);
        assert_eq!(d["rail"].as_deref(), Some("rail-1"));
    }

    #[test]
    fn a_nad_file_stands_in_for_the_cluster_copy_of_its_nad() {
        let dir = std::env::temp_dir().join(format!("tether-nads-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = r#"{"type":"tether-ipvlan","master":"enp6s0","ipam":{"type":"tether-ipam","range":"10.31.0.0/24"}}"#;
        let object = dir.join("rail.json");
        std::fs::write(
            &object,
            serde_json::json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                               "metadata": {"name": "rail", "namespace": "b"}, "spec": {"config": config}})
            .to_string(),
        )
        .unwrap();
        let plain = dir.join("plain.conf");
        std::fs::write(
            &plain,
            r#"{"name":"plain","ipam":{"type":"tether-ipam","range":"10.32.0.0/24"}}"#,
        )
        .unwrap();
        let from_object = file_network(&object, &NodeAgent::Absent).unwrap();
        let from_plain = file_network(&plain, &NodeAgent::Absent).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            (from_object.nad.as_str(), from_object.master.as_deref()),
            ("b/rail", Some("enp6s0"))
        );
        assert_eq!(from_object.cfg.network_name, "rail", "the NAD's name");
        assert_eq!(from_plain.nad, plain.display().to_string());

        let cluster = nad_networks(&[
            nad("b", "rail", &config.replace("10.31.0.0/24", "10.31.0.0/16")),
            nad("a", "mgmt", config),
        ]);
        let both = with_files(cluster, &[from_object, from_plain]);
        let names: Vec<(&str, String)> = both
            .iter()
            .map(|n| (n.nad.as_str(), n.cfg.ranges[0].to_string()))
            .collect();
        assert_eq!(
            names,
            [
                ("a/mgmt", "10.31.0.0/24".to_string()),
                ("b/rail", "10.31.0.0/24".to_string()),
                (plain.to_str().unwrap(), "10.32.0.0/24".to_string()),
            ]
        );
    }
}
