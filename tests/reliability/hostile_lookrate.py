#!/usr/bin/env python3
"""hostile_lookrate.py -- issue 27: one authenticated peer floods LOOKUPs of
many keys, all misses; a good peer's fetches, quiet and under the flood, in
one run.

    hostile_lookrate.py KVPEERD_BINARY [--rate KEYS] [--window S] [--capacity]

D serves with its default budgets (or --rate: max_lookup_keys_per_sec, 0 =
no limit, the figure "before"); G is a good peer fetching 8 fresh blocks of
D again and again (hostile.GoodPeer: D puts them, G fetches, G finishes the
request); X only lends its address blob, so that the flooder completes a real
session with D (no PSK on loopback: an authenticated peer as far as D can
tell). The flooder is a separate process at the lowest priority (nice 19,
SCHED_IDLE: the model of a peer on another host, as in hostile.py), which
keeps up to 4 LOOKUPs of 65 536 keys (~0.85 MB each) in flight, answering
D's PINGs, for a window. A quiet window first runs the same process at the
same priority spinning without touching D, then the flood window.

Printed: G's fetch rate (fetches a second) and median fetch time (G's own
fetch_us) in each window, and what the flooder got (LOOKUPs answered, keys
a second, answers with the limit flag). Asserted: every fetch of G succeeded
in both windows (at least a few in each), G's fetch rate under the flood is
not below a quarter of the quiet one's divided by KVPEER_TEST_TIME_SCALE (a
collapse, not the goal: this machine's 2 cores are shared), the flood really
ran (answers received; with a key rate, answers said limit and D counted
the keys refused), D alive with /admin/verify bad=0, D's RSS bounded, G's
session still up, and every daemon exits cleanly.

--reconnect (doors2): the key rate outlives the session. The flooder, in this
process, reconnects in a loop under one peer id: handshake, one LOOKUP of
--rate all-miss keys (a whole second's worth), answer, close, again, for
--window seconds, while G fetches. Asserted: the keys D looked up for it
(asked minus D's lookup_keys refusals) stay within rate x (elapsed + 1 s)
(+1 %), G's fetches all succeed, D verify bad=0. With the bucket per session
(the old behaviour) every session got a full second's worth.

--capacity: no G and no quiet window; the flooder at normal priority with
one LOOKUP in flight measures how many keys a second D answers (with --rate
0: what D can look up; the basis of the default, docs/DESIGN.md "LOOKUP key
rate").
"""
import argparse
import os
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import relib  # noqa: E402
from relib import check, log, scaled, wait_for  # noqa: E402
import hostile as H  # noqa: E402

NB = 256
NK = 65536  # keys per LOOKUP (the wire's list limit)
F_LIMIT = 4
KEY0 = 10000000  # the flood's keys: never put anywhere


# ------------------------------------------------------------- flooder

