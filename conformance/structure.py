#!/usr/bin/env python3
"""The layout rules of `make test`'s style gate, checked on the sources (issue 24):

- no import circle between the modules of a crate: module A names module B (`use crate::b`,
  `super::b::X`, `crate::b::f()`) and B, directly or through others, names A. A module's own
  submodules are its own business: declaring or re-exporting them (`mod x; pub use x::T;`) is not
  an edge, so a parent and its children never form a circle by that alone;
- no product source file over 600 lines: every workspace member but those under conformance/ (the
  suites and the API double); tests and benches excepted;
- no function over 80 lines on the per-pod path: the two plugin packages' own sources and the
  libraries of every workspace crate they depend on through `path` dependencies, directly or not
  ([dependencies] only: dev-dependencies are not linked into a plugin). The layout is read from the
  Cargo.toml files, so a crate a plugin starts to depend on is under the rule at once, and one it
  stops depending on is not.

Prints each finding and exits 1 when there is one. `--graph CRATE_DIR` prints that crate's module
edges instead, `--per-pod` the per-pod crates. Rust is read with a small tokenizer (comments,
strings, chars and lifetimes skipped), which is enough for module paths and brace nesting.
"""
import glob
import os
import re
import sys
import tomllib
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILE_LINES = 600
MAX_FN_LINES = 80
# The packages a runtime execs for every pod (plugins/ and ipam/).
PLUGINS = ("tether-ipvlan", "tether-ipam")


def manifest(crate):
    with open(os.path.join(ROOT, crate, "Cargo.toml"), "rb") as f:
        return tomllib.load(f)


def members():
    """The workspace members (directories relative to ROOT), as the root Cargo.toml lists them."""
    out = []
    for m in manifest(".")["workspace"]["members"]:
        found = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, m))
                       if os.path.isfile(os.path.join(p, "Cargo.toml")))
        out.extend(found or [m])
    return out


def path_deps(crate):
    """The crates `crate` links: its [dependencies] (also per target) given by `path`, or by
    `workspace = true` naming a workspace dependency given by `path`."""
    m = manifest(crate)
    tables = [m.get("dependencies", {})]
    tables += [t.get("dependencies", {}) for t in m.get("target", {}).values()]
    shared = manifest(".").get("workspace", {}).get("dependencies", {})
    out = []
    for table in tables:
        for name, dep in table.items():
            if not isinstance(dep, dict):
                continue
            if "path" in dep:
                out.append(os.path.normpath(os.path.join(crate, dep["path"])))
            elif dep.get("workspace") and isinstance(shared.get(name), dict) and "path" in shared[name]:
                out.append(os.path.normpath(shared[name]["path"]))
    return out


def per_pod_crates(plugins=PLUGINS):
    """The plugin packages and every crate they depend on, directly or not: {dir: is_plugin}."""
    by_name = {manifest(c)["package"]["name"]: c for c in members()}
    missing = [p for p in plugins if p not in by_name]
    if missing:
        raise SystemExit(f"structure: no workspace member is the plugin package {', '.join(missing)}")
    out = {by_name[p]: True for p in plugins}
    todo = list(out)
    while todo:
        for dep in path_deps(todo.pop()):
            if dep not in out:
                out[dep] = False
                todo.append(dep)
    return out


def source_dirs(crate, is_plugin):
    """Where a per-pod crate's linked sources are: a plugin's src/ (its binary and library); a
    dependency's library root directory, without src/bin (its own programs)."""
    lib = manifest(crate).get("lib", {}).get("path", "src/lib.rs")
    if is_plugin:
        return [os.path.join(crate, "src")], []
    return [os.path.join(crate, os.path.dirname(lib))], [os.path.join(crate, "src", "bin")]


def own_files(crate, ms):
    """A member's Rust files, without those of the members nested in its directory (ipam/operator
    in ipam/)."""
    nested = [m for m in ms if m != crate and under(m, [crate])]
    for p in rust_files(os.path.join(ROOT, crate)):
        rel = os.path.relpath(p, ROOT)
        if not under(rel, nested):
            yield rel


def per_pod_files(plugins=PLUGINS):
    ms = members()
    out = set()
    for crate, is_plugin in per_pod_crates(plugins).items():
        dirs, skip = source_dirs(crate, is_plugin)
        out.update(rel for rel in own_files(crate, ms) if under(rel, dirs) and not under(rel, skip))
    return out


def product_crates():
    """Every member but the conformance suite and what lives with it (the API double)."""
    return [m for m in members() if not under(m, ["conformance"])]


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
    with tempfile.TemporaryDirectory() as d:
        ROOT = d
        self_test_layout()
    ROOT = saved
    print("structure: self-test passed (a circle, a long function and a long file are found; the "
          "per-pod crates and the product are read from the manifests)")


