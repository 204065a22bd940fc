#!/usr/bin/env python3
"""Write BENCHMARKS.md and docs/benchmarks.png, whole, from one `make bench` run at one commit.

Inputs (made by `make bench` in target/bench/): each benchmark's stdout as <name>.txt (the real
node's table as node.md, its own generated file), the latency samples the benchmarks keep in
samples/<bench>__<label>.txt (one ms value a line), and <name>.rev: the commit (`git rev-parse
HEAD`) and whether the tree was clean (`git status --porcelain` empty, this script's two outputs
aside) as each benchmark started and as it ended (`report.py --stamp NAME start|end`). The report
is written only when every input is there, all were measured at one commit of a clean tree, and
the tree is still at that commit and clean: the commit it names is the code that was measured.
Every ratio in the report was measured in the same run as the reference it compares against.

  report.py                          # target/bench -> BENCHMARKS.md, docs/benchmarks.png
  report.py --check-tree             # exit 1 unless the tree is clean (make bench, before it starts)
  report.py --stamp NAME start|end   # record the commit and the tree's state for input NAME
  report.py --run DIR --out FILE.md [--partial]   # elsewhere; --partial: missing inputs allowed
"""
import argparse
import datetime
import json
import pathlib
import re
import platform
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ROOT / "target" / "bench"
OUT_MD = ROOT / "BENCHMARKS.md"
OUT_PNG = ROOT / "docs" / "benchmarks.png"

