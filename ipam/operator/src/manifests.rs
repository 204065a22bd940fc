//! Network configurations as people keep them: a CNI config or conflist (JSON), a
//! NetworkAttachmentDefinition as JSON or YAML, a manifest of several YAML documents, or a `List`
//! (`kubectl get net-attach-def -o yaml`). Each NAD's `spec.config` is read as Multus reads it (its
//! name injected when the config has none); documents of other kinds are skipped.

use std::path::Path;

use serde_json::Value;

/// The largest file read: manifests are kilobytes; a huge file is a mistake, not a network.
const MAX_FILE: u64 = 16 << 20;

/// One network configuration found in a file.
#[derive(Debug, Clone)]
pub struct NetworkDocument {
    /// Where it was: the file, and the document's number when the file holds several.
    pub source: String,
    /// `namespace/name` when it is a NAD (namespace `default` when it names none).
    pub nad: Option<String>,
    /// The configuration: a single plugin's, or a conflist.
    pub config: Value,
}

/// What [`read_documents`] found in a file.
#[derive(Debug, Default)]
pub struct FileContents {
    pub networks: Vec<NetworkDocument>,
    /// Documents that are neither a NAD nor a network config (`Pod`, `Deployment`, …).
    pub other_kinds: Vec<String>,
    /// NADs without `spec.config`: Multus reads a file on the node instead, which is not here.
    pub without_config: Vec<String>,
}

/// Every network configuration in the file at `path`.
pub fn read_documents(path: &Path) -> Result<FileContents, String> {
    let shown = path.display().to_string();
    let text = read_bounded(path)?;
    let docs: Vec<Value> = match serde_json::from_str::<Value>(&text) {
        Ok(v) => vec![v],
        Err(json_error) => serde_saphyr::from_multiple::<Value>(&text).map_err(|yaml_error| {
            if text.trim_start().starts_with(['{', '[']) {
                format!("{shown} is not JSON: {json_error}")
            } else {
                format!("{shown} is neither JSON nor YAML: {yaml_error}")
            }
        })?,
    };
    let several = docs.len() > 1;
    let mut out = FileContents::default();
    for (i, doc) in docs.into_iter().enumerate() {
        let source = if several {
            format!("{shown} (document {})", i + 1)
        } else {
            shown.clone()
        };
        collect(doc, &source, &mut out)?;
    }
    Ok(out)
}

