#!/usr/bin/env python3
"""Print the conformance table: every item of the checklist with the tests that prove it.

Input: the output of libtest runs (`test <name> ... ok|FAILED|ignored` lines) in the files given on
the command line. A test proves the checklist items its name starts with: `item34_…` (or the short
forms `h34_…`, `i34_…`), or several: `item11_12_…`, `i89_i90_…`.

An item whose tests were only ignored because they need a real Kubernetes API server (`ignored,
needs a real API server: …`: no ../shared/peers, so `make test` could start none) is NOT RUN: not
passed, and said loudly, but it fails the run only with TETHER_REQUIRE_KUBE=1 (CI). Exit status 1
when an item failed, has no passing test, or was skipped for another reason.
"""
import os
import pathlib
import re
import sys

CHECKLIST = pathlib.Path(__file__).resolve().parent / "checklist.md"
LINE = re.compile(r"^test (?:\S+::)?((?:item|h|i)\d+(?:_(?:item|h|i)?\d+)*)_\S* \.\.\. (ok|FAILED|ignored)(.*)")
NEEDS_API = "needs a real API server"


def items():
    out = {}
    for line in CHECKLIST.read_text().splitlines():
        m = re.match(r"^(\d+)\. (.*)", line)
        if m:
            out[int(m.group(1))] = m.group(2)
    return out


def main(logs):
    results = {}
    for log in logs:
        path = pathlib.Path(log)
        if not path.exists():
            print(f"report: {log} is missing (that phase did not run)", file=sys.stderr)
            continue
        for line in path.read_text(errors="replace").splitlines():
            m = LINE.match(line.strip())
            if not m:
                continue
            outcome = m.group(2)
            if outcome == "ignored" and NEEDS_API in m.group(3):
                outcome = "not-run"
            for n in re.findall(r"\d+", m.group(1)):
                results.setdefault(int(n), []).append(outcome)
    checklist = items()
    bad = 0
    not_run = []
    print(f"{'item':>4}  {'result':<7} {'tests':>5}  expectation")
    for n, text in checklist.items():
        got = results.get(n, [])
        if not got:
            verdict = "MISSING"
        elif "FAILED" in got:
            verdict = "FAIL"
        elif "ok" in got:
            verdict = "pass"
        elif "not-run" in got:
            verdict = "NOT RUN"
            not_run.append(n)
        else:
            verdict = "SKIPPED"
        bad += verdict not in ("pass", "NOT RUN")
        short = text if len(text) <= 90 else text[:87] + "..."
        print(f"{n:>4}  {verdict:<7} {len(got):>5}  {short}")
    passed = len(checklist) - bad - len(not_run)
    if not_run:
        print(
            f"\nNOT RUN: item(s) {', '.join(map(str, not_run))} — their tests need a real Kubernetes API "
            "server and ../shared/peers is absent. They have NOT passed."
        )
    print(f"\n{passed} passed, {bad} failed, {len(not_run)} skipped")
    if not_run and os.environ.get("TETHER_REQUIRE_KUBE") == "1":
        print("report: TETHER_REQUIRE_KUBE=1: items NOT RUN fail the run", file=sys.stderr)
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
