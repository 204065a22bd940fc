#!/usr/bin/env python3
"""Print the conformance table: every item of the checklist with the tests that prove it.

Input: the output of libtest runs (`test <name> ... ok|FAILED|ignored` lines) in the files given on
the command line. A test proves the checklist items its name starts with: `item34_…` (or the short
forms `h34_…`, `i34_…`), or several: `item11_12_…`, `i89_i90_…`. Exit status 1 when an item failed or has no passing test.
"""
import pathlib
import re
import sys

CHECKLIST = pathlib.Path(__file__).resolve().parent / "checklist.md"
LINE = re.compile(r"^test (?:\S+::)?((?:item|h|i)\d+(?:_(?:item|h|i)?\d+)*)_\S* \.\.\. (ok|FAILED|ignored)")


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
        for line in pathlib.Path(log).read_text(errors="replace").splitlines():
            m = LINE.match(line.strip())
            if not m:
                continue
            for n in re.findall(r"\d+", m.group(1)):
                results.setdefault(int(n), []).append(m.group(2))
    checklist = items()
    bad = 0
    print(f"{'item':>4}  {'result':<7} {'tests':>5}  expectation")
    for n, text in checklist.items():
        got = results.get(n, [])
        if not got:
            verdict = "MISSING"
        elif "FAILED" in got:
            verdict = "FAIL"
        elif "ok" in got:
            verdict = "pass"
        else:
            verdict = "SKIPPED"
        bad += verdict != "pass"
        short = text if len(text) <= 90 else text[:87] + "..."
        print(f"{n:>4}  {verdict:<7} {len(got):>5}  {short}")
    passed = len(checklist) - bad
    print(f"\n{passed} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
