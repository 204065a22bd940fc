#!/usr/bin/env python3
"""Install what the Multus lab needs into a fresh API server, in one process and one connection
(under qemu TCG every curl exec costs seconds): the NetworkAttachmentDefinition and IPLease CRDs
(waits until both are Established and list), ServiceAccounts kube-system/multus and
kube-system/tether with their ClusterRoles and bindings, tether's node-scope policy
(deploy/base/policy.yaml), the Node object of the lab node with a node-agent pod on it, and a
TokenRequest token for each account: tether's bound to that pod, as the node-agent writes it, so
the API server holds it to the lab node.

    setup-api.py URL CA_FILE ADMIN_TOKEN NAD_CRD IPLEASE_CRD TETHER_RBAC TETHER_POLICY NODE > tokens.json

Prints {"multus": TOKEN, "tether": TOKEN, "tether-peer": TOKEN} (tether-peer: bound to
node gpu-node-2's agent pod). Called by up.sh inside the node's netns.
"""
import http.client
import json
import ssl
import sys
import time
import urllib.parse

URL, CA, TOKEN, NAD_CRD, IPLEASE_CRD, TETHER_RBAC, TETHER_POLICY, NODE = sys.argv[1:9]
u = urllib.parse.urlparse(URL)
ctx = ssl.create_default_context(cafile=CA)
conn = http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=120)


def call(method, path, body=None, ctype="application/json"):
    global conn
    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = ctype
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
    for attempt in range(5):
        try:
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            return r.status, (json.loads(data) if data else None)
        except (http.client.HTTPException, OSError):
            if attempt == 4:
                raise
            conn.close()
            conn = http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=120)
            time.sleep(1)


def create(path, body, ctype="application/json"):
    status, out = call("POST", path, body, ctype)
    if status not in (200, 201, 409):
        sys.exit(f"setup-api: POST {path}: HTTP {status}: {out}")


def yaml_docs(path):
    """The documents of a multi-document YAML file (split on '---' lines), those with a kind."""
    docs, cur = [], []
    for line in open(path).read().splitlines():
        if line.strip() == "---":
            docs.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    docs.append("\n".join(cur))
    return [d for d in docs if any(line.startswith("kind:") for line in d.splitlines())]


def kind(doc):
    return next(line.split(":", 1)[1].strip() for line in doc.splitlines() if line.startswith("kind:"))


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
for f in (NAD_CRD, IPLEASE_CRD):
    for d in yaml_docs(f):
        create(CRDS, d, "application/yaml")
deadline = time.time() + 300
for name, lst in (
    ("network-attachment-definitions.k8s.cni.cncf.io", "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions"),
    ("ipleases.ipam.tether.dev", "/apis/ipam.tether.dev/v1alpha1/ipleases"),
):
    while True:
        status, crd = call("GET", f"{CRDS}/{name}")
        # A CRD just created may show "status": {"conditions": null}: not established yet.
        conds = ((crd or {}).get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
            # Established comes a moment before the resource lists.
            if call("GET", f"{lst}?limit=1")[0] == 200:
                break
        if time.time() > deadline:
            sys.exit(f"setup-api: CRD {name} not established/listable: {crd}")
        time.sleep(0.5)

create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})
for sa in ("multus", "tether"):
    create(
        "/api/v1/namespaces/kube-system/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": "kube-system"}},
    )
RBAC = "/apis/rbac.authorization.k8s.io/v1"
# Upstream Multus' ClusterRole (deployments/multus-daemonset-thick.yml, v4.3.0).
create(f"{RBAC}/clusterroles", {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "multus"},
    "rules": [
        {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["*"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": ["get", "list", "update", "watch"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
    ],
})
create(f"{RBAC}/clusterrolebindings", {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "multus"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "multus"},
    "subjects": [{"kind": "ServiceAccount", "name": "multus", "namespace": "kube-system"}],
})
# tether's, exactly as shipped (deploy/base/rbac.yaml).
# The namespaced ones (the plugin-token Role) go where kustomize puts them: kube-system.
RBAC_PATHS = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
              "Role": "namespaces/kube-system/roles", "RoleBinding": "namespaces/kube-system/rolebindings"}
for d in yaml_docs(TETHER_RBAC):
    k = kind(d)
    if k not in RBAC_PATHS:
        sys.exit(f"setup-api: {TETHER_RBAC}: no path for kind {k}")
    create(f"{RBAC}/{RBAC_PATHS[k]}", d, "application/yaml")

# tether's node-scope policy, exactly as shipped.
ADM = "/apis/admissionregistration.k8s.io/v1"
for d in yaml_docs(TETHER_POLICY):
    k = kind(d)
    create(f"{ADM}/{'validatingadmissionpolicies' if k == 'ValidatingAdmissionPolicy' else 'validatingadmissionpolicybindings'}",
           d, "application/yaml")
# The lab node and, for tests that play a second node on the same segment, PEER_NODE; a node-agent
# pod on each. tether's tokens are bound to those pods, so the API server holds each to its node.
PEER_NODE = "gpu-node-2"


def agent_pod(node):
    create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"tether-{node}", "namespace": "kube-system",
                        "labels": {"app.kubernetes.io/name": "tether"}},
           "spec": {"nodeName": node, "serviceAccountName": "tether",
                    "containers": [{"name": "agent", "image": "tether"}]}}
    create("/api/v1/namespaces/kube-system/pods", pod)
    status, pod = call("GET", f"/api/v1/namespaces/kube-system/pods/tether-{node}")
    if status != 200:
        sys.exit(f"setup-api: GET of the node-agent pod on {node}: HTTP {status}: {pod}")
    return {"kind": "Pod", "apiVersion": "v1", "name": f"tether-{node}", "uid": pod["metadata"]["uid"]}


def token(sa, bound=None):
    spec = {"expirationSeconds": 86400}
    if bound:
        spec["boundObjectRef"] = bound
    status, out = call(
        "POST",
        f"/api/v1/namespaces/kube-system/serviceaccounts/{sa}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    if status != 201:
        sys.exit(f"setup-api: TokenRequest for kube-system/{sa}: HTTP {status}: {out}")
    return out["status"]["token"]


tokens = {
    "multus": token("multus"),
    "tether": token("tether", agent_pod(NODE)),
    "tether-peer": token("tether", agent_pod(PEER_NODE)),
}
print(json.dumps(tokens))
