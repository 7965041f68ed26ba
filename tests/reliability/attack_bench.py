#!/usr/bin/env python3
"""attack_bench.py -- issue 27: a good peer's throughput quiet and under each
attack on a node's doors, in one run.

    attack_bench.py KVPEERD [--bench] [--pairs N] [--window S] [--only a,b]

Two set-ups, one after the other, each a daemon D under systemd's default fd
limit (1024, set with prlimit) serving a good peer G (hostile.GoodPeer: D puts
8 fresh blocks, G fetches them, again and again):
  keyed  D and G share a PSK (psk_file): what a host without the key meets;
  open   no PSK (loopback: allowed without `insecure`): a client that copies
         D's HELLO completes a session, so the key holder's abuses run here
         (X, a third daemon, lends its address blob to those sessions).
Each attack is a separate process at the lowest priority (nice 19 and
SCHED_IDLE: the model of a host elsewhere, as in hostile.py), looping its
attack for the window. Windows alternate quiet, attack (--pairs of them per
attack); a quiet window runs the same process at the same priority spinning
without touching D (an idle CPU wakes slower). Figures per attack: G's
fetches a second and median fetch (G's own fetch_us, HTTP not in it), quiet
and under attack, their ratio, what the attacker did, D's RssAnon.

Attacks (the doors of issue 27's "Why"):
  ctl_battery     hostile.py's malformed-frame battery on the control port
                  (oversized, huge counts, bad strings, garbage, bad blobs, bursts)
  preauth_flood   1100 idle connects held, dropped, again (fd limit 1024)
  no_auth         (keyed) 25 HELLOs that never AUTH, held, again
  mirror          D's own HELLO copied back: keyed, refused at AUTH; open,
                  D's own blob reflected and G's peer id claimed (refused)
  stream_flood    D's data-stream port: 200 idle, wrong secrets, garbage, churn
  http_slowloris  70 HTTP sockets from 7 addresses sending one header line,
                  plus log/page injection URLs
  lookup_flood    (open) an authenticated peer: LOOKUPs of 65 536 keys, 4 deep
  pin_hold        (open) an authenticated peer: LOOKUPs of D's blocks, never
                  fetched, fresh requests (pins, leases)
(The foreign UCX worker has no door left to knock on: neither UCX context
listens on tcp -- ucx_listen_netns.py and foreign_ucx.py show it.)

Asserted per attack: D alive, every fetch of G succeeded, G fetched in every
attack window, G's rate not collapsed (>= 0.2 / KVPEER_TEST_TIME_SCALE of the
quiet rate; the goal, 0.8, is printed by --bench), /admin/verify bad=0 on D
and G, D's fds back. At the end: D's RssAnon bounded, clean exits.
"""
import argparse
import os
import random
import resource
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import relib  # noqa: E402
from relib import check, log, scaled, wait_for  # noqa: E402
import hostile as H  # noqa: E402
import hostile_gate as HG  # noqa: E402
import hostile_lookrate as HL  # noqa: E402

NB = H.NUM_BLOCKS
HELD = NB - 6  # D's blocks 0..HELD-1 before each attack: pinned all, G's 8 would not fit
KEYED_ONLY = {"no_auth"}
OPEN_ONLY = {"lookup_flood", "pin_hold"}
ATTACKS = ["ctl_battery", "preauth_flood", "no_auth", "mirror", "stream_flood",
           "http_slowloris", "lookup_flood", "pin_hold"]


# ------------------------------------------------------------- attacks
# Each: setup(a) -> state (before "ready"), run(a, state, end) -> dict of
# counts. The window is what lies between "start" and "done".

def quiet_sock(addr, src=None):
    try:
        return H.connect(addr, src)
    except OSError:
        return None


def att_ctl_battery(a, st, end):
    bat = H.battery(a.target, a.fp, bytes.fromhex(a.blob), a.lim)
    names, n, refused = list(bat), 0, 0
    while time.monotonic() < end:
        try:
            bat[names[n % len(names)]]()
        except OSError:
            refused += 1  # refused at once (a cap): a result too
        n += 1
    return {"shots": n, "refused": refused}


def att_preauth_flood(a, st, end):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    host, port = a.target.rsplit(":", 1)
    conns = rounds = 0
    while time.monotonic() < end:
        socks = []
        for _ in range(1100):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect((host, int(port)))
            except (BlockingIOError, OSError):
                pass
            socks.append(s)
        conns += len(socks)
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        for s in socks:
            s.close()
        rounds += 1
    return {"conns": conns, "rounds": rounds}


