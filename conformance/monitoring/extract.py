#!/usr/bin/env python3
"""Prepare deploy/monitoring for promtool, and check what promtool cannot (check.sh runs this).

Writes into OUT:
- rules.yaml: the PrometheusRule's groups, the plain rule file `promtool check/test rules` reads;
- dashboard-rules.yaml: each dashboard query as a recording rule (Grafana's variables replaced by
  what they stand for), so that `promtool check rules` parses every query.

Checks, failing with what is wrong:
- every tether_* series the rules and the dashboard name is one the docs' metric table lists
  (docs/monitoring.md: what the node-agent and the controller serve);
- the PodMonitor selects the pods of both the node-agent DaemonSet and the controller Deployment,
  and each has a port named as the PodMonitor scrapes.
"""
import json
import pathlib
import re
import sys

import yaml

SERIES = re.compile(r"\btether_[a-z_]+\b")
VARIABLES = {"$__rate_interval": "5m", '"$network"': '".*"'}


def documented(docs: pathlib.Path) -> set:
    names = set()
    for line in docs.read_text().splitlines():
        m = re.match(r"^\| `(tether_[a-z_]+)` \| ([a-z]+) \|", line)
        if m:
            names.add(m.group(1))
            # A histogram is served as its three series.
            if m.group(2) == "histogram":
                names.update(m.group(1) + s for s in ("_bucket", "_sum", "_count"))
    return names


def pod_template_names(path: pathlib.Path) -> dict:
    """app.kubernetes.io/name of each workload's pod template → its container port names."""
    out = {}
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc or doc.get("kind") not in ("DaemonSet", "Deployment"):
            continue
        tpl = doc["spec"]["template"]
        name = tpl["metadata"]["labels"]["app.kubernetes.io/name"]
        ports = {p.get("name") for c in tpl["spec"]["containers"] for p in c.get("ports", [])}
        out[name] = ports
    return out


def main(monitoring: str, out: str) -> int:
    mon, work = pathlib.Path(monitoring), pathlib.Path(out)
    root = mon.parent.parent
    problems = []
    rule = yaml.safe_load((mon / "prometheusrule.yaml").read_text())
    (work / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))

    dash = json.loads((mon / "dashboard.json").read_text())
    recorded = []
    for panel in dash["panels"]:
        for t in panel["targets"]:
            expr = t["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            if "$" in expr:
                problems.append(f"dashboard panel {panel['title']!r}: a variable check.sh cannot stand in for: {t['expr']}")
            recorded.append({"record": f"tether:dashboard:panel{panel['id']}_{t['refId']}", "expr": expr})
    (work / "dashboard-rules.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}, sort_keys=False))

    known = documented(root / "docs" / "monitoring.md")
    if len(known) < 20:
        problems.append(f"docs/monitoring.md lists only {len(known)} tether_* metrics: the table was not found")
    named = {}
    for g in rule["spec"]["groups"]:
        for r in g["rules"]:
            for s in SERIES.findall(r["expr"]):
                named.setdefault(s, f"alert {r.get('alert')}")
    for panel in dash["panels"]:
        for t in panel["targets"]:
            for s in SERIES.findall(t["expr"]):
                named.setdefault(s, f"dashboard panel {panel['title']!r}")
    for var in dash["templating"]["list"]:
        for s in SERIES.findall(json.dumps(var.get("query", ""))):
            named.setdefault(s, f"dashboard variable {var['name']}")
    for s, where in sorted(named.items()):
        if s not in known:
            problems.append(f"{where} names {s}, which neither the node-agent nor the controller serves (docs/monitoring.md)")
    (work / "series.txt").write_text("".join(f"{s}\n" for s in sorted(named)))

    pm = yaml.safe_load((mon / "podmonitor.yaml").read_text())
    selected = set()
    for e in pm["spec"]["selector"].get("matchExpressions", []):
        if e["key"] == "app.kubernetes.io/name" and e["operator"] == "In":
            selected |= set(e["values"])
    selected |= {v for k, v in pm["spec"]["selector"].get("matchLabels", {}).items() if k == "app.kubernetes.io/name"}
    ports = {ep["port"] for ep in pm["spec"]["podMetricsEndpoints"]}
    workloads = {}
    for f in ("daemonset.yaml", "controller.yaml"):
        workloads.update(pod_template_names(root / "deploy" / "base" / f))
    for name, pod_ports in sorted(workloads.items()):
        if name not in selected:
            problems.append(f"the PodMonitor does not select the pods of {name} (app.kubernetes.io/name={name})")
        elif not ports & pod_ports:
            problems.append(f"the pods of {name} have no port named {sorted(ports)} (they have {sorted(pod_ports)})")
    if len(workloads) < 2:
        problems.append(f"found {sorted(workloads)} in deploy/base, not the DaemonSet and the controller")

    for p in problems:
        print(f"monitoring-check: {p}", file=sys.stderr)
    if not problems:
        print(f"monitoring-check: {len(named)} series named by the rules and the dashboard, all served; "
              f"the PodMonitor selects {', '.join(sorted(workloads))}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