class Flooder(H.Raw):
    """A real session with D (X's blob), then LOOKUPs of NK all-miss keys,
    `depth` in flight; a reader thread answers PINGs and counts answers."""

    def __init__(self, addr, fp, xblob, depth):
        self.lock = threading.Lock()
        super().__init__(addr, fp, NB)
        check(self.handshake(scaled(10)), "flooder: handshake with D (%s)" % self.hs_types)
        self.ack(xblob)
        self.slots = threading.Semaphore(depth)
        self.sent = self.answers = self.keys = self.limited = self.hits = 0
        self.bye = None
        self.keys_blob = b"".join(H.wkey(k) for k in range(KEY0, KEY0 + NK))
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def send(self, mtype, body):
        with self.lock:
            self.s.sendall(H.frame(mtype, self.epoch + self.peer_epoch + body))

    def lookup(self, i):
        body = self.epoch + self.peer_epoch + struct.pack("<QQI", 1 + i, 1 + i, NK)
        with self.lock:  # header, then the keys: no 0.85 MB copy per LOOKUP
            self.s.sendall(struct.pack("<IHH", len(body) + len(self.keys_blob), H.T_LOOKUP, 0) +
                           body)
            self.s.sendall(self.keys_blob)
        self.sent += 1

    def read(self):
        buf = bytearray()
        self.s.settimeout(None)
        while True:
            try:
                b = self.s.recv(1 << 20)
            except OSError:
                b = b""
            if not b:
                self.bye = self.bye or "EOF"
                self.slots.release()
                return
            buf += b
            while len(buf) >= 8:
                ln, t, fl = struct.unpack_from("<IHH", buf)
                if len(buf) < 8 + ln:
                    break
                p = bytes(buf[8:8 + ln])
                del buf[:8 + ln]
                if t == H.T_PING:
                    self.send(H.T_PONG, p[32:48])
                elif t == H.T_LOOKUP_RESP:
                    n = struct.unpack_from("<I", p, 48)[0]
                    self.answers += 1
                    self.keys += n
                    self.limited += bool(fl & F_LIMIT)
                    self.hits += p.count(1, 52, 52 + n)
                    self.slots.release()
                elif t == H.T_BYE:
                    self.bye = "BYE %d" % struct.unpack_from("<H", p, 32)[0]

    def flood(self, seconds):
        end, i = time.monotonic() + seconds, 0
        while time.monotonic() < end and self.bye is None:
            if self.slots.acquire(timeout=0.2):
                self.lookup(i)
                i += 1
        settle = time.monotonic() + scaled(10)
        while self.answers < self.sent and self.bye is None and time.monotonic() < settle:
            time.sleep(0.01)


def lowest_priority():
    os.nice(19)
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "SCHED_IDLE"
    except (AttributeError, OSError):
        return "nice-19-only"


def attacker(a):
    """--attacker: handshake, say the peer id, wait for "go" on stdin, flood
    a.seconds, print what came back. --idle: spin a.seconds instead."""
    policy = lowest_priority() if not a.normal else "normal"
    if a.idle:
        print("ATTACK ready peer=none", flush=True)
        sys.stdin.readline()
        print("ATTACK start %s idle" % policy, flush=True)
        end, n = time.monotonic() + a.seconds, 0
        while time.monotonic() < end:
            n += sum(range(1000))
        print("ATTACK done sent=0 answers=0 keys=0 limited=0 hits=0 bye=none secs=%.2f" %
              a.seconds, flush=True)
        return
    f = Flooder(a.target, a.fp, bytes.fromhex(a.blob), a.depth)
    print("ATTACK ready peer=%s" % f.peer_id, flush=True)
    sys.stdin.readline()
    print("ATTACK start %s" % policy, flush=True)
    t0 = time.monotonic()
    f.flood(a.seconds)
    secs = time.monotonic() - t0
    print("ATTACK done sent=%d answers=%d keys=%d limited=%d hits=%d bye=%s secs=%.2f" % (
        f.sent, f.answers, f.keys, f.limited, f.hits, (f.bye or "none").replace(" ", "_"), secs),
        flush=True)
    f.close()


class Window:
    """One attacker (or idle) process: started, ready, then run on go()."""

    def __init__(self, D, fp, xblob, seconds, idle=False, depth=4, normal=False):
        argv = [sys.executable, os.path.abspath(__file__), D.kvpeerd, "--attacker",
                "--target", D.peer, "--fp", str(fp), "--blob", xblob.hex(),
                "--seconds", str(seconds), "--depth", str(depth)]
        argv += (["--idle"] if idle else []) + (["--normal"] if normal else [])
        self.D, self.idle = D, idle
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.p.stdout.readline()
        check(ready.startswith("ATTACK ready"), "the attacker did not start: %r" % ready)
        self.peer = relib.kv(ready)["peer"]
        if not idle:
            wait_for(lambda: D.peer_ready(self.peer), "D's session with the flooder", 20)

    def run(self):
        """(t_start, t_end, done fields) of the window."""
        t1, t2, done = relib.attacker_go(self.p)
        return t1, t2, relib.kv(done)


# ------------------------------------------------------------- measures

