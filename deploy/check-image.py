#!/usr/bin/env python3
"""Check the image `make image` saved (docker-archive): one layer (FROM scratch, no base image), holding
exactly the two plugins and the operator binary `tether`, static, under /usr/local/bin, with tether
as the entrypoint.

    deploy/check-image.py target/tether-image.tar
"""
import json
import sys
import tarfile

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


def main(path):
    with tarfile.open(path) as archive:
        manifest = json.load(archive.extractfile("manifest.json"))[0]
        config = json.load(archive.extractfile(manifest["Config"]))
        layers = manifest["Layers"]
        if len(layers) != 1:
            return f"{path}: {len(layers)} layers; FROM scratch with one COPY makes one"
        with tarfile.open(fileobj=archive.extractfile(layers[0])) as layer:
            files = {m.name.lstrip("./"): m for m in layer.getmembers() if m.isfile()}
            if set(files) != WANT:
                return f"{path}: the layer holds {sorted(files)}, expected {sorted(WANT)}"
            for name in sorted(WANT):
                elf = layer.extractfile(files[name]).read()
                if not is_static(elf):
                    return f"{path}: {name} is not a static ELF executable (ET_EXEC, no PT_INTERP, no PT_DYNAMIC)"
                if not files[name].mode & 0o111:
                    return f"{path}: {name} is not executable"
    entry = config.get("config", {}).get("Entrypoint")
    if entry != ["/usr/local/bin/tether"]:
        return f"{path}: entrypoint {entry}, expected /usr/local/bin/tether"
    tags = manifest.get("RepoTags") or []
    print(f"image: {path}: one layer, {', '.join(sorted(WANT))} (static), entrypoint tether; tags {', '.join(tags)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
