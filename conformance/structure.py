#!/usr/bin/env python3
"""The layout rules of `make test`'s style gate, checked on the sources (issue 24):

- no import circle between the modules of a crate: module A names module B (`use crate::b`,
  `super::b::X`, `crate::b::f()`) and B, directly or through others, names A. A module's own
  submodules are its own business: declaring or re-exporting them (`mod x; pub use x::T;`) is not
  an edge, so a parent and its children never form a circle by that alone;
- no product source file over 600 lines (tests, benches, the conformance suite and the API double
  excepted);
- no function over 80 lines on the per-pod path (the crates a CNI call runs, and the two plugin
  binaries' own sources).

Prints each finding and exits 1 when there is one. `--graph CRATE_DIR` prints that crate's module
edges instead. Rust is read with a small tokenizer (comments, strings, chars and lifetimes
skipped), which is enough for module paths and brace nesting.
"""
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILE_LINES = 600
MAX_FN_LINES = 80
# Crates whose every source file is product code: the file limit applies (ipam/ holds the
# operator's package too).
PRODUCT = ["crates/cni", "crates/pool", "crates/leases", "crates/link", "crates/attach",
           "crates/wire", "crates/kube-store", "crates/trusted-fs", "crates/stable-hash",
           "crates/lease-service", "plugins", "ipam"]
# What one CNI call runs: the function limit applies (the operator program is not per pod).
PER_POD = ["crates/cni", "crates/pool", "crates/leases", "crates/link", "crates/attach",
           "crates/wire", "crates/kube-store", "crates/trusted-fs", "crates/stable-hash",
           "crates/lease-service", "plugins/src", "ipam/src"]
# kube-store modules only the operator uses (not on the per-pod path).
NOT_PER_POD = ["crates/kube-store/src/cluster", "crates/kube-store/src/nodes.rs",
               "crates/kube-store/src/monitoring.rs", "crates/kube-store/src/access.rs",
               "crates/kube-store/src/node_token.rs", "crates/lease-service/src/server",
               "crates/lease-service/src/network_cache.rs"]
# Every crate of the workspace: no circles anywhere.
CRATES = PRODUCT + ["ipam/operator", "conformance", "conformance/apiserver-double"]


def strip(text):
    """The source with comments, strings and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
        elif c == '"' or (c == "b" and text.startswith('b"', i) and (i == 0 or not text[i - 1].isalnum())):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\.|\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|[^\\'])'", text[i:i + 12])
            if m:
                out.append("' '")
                i += m.end()
            else:  # a lifetime or label
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def rust_files(d):
    for base, dirs, files in os.walk(d):
        dirs[:] = [x for x in dirs if x not in ("target", "fuzz")]
        for f in files:
            if f.endswith(".rs"):
                yield os.path.join(base, f)


def module_of(src_dir, path):
    """Module path of a file under a crate's src/ ('' for lib.rs/main.rs)."""
    rel = os.path.relpath(path, src_dir)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def crate_modules(crate):
    src = os.path.join(ROOT, crate, "src")
    mods = {}
    for p in rust_files(src):
        rel = os.path.relpath(p, src)
        if rel.startswith("bin" + os.sep):
            continue  # binaries are crates of their own
        mods[module_of(src, p)] = strip(open(p, encoding="utf-8").read())
    return mods


PATH = re.compile(r"\b(crate|super|self)((?:\s*::\s*(?:super|[A-Za-z_][A-Za-z0-9_]*))+)")
USE = re.compile(r"\buse\s+([^;]*);", re.S)


def expand_use(tree):
    """`a::{b, c::{d}}` → ['a::b', 'a::c::d'] (whitespace removed)."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, inner = m.group(1), m.group(2)
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p:
            out.extend(prefix + q for q in expand_use(p))
    return out


def resolve(mod, path, mods):
    """The module a path (`crate::a::b::T`, `super::x`) lands in: its longest module prefix."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, rest = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = mod
        rest = segs
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    else:
        return None
    best = base
    for k in range(1, len(rest) + 1):
        cand = base + tuple(rest[:k])
        if cand in mods:
            best = cand
    return best


def edges(mods):
    out = defaultdict(set)
    for mod, text in mods.items():
        targets = []
        for m in USE.finditer(text):
            targets.extend(expand_use(m.group(1)))
        for m in PATH.finditer(text):
            targets.append(m.group(1) + re.sub(r"\s+", "", m.group(2)))
        for t in targets:
            to = resolve(mod, t, mods)
            # A module's own descendants are declared by it, not imported.
            if to is None or to == mod or to[:len(mod)] == mod:
                continue
            out[mod].add(to)
    return out


