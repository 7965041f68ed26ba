#!/usr/bin/env python3
"""foreign_ucx.py -- a foreign UCX worker against a live node's data plane
(issue 27, "What to build" 1; the attacker is tests/reliability/foreign_ucx.c).

    foreign_ucx.py E2E_NODE FOREIGN_UCX [FOREIGN_UCT] [--strict-uct]

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

Below UCP (FOREIGN_UCT, tests/reliability/foreign_uct.c): a raw UCT tcp
endpoint to every other tcp port V listens on (from `ss -ltnp`) sends tcp's
internal PUT_REQ into slot 15 of V's region, and, each on a fresh node, to
address 0x10 and an AM longer than UCX's RX_SEG_SIZE. UCX's tcp receiver
executes PUT_REQ from anyone (uct_tcp_ep_handle_put_req memcpy()s to the
requested address; measured on 1.13 and 1.22 before issue 27's fix: the
block changed, the node died of SIGSEGV and of libuct's assertion). kvpeer
no longer gives UCX any tcp (its own stream, src/transport/tcpd.h, is the
only other port): asserted that none of the three lands and V stays alive
(--strict-uct, now the default, is accepted and changes nothing).

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
STRICT_UCT = True  # issue 27: kvpeer's own tcp stream; UCX has no tcp
RESIDUALS = []


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


def ucx_ports(node):
    """V's listening tcp ports other than its control port: UCX's tcp iface."""
    ctl = node.id.rsplit(":", 1)[1]
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True,
                         timeout=scaled(30)).stdout
    ports = []
    for line in out.splitlines():
        w = line.split()
        if len(w) > 5 and "pid=%d," % node.p.pid in line:
            port = w[3].rsplit(":", 1)[1]
            if port != ctl:
                ports.append(port)
    return ports


def uct_attack(foreign_uct, blob, port, target, env, must_finish=True):
    r = subprocess.run([foreign_uct, blob, "127.0.0.1", port, target, str(int(scaled(1500)))],
                       env=env, capture_output=True, text=True, timeout=scaled(120))
    out = {}
    for line in r.stdout.splitlines():
        w = line.split(None, 1)
        if w:
            out[w[0]] = w[1] if len(w) > 1 else ""
    if must_finish:
        check("done" in out, "UCT attacker did not finish (rc %d): %s %s" % (r.returncode, r.stdout,
                                                                             r.stderr[-2000:]))
    elif "done" not in out:
        # the attacker's own UCX would not send the frame (UCX 1.22's wheel
        # aborts the over-long AM in the sender): the frame was never sent
        log("  the UCT attacker could not send %s (rc %d): not measured on this UCX"
            % (target, r.returncode))
        out["unsent"] = str(r.returncode)
    return out


def run_uct(e2e, foreign_uct, name, v, g, env, a_env, crash):
    """UCT tcp PUT_REQ into slot 15 of V, then (crash) at 0x10 of a fresh node."""
    ports = ucx_ports(v)
    check(ports, "%s: no UCX tcp port of V in `ss -ltnp`" % name)
    for port in ports:
        u = uct_attack(foreign_uct, v.cmd("blob").split()[1], port, "15", a_env)
        log("  UCT tcp port %s: %s" % (port, u))
        check(u.get("connect") == "ok", "%s: the UCT attacker could not connect: %s" % (name, u))
        check(v.alive(), "%s: V died after the UCT PUT_REQ into its region" % name)
        pr, bad = v.verify(0, 16)
        bad = v.verify(15, 1)[1]  # slot 15 only (the same-uid RMA residual wrote 0 and 1)
        msg = "%s: UCT PUT_REQ port %s: flush %s, V verify 0-15 present=%d, slot 15 bad=%d" % (
            name, port, u.get("flush"), pr, bad)
        if bad or u.get("flush") == "completed":
            msg = ("%s: UCT tcp PUT_REQ into slot 15 LANDED (flush %s; V verify 0-15 "
                   "present=%d, slot 15 bad=%d)" % (name, u.get("flush"), pr, bad))
            RESIDUALS.append(msg)
            log("  !!! RESIDUAL " + msg)
        if STRICT_UCT:
            check(bad == 0 and u.get("flush") != "completed", "--strict-uct: " + msg)
    # a fresh good peer (G holds blocks 0-15 already); blocks 2-9, which no
    # attack here writes (the same-uid RMA residual writes 0 and 1)
    g2 = Node(e2e, env)
    check(g2.cmd("add %s" % v.id) == "ok", "G2 could not add V")
    r = g2.cmd("fetch %s 2 8 3" % v.id).split()
    check(r[:3] == ["load", "0", "8"], "%s: G2's fetch after the UCT attack: %s" % (name, r))
    check(g2.verify(2, 8) == (8, 0), "%s: G2's blocks: %s" % (name, g2.verify(2, 8)))
    g2.quit()
    if not crash:
        return
    # one frame each, on a fresh node: a PUT_REQ at 0x10 (SIGSEGV in libuct's
    # memcpy) and an AM longer than the node's RX_SEG_SIZE (libuct's assert)
    for target, what in (("@10", "PUT_REQ at address 0x10"),
                         ("am100000", "AM of 100000 B (> RX_SEG_SIZE)")):
        v3 = Node(e2e, env)
        port = ucx_ports(v3)[0]
        u = uct_attack(foreign_uct, v3.cmd("blob").split()[1], port, target, a_env,
                       must_finish=False)
        try:
            rc = v3.p.wait(timeout=scaled(5))
        except subprocess.TimeoutExpired:
            rc = None
        log("  UCT tcp %s: %s -> node %s" % (what, u, "alive" if rc is None else
                                             "DIED rc %s" % rc))
        if rc is not None:
            msg = "%s: UCT tcp %s KILLED the node (rc %s)" % (name, what, rc)
            RESIDUALS.append(msg)
            log("  !!! RESIDUAL " + msg)
        if STRICT_UCT:
            check(rc is None, "--strict-uct: the node died of a UCT tcp %s (rc %s)" % (what, rc))
        if rc is None:
            v3.quit()


def run_case(e2e, foreign, psk, tls, foreign_uct=None):
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
    if foreign_uct:
        run_uct(e2e, foreign_uct, name, v, g, env, a_env, crash=(tls == "tcp" and not psk))
    g.quit()
    v.quit()
    log("case %s: ok" % name)


def main():
    args = [a for a in sys.argv[1:] if a != "--strict-uct"]
    if len(args) < 2:
        print(__doc__)
        return 2
    e2e, foreign = args[0], args[1]
    foreign_uct = args[2] if len(args) > 2 else None
    cases = [("", ""), ("s3cret-key-for-the-test", ""), ("", "tcp"),
             ("s3cret-key-for-the-test", "tcp")]
    try:
        for psk, tls in cases:
            run_case(e2e, foreign, psk, tls, foreign_uct)
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r in RESIDUALS:
        log("!!! RESIDUAL (UCX tcp PUT_REQ, docs/DESIGN.md): %s" % r)
    log("foreign_ucx: all cases passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
