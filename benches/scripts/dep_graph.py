#!/usr/bin/env python3
"""The dependency graph of `vmm` (issue 31): its packages and their modules.

Prints every Rust package under `vmm/` with the workspace packages it depends
on, then each package's top-level modules and the modules each one imports
(`crate::x`, `super::x` from a crate root's child, and the other `vmm`
packages' modules by their library names). Fails (exit 1) on:

- an upward package edge: the layers run one way,
  tiervm (binary) -> tiervm-service -> tiervm-core -> tiering -> tiervm-guest,
  and a package may only depend on packages below it;
- an import cycle across top-level modules of one package (files of one
  directory module may import each other; two modules may not);
- a library (core, service) that names a crate its layer must not use
  (the core: clap, tokio, axum, hyper, utoipa, prometheus, plotters).

What is left to do is listed in `KNOWN` and printed as "known": it passes
while it does not grow, so the graph can only get better.

Run from anywhere: `python3 benches/scripts/dep_graph.py` (`.ci/run` runs it).
`--dot` prints the module graph in Graphviz form instead.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Lowest first: a package may depend only on packages earlier in this list.
LAYERS = ["tiervm-guest", "tiering", "tiervm-core", "tiervm-service", "tiervm"]

# Crates a layer must not use (directly, in [dependencies]).
FORBIDDEN = {
    "tiervm-core": ["clap", "tokio", "axum", "hyper", "hyper-util", "utoipa", "utoipa-axum",
                    "prometheus", "plotters", "tower", "tower-http", "http-body-util"],
    "tiervm-service": ["clap", "plotters"],
}

# What is still left of issue 31, allowed until it is gone: a ratchet, not a
# waiver. A forbidden crate listed here passes; a cycle passes when it is one
# of these (same package, no more modules than listed, all of them named
# here). A new cycle, a grown one, or a new forbidden crate fails.
KNOWN = {
    "forbidden": set(),
    "cycles": {},
    # Subcommands that still import another one: (importer, imported).
    "subcommands": set(),
}


def strip_code(text):
    """`text` without comments, string and char literals (they hold no imports)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", text[i:])
            if m:
                i += len(m.group(0))
                out.append("' '")
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_toml_deps(path):
    """{name: path-or-None} of a Cargo.toml's [dependencies] (not dev, not build)."""
    deps, section = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]").strip()
                continue
            if section != "dependencies" or not line or line.startswith("#"):
                continue
            m = re.match(r'([A-Za-z0-9_-]+)(\.workspace)?\s*=\s*(.*)', line)
            if not m:
                continue
            name, rest = m.group(1), m.group(3)
            pkg = re.search(r'package\s*=\s*"([^"]+)"', rest)
            deps[name] = pkg.group(1) if pkg else name
    return deps


def toml_value(path, section, key):
    cur = None
    with open(path) as f:
        for line in f:
            s = line.strip()
            if s.startswith("["):
                cur = s.strip("[]").strip()
            elif cur == section:
                m = re.match(r'%s\s*=\s*"([^"]+)"' % re.escape(key), s)
                if m:
                    return m.group(1)
    return None


def workspace_aliases():
    """Workspace dependency name -> package name (`vmm = { package = ... }`)."""
    aliases = {}
    path = os.path.join(ROOT, "Cargo.toml")
    section = None
    with open(path) as f:
        for line in f:
            s = line.strip()
            if s.startswith("["):
                section = s.strip("[]").strip()
                continue
            if section != "workspace.dependencies":
                continue
            m = re.match(r'([A-Za-z0-9_-]+)\s*=\s*(.*)', s)
            if m:
                pkg = re.search(r'package\s*=\s*"([^"]+)"', m.group(2))
                aliases[m.group(1)] = pkg.group(1) if pkg else m.group(1)
    return aliases


def packages():
    """The Rust packages under vmm/: [(dir, package name, lib crate name)]."""
    found = []
    base = os.path.join(ROOT, "vmm")
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = [d for d in dirnames if d not in ("target", "src", "tests")]
        if "Cargo.toml" in filenames:
            toml = os.path.join(dirpath, "Cargo.toml")
            name = toml_value(toml, "package", "name")
            lib = toml_value(toml, "lib", "name") or name.replace("-", "_")
            found.append((dirpath, name, lib))
    return sorted(found)


def top_module(src, path):
    """The top-level module a source file belongs to (`vstate` for src/vstate/vm.rs)."""
    rel = os.path.relpath(path, src)
    head = rel.split(os.sep)[0]
    return head[:-3] if head.endswith(".rs") else head


def module_edges(src, crate_names):
    """{module: {module or 'crate::module': set of files}} for one package's src/."""
    edges, modules = {}, set()
    roots = {"lib", "main"}
    for dirpath, _, filenames in os.walk(src):
        for fn in filenames:
            if not fn.endswith(".rs"):
                continue
            path = os.path.join(dirpath, fn)
            mod = top_module(src, path)
            modules.add(mod)
            with open(path) as f:
                code = strip_code(f.read())
            targets = set()
            # crate::a, crate::{a, b::c}, and a root child's super::a.
            for m in re.finditer(r'\bcrate::(\{[^}]*\}|\w+)', code):
                targets.update(names_in(m.group(1)))
            if mod not in roots and os.path.dirname(path) == src:
                for m in re.finditer(r'\bsuper::(\{[^}]*\}|\w+)', code):
                    targets.update(names_in(m.group(1)))
            for crate in crate_names:
                for m in re.finditer(r'\b%s::(\{[^}]*\}|\w+)' % re.escape(crate), code):
                    targets.update("%s::%s" % (crate, t) for t in names_in(m.group(1)))
            for t in targets:
                if t != mod:
                    edges.setdefault(mod, {}).setdefault(t, set()).add(os.path.relpath(path, ROOT))
    return modules, edges


