#!/usr/bin/env python3
"""Validate every manifest under deploy/ so a broken one fails `make test`.

- Kubernetes kinds: kubernetes-validate --strict (bundled OpenAPI schemas, offline).
- NetworkAttachmentDefinitions (no upstream schema): shape checked here, and spec.config handed to
  `tether validate --strict`, the plugin's own parser, so an example NAD can never drift from
  what the plugin accepts, nor share a range across nodes through node-local file stores. The
  README's NADs get the same check. Then all the NAD objects in one `tether validate --strict`:
  no two examples overlap across uniqueness domains on one master or disagree about a subnet.
- kustomization.yaml: every listed resource exists.
- deploy/tether.yaml (the one-file install, for RKE2's auto-deploy directory) is exactly a fresh
  `kubectl kustomize deploy/base` under its header: `deploy/validate.py --render` rewrites it
  (`make render`).
- Against the real API server (TETHER_TEST_KUBECONFIG, exported by conformance/kube/with-server.sh
  in `make test` / `make manifests`): the CRDs the manifests need are installed for real (the
  IPLease CRD from deploy/crds/, Multus' NAD CRD from ../shared/peers), then every manifest file and
  the kustomize base are applied with `kubectl apply --dry-run=server`: admission, defaulting and
  the server's own validation (CRD schemas and CEL rules too), nothing persisted. Without a server
  that part is NOT RUN (a banner; a failure when TETHER_REQUIRE_KUBE=1, as in CI).
"""
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "base"
RENDERED = DEPLOY / "tether.yaml"
TETHER = ROOT / "target" / "debug" / "tether"
# The kubectl built with the other peers (.ci/deps.sh), of the same version as the API server.
KUBECTL = os.environ.get(
    "KUBECTL", os.path.join(os.environ.get("PEERS_BIN_DIR", "/var/cache/tether-peers/bin"), "kubectl")
)
PEERS = pathlib.Path(os.environ.get("TETHER_PEERS", ROOT.parent / "shared" / "peers"))
NAD_CRD = PEERS / "nad-crd.yaml"
# The Prometheus Operator's CRDs for deploy/monitoring (conformance/peers/build.sh copies them from
# its published module beside the peers' bin directory).
MONITORING_CRDS = pathlib.Path(os.environ.get("PEERS_BIN_DIR", "/var/cache/tether-peers/bin")).parent / "crds"
IPLEASE_CRD = DEPLOY / "crds" / "ipleases.yaml"
K8S_VERSION = "1.32.0"
RENDERED_HEADER = """\
# tether: everything in one file (CRD, ServiceAccount, RBAC, node-agent DaemonSet in kube-system).
# GENERATED from deploy/base by `make render` (kubectl kustomize); do not edit: `make test` fails
# when this file differs from a fresh render. Install it with `kubectl apply -f deploy/tether.yaml`,
# or on RKE2 copy it to /var/lib/rancher/rke2/server/manifests/tether.yaml on a server node.
# Comments are not rendered: why the DaemonSet has the privileges it has is in deploy/base/daemonset.yaml.
"""
errors = []


def fail(path, msg):
    errors.append(f"{path.relative_to(ROOT)}: {msg}")