def good_in(good, t1, t2):
    """(fetches a second, median fetch_us, count) of G's fetches in [t1, t2)."""
    us = [u for s, e, u in good.samples if t1 <= s and e < t2]
    return len(us) / max(t2 - t1, 1e-3), relib.median(us), len(us)


def capacity(D, fp, xblob, window):
    t1, t2, f = Window(D, fp, xblob, window, depth=4, normal=True).run()
    secs = float(f["secs"])
    log("capacity: D answered %s LOOKUPs of %d keys in %.2f s: %.0f keys/s (%s with the limit "
        "flag, %s hits)" % (f["answers"], NK, secs, int(f["keys"]) / secs, f["limited"],
                            f["hits"]))
    check(int(f["answers"]) > 0 and f["bye"] == "none", "the flood got no answers: %s" % f)


def refused_keys(D):
    return int(D.metrics().get('kvpeer_budget_refusals_total{budget="lookup_keys"}', 0))


def one_session(D, fp, xblob, peer_id, keys_blob, n):
    """A session under peer_id with one LOOKUP of n keys; True once answered."""
    r = H.Raw(D.peer, fp, NB)
    r.peer_id = peer_id
    try:
        if not r.handshake(scaled(5)):
            return False  # D still holds the last session of this id (no takeover)
        r.ack(xblob)
        body = r.epoch + r.peer_epoch + struct.pack("<QQI", 1, 1, n)
        r.s.sendall(struct.pack("<IHH", len(body) + len(keys_blob), H.T_LOOKUP, 0) + body)
        r.s.sendall(keys_blob)
        while True:
            f = r.recv_frame(scaled(10))
            check(f is not None, "the reconnecting flooder's LOOKUP got no answer")
            if f[0] == H.T_LOOKUP_RESP:
                return True
    finally:
        r.s.close()


