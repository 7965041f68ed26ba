#!/usr/bin/env python3
"""hostile_gate.py -- the control plane's gate against a live kvpeerd (issue 27).

    hostile_gate.py KVPEERD_BINARY

D is the node under attack (RLIMIT_NOFILE 1024, as systemd's default), G a
good peer that keeps fetching 8-block batches from D the whole time
(hostile.GoodPeer). Each case: D stays alive, /healthz answers, G's fetches
all succeed (and some ran during the attack), /admin/verify bad=0 on D and G.

  flood      1100 idle TCP connects to D's control port, held 4 s (scaled):
             D's CPU over the flood from /proc/PID/stat, its log growth, the
             pre-auth refusals it counted. Without a PSK and with one.
  no_auth    (PSK, max_sessions 20) 25 connections that send a valid HELLO
             and never AUTH; then a new keyed peer K joins and fetches.
             Keyed only: without a key a valid HELLO is all the
             authentication there is, and such links are sessions.
  mirror     a stdlib client copies the fields of D's own HELLO:
             - PSK on D: it never receives a HELLO_ACK (no blob), and is
               closed at the pre-auth deadline;
             - no PSK: it gets D's blob and hands it back in its HELLO_ACK
               (own-blob reflection): refused with BYE DUPLICATE before any
               FETCH is read; D's blocks verify;
             - no PSK: while G is SIGSTOPped (1.5 s, well below D's
               dead_after), a HELLO claiming G's peer id: never acked,
               refused once G speaks again; G's session is not reaped.
"""
import argparse
import os
import resource
import signal
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import relib  # noqa: E402
from relib import check, log, scaled, wait_for  # noqa: E402
import hostile as H  # noqa: E402

HELLO_AUTH_REQUIRED = 1
BYE_DUPLICATE = 4  # kvp_bye_reason_t (wire.h)
KEY_HEX = "5f1c0ffee0ddba11" * 4  # 32 bytes


def bye_duplicate():
    """KVP_BYE_DUPLICATE from the wire header (the enum, not a guess)."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "wire",
                       "wire.h")
    for line in open(src):
        if "KVP_BYE_DUPLICATE" in line and "=" in line:
            return int(line.split("=")[1].split(",")[0])
    return BYE_DUPLICATE


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15)


def metric(d, name):
    return d.metrics().get(name, 0.0)


def refusals(d, reason):
    return metric(d, 'kvpeer_session_failures_total{reason="%s"}' % reason)


def healthz(d):
    code, _ = d.req("/healthz", timeout=5)
    return code == 200


def limited(daemon):
    """D runs with the fd limit of systemd's default unit (1024)."""
    daemon.args = ["sh", "-c", 'ulimit -n 1024 && exec "$@"', "sh"] + daemon.args
    return daemon


