#!/usr/bin/env python3
"""death_loop.py -- a peer's death never takes the process down (issue 14).

Repeats, RUNS times per case: two e2e_node processes (tests/node/e2e_node.c),
the source holds BLOCKS blocks, the consumer starts one fetch of all of them,
and after a random 0..KILL_MS ms one of the two is SIGKILLed mid-fetch:

  kill-source    the consumer must survive, report the load (failed, or OK
                 if it finished first) within dead-after, hold no FILLING or
                 QUARANTINED slot on an AM path (proof=am-refuse: released at
                 once) and every block it committed must verify byte-exact;
                 then it quits cleanly (exit 0).
  kill-consumer  the source must survive, keep answering, and quit cleanly.

Cases: tcp (UCX_TLS=tcp: kvpeer's AM path, "am-tcp") and shm (default UCX
settings on one host: "direct-shm"). A "death" is a survivor that exited,
crashed or stopped answering. Exit status 0 only if every run of every case
passed. Figures are printed per case; use --mutation to show what the harness
catches (e.g. 7 = ucx-emulated-put, the pre-issue-14 data path).

--external (issue 29): both processes in external-slots mode (e2e_ext.c): the
process owns its region, the source publishes its blocks, the consumer fetches
into slots it names (kvp_fetch_into) and reuses a slot with its own pattern the
moment it is handed back (a failed block at once, a held one at its
KVP_EV_SLOTS_RELEASED). On top of the checks above: every held slot is handed
back within the bound (a proof: the source's exit, or the AM path's refusal),
no reuse pattern is broken by a late landing, the node never holds a slot the
embedding owns (kvp_slots_held), and the source, unpublishing everything just
before the consumer dies (the transfer's slots answer BUSY), gets every
published slot back (at once, or by KVP_EV_SLOT_FREE) with its blocks unchanged.
A third of the source's blocks are published once for the fetch's request
(kvp_publish_once): those its fetch completed come back by SLOT_FREE alone
(unpublish answers NOT_FOUND; in a quarter of the kill-consumer runs the
load is done before the unpublish and the kill), the rest as above.

  death_loop.py build/release/tests/node/e2e_node --runs 100 [--external]
"""
import argparse
import os
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time


def scale():
    try:
        return max(1.0, float(os.environ.get("KVPEER_TEST_TIME_SCALE", "1")))
    except ValueError:
        return 1.0


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Dead(Exception):
    pass


