//! Who is asking and for which addresses: pod identity and requested IPs from the three places a
//! runtime can put them.

use serde_json::Value;
use tether_cni::{CniError, Request};
use tether_leases::PodRef;
use tether_pool::RequestedIp;

/// The pod behind the attachment, from Multus/kubelet's CNI_ARGS.
pub fn pod_ref(req: &Request) -> PodRef {
    let get = |k: &str| {
        req.env
            .args
            .get(k)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    PodRef {
        namespace: get("K8S_POD_NAMESPACE"),
        name: get("K8S_POD_NAME"),
        uid: get("K8S_POD_UID"),
    }
}

/// Requested addresses, by precedence: `runtimeConfig.ips` (capability `ips`), then `args.cni.ips`, then
/// CNI_ARGS `IP=` (a comma list, as Multus sends it). The deprecated CNI_ARGS form is ignored when either
/// JSON form is present, as the CNI conventions ask.
pub fn requested_ips(req: &Request) -> Result<Vec<RequestedIp>, CniError> {
    if let Some(v) = req.conf.runtime_config("ips") {
        return parse_list("runtimeConfig.ips", v);
    }
    if let Some(v) = req.conf.args_cni("ips") {
        return parse_list("args.cni.ips", v);
    }
    match req.env.args.get("IP").filter(|s| !s.trim().is_empty()) {
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| parse_one("CNI_ARGS IP", s))
            .collect(),
        None => Ok(Vec::new()),
    }
}

fn parse_list(source: &str, v: &Value) -> Result<Vec<RequestedIp>, CniError> {
    let Value::Array(items) = v else {
        return Err(CniError::invalid_config(format!(
            "{source} must be a list of addresses, got {v}"
        )));
    };
    items
        .iter()
        .map(|i| match i.as_str() {
            Some(s) => parse_one(source, s),
            None => Err(CniError::invalid_config(format!(
                "{source}: {i} is not an address string"
            ))),
        })
        .collect()
}

fn parse_one(source: &str, s: &str) -> Result<RequestedIp, CniError> {
    RequestedIp::parse(s).map_err(|e| CniError::invalid_config(format!("{source}: {e}")))
}
