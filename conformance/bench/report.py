#!/usr/bin/env python3
"""Write BENCHMARKS.md and benchmarks.png from one `make bench` run.

Inputs (made by `make bench` in target/bench/): each benchmark's stdout as <name>.txt, and the
latency samples the Rust benchmarks keep in samples/<bench>__<label>.txt (one ms value a line).
Every ratio in the report was measured in the same run as the reference it compares against.
"""
import datetime
import pathlib
import platform
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "target" / "bench"
OUT_MD = ROOT / "BENCHMARKS.md"
OUT_PNG = ROOT / "docs" / "benchmarks.png"

SECTIONS = [
    ("attach", "Attach: tether-ipvlan + tether-ipam vs reference ipvlan + host-local (lab VM, real ipvlan)",
     "ADD/DEL cycles of each (BENCH_CYCLES, default 50; the count is in the header below), interleaved, in one boot of the lab VM (Debian 6.1 kernel under qemu without KVM: "
     "absolute times are inflated by emulation; the ratio is the comparison)."),
    ("ipam", "Node-local IPAM: tether-ipam (file store) vs host-local",
     "256 ADDs then 256 DELs at concurrency 1 and 32, fresh store per round, best of 3 rounds; probing off so the "
     "store is what is measured."),
    ("kube", "Cluster IPAM: tether-ipam's Kubernetes store on the API double",
     "N=300 allocations at concurrency 1, 8 and 32 against the in-repo API double (not a real API server), with 0 and "
     "2 ms injected latency per request; `fresh` builds a new client per allocation like one CNI process per call. "
     "whereabouts' figure for comparison (landscape notes, real kube-apiserver v1.36, 32 callers): 12.8 allocations/s, p99 17 s."),
    ("probe", "Conflict probing: added latency per ADD",
     "Sequential ADDs on a veth segment (this machine's kernel), probing off vs on with several budgets."),
]


def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "(not available)"


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in sh("lscpu").splitlines() if l.startswith("Model name")), "?")
    mem = next((l.split()[1] for l in pathlib.Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal")), "0")
    ref = sh("dpkg-query", "-W", "-f=${Version}", "containernetworking-plugins")
    return [
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- CPU: {cpu}, {sh('nproc')} cores; memory {int(mem) // 1024 // 1024} GiB",
        f"- kernel: {platform.release()} (host); lab VM: Debian {sh('sh', '-c', 'cat /var/cache/tether-lab/current 2>/dev/null') or '6.1'}",
        f"- {sh('rustc', '--version')}; tether {sh('git', '-C', str(ROOT), 'describe', '--always', '--dirty')}",
        f"- reference plugins: Debian containernetworking-plugins {ref or '?'}",
        f"- load average when the report was written: {' '.join(pathlib.Path('/proc/loadavg').read_text().split()[:3])}",
    ]


def chart():
    samples = sorted((RUN / "samples").glob("*.txt"))
    if not samples:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {}
    for f in samples:
        bench, label = f.stem.split("__", 1)
        vals = [float(x) for x in f.read_text().split()]
        if vals:
            groups.setdefault(bench, []).append((label.replace("_", " "), vals))
    fig, axes = plt.subplots(len(groups), 1, figsize=(11, 3.2 * len(groups)), squeeze=False)
    for ax, (bench, series) in zip(axes[:, 0], sorted(groups.items())):
        ax.boxplot([v for _, v in series], orientation="horizontal", showfliers=True, whis=(1, 99))
        ax.set_yticks(range(1, len(series) + 1), [l for l, _ in series], fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("latency per call, ms (log scale; whiskers p1–p99)")
        ax.set_title(f"{bench}: latency distribution per call")
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    OUT_PNG.parent.mkdir(exist_ok=True)
    fig.savefig(OUT_PNG, dpi=110)
    return True


def main():
    lines = ["# Benchmarks", "", "Written by `make bench`; do not edit by hand. Every ratio compares against a reference "
             "measured in the same run, on the machine below.", "", "## Machine", ""] + machine()
    for name, title, how in SECTIONS:
        f = RUN / f"{name}.txt"
        lines += ["", f"## {title}", "", how, ""]
        if f.exists() and f.read_text().strip():
            lines += ["```text", f.read_text().rstrip(), "```"]
        else:
            lines += ["(not run in this report)"]
    if chart():
        lines += ["", "## Latency distributions", "", "![latency distributions](docs/benchmarks.png)"]
    OUT_MD.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT_MD.relative_to(ROOT)}" + (f" and {OUT_PNG.relative_to(ROOT)}" if OUT_PNG.exists() else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