def circles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def name(crate, mod):
    return crate + ":" + ("::".join(mod) or "(root)")


FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def long_functions(path):
    text = strip(open(path, encoding="utf-8").read())
    found = []
    for m in FN.finditer(text):
        # The body starts at the first '{' after the signature, unless a ';' ends it first.
        j = m.end()
        depth = 0
        while j < len(text):
            if text[j] in "<([":
                depth += 1
            elif text[j] in ">)]":
                depth -= 1
            elif text[j] == ";" and depth <= 0:
                j = -1
                break
            elif text[j] == "{" and depth <= 0:
                break
            j += 1
        if j < 0 or j >= len(text):
            continue
        start, depth, k = j, 0, j
        while k < len(text):
            if text[k] == "{":
                depth += 1
            elif text[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        lines = text.count("\n", start, k) + 1
        if lines > MAX_FN_LINES:
            found.append((m.group(1), text.count("\n", 0, m.start()) + 1, lines))
    return found


def is_test_file(rel):
    parts = rel.split(os.sep)
    return ("tests" in parts or "benches" in parts or parts[-1] in ("tests.rs", "seam_tests.rs", "fake_kernel.rs")
            or parts[-1].endswith("_tests.rs"))


def under(rel, prefixes):
    return any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in prefixes)


def self_test():
    """The checks on a small made-up crate: each rule must find what it is for."""
    import tempfile
    global ROOT
    saved = ROOT
    with tempfile.TemporaryDirectory() as d:
        ROOT = d
        src = os.path.join(d, "c", "src")
        os.makedirs(os.path.join(src, "engine"))
        files = {
            "lib.rs": "mod a; mod b; mod engine; pub use engine::Allocator;",
            # a -> b through a use tree, b -> a through a path in code: a circle.
            "a.rs": "use crate::{b::{Thing}, engine};\npub struct A;",
            "b.rs": "pub struct Thing;\nfn f() { let _ = crate::a::A; let s = \"crate::engine::x {\"; }",
            # A parent and its child naming each other is no circle.
            "engine/mod.rs": "mod add;\npub use add::AddRequest;\npub struct Allocator;",
            "engine/add.rs": "use super::Allocator;\npub struct AddRequest;\nfn long() {\n"
                             + "    let x = '{';\n" * 90 + "}\n" + "// filler\n" * 600,
        }
        for name, text in files.items():
            with open(os.path.join(src, name), "w", encoding="utf-8") as f:
                f.write(text)
        found = circles(edges(crate_modules("c")))
        assert found == [[("a",), ("b",)]], found
        longs = long_functions(os.path.join(src, "engine", "add.rs"))
        assert [(n, lines) for n, _, lines in longs] == [("long", 92)], longs
        assert sum(1 for _ in open(os.path.join(src, "engine", "add.rs"))) > MAX_FILE_LINES
    ROOT = saved
    print("structure: self-test passed (a circle, a long function and a long file are found)")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "--graph":
        mods = crate_modules(sys.argv[2])
        for a, bs in sorted(edges(mods).items()):
            for b in sorted(bs):
                print(f"{name(sys.argv[2], a)} -> {'::'.join(b) or '(root)'}")
        return 0
    problems = []
    for crate in CRATES:
        for comp in circles(edges(crate_modules(crate))):
            problems.append("import circle: " + " <-> ".join(name(crate, m) for m in comp))
    for crate in PRODUCT:
        for p in rust_files(os.path.join(ROOT, crate)):
            rel = os.path.relpath(p, ROOT)
            if is_test_file(rel):
                continue
            n = sum(1 for _ in open(p, encoding="utf-8"))
            if n > MAX_FILE_LINES:
                problems.append(f"{rel}: {n} lines (at most {MAX_FILE_LINES} for product sources)")
            if under(rel, PER_POD) and not under(rel, NOT_PER_POD):
                for fname, line, lines in long_functions(p):
                    # Test modules inside a product file are not on the per-pod path.
                    problems.append(f"{rel}:{line}: fn {fname} is {lines} lines (at most {MAX_FN_LINES} on the per-pod path)")
    for p in problems:
        print(p)
    if problems:
        print(f"structure: {len(problems)} finding(s)")
        return 1
    print("structure: no import circle, no product file over "
          f"{MAX_FILE_LINES} lines, no per-pod function over {MAX_FN_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
