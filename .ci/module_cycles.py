#!/usr/bin/env python3
"""Module dependency cycles and file sizes in a Rust crate's src/ (top-level modules as nodes).

module_cycles.py SRC_DIR...   prints the cycles (strongly connected groups of 2+ modules) and the
                              largest non-test source files; exits 1 if any cycle exists.
Run by e2e/test-all.sh over proxy/src and cache-core/src: a cycle fails the suite.
A module is a top-level file or folder under src/; an edge A -> B is any `crate::B` path in A's code
outside `#[cfg(test)]` blocks (approximated: text before the first `#[cfg(test)]`).
"""
import os
import re
import sys


def graph(src):
    mods = {}
    for entry in os.listdir(src):
        p = os.path.join(src, entry)
        name = entry[:-3] if entry.endswith(".rs") else entry
        if name in ("lib", "main"):
            continue
        files = [p] if p.endswith(".rs") else [os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs if f.endswith(".rs")]
        if files:
            mods.setdefault(name, []).extend(files)
    edges, sizes = {m: set() for m in mods}, []
    for m, files in mods.items():
        for f in files:
            text = re.split(r"\n#\[cfg\(test\)\]\s*\nmod tests", open(f, encoding="utf-8", errors="replace").read())[0]
            sizes.append((text.count("\n"), os.path.relpath(f)))
            for dep in re.findall(r"\bcrate::([a-z_][a-z0-9_]*)", text):
                if dep in mods and dep != m:
                    edges[m].add(dep)
            for dep in re.findall(r"\bsuper::([a-z_][a-z0-9_]*)", text) if os.path.dirname(f) == src else []:
                if dep in mods and dep != m:
                    edges[m].add(dep)
    return edges, sizes


def sccs(edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    return out


bad = False
allsizes = []
for src in sys.argv[1:]:
    edges, sizes = graph(src)
    allsizes += sizes
    for comp in sccs(edges):
        bad = True
        print("cycle in %s: %s" % (os.path.relpath(src), " <-> ".join(comp)))
allsizes.sort(reverse=True)
print("largest non-test files: " + ", ".join("%s %d" % (f, n) for n, f in allsizes[:4]))
sys.exit(1 if bad else 0)
