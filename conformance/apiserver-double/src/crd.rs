//! The IPLease CRD as the API server shows it: `Established`, or 404 when "not installed".

use std::sync::atomic::Ordering;

use serde_json::json;

use crate::response::{Resp, json_resp, status};
use crate::shared::Shared;
use crate::{CRD_NAME, GROUP, KIND, PLURAL, VERSION};

pub(crate) fn crd(sh: &Shared, name: &str) -> Resp {
    if name != CRD_NAME || !sh.crd_installed.load(Ordering::Relaxed) {
        return status(
            404,
            "NotFound",
            &format!("customresourcedefinitions.apiextensions.k8s.io \"{name}\" not found"),
            json!({"name": name, "group": "apiextensions.k8s.io", "kind": "customresourcedefinitions"}),
        );
    }
    json_resp(
        200,
        &json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": CRD_NAME, "uid": "00000000-0000-4000-8000-000000000001",
                         "resourceVersion": "1", "generation": 1},
            "spec": {
                "group": GROUP,
                "names": {"kind": KIND, "listKind": "IPLeaseList", "plural": PLURAL, "singular": "iplease"},
                "scope": "Cluster",
                "versions": [{"name": VERSION, "served": true, "storage": true}]
            },
            "status": {
                "acceptedNames": {"kind": KIND, "listKind": "IPLeaseList", "plural": PLURAL, "singular": "iplease"},
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                     "message": "no conflicts found", "lastTransitionTime": "2024-01-01T00:00:00Z"},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                     "message": "the initial names have been accepted", "lastTransitionTime": "2024-01-01T00:00:00Z"}
                ],
                "storedVersions": [VERSION]
            }
        }),
    )
}
