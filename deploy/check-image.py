#!/usr/bin/env python3
"""Check an image archive of tether: one layer (FROM scratch, no base image) holding exactly the
two plugins and the operator binary `tether`, static, under /usr/local/bin, with tether as the
entrypoint.

    deploy/check-image.py target/tether-image.tar
    deploy/check-image.py --arch amd64 --arch arm64 target/release-artifacts/tether-0.2.0-image.oci.tar

Reads docker-archive (make image) and OCI archives (make release), single images or one multi-arch
index; each image's binaries must be of the architecture its config names.
"""
import argparse
import json
import sys
import tarfile

# ELF e_machine of each image architecture: an arm64 image must hold arm64 binaries.
ELF_MACHINE = {"amd64": 62, "arm64": 183}
WANT = {"usr/local/bin/tether-ipam", "usr/local/bin/tether-ipvlan", "usr/local/bin/tether"}


def is_static(elf):
    """ELF64 little-endian, ET_EXEC, and no PT_INTERP (3) or PT_DYNAMIC (2) program header."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1 or int.from_bytes(elf[16:18], "little") != 2:
        return False
    phoff = int.from_bytes(elf[32:40], "little")
    phentsize = int.from_bytes(elf[54:56], "little")
    phnum = int.from_bytes(elf[56:58], "little")
    types = [int.from_bytes(elf[phoff + i * phentsize:phoff + i * phentsize + 4], "little") for i in range(phnum)]
    return 2 not in types and 3 not in types


def check_image(path, what, config, layer_blobs):
    """One image: one layer holding exactly WANT, static and executable; tether the entrypoint."""
    if len(layer_blobs) != 1:
        return f"{path}: {what}: {len(layer_blobs)} layers; FROM scratch with one COPY makes one"
    with tarfile.open(fileobj=layer_blobs[0]) as layer:
        files = {m.name.lstrip("./"): m for m in layer.getmembers() if m.isfile()}
        if set(files) != WANT:
            return f"{path}: {what}: the layer holds {sorted(files)}, expected {sorted(WANT)}"
        for name in sorted(WANT):
            elf = layer.extractfile(files[name]).read()
            if not is_static(elf):
                return f"{path}: {what}: {name} is not a static ELF executable (ET_EXEC, no PT_INTERP, no PT_DYNAMIC)"
            if not files[name].mode & 0o111:
                return f"{path}: {what}: {name} is not executable"
            machine = int.from_bytes(elf[18:20], "little")
            if ELF_MACHINE.get(config.get("architecture")) != machine:
                return f"{path}: {what}: {name} is ELF machine {machine}, the image says {config.get('architecture')}"
    entry = config.get("config", {}).get("Entrypoint")
    if entry != ["/usr/local/bin/tether"]:
        return f"{path}: {what}: entrypoint {entry}, expected /usr/local/bin/tether"
    return None


def docker_archive(path, archive):
    manifest = json.load(archive.extractfile("manifest.json"))[0]
    config = json.load(archive.extractfile(manifest["Config"]))
    layers = [archive.extractfile(name) for name in manifest["Layers"]]
    error = check_image(path, config.get("architecture"), config, layers)
    return error, {config.get("architecture")}, manifest.get("RepoTags") or []


def oci_archive(path, archive):
    """An OCI image layout: index.json names one image, or one index of images (one per arch)."""

    def blob(descriptor):
        algorithm, digest = descriptor["digest"].split(":", 1)
        return archive.extractfile(f"blobs/{algorithm}/{digest}")

    top = json.load(archive.extractfile("index.json"))["manifests"]
    if len(top) != 1:
        return f"{path}: index.json lists {len(top)} entries, expected one", set(), []
    names = [top[0].get("annotations", {}).get("org.opencontainers.image.ref.name", "(no name)")]
    entries = [top[0]]
    if top[0]["mediaType"] == "application/vnd.oci.image.index.v1+json":
        entries = json.load(blob(top[0]))["manifests"]
    arches = set()
    for entry in entries:
        manifest = json.load(blob(entry))
        config = json.load(blob(manifest["config"]))
        arch = config.get("architecture")
        platform = entry.get("platform")
        if platform and (platform.get("architecture"), platform.get("os")) != (arch, config.get("os")):
            return f"{path}: the index says {platform}, the image's config {arch}/{config.get('os')}", arches, names
        if arch in arches:
            return f"{path}: two images for {arch}", arches, names
        arches.add(arch)
        error = check_image(path, arch, config, [blob(layer) for layer in manifest["layers"]])
        if error:
            return error, arches, names
    return None, arches, names


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", help="the architectures the archive must hold (default amd64)")
    parser.add_argument("archive")
    args = parser.parse_args(argv)
    want_arches = set(args.arch or ["amd64"])
    with tarfile.open(args.archive) as archive:
        members = set(archive.getnames())
        check = oci_archive if "index.json" in members else docker_archive
        error, arches, names = check(args.archive, archive)
    if error:
        return error
    if arches != want_arches:
        return f"{args.archive}: images for {sorted(arches)}, expected {sorted(want_arches)}"
    print(
        f"image: {args.archive}: {', '.join(sorted(arches))}: one layer each, {', '.join(sorted(WANT))} "
        f"(static), entrypoint tether; named {', '.join(names)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
