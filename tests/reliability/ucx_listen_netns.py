#!/usr/bin/env python3
"""ucx_listen_netns.py -- UCX's tcp data port listens only on the interface of
the control listen address (issue 27).

    ucx_listen_netns.py E2E_NODE

Two network namespaces made here (removed on every exit path, relib), joined
by a veth pair: A has 10.199.R.1/24 (plus its own lo, 127.0.0.1), B has
10.199.R.2/24. Node A (tests/node/e2e_node.c) listens on 10.199.R.1:0, node B
on 10.199.R.2:0; both with UCX_TLS=tcp so that the data really crosses the
veth (namespaces do not separate shared memory). B fetches 8 blocks from A.
Then `ss -ltnp` inside A: every TCP listener of A's process (control port
and UCX's data port) must be on 10.199.R.1 -- none on 127.0.0.1 or any
wildcard. Before the fix UCX's tcp transport listened on every interface.

Exit 0 pass, 1 fail, 77 skip (no root / no `ip netns`).
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from relib import check, log, netns_add, scaled, sh  # noqa: E402

BS, NB = 65536, 64
PROCS = []


class NsNode:
    def __init__(self, binary, ns, listen, env):
        self.p = subprocess.Popen(["ip", "netns", "exec", ns, binary, listen, str(BS), str(NB),
                                   "120000", str(int(scaled(2000)))],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                  text=True)
        PROCS.append(self.p)
        line = self.p.stdout.readline().split()
        check(line[:1] == ["ready"], "node in %s did not start: %r" % (ns, line))
        self.id = line[1]

    def cmd(self, c):
        check(self.p.poll() is None, "node %s died before %r" % (self.id, c))
        self.p.stdin.write(c + "\n")
        self.p.stdin.flush()
        while True:
            r = self.p.stdout.readline().strip()
            check(r != "", "node %s gave no answer to %r" % (self.id, c))
            if not r.startswith("["):  # UCX logs to stdout
                return r

    def quit(self):
        self.p.stdin.write("quit\n")
        self.p.stdin.flush()
        check(self.p.wait(timeout=scaled(30)) == 0, "node %s exit code" % self.id)


def listeners(ns, pid_re):
    """(local address, port) of every TCP listener of the process(es) whose
    ss users field matches pid_re, inside namespace ns."""
    out = sh("ss", "-ltnpH", ns=ns).stdout
    got = []
    for line in out.splitlines():
        if not re.search(pid_re, line):
            continue
        local = line.split()[3]
        host, _, port = local.rpartition(":")
        got.append((host.strip("[]"), port))
    return got


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    e2e = sys.argv[1]
    if os.geteuid() != 0 or subprocess.run(["ip", "netns", "list"],
                                           capture_output=True).returncode != 0:
        print("SKIP: needs root and ip netns")
        return 77
    r = os.getpid() % 200 + 20
    a, b = "kvpA%d" % os.getpid(), "kvpB%d" % os.getpid()
    va, vb = "kva%d" % (os.getpid() % 100000), "kvb%d" % (os.getpid() % 100000)
    try:
        netns_add(a)
        netns_add(b)
        sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        sh("ip", "link", "set", va, "netns", a)
        sh("ip", "link", "set", vb, "netns", b)
        sh("ip", "addr", "add", "10.199.%d.1/24" % r, "dev", va, ns=a)
        sh("ip", "addr", "add", "10.199.%d.2/24" % r, "dev", vb, ns=b)
        sh("ip", "link", "set", va, "up", ns=a)
        sh("ip", "link", "set", vb, "up", ns=b)
    except (RuntimeError, OSError) as e:
        print("SKIP: network namespaces unavailable: %s" % e)
        return 77
    env = dict(os.environ)
    env["UCX_TLS"] = "tcp"
    env.pop("UCX_NET_DEVICES", None)
    # A namespace address is not loopback: the node refuses to listen there
    # without a pre-shared key (issue 27), so both nodes share one.
    env["KVPEER_E2E_PSK"] = "netns-listen-test-key-" + os.urandom(8).hex()
    try:
        na = NsNode(e2e, a, "10.199.%d.1:0" % r, env)
        nb = NsNode(e2e, b, "10.199.%d.2:0" % r, env)
        check(na.cmd("put 0 16").startswith("ok"), "put")
        check(nb.cmd("add %s" % na.id) == "ok", "B could not add A")
        res = nb.cmd("fetch %s 0 8 1" % na.id).split()
        check(res[:3] == ["load", "0", "8"], "B's fetch from A over the veth: %s" % res)
        check(nb.cmd("verify 0 8").split()[1:] == ["8", "0"], "B's blocks")
        # the e2e_node process (ip netns exec execs it: same pid)
        got = listeners(a, r"pid=%d," % na.p.pid)
        log("A (pid %d) listens on: %s" % (na.p.pid, got))
        check(len(got) >= 2, "expected the control port and UCX's tcp port, got %s" % got)
        other = [g for g in got if g[0] != "10.199.%d.1" % r]
        check(not other, "A listens beyond its listen address: %s" % other)
        nb.quit()
        na.quit()
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.kill()
                p.wait()
    log("ucx_listen_netns: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
