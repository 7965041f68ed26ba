#!/usr/bin/env python3
"""foreign_ucx.py -- a foreign UCX worker against a live node's data plane
(issue 27, "What to build" 1; the attacker is tests/reliability/foreign_ucx.c).

    foreign_ucx.py E2E_NODE FOREIGN_UCX [--cases LIST]

Per case (PSK or none) x (UCX transports: default, tcp): node V (e2e_node, its
own process) holds 16 known blocks; G, a good peer with the same key, fetches
8 of them. The attacker is then given V's REAL address blob (stronger than a
real attacker) and, on V's AM worker and on its RMA worker, tries put into
slots 0 and 1, a 64 KiB get from the region base, two out-of-region puts and
kvpeer's own data AM without the secret. Asserted after each attack: V alive,
V's 16 blocks byte-exact (verify: bad=0, present=16), G's next fetch of 8
blocks succeeds and is byte-exact, the attacker's get read no byte
(changed=0), and no put was acknowledged (its flush never completes: the
sends complete locally, nobody on V answers them).

The RMA worker (shm/RDMA only, never tcp) is unreachable with UCX_TLS=tcp
(asserted: connect fails). With the default transports it IS reachable from
this host through shared memory by a process of the same user: that is the
documented residual (docs/DESIGN.md, "Threat model: data plane"); the case
then runs the attacker (if we are root) as another user, and as another user
of the node's group, on both workers, and asserts that neither can read or
write; what the same-uid attacker achieved is reported, not asserted.

Exit 0 = pass, 1 = fail.
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from relib import check, fail, log, scaled  # noqa: E402

BS, NB = 65536, 64
PROCS = []


class Node:
    """An e2e_node child (tests/node/e2e_node.c), one command per line."""

    def __init__(self, binary, env):
        self.p = subprocess.Popen([binary, "127.0.0.1:0", str(BS), str(NB), "120000",
                                   str(int(scaled(2000)))],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  text=True)
        PROCS.append(self.p)
        line = self.p.stdout.readline().split()
        check(line[:1] == ["ready"], "node did not start: %r" % line)
        self.id = line[1]

    def cmd(self, c):
        check(self.p.poll() is None, "node %s died (rc %s) before %r" % (self.id, self.p.poll(), c))
        self.p.stdin.write(c + "\n")
        self.p.stdin.flush()
        while True:
            r = self.p.stdout.readline().strip()
            check(r != "", "node %s gave no answer to %r (rc %s)" % (self.id, c, self.p.poll()))
            if not r.startswith("["):
                return r
            log("  %s (UCX): %s" % (self.id, r))  # UCX logs to stdout

    def alive(self):
        return self.p.poll() is None

    def verify(self, first, count):
        r = self.cmd("verify %d %d" % (first, count)).split()
        return int(r[1]), int(r[2])

    def late_dropped(self):
        return int(self.cmd("stats").split()[10])

    def quit(self):
        self.p.stdin.write("quit\n")
        self.p.stdin.flush()
        rc = self.p.wait(timeout=scaled(30))
        check(rc == 0, "node %s exited %d" % (self.id, rc))


def attack(binary, blob, mode, env, as_ids=None):
    """as_ids: (uid, gid) to drop to before exec (we are root)."""
    pre = None
    if as_ids:
        def pre():
            os.setgroups([])
            os.setgid(as_ids[1])
            os.setuid(as_ids[0])
    r = subprocess.run([binary, blob, mode, str(int(scaled(1500)))], env=env,
                       capture_output=True, text=True, timeout=scaled(120),
                       preexec_fn=pre)
    out = {}
    for line in r.stdout.splitlines():
        w = line.split(None, 1)
        if w:
            out[w[0]] = w[1] if len(w) > 1 else ""
    check("done" in out, "attacker did not finish (rc %d): %s %s" % (r.returncode, r.stdout,
                                                                     r.stderr[-2000:]))
    return out


def run_case(e2e, foreign, psk, tls):
    env = dict(os.environ)
    env.pop("KVPEER_E2E_PSK", None)
    env.pop("UCX_TLS", None)
    if psk:
        env["KVPEER_E2E_PSK"] = psk
    if tls:
        env["UCX_TLS"] = tls
    name = "psk=%s tls=%s" % ("yes" if psk else "no", tls or "default")
    log("case %s" % name)
    v = Node(e2e, env)
    g = Node(e2e, env)
    check(v.cmd("put 0 16").startswith("ok"), "put")
    check(g.cmd("add %s" % v.id) == "ok", "G could not add V")
    r = g.cmd("fetch %s 0 8 1" % v.id).split()
    check(r[:3] == ["load", "0", "8"], "%s: G's fetch before the attack: %s" % (name, r))
    blob = v.cmd("blob").split()[1]
    dropped0 = v.late_dropped()
    a_env = dict(env)
    a_env.pop("KVPEER_E2E_PSK", None)
    am = attack(foreign, blob, "am", a_env)
    log("  AM worker: %s" % am)
    check(v.alive(), "%s: V died after the attack on its AM worker" % name)
    check(v.verify(0, 16) == (16, 0), "%s: V's blocks changed: %s" % (name, v.verify(0, 16)))
    if am.get("connect") == "ok":
        check(am.get("get", "x 0").split()[-1] == "0",
              "%s: the attacker's get read block bytes: %s" % (name, am.get("get")))
        check("flush=completed" not in am.get("put", ""),
              "%s: the attacker's put was acknowledged: %s" % (name, am.get("put")))
        # kvpeer's own AM without the secret: dropped and counted (if it got there)
        dropped = v.late_dropped() - dropped0
        log("  V dropped %d B of data AM without its secret" % dropped)
    rma = attack(foreign, blob, "rma", a_env)
    log("  RMA worker: %s" % rma)
    check(v.alive(), "%s: V died after the attack on its RMA worker" % name)
    if tls == "tcp":
        check(rma.get("connect", "").startswith("fail"),
              "%s: the RMA worker was reachable over tcp: %s" % (name, rma))
        check(v.verify(0, 16) == (16, 0), "%s: V's blocks changed: %s" % (name, v.verify(0, 16)))
    else:
        # Same host, same uid: the residual (documented). Reported, then the
        # blocks are restored by a fresh node below; a different uid must fail.
        pr, bad = v.verify(0, 16)
        log("  RESIDUAL same-host same-uid attacker on the RMA worker: put=%s get=%s -> "
            "V verify present=%d bad=%d" % (rma.get("put"), rma.get("get"), pr, bad))
    r = g.cmd("fetch %s 8 8 2" % v.id).split()
    check(r[:3] == ["load", "0", "8"], "%s: G's fetch after the attack: %s" % (name, r))
    check(g.verify(0, 16) == (16, 0), "%s: G's blocks: %s" % (name, g.verify(0, 16)))
    if not tls and os.geteuid() == 0:
        # Another user (nobody), and another user of the node's own group
        # (gid 0): UCX's sysv segments are 0660, so the group case is the one
        # that shows the RMA context has no sysv (ucx_setup.c, ucx_rma_tls).
        # The group attacker also forces sysv (UCX would otherwise try posix
        # first and stop there).
        for who, ids, a_tls in (("uid 65534 gid 65534", (65534, 65534), None),
                                ("uid 65534 gid 0 (the node's group)", (65534, 0), None),
                                ("uid 65534 gid 0, UCX_TLS=sysv,self", (65534, 0), "sysv,self")):
            v2 = Node(e2e, env)
            check(v2.cmd("put 0 16").startswith("ok"), "put")
            blob2 = v2.cmd("blob").split()[1]
            o_env = dict(a_env)
            if a_tls:
                o_env["UCX_TLS"] = a_tls
            for mode in ("rma", "am"):
                other = attack(foreign, blob2, mode, o_env, as_ids=ids)
                log("  %s worker, attacker as %s: %s" % (mode.upper(), who, other))
                check(v2.alive(), "%s: V2 died after an attack as %s" % (name, who))
                check(v2.verify(0, 16) == (16, 0), "%s: an attacker as %s changed V2's blocks: %s"
                      % (name, who, v2.verify(0, 16)))
                check(other.get("get", "x 0").split()[-1] == "0",
                      "%s: an attacker as %s read block bytes: %s" % (name, who, other.get("get")))
            v2.quit()
    g.quit()
    v.quit()
    log("case %s: ok" % name)


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    e2e, foreign = sys.argv[1], sys.argv[2]
    cases = [("", ""), ("s3cret-key-for-the-test", ""), ("", "tcp"),
             ("s3cret-key-for-the-test", "tcp")]
    try:
        for psk, tls in cases:
            run_case(e2e, foreign, psk, tls)
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()
                p.wait()
    log("foreign_ucx: all cases passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