class Node:
    def __init__(self, exe, listen, bs, nb, hold_ms, dead_ms, tls, mutation, external=False):
        env = dict(os.environ)
        env.pop("KVPEER_E2E_EXTERNAL", None)
        if external:
            env["KVPEER_E2E_EXTERNAL"] = "1"
        if tls:
            env["UCX_TLS"] = tls
        else:
            env.pop("UCX_TLS", None)
        if mutation:
            env["KVPEER_E2E_MUTATION"] = str(mutation)
        self.errf = tempfile.TemporaryFile(mode="w+")
        self.p = subprocess.Popen(
            [exe, listen, str(bs), str(nb), str(hold_ms), str(dead_ms)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errf,
            env=env, text=True, bufsize=1)
        line = self.readline(30 * scale())
        if not line.startswith("ready "):
            raise Dead("no ready line: %r" % line)
        self.id = line.split()[1]

    def alive(self):
        return self.p.poll() is None

    def readline(self, timeout):
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise Dead("no answer within %.1f s" % timeout)
            r, _, _ = select.select([self.p.stdout], [], [], left)
            if self.p.stdout in r:
                line = self.p.stdout.readline()
                if not line:
                    raise Dead("stdout closed (exit %s)" % self.p.poll())
                if " UCX " in line and line.startswith("["):
                    continue  # UCX logs to stdout (e.g. a reconnect refused by the dead peer)
                return line

    def cmd(self, text, timeout=30):
        if not self.alive():
            raise Dead("exited %s" % self.p.returncode)
        try:
            self.p.stdin.write(text + "\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise Dead("stdin: %s" % e)
        return self.readline(timeout * scale())

    def kill(self):
        if self.alive():
            self.p.send_signal(signal.SIGKILL)
        self.p.wait()
        self.close_pipes()

    def quit(self, timeout=20):
        """quit -> exit status (None if it had to be killed)."""
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        try:
            rc = self.p.wait(timeout * scale())
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        self.close_pipes()
        return rc

    def close_pipes(self):
        for f in (self.p.stdin, self.p.stdout):
            try:
                f.close()
            except OSError:
                pass

    def err_tail(self, n=6):
        try:
            self.errf.seek(0)
            return "".join(self.errf.readlines()[-n:])
        except (OSError, ValueError):
            return ""

    def describe_exit(self):
        rc = self.p.poll()
        if rc is None:
            return "running"
        if rc < 0:
            return "killed by signal %d" % -rc
        return "exit %d" % rc


def stats(node):
    f = node.cmd("stats").split()
    keys = ("ready filling quarantined suspect pins retained force mismatches "
            "am_refuse late_dropped").split()
    d = dict.fromkeys(keys, 0)  # a tree without the AM counters reports 8 fields
    d.update(zip(keys, (int(x) for x in f[1:])))
    return d


# The same-host paths into memory UCX did not allocate (external slots).
EXTERNAL_SHM_PATHS = ("am-shm", "direct-cma")


def want_paths(case, external):
    if case == "tcp":
        return ("am-tcp",)
    return EXTERNAL_SHM_PATHS if external else ("direct-shm",)


def check_external_consumer(dst, blocks, status, n_held, dead_ms):
    """After the source's death: held slots back by a proof within the bound,
    no late landing, the node's view and the embedding's agree. (ok, note)."""
    bound = int(5 * dead_ms * scale())
    r = dst.cmd("settle %d" % bound, timeout=bound / 1000.0 + 20).split()
    if r[0] != "settle":
        return False, "settle: %s" % " ".join(r)
    lent, held, pub, took = (int(x) for x in r[1:5])
    if lent or held:
        return False, "%d lent / %d held slots not back %d ms after the load (n_held %d)" % (
            lent, held, took, n_held)
    v = dst.cmd("verify 0 %d" % blocks, timeout=60).split()
    if int(v[3]) != 0:
        return False, "%d slots reused by the embedding were written later" % int(v[3])
    if int(v[4]) != 0:
        return False, "the node holds %d slots the embedding owns" % int(v[4])
    return True, "n_held %d back in %d ms" % (n_held, took)


def check_external_source(src, blocks, dead_ms, r):
    """The source unpublished everything just before the consumer's death (r:
    its answer): every published slot back, its blocks unchanged."""
    if r[0] != "unpub" or int(r[1]) + int(r[2]) != blocks:
        return False, "unpublish: %s" % " ".join(r)
    bound = int(5 * dead_ms * scale())
    s = src.cmd("settle %d" % bound, timeout=bound / 1000.0 + 20).split()
    if s[0] != "settle" or s[1:4] != ["0", "0", "0"]:
        return False, "slots not back after unpublish: %s" % " ".join(s)
    v = src.cmd("verify 0 %d" % blocks, timeout=60).split()
    if v[0] != "verify" or int(v[1]) != blocks or int(v[2]) or int(v[4]):
        return False, "the source's blocks after the consumer's death: %s" % " ".join(v)
    return True, "unpublished %s at once, %s by SLOT_FREE (all back in %s ms)" % (r[1], r[2], s[4])


def one_run(a, exe, case, victim, blocks, bs, kill_ms, dead_ms, mutation, rng):
    """Returns (ok, note, fail_ms)."""
    tls = "tcp" if case == "tcp" else None
    want = want_paths(case, a.external)
    listen = "127.0.0.1:%d" % free_port()
    node_dead = int(dead_ms * scale())  # as test_node_e2e: every bound scaled
    src = Node(exe, listen, bs, blocks + 16, 60000, node_dead, tls, mutation, a.external)
    dst = None
    try:
        dst = Node(exe, "127.0.0.1:0", bs, blocks + 16, 60000, node_dead, tls, mutation,
                   a.external)
        # external: a third of the blocks published once for the fetch's request (1)
        r = src.cmd("put 0 %d%s" % (blocks, " 1" if a.external else ""))
        if not r.startswith("ok %d" % blocks):
            return False, "put: %s" % r.strip(), None
        r = dst.cmd("add %s" % src.id)
        if r.strip() != "ok":
            return False, "add: %s" % r.strip(), None
        path = dst.cmd("path %s" % src.id).split()[1]
        if path not in want and not a.any_path:
            return False, "data path %s, expected %s" % (path, " or ".join(want)), None
        a.paths[path] = a.paths.get(path, 0) + 1
        r = dst.cmd("fetchnw %s 0 %d 1" % (src.id, blocks))
        if r.strip() != "started":
            return False, "fetchnw: %s" % r.strip(), None
        time.sleep(rng.uniform(0, kill_ms) / 1000.0)
        first = a.external and victim == "consumer" and rng.random() < 0.25
        if first:
            # a quarter of the runs: the load done first, so the blocks published
            # once come back by their fetch alone (unpublish: NOT_FOUND)
            r = dst.cmd("wait %d" % int(10 * dead_ms * scale()), timeout=30)
            if not r.startswith("load 0 "):
                return False, "the load before the consumer's death: %s" % r.strip(), None
        if victim == "source":
            survivor, dead = dst, src
        else:
            survivor, dead = src, dst
        unpub = None
        if a.external and victim == "consumer":  # mid-transfer: pinned slots answer BUSY
            unpub = src.cmd("unpub 0 %d" % blocks).split()
        t0 = time.monotonic()
        dead.kill()
        if victim == "source":
            r = dst.cmd("wait %d" % int(10 * dead_ms * scale()), timeout=20)
            fail_ms = (time.monotonic() - t0) * 1000.0
            parts = r.split()
            if parts[0] != "load":
                return False, "no load result: %s" % r.strip(), fail_ms
            status = int(parts[1])
            if status != 0 and fail_ms > dead_ms * scale():
                return False, "load failed after %.0f ms > dead-after %d ms" % (
                    fail_ms, dead_ms), fail_ms
            v = dst.cmd("verify 0 %d" % blocks, timeout=60).split()
            if v[0] != "verify" or int(v[2]) != 0:
                return False, "committed blocks fail verification: %s" % " ".join(v), fail_ms
            n_held = int(parts[5]) if len(parts) > 5 else 0
            ext_note = ""
            if a.external:
                if case == "tcp" and n_held:
                    return False, "%d slots held on an AM path" % n_held, fail_ms
                ok, ext_note = check_external_consumer(dst, blocks, status, n_held, dead_ms)
                if not ok:
                    return False, ext_note, fail_ms
            st = stats(dst)
            if st["filling"] != 0:
                return False, "%d slots still FILLING" % st["filling"], fail_ms
            if case == "tcp" and status != 0 and st["quarantined"] != 0:
                return False, "%d slots quarantined on an AM path" % st["quarantined"], fail_ms
            note = "status %d ok %s verified %s quarantined %d am_refuse %d late_dropped %d %s" % (
                status, parts[2], v[1], st["quarantined"], st["am_refuse"], st["late_dropped"],
                ext_note)
        else:
            fail_ms = None
            ext_note = ""
            if a.external:
                ok, ext_note = check_external_source(src, blocks, dead_ms, unpub)
                if not ok:
                    return False, ext_note, fail_ms
                if first:
                    ext_note = "(load done first) " + ext_note
            time.sleep(1.5 * dead_ms * scale() / 1000.0)  # past dead-after: teardown ran
            st = stats(src)
            note = "retained %d pins %d %s" % (st["retained"], st["pins"], ext_note)
        rc = survivor.quit()
        if rc != 0:
            return False, "survivor did not quit cleanly (%s)" % (
                "hung" if rc is None else survivor.describe_exit()), fail_ms
        return True, note, fail_ms
    except Dead as e:
        who = "consumer" if victim == "source" else "source"
        s = dst if victim == "source" else src
        how = s.describe_exit() if s is not None else "?"
        tail = s.err_tail() if s is not None else ""
        return False, "DEATH of the %s (%s): %s\n%s" % (who, how, e, tail), None
    finally:
        for n in (src, dst):
            if n is not None:
                if n.alive():
                    n.kill()
                n.errf.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("e2e_node")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--cases", default="tcp,shm")
    ap.add_argument("--victims", default="source,consumer")
    ap.add_argument("--blocks", type=int, default=800)
    ap.add_argument("--block-size", type=int, default=262144)
    ap.add_argument("--kill-ms", type=float, default=20.0, help="kill after uniform 0..this")
    ap.add_argument("--dead-after", type=int, default=1000)
    ap.add_argument("--mutation", type=int, default=0)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--any-path", action="store_true",
                    help="do not insist on the data path (to run an older tree's e2e_node)")
    ap.add_argument("--external", action="store_true",
                    help="external-slots mode (issue 29): the process owns the region")
    a = ap.parse_args()
    a.paths = {}
    seed = a.seed if a.seed is not None else int(time.time())
    rng = random.Random(seed)
    print("death_loop: %s, %d runs per case, %d x %d B, kill after 0..%.0f ms, dead-after %d ms, "
          "seed %d, time scale %.1f%s%s" % (a.e2e_node, a.runs, a.blocks, a.block_size, a.kill_ms,
                                            a.dead_after, seed, scale(),
                                            ", MUTATION %d" % a.mutation if a.mutation else "",
                                            ", EXTERNAL slots" if a.external else ""))
    total_bad = 0
    for case in a.cases.split(","):
        for victim in a.victims.split(","):
            bad, deaths, fails = 0, 0, []
            t0 = time.monotonic()
            for i in range(a.runs):
                ok, note, fail_ms = one_run(a, a.e2e_node, case, victim, a.blocks,
                                            a.block_size, a.kill_ms, a.dead_after,
                                            a.mutation, rng)
                if fail_ms is not None:
                    fails.append(fail_ms)
                if not ok:
                    bad += 1
                    deaths += note.startswith("DEATH")
                    print("  %s kill-%s run %d: FAIL %s" % (case, victim, i + 1, note.rstrip()))
                elif os.environ.get("KVPEER_TEST_VERBOSE"):
                    print("  %s kill-%s run %d: %s" % (case, victim, i + 1, note))
            fails.sort()
            lat = ""
            if fails:
                lat = ", load reported %.0f / %.0f ms after the kill (median / max)" % (
                    fails[len(fails) // 2], fails[-1])
            print("%s kill-%s: %d runs, %d process deaths, %d failed checks%s (%.0f s; paths %s)" % (
                case, victim, a.runs, deaths, bad - deaths, lat, time.monotonic() - t0,
                ", ".join("%s %d" % kv for kv in sorted(a.paths.items()))))
            a.paths = {}
            sys.stdout.flush()
            total_bad += bad
    print("death_loop: %s" % ("PASS" if total_bad == 0 else "FAIL (%d bad runs)" % total_bad))
    return 0 if total_bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
