#!/usr/bin/env python3
"""Validate every manifest under deploy/ so a broken one fails `make test`.

- Kubernetes kinds: kubernetes-validate --strict (bundled OpenAPI schemas, offline).
- NetworkAttachmentDefinitions (no upstream schema): shape checked here, and spec.config handed to
  `tether-ipam validate`, the plugin's own parser, so an example NAD can never drift from what the
  plugin accepts.
- kustomization.yaml: every listed resource exists.
"""
import json
import pathlib
import subprocess
import sys
import tempfile

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
IPAM = ROOT / "target" / "debug" / "tether-ipam"
K8S_VERSION = "1.32.0"
errors = []


def fail(path, msg):
    errors.append(f"{path.relative_to(ROOT)}: {msg}")


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
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(conf, f)
        f.flush()
        r = subprocess.run([str(IPAM), "validate", "--config", f.name], capture_output=True, text=True)
    if r.returncode != 0:
        fail(path, f"tether-ipam rejects spec.config: {r.stderr.strip() or r.stdout.strip()}")


def main():
    k8s_files = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        if not docs:
            fail(path, "no YAML documents")
        for doc in docs:
            kind = doc.get("kind")
            if kind == "NetworkAttachmentDefinition":
                check_nad(path, doc)
            elif kind == "Kustomization":
                for res in doc.get("resources", []):
                    if not (path.parent / res).exists():
                        fail(path, f"resource {res} does not exist")
            elif path not in k8s_files:
                k8s_files.append(path)
    r = subprocess.run(
        ["kubernetes-validate", "--strict", "--quiet", "-k", K8S_VERSION, *map(str, k8s_files)],
        capture_output=True, text=True,
    )
    if r.returncode != 0:
        errors.append("kubernetes-validate:\n" + (r.stdout + r.stderr).strip())
    checked = len(list(DEPLOY.rglob("*.yaml")))
    if errors:
        print("manifest validation FAILED:\n  " + "\n  ".join(errors))
        return 1
    print(f"manifests: {checked} files valid ({len(k8s_files)} against Kubernetes {K8S_VERSION} schemas)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
