#!/usr/bin/env python3
"""(Copied from ../shared/peers/kubelet-lab/lib/mkimage.py for conformance/e2e/images.sh.)

Write a single-layer OCI image archive (FROM scratch), offline, for `ctr images import`.

usage: mkimage.py OUT.tar NAME ROOTFS_DIR --entrypoint JSON [--cmd JSON] [--user U] [--env K=V ...]

The layer is ROOTFS_DIR as an uncompressed tar (owner root, mtime 0, sorted: reproducible).
The archive's index.json names the image through the annotation io.containerd.image.name.
"""
import argparse, hashlib, io, json, os, tarfile

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("name")
ap.add_argument("rootfs")
ap.add_argument("--entrypoint", default="null")
ap.add_argument("--cmd", default="null")
ap.add_argument("--user", default="")
ap.add_argument("--env", action="append", default=[])
a = ap.parse_args()


def layer_tar(root):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        paths = []
        for d, dirs, files in os.walk(root):
            dirs.sort()
            for n in sorted(dirs + files):
                paths.append(os.path.join(d, n))
        for p in sorted(paths):
            rel = os.path.relpath(p, root)
            ti = t.gettarinfo(p, arcname=rel)
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = "root"
            ti.mtime = 0
            if ti.isreg():
                with open(p, "rb") as f:
                    t.addfile(ti, f)
            else:
                t.addfile(ti)
    return buf.getvalue()


def blob(data):
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


layer_digest, layer = blob(layer_tar(a.rootfs))
cfg = {
    "architecture": "amd64",
    "os": "linux",
    "created": "1970-01-01T00:00:00Z",
    "config": {
        "Entrypoint": json.loads(a.entrypoint),
        "Cmd": json.loads(a.cmd),
        "Env": a.env or ["PATH=/bin:/sbin:/usr/bin:/usr/sbin"],
        "WorkingDir": "/",
    },
    "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "kubelet-lab mkimage.py"}],
}
if a.user:
    cfg["config"]["User"] = a.user
cfg_digest, cfg_b = blob(json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode())
manifest = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfg_digest, "size": len(cfg_b)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": len(layer)}],
}
man_digest, man_b = blob(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
index = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": man_digest, "size": len(man_b),
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"io.containerd.image.name": a.name,
                        "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1]},
    }],
}

with tarfile.open(a.out, "w") as out:
    def add(name, data):
        ti = tarfile.TarInfo(name)
        ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
        out.addfile(ti, io.BytesIO(data))
    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    for d, b in ((layer_digest, layer), (cfg_digest, cfg_b), (man_digest, man_b)):
        add("blobs/sha256/" + d.split(":")[1], b)
    add("index.json", json.dumps(index, sort_keys=True).encode())
print(f"{a.out}: {a.name} manifest {man_digest} layer {len(layer)} bytes")