def att_no_auth(a, st, end):
    held = n = 0
    while time.monotonic() < end:
        ms = []
        for i in range(25):
            try:
                ms.append(HG.Mirror(a.target, "squatter-%d:1" % i, HG.HELLO_AUTH_REQUIRED))
            except OSError:
                pass
        n += len(ms)
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        for m in ms:
            held += m.blob is None
            m.close()
    return {"conns": n, "blobs": n - held}


def att_mirror(a, st, end):
    n = blobs = 0
    while time.monotonic() < end:
        try:
            if a.psk:
                m = HG.Mirror(a.target, a.good_id, HG.HELLO_AUTH_REQUIRED)
                blobs += m.pump(0.5) and m.blob is not None
            else:
                m = HG.Mirror(a.target, "mirror-%d:1" % n, 0)  # own-blob reflection
                if m.pump(2.0) and m.blob:
                    m.send(H.T_ACK, m.d_epoch + struct.pack("<I", len(m.blob)) + m.blob)
                    m.pump(0.5)
                m.close()
                m = HG.Mirror(a.target, a.good_id, 0)  # G's id while G's session is live
                blobs += m.pump(0.5) and m.blob is not None
            m.close()
        except OSError:
            pass
        n += 1
    return {"shots": n, "blobs_to_claims": blobs}


def att_stream_flood(a, st, end):
    host, port = a.data.rsplit(":", 1)
    rnd = random.Random(7)
    held, n = [], 0

    def conn(src):
        try:
            s = socket.create_connection((host, int(port)), timeout=2, source_address=(src, 0))
            return s
        except OSError:
            return None
    while time.monotonic() < end:
        for s in held:
            s.close()
        held = [s for s in (conn("127.0.0.%d" % (2 + i % 8)) for i in range(128)) if s]
        for k in range(8):
            s = conn("127.0.1.%d" % (k + 1))
            if s:
                try:
                    s.sendall(struct.pack("<IIQQ", 0x5054564B, 1, rnd.getrandbits(64), 1) if k % 2
                              else bytes(rnd.getrandbits(8) for _ in range(4096)))
                except OSError:
                    pass
                held.append(s)
        for _ in range(100):
            s = conn("127.0.3.%d" % rnd.randint(1, 250))
            if s:
                s.close()
        n += len(held) + 100
        time.sleep(min(0.5, max(0.0, end - time.monotonic())))
    for s in held:
        s.close()
    return {"conns": n}


INJECT = ["/peers%0a2026-12-05T00:00:00Z%20INFO%20forged", "/metrics?x=%1b[31mred",
          "/healthz/%e2%80%ae", "/admin/corrupt", "/%00%0d%0a"]


def att_http_slowloris(a, st, end):
    host, port = a.http.rsplit(":", 1)
    n = injected = 0
    while time.monotonic() < end:
        socks = []
        for i in range(70):
            s = socket.socket()
            try:
                s.bind(("127.0.4.%d" % (1 + i % 7), 0))
                s.settimeout(2)
                s.connect((host, int(port)))
                s.sendall(b"GET /healthz HTTP/1.1\r\n")
                socks.append(s)
            except OSError:
                s.close()
        for path in INJECT:
            try:
                s = socket.create_connection((host, int(port)), timeout=2,
                                             source_address=("127.0.5.1", 0))
                s.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n")
                s.recv(4096)
                s.close()
                injected += 1
            except OSError:
                pass
        n += len(socks)
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
        for s in socks:
            s.close()
    return {"conns": n, "injected": injected}


def setup_lookup_flood(a):
    return HL.Flooder(a.target, a.fp, bytes.fromhex(a.blob), 4)


def att_lookup_flood(a, f, end):
    f.flood(max(0.0, end - time.monotonic()))
    r = {"lookups": f.answers, "limited": f.limited, "bye": (f.bye or "none").replace(" ", "_")}
    f.close()
    return r


def setup_pin_hold(a):
    r = H.Raw(a.target, a.fp, NB)
    check(r.handshake(scaled(10)), "pin_hold: handshake with D (%s)" % r.hs_types)
    r.ack(bytes.fromhex(a.blob))
    return r


def att_pin_hold(a, r, end):
    req = hits = lookups = 0
    while time.monotonic() < end:
        req += 1
        k = (req * 64) % 256
        r.lookup(req, req, list(range(k, min(k + 64, HELD))))
        for f in r.answers(2.0, until=(H.T_LOOKUP_RESP, H.T_BYE)):
            if f[0] == "LOOKUP_RESP":
                hits += sum(f[1])
                lookups += 1
            elif f[0] in ("BYE", "EOF"):
                return {"lookups": lookups, "hits": hits, "bye": f}
    r.close()
    return {"lookups": lookups, "hits": hits}