def reconnect(D, G, fp, xblob, rate, window):
    good = H.GoodPeer(G, D)
    good.start()
    wait_for(lambda: good.ok >= 8, "the good peer's warm-up fetches", 60)
    peer_id = "hostile-%s:1" % os.urandom(4).hex()
    keys_blob = b"".join(H.wkey(k) for k in range(KEY0, KEY0 + rate))
    ok0, r0 = good.ok, refused_keys(D)
    t0 = time.monotonic()
    sessions = tries = 0
    while time.monotonic() - t0 < window:
        tries += 1
        if one_session(D, fp, xblob, peer_id, keys_blob, rate):
            sessions += 1
        else:
            time.sleep(0.005)
    elapsed = time.monotonic() - t0
    refused = refused_keys(D) - r0
    good.stop_evt.set()
    good.join(scaled(30))
    looked = sessions * rate - refused
    bound = rate * (elapsed + 1.0) * 1.01
    print("reconnect: %d sessions of one peer id (%d tries) in %.2f s, %d keys asked, %d looked "
          "up (bound rate x (elapsed + 1 s) = %.0f); G %d fetches meanwhile" %
          (sessions, tries, elapsed, sessions * rate, looked, bound, good.ok - ok0), flush=True)
    check(sessions >= 3, "too few sessions to judge (%d)" % sessions)
    check(looked <= bound, "the reconnect loop got %d keys looked up, more than %.0f" %
          (looked, bound))
    check(good.bad == 0, "G's fetches failed %d times: %s" % (good.bad, good.last_bad))
    check(good.ok - ok0 >= 3, "G was not served meanwhile (%d fetches)" % (good.ok - ok0))
    check(D.proc.poll() is None, "D died")
    v = D.verify(0, 200)
    check(v.get("bad", 1) == 0, "D verify: %s" % v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvpeerd")
    ap.add_argument("--rate", type=int, help="D's max_lookup_keys_per_sec (default: kvpeerd's)")
    ap.add_argument("--window", type=float, default=4.0)
    ap.add_argument("--capacity", action="store_true")
    ap.add_argument("--reconnect", action="store_true")
    for hidden in ("--target", "--blob"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--fp", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--depth", type=int, default=4, help=argparse.SUPPRESS)
    for flag in ("--attacker", "--idle", "--normal"):
        ap.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.attacker:
        return attacker(a)
    kvpeerd = os.path.abspath(a.kvpeerd)
    fp = H.fingerprint()
    common = relib.hostile_args(H.COMPAT, NB)
    rate = [] if a.rate is None else ["--max_lookup_keys_per_sec", str(a.rate)]
    D, G = relib.serving_pair(kvpeerd, common, rate)
    X = relib.Daemon(kvpeerd, "X", common).start()
    xblob = H.capture_blob(X.peer, fp, NB)
    D.put(0, 200)
    if a.reconnect:
        check(a.rate, "--reconnect needs --rate")
        reconnect(D, G, fp, xblob, a.rate, a.window)
        for d in (G, X, D):
            d.check_clean_exit(d.stop())
        log("PASS")
        return
    if a.capacity:  # G idle
        capacity(D, fp, xblob, a.window)
        for d in (G, X, D):
            d.check_clean_exit(d.stop())
        log("PASS")
        return
    good = H.GoodPeer(G, D)
    good.start()
    wait_for(lambda: good.ok >= 24, "the good peer's warm-up fetches", 60)
    rss0 = D.rss_kb("RssAnon")
    quiet, flood = Window(D, fp, xblob, a.window, idle=True), Window(D, fp, xblob, a.window)
    q1, q2, _ = quiet.run()
    f1, f2, f = flood.run()
    time.sleep(0.3)
    good.stop_evt.set()
    good.join(scaled(30))
    rss1 = D.rss_kb("RssAnon")
    (qr, qus, qn), (fr, fus, fn) = good_in(good, q1, q2), good_in(good, f1, f2)
    secs = float(f["secs"])
    m = D.metrics()
    refused = int(m.get('kvpeer_budget_refusals_total{budget="lookup_keys"}', 0))
    print("D max_lookup_keys_per_sec %s; flooder at nice 19 + SCHED_IDLE, %.1f s windows" %
          (a.rate if a.rate is not None else "default", a.window), flush=True)
    print("  G quiet: %.1f fetches/s, median fetch %d us (%d fetches)" % (qr, qus, qn), flush=True)
    print("  G flood: %.1f fetches/s, median fetch %d us (%d fetches)" % (fr, fus, fn), flush=True)
    print("  flood: %s LOOKUPs of %d keys answered (%.0f keys/s), %s said limit; D refused %d "
          "keys; D RssAnon %d -> %d kB" % (f["answers"], NK, int(f["keys"]) / secs, f["limited"],
                                           refused, rss0, rss1), flush=True)
    check(good.bad == 0, "G's fetches failed %d times: %s" % (good.bad, good.last_bad))
    check(qn >= 3 and fn >= 3, "too few good fetches measured (%d quiet, %d flood)" % (qn, fn))
    check(int(f["answers"]) > 0 and f["bye"] == "none", "the flood did not run: %s" % f)
    check(int(f["hits"]) == 0, "the flood's keys hit: %s" % f)
    if a.rate != 0:
        check(int(f["limited"]) > 0 and refused > 0,
              "a key rate is set, but no answer said limit (%s) / D refused %d" % (f, refused))
    check(fr >= qr / 4 / relib.SCALE, "G's fetch rate under the flood collapsed: %.1f/s vs %.1f/s"
          " quiet" % (fr, qr))
    check(G.peer_ready(D.peer), "G's session to D is gone")
    check(D.proc.poll() is None, "D died")
    v = D.verify(0, 200)
    check(v.get("bad", 1) == 0, "D verify: %s" % v)
    if relib.MEM_CHECKS:
        check(rss1 - rss0 < 32 * 1024 * relib.MEM_SLACK, "D's RssAnon grew by %d kB" %
              (rss1 - rss0))
    for d in (G, X, D):
        d.check_clean_exit(d.stop())
    log("PASS")


if __name__ == "__main__":
    main()