SECTIONS = [
    ("attach", "Attach: tether-ipvlan + tether-ipam vs the reference ipvlan + host-local (lab VM, real ipvlan)",
     "`make bench-attach` (`conformance/bench/attach.sh`): ADD/DEL cycles of every row (BENCH_CYCLES, default 50; "
     "the count is in the header below), interleaved (the order rotates every cycle), in one boot of the lab VM. "
     "The plugins are exec'd directly, one process per call, from copies in the VM's RAM. tether's binaries are the "
     "static musl builds that ship (`make build`); the reference is Debian's containernetworking-plugins. The "
     "reference never probes the wire, so each family has two tether rows, probe off and probe on (tether-ipam as "
     "shipped: every address it hands out probed, 100 ms, one attempt), both compared with the same reference. Each "
     "ratio's label says what differs between its two sides besides the plugins themselves. IPv4: one range, no "
     "DAD. dual: an IPv4 and an IPv6 range; the IPv6 address is never used tentative on either side, but the "
     "reference waits out the kernel's default DAD (a random delay of up to 1 s, then 1 s), while tether-ipvlan "
     "shortens DAD on the pod's interface to one 100 ms window and waits that out (probe off) or adds the address "
     "tether-ipam probed with `nodad` (probe on): the dual ratios are mostly that difference, not like for like. "
     "\"attacher alone\" runs tether-ipvlan over host-local. The exec cost is one `CNI_COMMAND=VERSION` round trip "
     "of each binary."),
    ("ipam", "Node-local IPAM: tether-ipam (file store) vs host-local",
     "`make bench-ipam` (`conformance/src/bin/bench-ipam.rs`), on this machine's kernel: 256 ADDs then 256 DELs at "
     "concurrency 1 and 32, each call a process, fresh store per round, best of 3 rounds. tether-ipam with probing "
     "off, so both sides do the same work (no wire, no link): what differs is the store (tether-ipam's node journal "
     "and lease files vs host-local's files and lock)."),
    ("kube", "Cluster IPAM: tether-ipam's Kubernetes store vs whereabouts on a real API server",
     "`make bench-kube` (`conformance/src/bin/bench-kube/`) starts a kube-apiserver {apiserver} + etcd {etcd} of "
     "its own with the peers directory's `k8s-up.sh` (`TETHER_PEERS`, default `../shared/peers`; loopback only, "
     "no controllers; stopped at the end) on this machine, so the server shares its cores with the plugins. "
     "tether-ipam (the static build that ships; `\"store\": \"kubernetes\"`, probing off) and whereabouts "
     "{whereabouts} (built by `.ci/deps.sh` from its published module, `conformance/peers/whereabouts`) run "
     "against it in the same run, one process per CNI call as a runtime execs them (Multus' CNI_ARGS), both on "
     "10.128.0.0/16. What differs besides the plugins: tether-ipam runs as on a node, with the plugins' node-bound "
     "token, so the IPLease CRD's schema and the node-scope ValidatingAdmissionPolicy of `deploy/base` check each of "
     "its writes, either through the node-agent's lease service (`tether lease-service`, the shipped default: "
     "\"agent\") or straight to the API server (\"direct\"); whereabouts uses the admin kubeconfig (no policy of "
     "tether's applies to it) with its defaults, logging errors only. Rows: N ADDs for distinct pods at concurrency "
     "1, 8 and 32, then a DEL of each; each row starts from empty stores and the plugins' order rotates by row. The "
     "ceiling is the same server's CREATE rate of IPLeases like tether's from keep-alive clients, measured right "
     "after the rows. API requests per call are the server's own `apiserver_request_total` counters (its requests "
     "to itself excluded) read around ADDs and DELs at concurrency 1, on each plugin's resources (tether: "
     "ipleases; whereabouts: ippools, overlappingrangeipreservations, leases). The scale rows repeat tether's ADDs "
     "after 20,000 IPLease objects were created through the API, half of them on addresses of the measured range. "
     "The targets are issue 25's; a MISS does not fail the run.", "markdown"),
    ("static", "Static (shipped) vs glibc builds of the plugins",
     "`make bench-static` (`conformance/bench/static.sh`): the static musl binaries that `make build` ships next to "
     "glibc release builds of the same code, interleaved in one run on this machine's kernel: the exec cost "
     "(`CNI_COMMAND=VERSION` round trips) and bench-ipam's file-store ADD/DEL with each build. Only the build "
     "differs. The attach and cluster benchmarks measure the static binaries."),
    ("probe", "Conflict probing: added latency per ADD",
     "`make bench-probe` (`conformance/src/bin/bench-probe.rs`): sequential tether-ipam ADDs on a veth segment "
     "(this machine's kernel), probing off vs on; only the probe differs between the rows."),
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
     "`apiserver_cache_list_fetched_objects_total`: read from its watch cache). No reference: tether against the "
     "bounds of issue 22; a MISS does not fail the run, a duplicate or a leak does.", "markdown"),
    ("node", "On a real node: pods Running, tether vs the reference ipvlan + whereabouts (lab VM)",
     "`make bench-node` (`conformance/e2e/bench-node.sh`; its table is its own generated file, "
     "`target/lab/e2e/bench-node.md`, copied here whole): the node of `make e2e` (kube-apiserver v1.36, etcd, "
     "controller-manager and scheduler on this machine; kubelet v1.36, containerd and runc in the lab VM; Multus "
     "thin as the node's CNI; `deploy/tether.yaml` applied as the README says). Per round one Deployment of "
     "BENCH_NODE_PODS pods, each selecting two NADs (`net1` on `enp5s0`, `net2` on `enp6s0`, real l2 ipvlan, IPv4 "
     "only), timed from the Deployment's creation to all pods `Running`, then deleted. tether first, then the "
     "reference, disjoint ranges, same node, same run. What differs besides the plugins: tether-ipam uses the "
     "cluster store through the node-agent with its node credential and probes every address (100 ms, as the "
     "examples ship); whereabouts ({whereabouts}, the binary of the cluster section) uses the admin's kubeconfig with its defaults (every ADD and DEL takes its one "
     "cluster-wide Lease in turn) and does not probe; the reference's round is cut at "
     "`TETHER_BENCH_NODE_REFERENCE_TIMEOUT` (600 s), after which its rate is a bound. Failed sandbox attempts are "
     "the kubelet's FailedCreatePodSandBox events, whoever failed (Multus included).", "raw"),
]

# What `make bench` writes: never counted as a change to the tree it measured.
OUTPUTS = ("BENCHMARKS.md", "docs/benchmarks.png")