def start_pair(kvpeerd, tag, psk_file, extra_d=(), dead_ms=None):
    common = relib.hostile_args(H.COMPAT, H.NUM_BLOCKS)
    if psk_file:
        common += ["--psk_file", psk_file]
    if dead_ms:
        common += ["--dead_after_ms", str(dead_ms), "--heartbeat_ms", str(dead_ms // 10)]
    D = limited(relib.Daemon(kvpeerd, "D" + tag, common + list(extra_d))).start()
    G = relib.Daemon(kvpeerd, "G" + tag, common + ["--peers", D.peer]).start()
    wait_for(lambda: G.peer_ready(D.peer), "G's session to D", 20)
    D.put(0, 200)
    good = H.GoodPeer(G, D)
    good.start()
    wait_for(lambda: good.ok >= 5, "the good peer's warm-up fetches", 60)
    return D, G, good


def finish(D, G, good, what, others=()):
    good.stop_evt.set()
    good.join(scaled(60))
    check(good.bad == 0, "%s: the good peer's fetches failed %d times: %s" %
          (what, good.bad, good.last_bad))
    for d in (D, G) + tuple(others):
        v = d.verify(0, 200)
        check(v.get("bad", 1) == 0, "%s: %s's blocks do not verify: %s" % (what, d.name, v))
    for d in tuple(others) + (G, D):
        d.check_clean_exit(d.stop())


def fetches_between(good, t0, t1):
    return sum(1 for s, e, _ in good.samples if s >= t0 and e <= t1)


# ----------------------------------------------------------------- flood

def case_flood(kvpeerd, psk_file):
    what = "flood (%s)" % ("psk" if psk_file else "no psk")
    D, G, good = start_pair(kvpeerd, "f" + ("k" if psk_file else "n"), psk_file)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    log_size0, ticks0, t0 = os.path.getsize(D.logpath), cpu_ticks(D.proc.pid), time.monotonic()
    host, port = D.peer.rsplit(":", 1)
    socks = []
    for _ in range(1100):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect((host, int(port)))
        except BlockingIOError:
            pass
        socks.append(s)
    hold = scaled(4)
    health = []
    while time.monotonic() - t0 < hold:
        health.append(healthz(D))
        time.sleep(0.5)
    t1 = time.monotonic()
    ticks1 = cpu_ticks(D.proc.pid)
    for s in socks:
        s.close()
    cpu = (ticks1 - ticks0) / os.sysconf("SC_CLK_TCK") / (t1 - t0)
    grew = os.path.getsize(D.logpath) - log_size0
    during = fetches_between(good, t0, t1)
    pre = refusals(D, "preauth")
    log("%s: D's CPU %.1f %% of a core over %.1f s, log +%d B, /healthz %d/%d, good fetches "
        "during the flood %d, pre-auth refusals %d" % (what, 100 * cpu, t1 - t0, grew,
                                                        sum(health), len(health), during, pre))
    check(D.proc.poll() is None, "%s: D died" % what)
    check(all(health), "%s: /healthz failed during the flood (%s)" % (what, health))
    if not relib.WRAP:  # under valgrind every accept costs far more: no CPU bound there
        check(cpu < 0.5, "%s: D spent %.0f %% of a core over the flood" % (what, 100 * cpu))
    check(grew < 64 * 1024, "%s: D's log grew by %d bytes over the flood" % (what, grew))
    check(during >= 1, "%s: no good fetch completed during the flood" % what)
    check(pre >= 1000, "%s: only %d pre-auth refusals counted" % (what, pre))
    finish(D, G, good, what)


# --------------------------------------------------------------- no AUTH

def hello_like(theirs, peer_id, flags, epoch):
    """A HELLO that copies the layout fields of `theirs` (D's HELLO payload)."""
    off = 4
    off += 1 + theirs[off]
    off += 1 + theirs[off]
    off += 16  # D's epoch
    layout = theirs[off:off + 24]  # num_blocks, block_size, fingerprint, hash_seed
    return H.frame(H.T_HELLO, struct.pack("<HH", 1, 0) + H.wstr(peer_id) + H.wstr(peer_id) +
                   epoch + layout + os.urandom(16) +
                   struct.pack("<I", flags))


def read_frame(s, buf, timeout):
    """(type, payload, rest) or (None, None, buf) at EOF/timeout."""
    end = time.monotonic() + timeout
    while True:
        if len(buf) >= 8:
            ln, t, _ = struct.unpack("<IHH", buf[:8])
            if len(buf) >= 8 + ln:
                return t, buf[8:8 + ln], buf[8 + ln:]
        left = end - time.monotonic()
        if left <= 0:
            return None, None, buf
        s.settimeout(min(left, 0.2))
        try:
            b = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return None, None, buf
        if not b:
            return None, None, buf
        buf += b


class Mirror:
    """A stdlib client that reads D's HELLO (sent first) and copies it."""

    def __init__(self, addr, peer_id, flags):
        self.s = H.connect(addr)
        self.buf = b""
        self.types = []
        t, p, self.buf = read_frame(self.s, self.buf, scaled(5))
        check(t == H.T_HELLO, "mirror: D did not send its HELLO first (%s)" % t)
        self.d_hello = p
        off = 4
        off += 1 + p[off]
        off += 1 + p[off]
        self.d_epoch = p[off:off + 16]
        self.epoch = os.urandom(15) + b"\x01"
        self.s.sendall(hello_like(p, peer_id, flags, self.epoch))
        self.blob = None
        self.bye = None

    def pump(self, timeout):
        """Read frames until EOF/timeout; remember D's blob and BYE."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            t, p, self.buf = read_frame(self.s, self.buf, end - time.monotonic())
            if t is None:
                return False  # EOF or timeout
            self.types.append(t)
            if t == H.T_ACK:
                (n,) = struct.unpack("<I", p[48:52])
                self.blob = p[52:52 + n]
                return True
            if t == H.T_BYE:
                self.bye = struct.unpack("<H", p[32:34])[0]
        return False

    def send(self, mtype, body):
        self.s.sendall(H.frame(mtype, self.epoch + self.d_epoch + body))

    def close(self):
        self.s.close()


def case_no_auth(kvpeerd, psk_file):
    # every squatter held (the per-source cap would close most of them at
    # accept) for longer than the newcomer takes to start
    D, G, good = start_pair(kvpeerd, "a", psk_file, [
        "--max_sessions", "20", "--max_preauth", "64", "--max_preauth_per_addr", "64",
        "--preauth_timeout_ms", "60000", "--handshake_timeout_ms", "60000"])
    squat = [Mirror(D.peer, "squatter-%d:1" % i, HELLO_AUTH_REQUIRED) for i in range(25)]
    t0 = time.monotonic()
    K = relib.Daemon(kvpeerd, "Ka", ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                                     "--admin", "--block_size", "64K", "--compat", H.COMPAT,
                                     "--num_blocks", str(H.NUM_BLOCKS), "--psk_file", psk_file,
                                     "--peers", D.peer, "--shutdown_drain_ms", "500"]).start()
    wait_for(lambda: K.peer_ready(D.peer), "the keyed peer's session to D past 25 squatters",
             20)
    oks = 0
    for i in range(5):
        D.put(300 + 8 * i, 8)
        r = K.fetch(D.peer, 300 + 8 * i, 8, 7000 + i, timeout_ms=20000)
        oks += r.get("status_code") == "0" and r.get("n_ok") == "8"
        K.ok("/admin/finish?request=%d" % (7000 + i), "POST")
    during = fetches_between(good, t0, time.monotonic())
    held = metric(D, 'kvpeer_sessions{state="handshaking"}')
    check(held >= 25, "no_auth: only %d squatters still held by D" % held)
    acks = 0
    for m in squat:
        m.pump(0.05)
        acks += m.blob is not None
        m.close()
    log("no_auth: keyed newcomer %d/5 fetches ok past 25 unauthenticated HELLOs "
        "(max_sessions 20); G %d fetches meanwhile; blobs to squatters %d" % (oks, during, acks))
    check(oks == 5, "no_auth: the keyed newcomer's fetches failed (%d/5 ok)" % oks)
    check(acks == 0, "no_auth: %d keyless squatters received D's blob" % acks)
    check(refusals(D, "limit") == 0, "no_auth: D refused a session at max_sessions")
    v = K.verify(300, 40)
    check(v.get("bad", 1) == 0, "no_auth: K's fetched blocks do not verify: %s" % v)
    finish(D, G, good, "no_auth", (K,))


# ---------------------------------------------------------------- mirror

def case_mirror_keyed(kvpeerd, psk_file):
    D, G, good = start_pair(kvpeerd, "mk", psk_file, ["--preauth_timeout_ms", "1000"])
    m = Mirror(D.peer, "mirror:1", HELLO_AUTH_REQUIRED)
    got_blob = m.pump(scaled(3))
    log("mirror (psk): frames from D %s, blob %s" % (m.types, "SENT" if got_blob else "never"))
    check(not got_blob and m.blob is None, "mirror (psk): D sent its blob to a keyless client")
    m.close()
    m = Mirror(D.peer, "mirror:2", 0)  # claims no key at all
    check(not m.pump(scaled(3)), "mirror (psk, no AUTH flag): D sent its blob")
    m.close()
    finish(D, G, good, "mirror (psk)")


def case_mirror_open(kvpeerd):
    dup = bye_duplicate()
    # dead_after well above the stall below even on a loaded, sanitized run
    # (liveness may reap a peer stopped for longer: then a claim is allowed)
    D, G, good = start_pair(kvpeerd, "mo", None, dead_ms=int(scaled(8) * 1000))
    # own-blob reflection, then a FETCH into D's own slots
    m = Mirror(D.peer, "mirror:1", 0)
    check(m.pump(scaled(5)) and m.blob, "mirror (open): no blob from a keyless node "
          "(frames %s)" % m.types)
    m.send(H.T_ACK, m.d_epoch + struct.pack("<I", len(m.blob)) + m.blob)
    m.send(H.T_LOOKUP, struct.pack("<QQI", 1, 1, 8) + b"".join(H.wkey(k) for k in range(8)))
    m.send(H.T_FETCH, struct.pack("<QQII", 1, 1, 0, 8) +
           b"".join(H.wkey(k) + struct.pack("<II", k, 1) for k in range(8)))
    m.pump(scaled(3))
    log("mirror (open, own blob): frames %s, BYE %s" % (m.types, m.bye))
    check(m.bye == dup, "mirror (open): own-blob reflection not refused (BYE %s)" % m.bye)
    check(H.T_FETCH_DONE not in m.types and H.T_LOOKUP_RESP not in m.types,
          "mirror (open): D answered after the reflected blob: %s" % m.types)
    m.close()
    v = D.verify(0, 200)
    check(v.get("bad", 1) == 0, "mirror (open): D's blocks changed: %s" % v)
    # peer-id takeover while G is stopped (less than dead_after)
    before = [p for p in D.peers() if p.get("peer") == G.peer]
    G.proc.send_signal(signal.SIGSTOP)
    try:
        t = Mirror(D.peer, G.peer, 0)
        acked = t.pump(1.5)
    finally:
        G.proc.send_signal(signal.SIGCONT)
    if not acked:
        t.pump(scaled(20))
    log("mirror (open, takeover of stopped G): frames %s, BYE %s" % (t.types, t.bye))
    check(not acked and t.blob is None, "mirror (open): a claim of G's id was acked while G "
          "was stopped")
    check(t.bye == dup, "mirror (open): the claim of G's id was not refused (BYE %s)" % t.bye)
    t.close()
    wait_for(lambda: G.peer_ready(D.peer), "G's session after SIGCONT", 10)
    after = [p for p in D.peers() if p.get("peer") == G.peer]
    check(refusals(D, "identity") >= 2, "mirror (open): identity refusals not counted")
    check(refusals(D, "dead") == 0, "mirror (open): G's session was reaped")
    log("G on D before %s, after %s" % (before, after))
    finish(D, G, good, "mirror (open)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvpeerd")
    a = ap.parse_args()
    kvpeerd = os.path.abspath(a.kvpeerd)
    psk_file = os.path.join(relib.TMP, "psk")
    fd = os.open(psk_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, (KEY_HEX + "\n").encode())
    os.close(fd)
    case_flood(kvpeerd, None)
    case_flood(kvpeerd, psk_file)
    case_no_auth(kvpeerd, psk_file)
    case_mirror_keyed(kvpeerd, psk_file)
    case_mirror_open(kvpeerd)
    log("hostile_gate: OK")


if __name__ == "__main__":
    main()
