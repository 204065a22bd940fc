#!/usr/bin/env python3
"""The release's SBOMs: one CycloneDX 1.5 JSON per architecture, of the crates the three shipped
binaries (tether-ipvlan, tether-ipam, tether) are built from, made by cargo-cyclonedx.

    deploy/sbom.py OUTDIR      # OUTDIR/tether-<v>-linux-{amd64,arm64}.cdx.json

cargo-cyclonedx writes one file per binary into each package's directory; to leave the checkout
untouched it runs on a copy of the tracked files (in tether-<v>/ of a temporary directory, whose
path is cut from the references: they read path+file:///tether-<v>/ipam#tether-ipam@<v>). The three
binaries' files are merged into one BOM per target (components and dependencies are unions; the
binaries are the subcomponents of the application). Then the check: every crate `cargo tree` says
a binary links for that target is listed, so a SBOM that misses a dependency fails the release.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
# package directory, package, binary
BINARIES = [("plugins", "tether-ipvlan", "tether-ipvlan"), ("ipam", "tether-ipam", "tether-ipam"),
            ("ipam/operator", "tether-operator", "tether")]
TARGETS = {"amd64": "x86_64-unknown-linux-musl", "arm64": "aarch64-unknown-linux-musl"}


def version():
    return re.search(r'^version = "(.*)"', (ROOT / "Cargo.toml").read_text(), re.M).group(1)


def copy_sources(dest):
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.split(b"\0")
    for f in filter(None, files):
        src = ROOT / os.fsdecode(f)
        if src.is_file():
            (dest / os.fsdecode(f)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(f))


def merge(boms, v, triple):
    first = boms[0]
    components, deps = {}, {}
    for bom in boms:
        for c in bom.get("components", []):
            components.setdefault(c["bom-ref"], c)
        for d in bom.get("dependencies", []):
            deps.setdefault(d["ref"], set()).update(d.get("dependsOn", []))
    apps = [b["metadata"]["component"] for b in boms]
    # (No serialNumber: cargo-cyclonedx leaves it out under SOURCE_DATE_EPOCH, so the same commit
    # makes the same file.)
    return {
        "bomFormat": "CycloneDX",
        "specVersion": first["specVersion"],
        "version": 1,
        "metadata": {
            "timestamp": first["metadata"]["timestamp"],
            "tools": first["metadata"]["tools"],
            "component": {"type": "application", "bom-ref": f"tether@{v}", "name": "tether", "version": v,
                          "licenses": [{"expression": "Apache-2.0"}], "components": apps},
            "properties": [{"name": "cdx:rustc:sbom:target:triple", "value": triple}],
        },
        "components": sorted(components.values(), key=lambda c: c["bom-ref"]),
        "dependencies": [{"ref": r, "dependsOn": sorted(d)} for r, d in sorted(deps.items())],
    }


def linked_crates(triple):
    """name@version of every crate the three binaries link for this target, as cargo tree sees it."""
    args = ["cargo", "tree", "--locked", "-e", "normal", "--target", triple, "--prefix", "depth", "--format", "{p}"]
    for _, package, _ in BINARIES:
        args += ["-p", package]
    out = subprocess.run(args, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    crates, macro_depth = set(), None
    for line in out.splitlines():
        m = re.match(r"(\d+)(\S+) v(\S+)", line)
        if not m:
            continue
        depth = int(m.group(1))
        if macro_depth is not None and depth > macro_depth:
            continue
        macro_depth = None
        # A proc-macro and what it uses run in the compiler; nothing of them is in a binary.
        if "(proc-macro)" in line:
            macro_depth = depth
            continue
        crates.add(f"{m.group(2)}@{m.group(3)}")
    return crates


def main(out_dir):
    v = version()
    out_dir = pathlib.Path(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / f"tether-{v}"
        copy_sources(src)
        for arch, triple in TARGETS.items():
            subprocess.run(["cargo", "cyclonedx", "--quiet", "--format", "json", "--spec-version", "1.5",
                            "--describe", "binaries", "--no-build-deps", "--target", triple],
                           cwd=src, check=True)
            boms = []
            for directory, _, binary in BINARIES:
                path = src / directory / f"{binary}_bin.cdx.json"
                text = path.read_text().replace(f"file://{tmp}/", "file:///")
                boms.append(json.loads(text))
                path.unlink()
            bom = merge(boms, v, triple)
            listed = {f"{c['name']}@{c['version']}" for c in bom["components"]}
            missing = linked_crates(triple) - listed - {f"{p}@{v}" for _, p, _ in BINARIES}
            if missing:
                sys.exit(f"sbom: {arch}: crates the binaries link are not in the SBOM: {', '.join(sorted(missing))}")
            path = out_dir / f"tether-{v}-linux-{arch}.cdx.json"
            path.write_text(json.dumps(bom, indent=2) + "\n")
            print(f"sbom: {path}: {len(bom['components'])} components ({triple})", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: deploy/sbom.py OUTDIR")
    main(sys.argv[1])