EMULATION_NOTE = (
    "**Absolute times.** The attach rows and the real node run in the lab VM: qemu without KVM (TCG: every guest "
    "instruction is translated) running a stock Debian 6.1 kernel, on this machine's 2 cores shared with the host's "
    "own work. There, system calls, page faults, process creation and exec, and the kernel's network paths cost "
    "several times to tens of times what they cost on hardware (compare the attach section's exec cost of a static "
    "binary with the static section's, measured on this machine's kernel), and timers fire late under load. "
    "Absolute times in the VM are therefore inflated and noisy, more so for whichever side makes more system calls "
    "and execs; the ratios between rows of one run are the comparison. The benchmarks outside the VM run on this "
    "machine's kernel, with the API server and etcd on the same 2 cores as the plugins: their absolute figures are "
    "this machine's, not a production node's."
)


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


def git(*args):
    # --no-optional-locks: status must not rewrite the index, on which crates/build-info rebuilds.
    cmd = ["git", "-C", str(ROOT), "--no-optional-locks", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def tree_state():
    """(commit, changes): HEAD and what `git status --porcelain` lists, this script's outputs aside."""
    commit = git("rev-parse", "HEAD").strip()
    changes = [l for l in git("status", "--porcelain").splitlines() if l[3:].strip('"') not in OUTPUTS]
    return commit, changes


def stamp(run, name, when):
    commit, changes = tree_state()
    rec = {"when": when, "commit": commit, "clean": not changes, "changes": changes[:20],
           "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    run.mkdir(parents=True, exist_ok=True)
    with open(run / f"{name}.rev", "a") as f:
        f.write(json.dumps(rec) + "\n")
    if changes:
        print(f"report.py: {name} {when}: the tree has changes, the report will refuse this input:\n  "
              + "\n  ".join(changes[:20]), file=sys.stderr)
    return 0


def provenance(run, names):
    """The one commit every input was measured at, and the run's first and last times; or the
    reasons there is none (an input missing, unstamped, measured at another commit or in a dirty
    tree, or the tree moved since)."""
    problems, commits, times = [], set(), []
    for name in names:
        f = run / f"{name}.rev"
        recs = [json.loads(l) for l in f.read_text().splitlines() if l.strip()] if f.exists() else []
        whens = [r["when"] for r in recs]
        if whens != ["start", "end"]:
            problems.append(f"{name}: {f.name} records {whens or 'nothing'}, not one start and one end "
                            "(an input not measured by this make bench run, or measured twice)")
            continue
        for r in recs:
            commits.add(r["commit"])
            times.append(r["time"])
            if not r["clean"]:
                problems.append(f"{name}: measured in a tree with changes at its {r['when']}: {r['changes']}")
    if len(commits) > 1:
        problems.append(f"the inputs were measured at different commits: {sorted(commits)}")
    commit, changes = tree_state()
    if commits and commit not in commits:
        problems.append(f"the tree is at {commit[:12]} now, not at the measured {sorted(commits)[0][:12]}")
    if changes:
        problems.append(f"the tree has changes now: {changes[:20]}")
    return (commits.pop() if len(commits) == 1 else None), sorted(times), problems


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in sh("lscpu").splitlines() if l.startswith("Model name")), "?")
    mem = next((l.split()[1] for l in pathlib.Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal")), "0")
    ref = sh("dpkg-query", "-W", "-f=${Version}", "containernetworking-plugins")
    return [
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- CPU: {cpu}, {sh('nproc')} cores; memory {int(mem) // 1024 // 1024} GiB",
        f"- kernel: {platform.release()} (host); lab VM: Debian {sh('sh', '-c', 'cat /var/cache/tether-lab/current 2>/dev/null') or '6.1'}",
        f"- {sh('rustc', '--version')}",
        f"- reference plugins: Debian containernetworking-plugins {ref or '?'}",
        f"- load average when the report was written: {' '.join(pathlib.Path('/proc/loadavg').read_text().split()[:3])}",
    ]


def chart(run, out_png):
    samples = sorted((run / "samples").glob("*.txt"))
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
    out_png.parent.mkdir(exist_ok=True)
    fig.savefig(out_png, dpi=110)
    return True


def kube_versions(text):
    """What bench-kube's header says ran: the API server's, etcd's and whereabouts' versions."""
    m = re.search(r"kube-apiserver (\S+) \+ etcd (\S+)", text)
    w = re.search(r"\(whereabouts (v[^ )]+)", text)
    return {"apiserver": m.group(1) if m else "?", "etcd": m.group(2) if m else "?",
            "whereabouts": w.group(1) if w else "(version unknown)"}


def header(commit, times):
    subject, date = git("show", "-s", "--format=%s%x00%cd", "--date=format:%Y-%m-%d %H:%M", commit).strip().split("\0")
    t = [datetime.datetime.fromisoformat(x) for x in times]
    took = f"{(t[-1] - t[0]).total_seconds() / 60:.0f} min" if t else "?"
    run_when = f"{t[0]:%Y-%m-%d %H:%M}–{t[-1]:%H:%M} UTC, {took}" if t else "?"
    return [
        "# Benchmarks", "",
        f"Measured at commit **`{commit[:12]}`** ({subject}; committed {date}), in a clean tree, by one `make bench` "
        f"run ({run_when}), which wrote this file whole, the real node's section included; do not edit it by hand. "
        "Every ratio compares against a reference measured in the same run, on the machine below.", "",
        EMULATION_NOTE,
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", type=pathlib.Path, default=RUN)
    ap.add_argument("--out", type=pathlib.Path, help="write the markdown here (the chart beside it, .png)")
    ap.add_argument("--partial", action="store_true", help="with --out: inputs may be missing or unstamped")
    ap.add_argument("--stamp", nargs=2, metavar=("NAME", "start|end"))
    ap.add_argument("--check-tree", action="store_true")
    a = ap.parse_args()
    if a.stamp:
        if a.stamp[1] not in ("start", "end"):
            ap.error("--stamp NAME start|end")
        return stamp(a.run, *a.stamp)
    if a.check_tree:
        _, changes = tree_state()
        if changes:
            print("report.py: the tree has changes; BENCHMARKS.md must come from a commit as it is "
                  "(commit, or bench a clean clone):\n  " + "\n  ".join(changes[:20]), file=sys.stderr)
            return 1
        return 0
    if a.partial and not a.out:
        ap.error("--partial writes only elsewhere (--out), never BENCHMARKS.md")
    out_md = a.out or OUT_MD
    out_png = a.out.with_suffix(".png") if a.out else OUT_PNG
    names = [s[0] for s in SECTIONS]
    files = {n: a.run / (f"{n}.md" if n == "node" else f"{n}.txt") for n in names}
    missing = [str(f) for f in files.values() if not (f.exists() and f.read_text().strip())]
    commit, times, problems = provenance(a.run, names)
    if missing:
        problems.insert(0, f"inputs missing or empty: {missing}")
    if problems and not a.partial:
        print("report.py: not writing " + str(out_md) + ": BENCHMARKS.md is written whole from one run at one "
              "commit of a clean tree (make bench):\n  - " + "\n  - ".join(problems), file=sys.stderr)
        return 1
    if commit:
        lines = header(commit, times)
    else:
        lines = ["# Benchmarks (partial: not a `make bench` run at one commit)", "", EMULATION_NOTE, ""]
        lines += ["Not written by `make bench`:", ""] + [f"- {p}" for p in problems]
    lines += ["", "## Machine", ""] + machine()
    kube = files["kube"].read_text() if files["kube"].exists() else ""
    for name, title, how, *form in SECTIONS:
        f = files[name]
        if name in ("kube", "node"):
            how = how.format(**kube_versions(kube))
        lines += ["", f"## {title}", "", how, ""]
        if f.exists() and f.read_text().strip():
            text = f.read_text()
            if form == ["raw"]:
                lines += text.rstrip().splitlines()
            elif form == ["markdown"]:
                lines += markdown_output(text)
            else:
                lines += ["```text", text.rstrip(), "```"]
        else:
            lines += ["(not run in this report)"]
    charted = chart(a.run, out_png)
    if not charted and not a.partial:
        print(f"report.py: not writing {out_md}: no latency samples in {a.run / 'samples'}", file=sys.stderr)
        return 1
    if charted:
        rel = out_png.relative_to(out_md.parent) if out_png.is_relative_to(out_md.parent) else out_png
        lines += ["", "## Latency distributions", "", f"![latency distributions]({rel})"]
    out_md.write_text("\n".join(lines) + "\n")
    print(f"wrote {out_md}" + (f" and {out_png}" if charted else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