def names_in(group):
    if group.startswith("{"):
        names = []
        depth, cur = 0, ""
        for ch in group[1:-1] + ",":
            if ch == "," and depth == 0:
                head = cur.strip().split("::")[0].strip()
                if re.fullmatch(r"\w+", head) and head not in ("self", "super"):
                    names.append(head)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        return names
    return [group] if group not in ("self", "super") else []


def sccs(nodes, adj):
    """Tarjan's strongly connected components."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(adj.get(v, ())):
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
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dot", action="store_true", help="print the module graph as Graphviz")
    args = ap.parse_args()

    aliases = workspace_aliases()
    pkgs = packages()
    libs = {name: lib for _, name, lib in pkgs}
    lib_to_pkg = {lib: name for name, lib in libs.items()}
    failures, known = [], []
    dot = ["digraph vmm {", "  rankdir=LR;"]

    print("== packages (lowest layer first: %s)" % " <- ".join(LAYERS))
    pkg_deps = {}
    for d, name, lib in pkgs:
        deps = parse_toml_deps(os.path.join(d, "Cargo.toml"))
        resolved = sorted({aliases.get(k, k) if v == k else v for k, v in deps.items()})
        inner = [p for p in resolved if p in LAYERS]
        pkg_deps[name] = inner
        print("%-16s (%s) -> %s" % (name, os.path.relpath(d, ROOT), ", ".join(inner) or "-"))
        for p in inner:
            if name in LAYERS and LAYERS.index(p) >= LAYERS.index(name):
                failures.append("upward package edge: %s -> %s" % (name, p))
        for bad in FORBIDDEN.get(name, []):
            if bad in resolved:
                msg = "%s depends on %s, which its layer must not use" % (name, bad)
                if (name, bad) in KNOWN["forbidden"]:
                    known.append(msg)
                else:
                    failures.append(msg)

    for d, name, lib in pkgs:
        src = os.path.join(d, "src")
        # Library names this package may import (its own deps among the vmm packages).
        others = [libs[p] for p in pkg_deps.get(name, []) if p in libs]
        own_lib = [lib] if os.path.exists(os.path.join(src, "main.rs")) and os.path.exists(os.path.join(src, "lib.rs")) else []
        modules, edges = module_edges(src, others + own_lib)
        inner = {m: {t for t in ts if t in modules} for m, ts in edges.items()}
        print()
        print("== %s: %d modules, %d files" % (name, len(modules), sum(
            1 for dp, _, fs in os.walk(src) for f in fs if f.endswith(".rs"))))
        for m in sorted(modules):
            local = sorted(t for t in edges.get(m, {}) if t in modules)
            outer = sorted(t for t in edges.get(m, {}) if "::" in t)
            line = "  %-18s -> %s" % (m, ", ".join(local) or "-")
            if outer:
                line += "   [%s]" % ", ".join(outer)
            print(line)
            for t in local:
                dot.append('  "%s::%s" -> "%s::%s";' % (lib, m, lib, t))
            for t in outer:
                dot.append('  "%s::%s" -> "%s";' % (lib, m, t))
        for comp in sccs(modules, inner):
            if len(comp) > 1:
                msg = "%s: import cycle across %d modules: %s" % (name, len(comp), ", ".join(comp))
                if set(comp) <= KNOWN["cycles"].get(name, set()):
                    known.append(msg)
                else:
                    failures.append(msg)
        for m, ts in edges.items():
            for t in ts:
                crate = t.split("::")[0] if "::" in t else None
                if crate and crate in lib_to_pkg and crate != lib:
                    p = lib_to_pkg[crate]
                    if name in LAYERS and p in LAYERS and LAYERS.index(p) >= LAYERS.index(name):
                        failures.append("upward import: %s::%s -> %s" % (name, m, t))

    # Subcommands never import each other (the binary's commands/ modules).
    for d, name, lib in pkgs:
        cmd_dir = os.path.join(d, "src", "commands")
        if not os.path.isdir(cmd_dir):
            continue
        for fn in sorted(os.listdir(cmd_dir)):
            if not fn.endswith(".rs") or fn == "mod.rs":
                continue
            me = fn[:-3]
            with open(os.path.join(cmd_dir, fn)) as f:
                code = strip_code(f.read())
            used = set()
            for m in re.finditer(r'\bcrate::commands::(\{[^}]*\}|\w+)', code):
                used.update(names_in(m.group(1)))
            for m in re.finditer(r'\bsuper::(\{[^}]*\}|\w+)', code):
                used.update(names_in(m.group(1)))
            for other in sorted(used - {me}):
                msg = "%s: subcommand %s imports subcommand %s" % (name, me, other)
                if (me, other) in KNOWN["subcommands"]:
                    known.append(msg)
                else:
                    failures.append(msg)

    dot.append("}")
    if args.dot:
        print("\n".join(dot))
    print()
    for k in known:
        print("known (issue 31, still to do): " + k)
    if failures:
        for f in failures:
            print("FAIL: " + f)
        return 1
    if known:
        print("ok: packages depend one way; nothing new beyond the %d known items above" % len(known))
    else:
        print("ok: dependencies run one way, no import cycle across modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
