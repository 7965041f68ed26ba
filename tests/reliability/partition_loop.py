#!/usr/bin/env python3
"""partition_loop.py -- repeat partition.py and count daemon crashes (issue 14).

    partition_loop.py KVPEERD_BINARY --runs 50 [--jobs 1] [--keep DIR]

Runs tests/reliability/partition.py RUNS times (JOBS at a time: each run has
its own network namespaces, so runs can overlap; overlapping runs load the
machine more). Per run it prints pass/fail, every daemon that ended on its
own (signal or exit code, read from relib's exit report, KVPEER_REL_REPORT)
with its crash site: a core file's backtrace (gdb; cores are enabled for the
run and written to the run's directory) or else UCX's own backtrace / fatal
line / sanitizer report from the daemon's log. A post-heal fetch failure is a
run whose "fetch from A after healing" failed for good ("no fetch from A
succeeded after healing"). A crash is a daemon killed by a signal (SIGSEGV,
SIGABRT from an assertion, ...); a daemon that exited with an error code is
listed but counted among the other failures. Last line:

    partition-loop: N runs, X daemon crashes, Y post-heal fetch failures

Exit status 0 only if every run passed. A run's directory (logs, cores) is
removed when it passed and kept under --keep (default /tmp) when it did not.
"""
import argparse
import glob
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PARTITION = os.path.join(HERE, "partition.py")

# lines of a daemon log that name where it died
SITE_RE = re.compile(r"(Caught signal|Assertion|Fatal|unexpected error|ucs_fatal|"
                     r"==== backtrace|^\s*\d+\s+0x[0-9a-f]+ |ERROR: AddressSanitizer|"
                     r"runtime error:|SUMMARY: |malloc\(\)|free\(\)|corrupted|double free)")


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def gdb_bt(exe, core):
    if shutil.which("gdb") is None:
        return "(no gdb)"
    r = subprocess.run(["gdb", "-batch", "-nx", "-ex", "set pagination off",
                        "-ex", "bt 25", "-ex", "info threads", exe, core],
                       capture_output=True, text=True, timeout=300)
    keep = [l for l in r.stdout.splitlines()
            if l.startswith("#") or l.startswith("Program terminated") or
            re.match(r"^\*?\s+\d+\s+Thread", l)]
    return "\n".join(keep[:60])


def log_site(logpath, n=40):
    try:
        with open(logpath, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return "(no log)"
    hits = [l for l in lines if SITE_RE.search(l)]
    return "\n".join(hits[:n]) if hits else "\n".join(lines[-8:])


def one_run(a, i):
    d = tempfile.mkdtemp(prefix="partloop%03d-" % (i + 1), dir=a.keep)
    report = os.path.join(d, "report.tsv")
    env = dict(os.environ, KVPEER_REL_REPORT=report, KVPEER_KEEP_TMP="1", TMPDIR=d)
    t0 = time.monotonic()
    load0 = load()
    with open(os.path.join(d, "partition.out"), "w") as out:
        # cores of the daemons (kvpeerd inherits the limit) land in cwd = d
        p = subprocess.Popen([sys.executable, PARTITION, a.kvpeerd], cwd=d, env=env,
                             stdout=out, stderr=subprocess.STDOUT,
                             preexec_fn=lambda: resource.setrlimit(
                                 resource.RLIMIT_CORE,
                                 (resource.RLIM_INFINITY, resource.RLIM_INFINITY)))
        try:
            rc = p.wait(a.timeout)
        except subprocess.TimeoutExpired:
            p.terminate()  # partition.py's handler removes its daemons and namespaces
            try:
                rc = p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
    took = time.monotonic() - t0
    text = open(os.path.join(d, "partition.out"), errors="replace").read()
    crashes, exits = [], []
    try:
        rows = [l.rstrip("\n").split("\t") for l in open(report)]
    except OSError:
        rows = []
    cores = glob.glob(os.path.join(d, "core*"))
    for name, how, pid, logpath in rows:
        if how in ("alive", "stopped exit 0"):
            continue  # still up when the script ended, or a clean exit on request
        if "signal" not in how:  # an exit code: a failure partition.py reports, not a crash
            exits.append("daemon %s: %s\n    %s" % (name, how, log_site(logpath, 8).replace(
                "\n", "\n    ")))
            continue
        site = None
        for c in cores:
            if c.endswith("." + pid) or len(cores) == 1:
                site = "core %s:\n%s" % (c, gdb_bt(a.kvpeerd, c))
        if site is None:
            site = "log %s:\n%s" % (logpath, log_site(logpath))
        crashes.append((name, how, site))
    heal_fail = "no fetch from A succeeded after healing" in text
    ok = rc == 0 and "\nPASS" in text and not crashes
    fail_line = ""
    m = re.search(r"^FAIL.*$", text, re.M)
    if m:
        fail_line = m.group(0)[:300]
    res = dict(i=i + 1, ok=ok, rc=rc, took=took, load=load0, crashes=crashes, exits=exits,
               heal_fail=heal_fail, fail=fail_line, dir=d,
               skipped=rc == 77)
    if ok or rc == 77:
        shutil.rmtree(d, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kvpeerd")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600.0, help="per run, seconds")
    ap.add_argument("--keep", default=tempfile.gettempdir(),
                    help="where failed runs' directories (logs, cores) stay")
    a = ap.parse_args()
    a.kvpeerd = os.path.abspath(a.kvpeerd)
    print("partition-loop: %s, %d runs, %d at a time, load %s, time scale %s" % (
        a.kvpeerd, a.runs, a.jobs, load(), os.environ.get("KVPEER_TEST_TIME_SCALE", "1")),
        flush=True)
    lock = threading.Lock()
    todo = list(range(a.runs))
    results = []

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            r = one_run(a, i)
            with lock:
                results.append(r)
                state = "SKIP" if r["skipped"] else "PASS" if r["ok"] else "FAIL"
                print("run %d: %s (%.0f s, load %s)%s%s" % (
                    r["i"], state, r["took"], r["load"],
                    "" if r["ok"] else " rc %s, kept %s" % (r["rc"], r["dir"]),
                    "\n  " + r["fail"] if r["fail"] else ""), flush=True)
                for name, how, site in r["crashes"]:
                    print("  CRASH daemon %s: %s\n    %s" % (
                        name, how, site.replace("\n", "\n    ")), flush=True)
                for e in r["exits"]:
                    print("  EXIT (not a crash) " + e, flush=True)
                if r["heal_fail"]:
                    print("  POST-HEAL FETCH FAILED", flush=True)

    threads = [threading.Thread(target=worker) for _ in range(max(1, a.jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    n = len(results)
    crashes = sum(len(r["crashes"]) for r in results)
    heal = sum(r["heal_fail"] for r in results)
    skipped = sum(r["skipped"] for r in results)
    other = sum(1 for r in results if not r["ok"] and not r["crashes"] and not r["heal_fail"]
                and not r["skipped"])
    print("partition-loop: %d runs, %d daemon crashes, %d post-heal fetch failures"
          "%s%s (load now %s)" % (n, crashes, heal,
                                  ", %d other failures" % other if other else "",
                                  ", %d skipped" % skipped if skipped else "", load()),
          flush=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
