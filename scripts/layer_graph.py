#!/usr/bin/env python3
"""Layer graph of src/ (issue 20): which layer includes and calls which.

Two views, both per layer (one folder under src/ is one layer, SPEC §2):

  includes  every `#include "<layer>/..."` line of src/<layer>/*.{c,h}
  symbols   for every object file of the shipped library, the undefined
            symbols (`nm -u`) resolved to the layer whose object defines
            them (`nm -g --defined-only`): who calls whom at link level

It prints each edge with a count (and, for symbols, a few names), then a
topological order of the layers, and exits 1 if either graph has a cycle
(e.g. node <-> session) or if a layer depends on one the order in
LOWER_FIRST puts above it.

usage: scripts/layer_graph.py [--src src] [--objs build/release/CMakeFiles/kvpeer_objs.dir/src]
"""
import argparse
import collections
import os
import re
import subprocess
import sys

# SPEC §2, lowest first (common is the shared base; ctl is the control
# transport, transport the data transport).
LOWER_FIRST = ["common", "store", "wire", "ctl", "transport", "session", "node"]
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/[^"]+"', re.M)


def include_edges(src):
    edges = collections.Counter()
    for layer in sorted(os.listdir(src)):
        d = os.path.join(src, layer)
        if not os.path.isdir(d):
            continue
        for f in sorted(os.listdir(d)):
            if not f.endswith((".c", ".h")):
                continue
            with open(os.path.join(d, f), encoding="utf-8", errors="replace") as fh:
                for dep in INCLUDE_RE.findall(fh.read()):
                    if dep != layer and os.path.isdir(os.path.join(src, dep)):
                        edges[(layer, dep)] += 1
    return edges


def nm(args, path):
    out = subprocess.run(["nm"] + args + [path], capture_output=True, text=True, check=True)
    return [line.split()[-1] for line in out.stdout.splitlines() if line.strip()]


def symbol_edges(objs):
    defined, undefined = {}, collections.defaultdict(set)
    for layer in sorted(os.listdir(objs)):
        d = os.path.join(objs, layer)
        if not os.path.isdir(d):
            continue
        for f in sorted(os.listdir(d)):
            if not f.endswith(".o"):
                continue
            p = os.path.join(d, f)
            for sym in nm(["-g", "--defined-only"], p):
                defined[sym] = layer
            undefined[layer].update(nm(["-u"], p))
    edges, names = collections.Counter(), collections.defaultdict(list)
    for layer, syms in undefined.items():
        for sym in sorted(syms):
            dep = defined.get(sym)
            if dep is not None and dep != layer:
                edges[(layer, dep)] += 1
                names[(layer, dep)].append(sym)
    return edges, names


def topo(layers, edges):
    """Kahn's algorithm, dependencies first. Returns (order, cyclic layers)."""
    deps = {l: {b for (a, b) in edges if a == l} for l in layers}
    order, left = [], set(layers)
    while True:
        ready = sorted(l for l in left if not (deps[l] & left))
        if not ready:
            return order, sorted(left)
        order += ready
        left -= set(ready)


def report(title, edges, names=None):
    print(f"== {title}: layer -> layer it depends on (count)")
    for (a, b), c in sorted(edges.items(), key=lambda e: (LOWER_FIRST.index(e[0][0]) if e[0][0] in LOWER_FIRST else 99, e[0][1])):
        extra = ""
        if names is not None:
            shown = names[(a, b)][:4]
            extra = "  e.g. " + ", ".join(shown) + (" ..." if len(names[(a, b)]) > 4 else "")
        print(f"  {a:10s} -> {b:10s} {c:4d}{extra}")
    layers = sorted({x for e in edges for x in e} | set(LOWER_FIRST))
    order, cyclic = topo(layers, edges)
    ok = True
    if cyclic:
        print(f"  CYCLE among: {', '.join(cyclic)}")
        ok = False
    else:
        print(f"  no cycle; dependency order: {' < '.join(order)}")
    for (a, b) in edges:
        if a in LOWER_FIRST and b in LOWER_FIRST and LOWER_FIRST.index(b) > LOWER_FIRST.index(a):
            print(f"  UPWARD: {a} depends on {b}, which SPEC §2 puts above it")
            ok = False
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default="src")
    ap.add_argument("--objs", default="build/release/CMakeFiles/kvpeer_objs.dir/src")
    a = ap.parse_args()
    ok = report("includes", include_edges(a.src))
    if os.path.isdir(a.objs):
        e, n = symbol_edges(a.objs)
        ok &= report(f"symbols (nm over {a.objs})", e, n)
    else:
        print(f"== symbols: {a.objs} not found (build the library first)")
        ok = False
    print("OK: no cycle, no upward dependency" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