def ipam_validate(path, conf, what):
    """The plugin's own parser, --strict: a warning (file store shared across nodes) fails too."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(conf, f)
        f.flush()
        r = subprocess.run([str(TETHER), "validate", "--strict", "--config", f.name], capture_output=True, text=True)
    if r.returncode != 0:
        fail(path, f"tether validate --strict rejects {what}: {r.stderr.strip() or r.stdout.strip()}")


def check_nads_together(nads):
    """Every NAD object at once: `tether validate` compares their ranges with each other."""
    with tempfile.TemporaryDirectory() as d:
        args = [str(TETHER), "validate", "--strict"]
        for i, (_, doc) in enumerate(nads):
            f = pathlib.Path(d) / f"nad-{i}.json"
            f.write_text(json.dumps(doc))
            args += ["--config", str(f)]
        r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        names = ", ".join(f"{p.relative_to(ROOT)} ({doc['metadata'].get('name')})" for p, doc in nads)
        errors.append(f"tether validate --strict rejects the NADs together [{names}]: "
                      f"{r.stderr.strip() or r.stdout.strip()}")


def check_nad(path, doc):
    spec = doc.get("spec") or {}
    if not doc.get("metadata", {}).get("name"):
        fail(path, "NetworkAttachmentDefinition without metadata.name")
    try:
        conf = json.loads(spec.get("config", ""))
    except json.JSONDecodeError as e:
        return fail(path, f"spec.config is not JSON: {e}")
    if conf.get("type") != "tether-ipvlan":
        fail(path, f'spec.config type is {conf.get("type")!r}, expected "tether-ipvlan"')
    if conf.get("mode", "l2") not in ("l2", "l3", "l3s"):
        fail(path, f'mode {conf.get("mode")!r} is not l2, l3 or l3s')
    if conf.get("ipam", {}).get("type") != "tether-ipam":
        fail(path, "ipam.type is not tether-ipam")
    # Multus injects the NAD's name; do the same before asking the plugin.
    conf.setdefault("name", doc["metadata"]["name"])
    ipam_validate(path, conf, "spec.config")


def check_readme():
    """Every tether-ipvlan config in the README and the install page is one the plugin accepts,
    with the cluster store."""
    nads = 0
    for page in (ROOT / "README.md", ROOT / "docs" / "install.md"):
        blocks = re.findall(r"```json\n(.*?)```", page.read_text(), re.S)
        for i, block in enumerate(blocks):
            try:
                conf = json.loads(block)
            except json.JSONDecodeError as e:
                fail(page, f"json block {i + 1} is not JSON: {e}")
                continue
            if conf.get("type") == "tether-ipvlan":
                nads += 1
                conf.setdefault("name", "readme")
                ipam_validate(page, conf, f"the NAD in json block {i + 1}")
    if nads == 0:
        fail(ROOT / "docs" / "install.md", "no tether-ipvlan NAD in a ```json block")


def kustomize():
    r = subprocess.run([KUBECTL, "kustomize", str(BASE)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"kubectl kustomize {BASE.relative_to(ROOT)} failed:\n{r.stderr}")
    return RENDERED_HEADER + r.stdout


def check_rendered():
    fresh = kustomize()
    if not RENDERED.exists() or RENDERED.read_text() != fresh:
        fail(RENDERED, "differs from a fresh `kubectl kustomize deploy/base`: run `make render` and commit it")


def kubectl(kc, *args):
    return subprocess.run([KUBECTL, "--kubeconfig", kc, *args], capture_output=True, text=True)


def dry_run_server(manifests):
    """kubectl apply --dry-run=server for every manifest, CRDs installed first. Returns a count."""
    kc = os.environ.get("TETHER_TEST_KUBECONFIG")
    if not kc:
        banner = ("NOT RUN: server-side dry-run of deploy/ (no TETHER_TEST_KUBECONFIG: run through "
                  "conformance/kube/with-server.sh, as `make manifests` does)")
        print("#" * 90 + "\n##  " + banner + "\n" + "#" * 90, file=sys.stderr)
        if os.environ.get("TETHER_REQUIRE_KUBE") == "1":
            errors.append("TETHER_REQUIRE_KUBE=1 and no API server for the server-side dry-run")
        return 0
    if not NAD_CRD.is_file():
        errors.append(f"{NAD_CRD}: Multus' NAD CRD is missing; the example NADs cannot be dry-run")
        return 0
    # The CRDs for real (idempotent): a dry-run of a NAD or of tether.yaml's CRD needs them served.
    crds = [(IPLEASE_CRD, "ipleases.ipam.tether.dev"), (NAD_CRD, "network-attachment-definitions.k8s.cni.cncf.io")]
    for plural in ("podmonitors", "prometheusrules"):
        crds.append((MONITORING_CRDS / f"monitoring.coreos.com_{plural}.yaml", f"{plural}.monitoring.coreos.com"))
    for crd, _ in crds:
        if not crd.is_file():
            errors.append(f"{crd} is missing: run .ci/deps.sh (make peers), which copies it from its published module")
            return 0
    for crd, name in crds:
        r = kubectl(kc, "apply", "-f", str(crd))
        if r.returncode == 0:
            r = kubectl(kc, "wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")
        if r.returncode != 0:
            errors.append(f"installing {crd}: {(r.stderr or r.stdout).strip()}")
            return 0
    count = 0
    for path in manifests:
        r = kubectl(kc, "apply", "--dry-run=server", "-f", str(path))
        count += 1
        if r.returncode != 0:
            fail(path, f"kubectl apply --dry-run=server:\n    {(r.stderr or r.stdout).strip()}")
    r = kubectl(kc, "apply", "--dry-run=server", "-k", str(BASE))
    count += 1
    if r.returncode != 0:
        fail(BASE, f"kubectl apply --dry-run=server -k:\n    {(r.stderr or r.stdout).strip()}")
    apply_monitoring_as_documented(kc)
    return count


def apply_monitoring_as_documented(kc):
    """docs/monitoring.md's command that installs deploy/monitoring, run as written (for real, then
    removed): both objects are there afterwards."""
    block = subprocess.run(
        [sys.executable, *"conformance/docs/blocks.py extract docs/monitoring.md apply-monitoring".split()],
        cwd=ROOT, capture_output=True, text=True)
    if block.returncode != 0:
        errors.append(f"docs/monitoring.md apply-monitoring: {block.stderr.strip()}")
        return
    env = dict(os.environ, KUBECONFIG=kc, PATH=f"{pathlib.Path(KUBECTL).parent}:{os.environ.get('PATH', '')}")
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", block.stdout], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        errors.append(f"docs/monitoring.md apply-monitoring failed as written:\n    {(r.stderr or r.stdout).strip()}")
    for kind in ("podmonitor", "prometheusrule"):
        got = kubectl(kc, "-n", "kube-system", "get", kind, "tether", "-o", "name")
        if got.returncode != 0:
            errors.append(f"docs/monitoring.md apply-monitoring: no {kind} tether afterwards: {got.stderr.strip()}")
        kubectl(kc, "-n", "kube-system", "delete", kind, "tether", "--ignore-not-found")


def main():
    if sys.argv[1:] == ["--render"]:
        RENDERED.write_text(kustomize())
        print(f"wrote {RENDERED.relative_to(ROOT)}")
        return 0
    k8s_files, manifests, nads = [], [], []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        if not docs:
            fail(path, "no YAML documents")
        if not any(d.get("kind") == "Kustomization" for d in docs):
            manifests.append(path)
        for doc in docs:
            kind = doc.get("kind")
            if kind == "NetworkAttachmentDefinition":
                check_nad(path, doc)
                nads.append((path, doc))
            elif kind == "Kustomization":
                for res in doc.get("resources", []):
                    if not (path.parent / res).exists():
                        fail(path, f"resource {res} does not exist")
            elif path not in k8s_files:
                k8s_files.append(path)
    if len(nads) > 1:
        check_nads_together(nads)
    check_readme()
    check_rendered()
    r = subprocess.run(
        ["kubernetes-validate", "--strict", "--quiet", "-k", K8S_VERSION, *map(str, k8s_files)],
        capture_output=True, text=True,
    )
    if r.returncode != 0:
        errors.append("kubernetes-validate:\n" + (r.stdout + r.stderr).strip())
    dry = dry_run_server(manifests)
    checked = len(list(DEPLOY.rglob("*.yaml")))
    if errors:
        print("manifest validation FAILED:\n  " + "\n  ".join(errors))
        return 1
    server = f"; {dry} server-side dry-runs passed" if dry else "; server-side dry-run NOT RUN"
    print(f"manifests: {checked} files valid ({len(k8s_files)} against Kubernetes {K8S_VERSION} schemas; "
          f"{RENDERED.relative_to(ROOT)} == fresh render{server})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