fn collect(doc: Value, source: &str, out: &mut FileContents) -> Result<(), String> {
    let kind = doc.get("kind").and_then(Value::as_str).map(str::to_string);
    match kind.as_deref() {
        _ if doc.is_null() => {}
        Some("List") | Some("NetworkAttachmentDefinitionList") => {
            let items = doc.get("items").and_then(Value::as_array).cloned();
            for (j, item) in items.unwrap_or_default().into_iter().enumerate() {
                collect(item, &format!("{source} item {}", j + 1), out)?;
            }
        }
        Some("NetworkAttachmentDefinition") => {
            let meta = |key: &str| {
                doc.pointer(&format!("/metadata/{key}"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            };
            let name =
                meta("name").ok_or_else(|| format!("the NAD in {source} has no metadata.name"))?;
            let nad = format!(
                "{}/{name}",
                meta("namespace").unwrap_or_else(|| "default".into())
            );
            let Some(text) = doc.pointer("/spec/config").and_then(Value::as_str) else {
                out.without_config.push(nad);
                return Ok(());
            };
            let mut config: Value = serde_json::from_str(text)
                .map_err(|e| format!("spec.config of NAD {nad} in {source} is not JSON: {e}"))?;
            // As Multus does: a config without a name is named after its NAD.
            if let Some(obj) = config.as_object_mut()
                && !obj.contains_key("name")
            {
                obj.insert("name".into(), Value::String(name));
            }
            out.networks.push(NetworkDocument {
                source: source.to_string(),
                nad: Some(nad),
                config,
            });
        }
        Some(other) if doc.get("apiVersion").is_some() => {
            let name = doc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("(unnamed)");
            out.other_kinds.push(format!("{other} {name}"));
        }
        _ if ["type", "plugins", "ipam"]
            .iter()
            .any(|k| doc.get(k).is_some()) =>
        {
            out.networks.push(NetworkDocument {
                source: source.to_string(),
                nad: None,
                config: doc,
            })
        }
        _ => {
            return Err(format!(
                "{source} is neither a network config (no \"type\", \"plugins\" or \"ipam\") nor a NetworkAttachmentDefinition"
            ));
        }
    }
    Ok(())
}

/// The plugin configurations of a network configuration, as the runtime hands them to each
/// plugin: the config itself, or each plugin of a conflist with the list's `name` and
/// `cniVersion` (which plugins inherit).
pub fn plugins_of(config: &Value) -> Vec<Value> {
    let Some(list) = config.get("plugins").and_then(Value::as_array) else {
        return vec![config.clone()];
    };
    list.iter()
        .map(|p| {
            let mut p = p.clone();
            for k in ["name", "cniVersion"] {
                if let (Some(obj), Some(val)) = (p.as_object_mut(), config.get(k))
                    && !obj.contains_key(k)
                {
                    obj.insert(k.to_string(), val.clone());
                }
            }
            p
        })
        .collect()
}

fn read_bounded(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_FILE + 1), &mut text)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    if text.len() as u64 > MAX_FILE {
        return Err(format!(
            "{shown} is larger than {} MiB: not a network manifest",
            MAX_FILE >> 20
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<FileContents, String> {
        let p = std::env::temp_dir().join(format!(
            "tether-manifests-{}-{:x}",
            std::process::id(),
            tether_stable_hash::fnv1a64(text.as_bytes(), 0)
        ));
        std::fs::write(&p, text).unwrap();
        let r = read_documents(&p);
        std::fs::remove_file(&p).unwrap();
        r
    }

    #[test]
    fn yaml_manifests_of_several_documents() {
        let got = read(
            r#"---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: mgmt, namespace: ml}
spec:
  config: '{"cniVersion": "1.0.0", "type": "tether-ipvlan", "ipam": {"type": "tether-ipam", "range": "10.0.0.0/24"}}'
---
apiVersion: v1
kind: Pod
metadata: {name: trainer}
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: elsewhere}
"#,
        )
        .unwrap();
        assert_eq!(got.networks.len(), 1);
        let n = &got.networks[0];
        assert_eq!(n.nad.as_deref(), Some("ml/mgmt"));
        assert_eq!(
            n.config["name"], "mgmt",
            "named after its NAD, as Multus does"
        );
        assert!(n.source.ends_with("(document 1)"), "{}", n.source);
        assert_eq!(got.other_kinds, ["Pod trainer"]);
        assert_eq!(got.without_config, ["default/elsewhere"]);
    }

    #[test]
    fn json_configs_lists_and_nonsense() {
        let got = read(r#"{"cniVersion": "1.0.0", "name": "a", "type": "tether-ipvlan"}"#).unwrap();
        assert_eq!(got.networks[0].nad, None);
        let list = read(
            r#"{"apiVersion": "v1", "kind": "List", "items": [
                 {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                  "metadata": {"name": "x"}, "spec": {"config": "{\"type\": \"tether-ipvlan\"}"}}]}"#,
        )
        .unwrap();
        assert_eq!(list.networks[0].nad.as_deref(), Some("default/x"));
        assert!(
            read(r#"{"name": "a"}"#)
                .unwrap_err()
                .contains("neither a network config")
        );
        assert!(read("{ not json").unwrap_err().contains("is not JSON"));
        let bad_inner = read(
            "kind: NetworkAttachmentDefinition\napiVersion: k8s.cni.cncf.io/v1\nmetadata: {name: bad}\nspec: {config: '{'}\n",
        )
        .unwrap_err();
        assert!(
            bad_inner.contains("spec.config of NAD default/bad"),
            "{bad_inner}"
        );
    }
}
