#!/usr/bin/env python3
"""hostile_tcpd.py -- raw-socket attacks on kvpeer's own tcp data stream
(src/transport/tcpd.h, issue 27), the port that replaced UCX's tcp.

V (the consumer under attack, UCX_TLS=tcp so every peer's blocks reach it
over the stream, started with a 256-fd limit) fetches from good peers while
attackers who know only V's stream port (from `ss -ltnp`) hold it:
  - idle connections: 64 from 127.0.0.1 (per-address cap) and 16 from each
    of 127.0.0.2 .. 127.0.0.9 (past the unauthenticated cap: eviction);
  - prefaces with a wrong token, garbage, a preface trickled 1 byte at a time;
  - 400 connect/close cycles.
Asserted: V alive; a good peer whose session (and stream) starts DURING the
flood is served (fetch ok, blocks byte-exact: verify bad=0), as is one
whose session started before it; V's RSS grew < 64 MiB. Then the attackers
go and a last fetch succeeds.

usage: hostile_tcpd.py E2E_NODE          Exit 0 = pass, 1 = fail.
"""
import os
import random
import resource
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import foreign_ucx  # noqa: E402
from foreign_ucx import Node, ucx_ports  # noqa: E402
from relib import check, log, scaled  # noqa: E402


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def conn(port, src="127.0.0.1"):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(scaled(5))
    s.bind((src, 0))
    try:
        s.connect(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    return s


def fetch_ok(v, g, first, seed):
    r = v.cmd("fetch %s %d 8 %d" % (g.id, first, seed)).split()
    check(r[:3] == ["load", "0", "8"], "V's fetch from %s: %s" % (g.id, r))
    check(v.verify(first, 8) == (8, 0), "V's blocks %d..: %s" % (first, v.verify(first, 8)))


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    e2e = sys.argv[1]
    env = dict(os.environ)
    env["UCX_TLS"] = "tcp"
    env.pop("KVPEER_E2E_PSK", None)
    v = Node(e2e, env)
    resource.prlimit(v.p.pid, resource.RLIMIT_NOFILE, (256, 256))  # a low fd limit
    g = Node(e2e, env)
    check(g.cmd("put 0 64").startswith("ok"), "G put")
    check(v.cmd("add %s" % g.id) == "ok", "V could not add G")
    fetch_ok(v, g, 0, 1)  # quiet, before the flood
    port = int(ucx_ports(v)[0])
    rss0 = rss_kib(v.p.pid)
    held = []
    for _ in range(64):
        s = conn(port)
        if s:
            held.append(s)
    for k in range(2, 10):
        for _ in range(16):
            s = conn(port, "127.0.0.%d" % k)
            if s:
                held.append(s)
    rnd = random.Random(7)
    for k in range(8):  # wrong tokens, garbage
        s = conn(port, "127.0.1.%d" % (k + 1))
        if s:
            pre = struct.pack("<IIQQ", 0x5054564B, 1, rnd.getrandbits(64), 1)
            s.sendall(pre if k % 2 == 0 else bytes(rnd.getrandbits(8) for _ in range(4096)))
            held.append(s)
    drip = conn(port, "127.0.2.1")
    for _ in range(400):  # connect/close churn
        s = conn(port, "127.0.3.%d" % rnd.randint(1, 250))
        if s:
            s.close()
    log("flood: %d sockets held on V's stream port %d" % (len(held), port))
    # a good peer whose session (and stream into V) starts during the flood
    g2 = Node(e2e, env)
    check(g2.cmd("put 0 64").startswith("ok"), "G2 put")
    check(v.cmd("add %s" % g2.id) == "ok", "V could not add G2 during the flood")
    for i in range(3):
        if drip:
            try:
                drip.send(b"K")
            except OSError:
                drip = None
        fetch_ok(v, g2, 8 + 16 * i, 3)  # distinct blocks each time
        fetch_ok(v, g, 16 + 16 * i, 1)
    check(v.alive(), "V died under the flood")
    rss1 = rss_kib(v.p.pid)
    log("V RSS %d -> %d KiB during the flood" % (rss0, rss1))
    check(rss1 - rss0 < 64 * 1024, "V's RSS grew by %d KiB" % (rss1 - rss0))
    for s in held:
        s.close()
    if drip:
        drip.close()
    time.sleep(0.2)
    fetch_ok(v, g2, 56, 3)
    for n in (g2, g, v):
        n.quit()
    log("hostile_tcpd: ok")
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    finally:
        for p in foreign_ucx.PROCS:
            if p.poll() is None:
                p.kill()
    sys.exit(rc)
