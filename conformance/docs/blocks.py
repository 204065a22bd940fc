#!/usr/bin/env python3
"""The command blocks the docs show, and the tests that run them as written.

A command block (```sh, ```bash, ```shell, ```console) in README.md or docs/*.md is preceded by a
marker naming where it runs:

    <!-- run: e2e quick-start -->      on the e2e's real node (conformance/e2e), as root
    <!-- run: host install-by-hand --> on the test host (make docs-check)
    <!-- run: kube import-whereabouts --> on the real API server of the suites (Rust in
                                         ipam/operator/tests: `doc_block("FILE", "NAME")`;
                                         deploy/validate.py)

  blocks.py extract FILE NAME   print the block FILE's marker NAME precedes (for a runner)
  blocks.py check ROOT          every block has a marker, every marker a runner: a script or
                                Makefile under ROOT that says `blocks.py extract FILE NAME`;
                                and every link between the pages leads to a page and heading
                                that exist; exit 1 with what is missing
  blocks.py list ROOT KIND      FILE NAME of every marker of KIND
"""
import pathlib
import re
import sys

FENCE = re.compile(r"^```(sh|bash|shell|console)\s*$")
MARKER = re.compile(r"^<!-- run: (e2e|host|kube) ([a-z0-9-]+) -->$")
RUNNER = re.compile(r"(?:blocks\.py extract|run_block) (\S+) ([a-z0-9-]+)|doc_block\(\s*\"([^\"]+)\",\s*\"([a-z0-9-]+)\"")


def pages(root: pathlib.Path):
    yield root / "README.md"
    yield from sorted((root / "docs").glob("*.md"))


def blocks(path: pathlib.Path):
    """(marker or None, first line number, text) of each command block."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if FENCE.match(lines[i]):
            prev = next((l for l in reversed(lines[:i]) if l.strip()), "")
            m = MARKER.match(prev.strip())
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            yield (m.groups() if m else None), i + 1, "\n".join(lines[i + 1:j]) + "\n"
            i = j
        i += 1


def extract(root: pathlib.Path, file: str, name: str) -> int:
    for marker, _, text in blocks(root / file):
        if marker and marker[1] == name:
            sys.stdout.write(text)
            return 0
    print(f"blocks.py: no block named {name} in {file}", file=sys.stderr)
    return 1


def runners(root: pathlib.Path) -> set:
    found = set()
    scripts = [root / "Makefile"]
    for tree in ("conformance", "ipam", "deploy"):
        scripts += [p for p in (root / tree).rglob("*") if p.suffix in (".sh", ".rs", ".py")]
    for p in scripts:
        if p.name == "blocks.py" or not p.is_file() or "target" in p.parts:
            continue
        for m in RUNNER.finditer(p.read_text(errors="replace")):
            found.add((m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4)))
    return found


def anchors(page: pathlib.Path) -> set:
    """The anchors of a page's headings, as GitHub makes them."""
    out = set()
    for line in page.read_text().splitlines():
        m = re.match(r"^#+ (.*)", line)
        if m:
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def broken_links(root: pathlib.Path) -> list:
    """Links between the pages (and to files of the repository) that lead nowhere."""
    problems = []
    for page in pages(root):
        for m in re.finditer(r"\]\(([^)\s]+)\)", page.read_text()):
            target = m.group(1)
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            rel = page.relative_to(root)
            if not dest.exists():
                problems.append(f"{rel}: a link to {target}, which does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{rel}: a link to {target}, a heading {dest.name} does not have")
    return problems


def check(root: pathlib.Path) -> int:
    problems = broken_links(root)
    run = runners(root)
    names = set()
    for page in pages(root):
        rel = str(page.relative_to(root))
        for marker, line, _ in blocks(page):
            if marker is None:
                problems.append(f"{rel}:{line}: a command block without a <!-- run: KIND NAME --> marker")
                continue
            if (rel, marker[1]) in names:
                problems.append(f"{rel}:{line}: a second block named {marker[1]}")
            names.add((rel, marker[1]))
            if (rel, marker[1]) not in run:
                problems.append(f"{rel}:{line}: block {marker[1]} is run by nothing (no `blocks.py extract {rel} {marker[1]}`)")
    for rel, name in sorted(run - names):
        problems.append(f"a runner extracts {rel} {name}, which no marker names")
    for p in problems:
        print(f"docs-check: {p}", file=sys.stderr)
    if not problems:
        print(f"docs-check: {len(names)} command blocks, each run by a test; the links lead somewhere")
    return 1 if problems else 0


def main(argv) -> int:
    if len(argv) == 4 and argv[1] == "extract":
        root = pathlib.Path(__file__).resolve().parents[2]
        return extract(root, argv[2], argv[3])
    if len(argv) == 3 and argv[1] == "check":
        return check(pathlib.Path(argv[2]))
    if len(argv) == 4 and argv[1] == "list":
        root = pathlib.Path(argv[2])
        for page in pages(root):
            for marker, _, _ in blocks(page):
                if marker and marker[0] == argv[3]:
                    print(page.relative_to(root), marker[1])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