def self_test_layout():
    """A made-up workspace: which files each rule applies to comes from its Cargo.toml files."""
    long_fn = "fn long() {\n" + "    let x = 1;\n" * 85 + "}\n"
    long_file = "// filler\n" * (MAX_FILE_LINES + 1)
    files = {
        "Cargo.toml": '[workspace]\nmembers = ["crates/*", "plug", "plug/op", "conformance", '
                      '"conformance/double"]\n[workspace.dependencies]\nws = { path = "crates/ws" }\n',
        # The plugin: its own src/ and what it links, through path dependencies.
        "plug/Cargo.toml": '[package]\nname = "plug"\n[dependencies]\ncore = { path = "../crates/core" }\n',
        "plug/src/main.rs": "fn main() {}\n",
        # A package inside the plugin's directory: the operator's (not per pod, product).
        "plug/op/Cargo.toml": '[package]\nname = "op"\n[dependencies]\nside = { path = "../../crates/side" }\n',
        "plug/op/src/main.rs": long_fn + long_file,
        # Linked: its library; not its own programs, tests or dev-dependencies.
        "crates/core/Cargo.toml": '[package]\nname = "core"\n[dependencies]\ndeep = { path = "../deep" }\n'
                                  'serde = "1"\n[dev-dependencies]\nside = { path = "../side" }\n',
        "crates/core/src/lib.rs": "pub fn f() {}\n",
        "crates/core/src/bin/tool.rs": long_fn,
        "crates/core/tests/t.rs": long_fn,
        # Linked through core (a per-target table, a workspace dependency).
        "crates/deep/Cargo.toml": '[package]\nname = "deep"\n[target.\'cfg(unix)\'.dependencies]\nws = { workspace = true }\n',
        "crates/deep/src/lib.rs": long_fn,
        "crates/ws/Cargo.toml": '[package]\nname = "ws"\n',
        "crates/ws/src/lib.rs": long_fn,
        # Linked by no plugin: product, not per pod.
        "crates/side/Cargo.toml": '[package]\nname = "side"\n',
        "crates/side/src/lib.rs": long_fn + long_file,
        # The suites: neither.
        "conformance/Cargo.toml": '[package]\nname = "suite"\n',
        "conformance/src/lib.rs": long_fn + long_file,
        "conformance/double/Cargo.toml": '[package]\nname = "double"\n',
        "conformance/double/src/lib.rs": long_fn + long_file,
    }
    for rel, text in files.items():
        os.makedirs(os.path.join(ROOT, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(ROOT, rel), "w", encoding="utf-8") as f:
            f.write(text)
    crates = per_pod_crates(("plug",))
    assert crates == {"plug": True, "crates/core": False, "crates/deep": False, "crates/ws": False}, crates
    found = sorted((p.split(":")[0], "fn" if " fn " in p else "lines") for p in findings(("plug",)))
    assert found == [("crates/deep/src/lib.rs", "fn"), ("crates/side/src/lib.rs", "lines"),
                     ("crates/ws/src/lib.rs", "fn"), ("plug/op/src/main.rs", "lines")], found


def findings(plugins=PLUGINS):
    problems = []
    ms = members()
    for crate in ms:
        for comp in circles(edges(crate_modules(crate))):
            problems.append("import circle: " + " <-> ".join(name(crate, m) for m in comp))
    per_pod = per_pod_files(plugins)
    product = {rel for crate in product_crates() for rel in own_files(crate, ms)}
    for rel in sorted(product | per_pod):
        if is_test_file(rel):
            continue
        p = os.path.join(ROOT, rel)
        n = sum(1 for _ in open(p, encoding="utf-8"))
        if rel in product and n > MAX_FILE_LINES:
            problems.append(f"{rel}: {n} lines (at most {MAX_FILE_LINES} for product sources)")
        if rel in per_pod:
            for fname, line, lines in long_functions(p):
                problems.append(f"{rel}:{line}: fn {fname} is {lines} lines (at most {MAX_FN_LINES} on the per-pod path)")
    return problems


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
    if sys.argv[1:] == ["--per-pod"]:
        for crate, is_plugin in sorted(per_pod_crates().items()):
            print(crate + ("  (plugin)" if is_plugin else ""))
        return 0
    problems = findings()
    for p in problems:
        print(p)
    if problems:
        print(f"structure: {len(problems)} finding(s)")
        return 1
    print("structure: no import circle, no product file over "
          f"{MAX_FILE_LINES} lines, no per-pod function over {MAX_FN_LINES} lines "
          f"(per pod: {', '.join(sorted(per_pod_crates()))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
