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
     "ADD/DEL cycles of every row (BENCH_CYCLES, default 50; the count is in the header below), interleaved (the order "
     "rotates every cycle), in one boot of the lab VM (Debian 6.1 kernel under qemu without KVM: absolute times are "
     "inflated by emulation; the ratios are the comparison). The reference never probes the wire, so each family has "
     "two tether rows: **like for like** is tether-ipam with `\"probe\": false`; **default** is tether-ipam as shipped, "
     "probing every address it hands out (100 ms, one attempt), compared with the same reference that does not probe. "
     "IPv4: one range; dual: an IPv4 and an IPv6 range, where the reference and tether without probing wait out the "
     "kernel's IPv6 DAD and tether with probing adds the address it proved unused with `nodad`. \"attacher alone\" runs "
     "tether-ipvlan over host-local. The exec cost is one `CNI_COMMAND=VERSION` round trip of each binary. tether's "
     "binaries are the static musl builds that ship (`make build`)."),
    ("ipam", "Node-local IPAM: tether-ipam (file store) vs host-local",
     "256 ADDs then 256 DELs at concurrency 1 and 32, fresh store per round, best of 3 rounds; probing off so the "
     "store is what is measured."),
    ("kube", "Cluster IPAM: tether-ipam's Kubernetes store vs whereabouts on a real API server",
     "`make bench-kube` (`conformance/src/bin/bench-kube.rs`) starts a kube-apiserver v1.36 + etcd 3.4 of its own "
     "from `../shared/peers` (loopback only, no controllers; stopped at the end) on this machine, so the server shares "
     "its cores with the plugins. tether-ipam (the static build that ships; `\"store\": \"kubernetes\"`, probing off) "
     "and whereabouts v0.9.3 run "
     "against it in the same run, one process per CNI call as a runtime execs them (Multus' CNI_ARGS), both on "
     "10.128.0.0/16. Rows: N ADDs for distinct pods at concurrency 1, 8 and 32, then a DEL of each; each row starts "
     "from empty stores and the plugins' order alternates by row. API requests per call are the server's own "
     "`apiserver_request_total` counters (its requests to itself excluded) read around ADDs and DELs at concurrency 1, "
     "on each plugin's resources (tether: ipleases; whereabouts: ippools, overlappingrangeipreservations, leases). "
     "The scale rows repeat tether's ADDs after 20,000 IPLease objects were created through the API, half of them on "
     "addresses of the measured range. The targets are issue 11's; a MISS does not fail the run.", "markdown"),
    ("static", "Static (shipped) vs glibc builds of the plugins",
     "`make bench-static`: the static musl binaries that `make build` ships next to glibc release builds of the same "
     "code, interleaved in one run: the exec cost (`CNI_COMMAND=VERSION` round trips) and bench-ipam's file-store "
     "ADD/DEL with each build. The attach and cluster benchmarks above measure the static binaries."),
    ("probe", "Conflict probing: added latency per ADD",
     "Sequential ADDs on a veth segment (this machine's kernel), probing off vs on with several budgets."),
    ("agents", "Lease reconciler at scale and under faults: simulated nodes on a real API server",
     "`make bench-agents` (`conformance/src/bin/bench-agents.rs`, the scenario of `conformance/src/fleet/scenario.rs`) "
     "starts a kube-apiserver v1.36 + etcd of its own per cluster size (`conformance/kube/up.sh`, `deploy/base` "
     "applied, loopback only, no controllers; stopped at the end) on this machine, which also runs every simulated "
     "node. Each node is a Node object with a heartbeat Lease renewed every 10 s, a `tether node-agent` process "
     "(the static build that ships, the DaemonSet's flags) with its own credential (a token bound to its agent pod, "
     "held to its node by the node-scope policy) and pods whose addresses come from real `tether-ipam` ADDs; one "
     "`tether controller` leads. Per size: a steady window with one pod deleted and replaced per node, a node "
     "deleted (its pods deleted later, as the pod GC controller does), a node gone silent (heartbeat stopped, "
     "Ready=Unknown, pods kept), then kube-apiserver killed (etcd kept) and started again. Per-agent figures are "
     "each agent's own metrics (`tether_api_requests_total`, `tether_api_objects_read_total`); server figures are "
     "the API server's own (`apiserver_storage_list_fetched_objects_total`: read from etcd; "
     "`apiserver_cache_list_fetched_objects_total`: read from its watch cache). The bounds are issue 22's; a MISS "
     "does not fail the run, a duplicate or a leak does.", "markdown"),
]


def markdown_output(text):
    """A benchmark that prints markdown (bench-kube): its header lines (the make commands, the setup)
    as text, then its tables and target lines as they are, from the first `### ` heading on."""
    out = text.rstrip().splitlines()
    first = next((i for i, l in enumerate(out) if l.startswith("### ")), len(out))
    head = [l for l in out[:first] if l.strip()]
    return (["```text"] + head + ["```", ""] if head else []) + out[first:]


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
    for name, title, how, *form in SECTIONS:
        f = RUN / f"{name}.txt"
        lines += ["", f"## {title}", "", how, ""]
        if f.exists() and f.read_text().strip():
            lines += markdown_output(f.read_text()) if form == ["markdown"] else ["```text", f.read_text().rstrip(), "```"]
        else:
            lines += ["(not run in this report)"]
    if chart():
        lines += ["", "## Latency distributions", "", "![latency distributions](docs/benchmarks.png)"]
    OUT_MD.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT_MD.relative_to(ROOT)}" + (f" and {OUT_PNG.relative_to(ROOT)}" if OUT_PNG.exists() else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
