//! What a request path is about: the version, the CRD, a collection or one object of a kind, the
//! access reviews, or the `/_double/` control endpoints.

use crate::objects::Kind;
use crate::{GROUP, PLURAL, VERSION};

pub(crate) enum Target {
    Version,
    Crd(String),
    Collection(Kind, Option<String>),
    Item(Kind, Option<String>, String),
    Control(Vec<String>),
    AccessReview,
    Unknown,
}

/// The target of a (percent-decoded) request path.
pub(crate) fn route(path: &str) -> Target {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["_double", rest @ ..] => Target::Control(rest.iter().map(|s| s.to_string()).collect()),
        ["version"] => Target::Version,
        [
            "apis",
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            name,
        ] => Target::Crd(name.to_string()),
        ["apis", g, v, p] if *g == GROUP && *v == VERSION && *p == PLURAL => {
            Target::Collection(Kind::Lease, None)
        }
        ["apis", g, v, p, name] if *g == GROUP && *v == VERSION && *p == PLURAL => {
            Target::Item(Kind::Lease, None, name.to_string())
        }
        ["api", "v1", "pods"] => Target::Collection(Kind::Pod, None),
        ["api", "v1", "nodes"] => Target::Collection(Kind::Node, None),
        ["api", "v1", "nodes", name] => Target::Item(Kind::Node, None, name.to_string()),
        [
            "apis",
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
        ] => Target::AccessReview,
        ["api", "v1", "namespaces", ns, "pods"] => {
            Target::Collection(Kind::Pod, Some(ns.to_string()))
        }
        ["api", "v1", "namespaces", ns, "pods", name] => {
            Target::Item(Kind::Pod, Some(ns.to_string()), name.to_string())
        }
        _ => Target::Unknown,
    }
}
