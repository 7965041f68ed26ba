#!/usr/bin/env python3
"""house_numbers.py -- issue 31's figures of the house, printed, for a
before/after in one place:

    scripts/house_numbers.py [--tree DIR] [--lib DIR] [--list]

  files in src/ over 800 lines          (wc -l)
  functions in src/ over 60 lines       (universal ctags, start to end line)
  session fields the node touches       (distinct `->field` of kvp_session_t
                                         variables in src/node/*.c: the
                                         variables declared kvp_session_t *)
  session functions the node calls      (distinct names declared in
                                         src/session/session.h called from src/node)
  state writes outside their setters    (`->state =`, `->phase =` assignments
                                         outside the kvp__*_set_state/_phase functions;
                                         a line with a `/* house: reason */` comment
                                         is listed apart as justified, not counted)
  unpins outside the release helper     (kvp_store_unpin( outside session/release.c
                                         and the store itself; one with a
                                         `/* house: reason */` comment on its line
                                         or just above is listed apart, not counted)
  non-API symbols shipped               (the release libkvpeer.so's dynamic symbols
                                         not declared KVP_EXPORT in include/kvpeer.h, and
                                         libkvpeer.a's global symbols not named kvp_*/kvp__*
                                         -- the per-layer check is tests/build)

--list names every item counted. Heuristics, stated: a field access is
counted when the variable's declaration in the same file says
`kvp_session_t *NAME`; a function's length is ctags' end line minus its
start line plus one.
"""
import argparse
import os
import re
import subprocess
import sys


def src_files(tree, sub, exts=(".c", ".h")):
    out = []
    for d, _, fs in os.walk(os.path.join(tree, sub)):
        out += [os.path.join(d, f) for f in fs if f.endswith(exts)]
    return sorted(out)


def long_files(tree):
    res = []
    for f in src_files(tree, "src"):
        n = sum(1 for _ in open(f, errors="replace"))
        if n > 800:
            res.append((n, os.path.relpath(f, tree)))
    return sorted(res, reverse=True)


def long_functions(tree):
    files = src_files(tree, "src", (".c",))
    out = subprocess.run(["ctags", "--c-kinds=f", "--fields=+ne", "-o", "-"] + files,
                         capture_output=True, text=True, check=True).stdout
    res = []
    for line in out.splitlines():
        parts = line.split("\t")
        f = dict(p.split(":", 1) for p in parts[3:] if ":" in p)
        if "line" in f and "end" in f:
            n = int(f["end"]) - int(f["line"]) + 1
            if n > 60:
                res.append((n, "%s %s" % (os.path.relpath(parts[1], tree), parts[0])))
    return sorted(res, reverse=True)


def session_api(tree):
    text = open(os.path.join(tree, "src", "session", "session.h")).read()
    return set(re.findall(r"\b(kvp__\w+)\s*\(", text))


def node_session_use(tree):
    fields, calls = set(), set()
    api = session_api(tree)
    for f in src_files(tree, os.path.join("src", "node"), (".c",)):
        text = open(f).read()
        names = set(re.findall(r"kvp_session_t\s*\*\s*(?:const\s+)?(\w+)", text))
        for v in names:
            for fld in re.findall(r"\b%s->(\w+)" % re.escape(v), text):
                fields.add(fld)
        calls |= {c for c in re.findall(r"\b(kvp__\w+)\s*\(", text) if c in api}
    return sorted(fields), sorted(calls)


def state_writes(tree):
    """Writes outside the setters; those whose line carries a `/* house:
    <reason> */` comment are listed apart (justified, shown with --list),
    not counted."""
    res, justified = [], []
    for f in src_files(tree, "src", (".c",)):
        cur = None
        for i, line in enumerate(open(f), 1):
            m = re.match(r"^\w[\w\s\*]*?\b(\w+)\s*\(", line)
            if m and not line.rstrip().endswith(";"):
                cur = m.group(1)
            if re.search(r"->(state|phase)\s*=[^=]", line) and not (
                    cur and re.search(r"set_(state|phase)", cur)):
                item = "%s:%d %s (in %s)" % (os.path.relpath(f, tree), i, line.strip(), cur)
                (justified if "/* house: " in line else res).append(item)
    return res, justified


def unpins(tree):
    """Unpins outside the helper; one whose line, or the comment line just
    above it, says `/* house: <reason> */` is listed apart (justified)."""
    res, justified = [], []
    for f in src_files(tree, "src", (".c",)):
        rel = os.path.relpath(f, tree)
        if rel.startswith("src/store/") or rel == "src/session/release.c":
            continue
        prev = ""
        for i, line in enumerate(open(f), 1):
            if "kvp_store_unpin(" in line:
                item = "%s:%d %s" % (rel, i, line.strip())
                ok = "/* house: " in line or prev.strip().startswith("/* house: ")
                (justified if ok else res).append(item)
            prev = line
    return res, justified


def shipped(tree, lib):
    api = set(re.findall(r"KVP_EXPORT\s[^;{]*?\b(kvp_\w+)\s*\(",
                         open(os.path.join(tree, "include", "kvpeer.h")).read()))
    so, a = os.path.join(lib, "libkvpeer.so"), os.path.join(lib, "libkvpeer.a")
    res_so = res_a = None
    if os.path.exists(so):
        out = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True,
                             text=True).stdout
        syms = {ln.split()[-1] for ln in out.splitlines() if ln.split()[1:2] and
                ln.split()[1] in "TDBRVW"}
        res_so = sorted(s for s in syms if s not in api and not s.startswith("_"))
    if os.path.exists(a):
        out = subprocess.run(["nm", "-g", "--defined-only", a], capture_output=True,
                             text=True).stdout
        syms = {ln.split()[-1] for ln in out.splitlines() if len(ln.split()) == 3}
        res_a = sorted(s for s in syms if not re.match(r"kvp_|kvp__", s))
    return res_so, res_a


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   ".."))
    ap.add_argument("--lib", help="directory of the release libkvpeer.so/.a "
                                  "(default TREE/build/release)")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    tree = os.path.abspath(a.tree)
    lib = a.lib or os.path.join(tree, "build", "release")
    fl, fn = long_files(tree), long_functions(tree)
    fields, calls = node_session_use(tree)
    (sw, sw_ok), (up, up_ok) = state_writes(tree), unpins(tree)
    so, ar = shipped(tree, lib)
    rows = [("files in src/ over 800 lines", fl), ("functions in src/ over 60 lines", fn),
            ("session fields the node touches", fields),
            ("session functions the node calls", calls),
            ("state writes outside their setters", sw),
            ("  justified in place (/* house: */)", sw_ok),
            ("unpins outside the release helper", up),
            ("  justified in place (/* house: */)", up_ok),
            ("non-API symbols in libkvpeer.so", so),
            ("non-kvp globals in libkvpeer.a", ar)]
    for name, items in rows:
        if items is None:
            print("%-38s (no library in %s)" % (name, lib))
            continue
        print("%-38s %d" % (name, len(items)))
        if a.list:
            for it in items:
                print("    %s" % (it if isinstance(it, str) else "%d %s" % it))
    return 0


if __name__ == "__main__":
    sys.exit(main())