class Refused(OSError):
    pass


def no_fail(cond, msg):
    """The attacker's stand-in for relib.check inside the clients it borrows
    (hostile_gate.Mirror): a refusal by D is the expected result, not a
    failure of the run (relib.fail would print FAIL into the protocol)."""
    if not cond:
        raise Refused(msg)


def attacker(a):
    HG.check = no_fail
    policy = HL.lowest_priority()
    st = None
    if not a.idle and "setup_" + a.attacker in globals():
        st = globals()["setup_" + a.attacker](a)
    print("ATTACK ready", flush=True)
    sys.stdin.readline()
    print("ATTACK start %s" % policy, flush=True)
    end = time.monotonic() + a.seconds
    if a.idle:
        n = 0
        while time.monotonic() < end:
            n += sum(range(1000))
        r = {}
    else:
        r = globals()["att_" + a.attacker](a, st, end)
    print("ATTACK done " + " ".join("%s=%s" % kv for kv in r.items()), flush=True)


# ------------------------------------------------------------- windows

class Window:
    def __init__(self, argv, idle):
        self.p = subprocess.Popen(argv + (["--idle"] if idle else []), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        ready = self.p.stdout.readline()
        check(ready.startswith("ATTACK ready"), "the attacker did not start: %r" % ready)

    def run(self):
        return relib.attacker_go(self.p)


def measure(setup, name, argv, pairs):
    D, G, good = setup["D"], setup["G"], setup["good"]
    quiet, attack, did = [], [], []
    for _ in range(pairs):
        for idle in (True, False):
            if not idle:  # G's churn evicts them: the attack finds D's blocks again
                D.put(0, HELD)
            w = Window(argv, idle)
            t1, t2, done = w.run()
            (quiet if idle else attack).append(HL.good_in(good, t1, t2) + (t2 - t1,))
            if not idle:
                did.append(done)
            time.sleep(0.3)
    alive = D.proc.poll() is None
    check(alive, "%s/%s: D died" % (setup["mode"], name))

    def agg(ws):
        n = sum(w[2] for w in ws)
        secs = sum(w[3] for w in ws)
        us = relib.median([w[1] for w in ws if w[2]])
        return n / max(secs, 1e-3), us, n
    (qr, qus, qn), (ar, aus, an) = agg(quiet), agg(attack)
    ratio = ar / qr if qr else 0.0
    v = D.verify(0, 200)
    rss = D.rss_kb("RssAnon")
    row = "%-6s %-15s %6.1f/s %6d us | %6.1f/s %6d us | %5.2f | D RssAnon %6d kB | %s" % (
        setup["mode"], name, qr, qus, ar, aus, ratio, rss, did[-1])
    log(row)
    check(good.bad == 0, "%s/%s: G's fetches failed %d times: %s" % (setup["mode"], name,
                                                                    good.bad, good.last_bad))
    check(all(w[2] >= 1 for w in attack), "%s/%s: a window with no good fetch: %s" %
          (setup["mode"], name, [w[2] for w in attack]))
    check(ratio >= 0.2 / relib.SCALE, "%s/%s: G's rate collapsed: %.1f/s vs %.1f/s quiet" %
          (setup["mode"], name, ar, qr))
    check(v.get("bad", 1) == 0, "%s/%s: D's blocks do not verify: %s" % (setup["mode"], name, v))
    return row, ratio


def start_setup(kvpeerd, mode, psk_file):
    common = relib.hostile_args(H.COMPAT, NB) + (["--psk_file", psk_file] if psk_file else [])
    # KVPEER_ATTACK_D_ARGS: extra flags for D only (a mutation, e.g. a budget lifted)
    extra = os.environ.get("KVPEER_ATTACK_D_ARGS", "").split()
    D = relib.Daemon(kvpeerd, "D" + mode, common + ["--data_port", "0"] + extra).start()
    resource.prlimit(D.proc.pid, resource.RLIMIT_NOFILE, (1024, 1024))
    G = relib.Daemon(kvpeerd, "G" + mode, common + ["--peers", D.peer]).start()
    wait_for(lambda: G.peer_ready(D.peer), "G's session to D", 20)
    xblob = os.urandom(96)
    if not psk_file:
        X = relib.Daemon(kvpeerd, "X" + mode, common).start()
        xblob = H.capture_blob(X.peer, H.fingerprint(), NB)
    else:
        X = None
    D.put(0, 200)
    good = H.GoodPeer(G, D)
    good.start()
    wait_for(lambda: good.ok >= 8, "the good peer's warm-up fetches", 60)
    return {"mode": mode, "D": D, "G": G, "X": X, "good": good, "blob": xblob,
            "rss0": D.rss_kb("RssAnon"), "fds0": H.fd_count(D.proc.pid)}


def data_addr(D):
    """D's data-stream listener: the one TCP port of D's that is neither
    its control nor its HTTP port (ss, as ucx_listen_netns.py reads it)."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    own = {D.peer.rsplit(":", 1)[1], D.http.rsplit(":", 1)[1]}
    for line in out.splitlines():
        if "pid=%d," % D.proc.pid in line:
            local = line.split()[3]
            port = local.rsplit(":", 1)[1]
            if port not in own:
                return "127.0.0.1:" + port
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvpeerd")
    ap.add_argument("--bench", action="store_true", help="3 pairs of 4 s windows; the goal")
    ap.add_argument("--pairs", type=int)
    ap.add_argument("--window", type=float)
    ap.add_argument("--only", help="comma-separated attack names")
    for hidden in ("--attacker", "--target", "--blob", "--data", "--http", "--good_id"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--fp", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--lim", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--psk", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--idle", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.attacker:
        return attacker(a)
    kvpeerd = os.path.abspath(a.kvpeerd)
    pairs = a.pairs or (3 if a.bench else 1)
    window = a.window or (4.0 if a.bench else 2.0)
    only = set(a.only.split(",")) if a.only else set(ATTACKS)
    lim = scaled(H.HS_MS / 1000.0) + 3
    psk_file = os.path.join(relib.TMP, "attack.psk")
    fd = os.open(psk_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(HG.KEY_HEX + "\n")
    rows, ratios = [], []
    for mode in ("keyed", "open"):
        names = [n for n in ATTACKS if n in only and
                 not (mode == "keyed" and n in OPEN_ONLY) and
                 not (mode == "open" and n in KEYED_ONLY)]
        if not names:
            continue
        s = start_setup(kvpeerd, mode, psk_file if mode == "keyed" else None)
        D = s["D"]
        data = data_addr(D)
        check(data is not None, "%s: D's data-stream port not found (ss)" % mode)
        for name in names:
            argv = [sys.executable, os.path.abspath(__file__), kvpeerd, "--attacker", name,
                    "--target", D.peer, "--data", data, "--http", D.http, "--fp",
                    str(H.fingerprint()), "--blob", s["blob"].hex(), "--lim", str(lim),
                    "--good_id", s["G"].peer, "--seconds", str(window)]
            argv += ["--psk"] if mode == "keyed" else []
            row, ratio = measure(s, name, argv, pairs)
            rows.append(row)
            ratios.append(ratio)
            wait_for(lambda: H.fd_count(D.proc.pid) <= s["fds0"] + 4,
                     "%s/%s: D's fds back to %d" % (mode, name, s["fds0"]), 20)
        s["good"].stop_evt.set()
        s["good"].join(scaled(30))
        rss1 = D.rss_kb("RssAnon")
        log("%s: D RssAnon %d -> %d kB over %d attacks" % (mode, s["rss0"], rss1, len(names)))
        if relib.MEM_CHECKS:
            check(rss1 - s["rss0"] < 48 * 1024 * relib.MEM_SLACK, "%s: D's RssAnon grew by %d kB"
                  % (mode, rss1 - s["rss0"]))
        gv = s["G"].verify(0, 200)
        check(gv.get("bad", 1) == 0, "%s: G's blocks do not verify: %s" % (mode, gv))
        for d in [x for x in (s["X"], s["G"], D) if x]:
            d.check_clean_exit(d.stop())
    print("good peer G, fetches of 8 x 64 KiB from D: quiet vs under each attack "
          "(%d pair(s) of %.1f s windows; attacker at nice 19 + SCHED_IDLE; load %s)" %
          (pairs, window, open("/proc/loadavg").read().split()[0]), flush=True)
    print("mode   attack           quiet rate  median | attack rate  median | ratio | ...",
          flush=True)
    for r in rows:
        print(r, flush=True)
    if a.bench:
        print("goal (every ratio >= 0.80): %s" % ("met" if min(ratios) >= 0.8 else "NOT met"),
              flush=True)
    log("PASS")


if __name__ == "__main__":
    sys.exit(main())
