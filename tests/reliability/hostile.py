#!/usr/bin/env python3
"""hostile.py -- hostile control-plane clients against a live kvpeerd (issue 9).

    hostile.py KVPEERD_BINARY [--bench] [--pairs N] [--window SECONDS]

Daemon D serves; daemon G is a well-behaved peer that keeps fetching from D
through the admin API the whole time; daemon X (another layout: 128 blocks)
is a real kvpeer whose address blob the hostile clients borrow, and whose
region, filled with known blocks, shows whether D ever wrote to it.
Meanwhile raw TCP clients speak the wire format (SPEC §4) wrongly on purpose.

Single cases, each asserted (closed by D within the handshake timeout,
scaled; protocol error counted where the peer broke a rule; a log line that
names the peer for the post-handshake cases; no session or endpoint left):
  oversized   a header declaring a 4 GiB frame
  prehs_list  a LOOKUP with a huge list count before the handshake
  bad_str     a HELLO whose string length runs past the frame
  truncated   half a frame, then close
  garbage     a valid, compatible HELLO followed by random bytes
  one_byte    a valid HELLO written one byte at a time (must be answered:
              the parser resumes at any byte boundary)
  slowloris   one byte every 100 ms, never completing (handshake timeout)
  no_read     a valid HELLO, then never reading its socket
  flood       200 idle connections at once
HELLO_ACK blob for another layout -- the client completes the HELLO exchange
(no pre-shared key is configured, so no AUTH is exchanged: D answers our
HELLO with its HELLO and HELLO_ACK at once, asserted), then acks with:
  ack_random       random bytes
  ack_truncated    X's real blob cut in half
  ack_other_layout X's real, well-formed blob (128 blocks) after a HELLO that
                   announced 256
  ack_huge_len     a blob length of 4 GiB in a short frame
  ack_64k          a 64 KiB blob (the wire's limit, over the blob's)
  ack_bad_addr     X's blob with its UCX worker address garbled (header and
                   lengths intact). Before the blob digest this aborted D
                   inside ucp_ep_create (UCX asserts on the address).
  ack_bad_rkey     the same for the packed rkey
  -> D answers BYE, closes, counts a protocol error, registers nothing.
FETCH beyond the layout -- after a completed handshake (X's blob, X's layout)
  fetch_slot_nb    FETCH naming dst slot == num_blocks      -> protocol error
  fetch_slot_huge  FETCH naming dst slot 0xFFFFFFFF         -> protocol error
  fetch_zero_keys  LOOKUP and FETCH of zero keys            -> empty answer /
                                                               request end
  fetch_no_lookup  FETCH of a round never looked up         -> FETCH_DONE
                                                               failure
  fetch_unsupplied FETCH of a key the round did not supply  -> failure
  fetch_after_miss FETCH of a key the LOOKUP answered MISS  -> failure
  fetch_dup_slots  two keys into one dst slot               -> closed, protocol error
  and a control (fetch_ok: a valid fetch), which must write exactly one block
  into X's region: the oracle that shows the other cases wrote nothing.

Throughput (the good peer's, during a sustained attack): the attacker runs
as a separate process, re-executing this script with --attacker. A hostile
peer lives on another host; on this shared 2-core machine that is modelled
by running the attacker at the lowest priority (os.nice(19) and SCHED_IDLE),
so that what is measured is what the attack costs D (accepting, parsing,
logging, refusing), not the attacker's own CPU. Windows alternate quiet,
attack, quiet, attack ... (--pairs, --window seconds each; a short settle
between windows); during an attack window the attacker loops the battery
(oversized, huge counts, bad strings, garbage after HELLO, truncated, every
bad HELLO_ACK blob, 50-connection bursts) without pause. A quiet window runs
the same process at the same priority spinning without touching D: a CPU
that would otherwise idle wakes up slower, which made the attack windows
look faster than the quiet ones (ratios > 1). The figure is the median
per-fetch throughput of G (G's own fetch_us, so HTTP is not in it) over all
quiet windows against the median over all attack windows; both, their ratio
and the per-window figures are printed. In the ctest run only a collapse
(ratio < 0.5) fails; --bench (longer windows, more pairs; `make
bench-hostile`) prints whether the goal (ratio >= 0.80) was met.

Asserts at the end: G's fetches all succeeded and its blocks verify; D's RSS
stayed bounded (and flat over the sustained attack); D's fds came back;
all daemons exit cleanly (no sanitizer report).
"""
import argparse
import ctypes
import ctypes.util
import os
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import relib
from relib import check, log, scaled, wait_for  # noqa: E402

COMPAT = "hostile-test"
NUM_BLOCKS, BLOCK_SIZE, HS_MS = 256, 65536, 2000
X_BLOCKS = 128  # X: another layout (same block size, so the HELLO is compatible)
X_FIRST = 5000  # X's keys, disjoint from D's (0..199, 1000..4999)
T_HELLO, T_AUTH, T_ACK, T_PING, T_PONG, T_BYE = 1, 2, 3, 4, 5, 6
T_LOOKUP, T_LOOKUP_RESP, T_FETCH, T_FETCH_DONE = 7, 8, 9, 10
BYE_PROTOCOL, BYE_INCOMPATIBLE = 1, 5


class _XXH128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


def _xxhash():
    name = ctypes.util.find_library("xxhash") or "libxxhash.so.0"
    lib = ctypes.CDLL(name)
    lib.XXH3_64bits_withSeed.restype = ctypes.c_uint64
    lib.XXH3_64bits_withSeed.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
    lib.XXH3_128bits_withSeed.restype = _XXH128
    lib.XXH3_128bits_withSeed.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
    return lib


def fingerprint():
    """kvp_hash64(compat, seed 0) = XXH3_64bits_withSeed (libxxhash)."""
    b = COMPAT.encode()
    return _xxhash().XXH3_64bits_withSeed(b, len(b), 0)


def digest(data, seed=0):
    """kvp_digest(data, seed) = XXH3_128bits_withSeed: (lo, hi), as a
    FETCH_DONE carries it (the block checksum, hash_seed 0 by default)."""
    h = _xxhash().XXH3_128bits_withSeed(data, len(data), seed)
    return h.low64, h.high64


def frame(mtype, payload, flags=0, length=None):
    return struct.pack("<IHH", len(payload) if length is None else length, mtype, flags) + payload


def wstr(s):
    b = s.encode()
    return bytes([len(b)]) + b


def hello(fp, peer_id="127.0.0.1:9", num_blocks=NUM_BLOCKS, epoch=None):
    epoch = epoch or os.urandom(15) + b"\x01"
    return frame(T_HELLO, struct.pack("<HH", 1, 0) + wstr(peer_id) + wstr(peer_id) + epoch +
                 struct.pack("<IIQQ", num_blocks, BLOCK_SIZE, fp, 0) + os.urandom(16) +
                 struct.pack("<I", 0))


def wkey(k):
    b = b"blk-%08u" % k  # kvpeer_demo_key(), the admin API's keys
    return bytes([len(b)]) + b


def connect(addr, src=None):
    """src: a loopback source address (the gate caps unauthenticated
    connections per source address: cases that run side by side each use
    their own, so that one's flood does not refuse another's handshake)."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5,
                                 source_address=(src, 0) if src else None)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def closed_by_peer(s, timeout):
    """Read until EOF/reset; returns (closed, bytes received, seconds)."""
    t0 = time.monotonic()
    got = 0
    s.settimeout(0.2)
    while time.monotonic() - t0 < timeout:
        try:
            b = s.recv(65536)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True, got, time.monotonic() - t0
        if not b:
            return True, got, time.monotonic() - t0
        got += len(b)
    return False, got, time.monotonic() - t0


def all_closed_by_peer(socks, timeout):
    """Every socket closed by D within `timeout` overall (then closed here);
    returns (all closed, 0, seconds) like closed_by_peer."""
    t0 = time.monotonic()
    n_closed = 0
    for s in socks:
        c, _, _ = closed_by_peer(s, max(0.1, timeout - (time.monotonic() - t0)))
        n_closed += c
        s.close()
    return n_closed == len(socks), 0, time.monotonic() - t0


class Raw:
    """A hand-rolled peer: completes the HELLO exchange, then acks (or not)
    with the blob it is given and speaks LOOKUP/FETCH. Answers PINGs."""

    def __init__(self, addr, fp, num_blocks=NUM_BLOCKS):
        self.s = connect(addr)
        self.fp, self.nb = fp, num_blocks
        self.buf = b""
        self.epoch = os.urandom(15) + b"\x01"
        self.peer_id = "hostile-%s:1" % os.urandom(4).hex()
        self.peer_epoch = self.peer_blob = None
        self.hs_types = []

    def send(self, mtype, body):
        self.s.sendall(frame(mtype, self.epoch + self.peer_epoch + body))

    def recv_frame(self, timeout):
        """(type, payload after the epochs) or None at EOF/timeout."""
        end = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 8:
                ln, t, _ = struct.unpack("<IHH", self.buf[:8])
                if len(self.buf) >= 8 + ln:
                    p, self.buf = self.buf[8:8 + ln], self.buf[8 + ln:]
                    if t == T_PING and self.peer_epoch:
                        self.send(T_PONG, p[32:48])
                        continue
                    return t, (p if t == T_HELLO else p[32:])
            left = end - time.monotonic()
            if left <= 0:
                return None
            self.s.settimeout(min(left, 0.2))
            try:
                b = self.s.recv(65536)
            except socket.timeout:
                continue
            except (ConnectionResetError, BrokenPipeError, OSError):
                return None
            if not b:
                return None
            self.buf += b

    def handshake(self, timeout=10):
        """HELLO out; D's HELLO and HELLO_ACK in. Returns False if D closed."""
        self.s.sendall(hello(self.fp, self.peer_id, self.nb, self.epoch))
        while self.peer_blob is None:
            f = self.recv_frame(timeout)
            if f is None:
                return False
            t, p = f
            self.hs_types.append(t)
            if t == T_HELLO:
                off = 4
                off += 1 + p[off]
                off += 1 + p[off]
                self.peer_epoch = p[off:off + 16]
            elif t == T_ACK and self.peer_epoch:
                (n,) = struct.unpack("<I", p[16:20])
                self.peer_blob = p[20:20 + n]
            else:
                return False
        return True

    def ack(self, blob, blob_len=None):
        n = len(blob) if blob_len is None else blob_len
        self.send(T_ACK, self.peer_epoch + struct.pack("<I", n) + blob)

    def lookup(self, req, rnd, keys):
        self.send(T_LOOKUP, struct.pack("<QQI", req, rnd, len(keys)) +
                  b"".join(wkey(k) for k in keys))

    def fetch(self, req, rnd, items):
        """items: (key, dst_slot, dst_gen)"""
        self.send(T_FETCH, struct.pack("<QQII", req, rnd, 0, len(items)) +
                  b"".join(wkey(k) + struct.pack("<II", sl, g) for k, sl, g in items))

    def answers(self, timeout, until=(T_FETCH_DONE, T_BYE)):
        """Decoded frames until one of `until` (included), EOF or timeout.
        Each: ('LOOKUP_RESP', results) | ('FETCH_DONE', status, oks) |
        ('BYE', reason) | ('EOF',) | ('TIMEOUT',) | (type,)"""
        out = []
        end = time.monotonic() + timeout
        while True:
            f = self.recv_frame(max(0.0, end - time.monotonic()))
            if f is None:
                out.append(("EOF",) if time.monotonic() < end else ("TIMEOUT",))
                return out
            t, p = f
            if t == T_LOOKUP_RESP:
                n = struct.unpack("<I", p[16:20])[0]
                out.append(("LOOKUP_RESP", list(p[20:20 + n])))
            elif t == T_FETCH_DONE:
                st, n = struct.unpack("<iI", p[16:24])
                out.append(("FETCH_DONE", st, [p[24 + 17 * i] for i in range(n)]))
            elif t == T_BYE:
                out.append(("BYE", struct.unpack("<H", p[:2])[0]))
            else:
                out.append((t,))
            if t in until:
                return out

    def close(self):
        self.s.close()


def capture_blob(addr, fp, num_blocks):
    """The real address blob of the kvpeerd at addr: act as a client to it."""
    r = Raw(addr, fp, num_blocks)
    ok = r.handshake()
    r.close()
    check(ok and r.peer_blob, "could not capture the blob of %s (frames %s)" % (addr, r.hs_types))
    return r.peer_blob


def blob_parts(blob):
    """(worker address offset, length), (rkey offset, length) of a kvpeer
    UCX blob (src/transport/ucx_setup.c, version 5: 64-byte header, host id,
    AM worker address, rkey, RMA worker address, probe rkey, digest)."""
    host_len, addr_len, rkey_len = struct.unpack("<HHH", blob[36:42])
    a = 64 + host_len
    return (a, addr_len), (a + addr_len, rkey_len)


def garble(blob, part):
    (off, n) = blob_parts(blob)[part]
    b = bytearray(blob)
    b[off:off + n] = os.urandom(n)
    return bytes(b)


def bad_acks(xblob):
    """name -> (HELLO's num_blocks, blob, declared blob length or None)"""
    return {
        "ack_random": (NUM_BLOCKS, os.urandom(200), None),
        "ack_truncated": (X_BLOCKS, xblob[:len(xblob) // 2], None),
        "ack_other_layout": (NUM_BLOCKS, xblob, None),
        "ack_huge_len": (NUM_BLOCKS, b"abc", 0xFFFFFFF0),
        "ack_64k": (NUM_BLOCKS, os.urandom(65536), None),
        "ack_bad_addr": (X_BLOCKS, garble(xblob, 0), None),
        "ack_bad_rkey": (X_BLOCKS, garble(xblob, 1), None),
    }


# ------------------------------------------------------------- the battery

def battery(addr, fp, xblob, lim):
    """The hostile single shots that each end quickly, as closures returning
    (closed, bytes from D, seconds). Used once each with assertions, and in
    a loop by the attacker process."""

    def oversized():
        s = connect(addr)
        s.sendall(frame(T_HELLO, b"", length=0xFFFFFFF0))
        return closed_by_peer(s, lim)

    def prehs_list():
        s = connect(addr)
        s.sendall(frame(T_LOOKUP, os.urandom(32) + struct.pack("<QQI", 1, 1, 0xFFFFFFFF)))
        return closed_by_peer(s, lim)

    def bad_str():
        s = connect(addr)
        s.sendall(frame(T_HELLO, struct.pack("<HH", 1, 0) + bytes([255]) + b"x" * 20))
        return closed_by_peer(s, lim)

    def truncated():
        s = connect(addr)
        h = hello(fp)
        s.sendall(h[: len(h) // 2])
        s.close()
        return True, 0, 0.0

    def garbage():
        s = connect(addr)
        s.sendall(hello(fp) + os.urandom(256))
        return closed_by_peer(s, lim)

    def bad_ack(name):
        nb, blob, blen = bad_acks(xblob)[name]

        def run():
            r = Raw(addr, fp, nb)
            t0 = time.monotonic()
            if not r.handshake(lim):
                r.close()
                return False, 0, time.monotonic() - t0
            r.ack(blob, blen)
            c, got, _ = closed_by_peer(r.s, lim)
            r.close()
            return c, got, time.monotonic() - t0
        return run

    def burst(n=50):
        def run():
            socks = [connect(addr) for _ in range(n)]
            for s in socks:
                s.sendall(frame(T_HELLO, b"", length=0xFFFFFFF0))
            return all_closed_by_peer(socks, lim)
        return run

    b = {"oversized": oversized, "prehs_list": prehs_list, "bad_str": bad_str,
         "truncated": truncated, "garbage": garbage, "burst50": burst()}
    for name in bad_acks(xblob):
        b[name] = bad_ack(name)
    return b


def attacker(a):
    """--attacker: loop the battery against a.target for a.seconds, at the
    lowest priority (the model of a hostile peer on another host). With
    --idle, spin for a.seconds instead without touching D: the quiet
    windows' stand-in, so that both kinds of window see the same process at
    the same priority keeping the CPUs busy (an idle CPU wakes up slower,
    which would otherwise make the attack windows look faster)."""
    os.nice(19)
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        policy = "SCHED_IDLE"
    except (AttributeError, OSError):
        policy = "nice 19 only"
    if a.idle:
        print("ATTACK start %s idle" % policy, flush=True)
        end = time.monotonic() + a.seconds
        n = 0
        while time.monotonic() < end:
            n += sum(range(1000))
        print("ATTACK done conns=0 shots=0 unclosed=0", flush=True)
        return
    xblob = bytes.fromhex(a.blob)
    bat = battery(a.target, a.fp, xblob, a.lim)
    order = list(bat)
    counts = {k: 0 for k in order}
    unclosed = []
    print("ATTACK start %s" % policy, flush=True)
    end = time.monotonic() + a.seconds
    i = 0
    while time.monotonic() < end:
        name = order[i % len(order)]
        i += 1
        try:
            closed, _, _ = bat[name]()
        except OSError as e:  # a refused connect is a result too, not a crash of ours
            closed = False
            name += "(%s)" % e.__class__.__name__
        counts[name.split("(")[0]] += 1
        if not closed:
            unclosed.append(name)
    conns = sum(v * (50 if k == "burst50" else 1) for k, v in counts.items())
    print("ATTACK done conns=%d shots=%d unclosed=%d %s %s" % (
        conns, sum(counts.values()), len(unclosed), ",".join(unclosed[:5]),
        " ".join("%s=%d" % kv for kv in counts.items())), flush=True)


# ------------------------------------------------------------- good peer

class GoodPeer(threading.Thread):
    """G fetches 8 blocks from D in a loop, a fresh request each time."""

    def __init__(self, G, D):
        super().__init__(daemon=True)
        self.G, self.D = G, D
        self.ok = self.bad = 0
        self.stop_evt = threading.Event()
        self.last_bad = None
        self.samples = []  # (start, end, fetch_us) of every good fetch

    def run(self):
        req = 100
        while not self.stop_evt.is_set():
            req += 1
            first = 1000 + (req * 8) % 4000  # fresh keys: both LRUs evict old ones
            self.D.put(first, 8)
            t0 = time.monotonic()
            r = self.G.fetch(self.D.peer, first, 8, req, timeout_ms=20000)
            t1 = time.monotonic()
            if r.get("status_code") == "0" and r.get("n_ok") == "8":
                self.ok += 1
                self.samples.append((t0, t1, int(r.get("fetch_us", "0"))))
            else:
                self.bad += 1
                self.last_bad = r
            self.G.ok("/admin/finish?request=%d" % req, "POST")
            time.sleep(0.05)


def rates(samples, t0, t1):
    """Per-fetch throughput (MB/s of 8 x 64 KiB) of the fetches that ran
    entirely inside [t0, t1)."""
    return [8 * 65536 / us for s, e, us in samples if t0 <= s and e < t1 and us > 0]


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def case(D, name, fn, want_proto):
    p0 = D.metrics().get("kvpeer_protocol_errors_total", 0)
    closed, got, secs = fn()
    p1 = D.metrics().get("kvpeer_protocol_errors_total", 0)
    log("%-16s closed=%s after %.2f s, %d bytes from D, protocol_errors +%d" %
        (name, closed, secs, got, p1 - p0))
    check(closed, "%s: D did not close the connection" % name)
    if want_proto:
        check(p1 > p0, "%s: no protocol error counted" % name)
    return got


def sessions_back(D, G):
    """Only G's session is left on D: the hostile ones are gone (no session,
    no endpoint: a session owns its transport peer)."""
    def ok():
        m = D.metrics()
        return (m.get('kvpeer_sessions{state="ready"}') == 1 and
                m.get('kvpeer_sessions{state="handshaking"}') == 0 and
                [p.get("peer") for p in D.peers()] == [G.peer])
    wait_for(ok, "D's sessions back to G's alone", 10)


def log_has(D, *parts):
    return any(all(p in line for p in parts) for line in D.logtext().splitlines())


# ------------------------------------------------------------- the cases

def blob_cases(D, G, fp, xblob, lim):
    """HELLO_ACK with a bad blob: BYE, close, protocol error, log line, nothing left."""
    for name, (nb, blob, blen) in bad_acks(xblob).items():
        p0 = D.metrics().get("kvpeer_protocol_errors_total", 0)
        r = Raw(D.peer, fp, nb)
        check(r.handshake(lim), "%s: D closed before its HELLO_ACK (frames %s)" % (name, r.hs_types))
        # no pre-shared key: HELLO answered by HELLO and HELLO_ACK, no AUTH
        check(r.hs_types == [T_HELLO, T_ACK], "%s: handshake frames %s" % (name, r.hs_types))
        r.ack(blob, blen)
        got = r.answers(lim, until=(T_BYE,))
        closed = got[-1][0] == "EOF" or (got[-1][0] == "BYE" and r.answers(lim)[-1][0] == "EOF")
        r.close()
        p1 = D.metrics().get("kvpeer_protocol_errors_total", 0)
        want_bye = BYE_INCOMPATIBLE if name == "ack_other_layout" else BYE_PROTOCOL
        log("%-16s D answered %s, closed=%s, protocol_errors +%d" % (name, got, closed, p1 - p0))
        check(closed, "%s: D did not close the connection" % name)
        check(("BYE", want_bye) in got, "%s: no BYE %d from D: %s" % (name, want_bye, got))
        check(p1 == p0 + 1, "%s: protocol_errors +%d, want +1" % (name, p1 - p0))
        wait_for(lambda: log_has(D, r.peer_id, "blob refused") or
                 log_has(D, r.peer_id, "refused by the session layer") or
                 log_has(D, r.peer_id, "protocol error: HELLO_ACK"),
                 "%s: D's log line naming %s" % (name, r.peer_id), 5)
        sessions_back(D, G)


def fetch_cases(D, G, X, fp, xblob, lim):
    """FETCH beyond the layout. The hostile session imports X's real blob, so
    any block D wrote would land in X's region, which X filled with its own
    blocks beforehand: X.verify counts the overwritten ones."""

    def session():
        r = Raw(D.peer, fp, X_BLOCKS)
        check(r.handshake(lim), "fetch session: handshake failed (%s)" % r.hs_types)
        r.ack(xblob)
        wait_for(lambda: r.peer_id in [p.get("peer") for p in D.peers()],
                 "D's session with %s" % r.peer_id, 10)
        return r

    def x_bad():
        return X.verify(X_FIRST, X_BLOCKS)["bad"]

    def run(name, body, want, proto, bad_after):
        D.put(0, 2)  # fresh: G's traffic keeps evicting D's older blocks
        m0 = D.metrics()
        r = session()
        body(r)
        if want == "open":  # the session must live on (PINGs answered meanwhile)
            got = r.answers(1.0, until=())
            check(got[-1][0] == "TIMEOUT", "%s: D closed the session: %s" % (name, got))
            check(r.peer_id in [p.get("peer") for p in D.peers()], "%s: session gone" % name)
        else:
            got = r.answers(lim)
            if got[-1][0] == "BYE":
                got += r.answers(lim)
        r.close()
        m1 = D.metrics()
        dp = m1.get("kvpeer_protocol_errors_total", 0) - m0.get("kvpeer_protocol_errors_total", 0)
        xb = x_bad()
        log("%-16s D answered %s, protocol_errors +%d, X blocks overwritten %d" %
            (name, got, dp, xb))
        if want == "closed":
            check(got[-2:] == [("BYE", BYE_PROTOCOL), ("EOF",)],
                  "%s: want BYE protocol then close, got %s" % (name, got))
            wait_for(lambda: log_has(D, r.peer_id, "protocol error: FETCH") or
                     log_has(D, r.peer_id, "closing session as fault", "FETCH"),
                     "%s: D's log line" % name, 5)
        elif want == "failed":
            fd = [g for g in got if g[0] == "FETCH_DONE"]
            check(len(fd) == 1 and fd[0][1] != 0 and not any(fd[0][2]),
                  "%s: want one FETCH_DONE failing every block, got %s" % (name, got))
        elif want == "ok":
            fd = [g for g in got if g[0] == "FETCH_DONE"]
            check(len(fd) == 1 and fd[0][1] == 0 and all(fd[0][2]),
                  "%s: want FETCH_DONE ok, got %s" % (name, got))
        check(dp == (1 if proto else 0), "%s: protocol_errors +%d" % (name, dp))
        check(xb == bad_after, "%s: %d of X's blocks overwritten, want %d" % (name, xb, bad_after))
        sessions_back(D, G)
        return got

    check(x_bad() == 0, "X's blocks do not verify before the cases")

    def lookup_fetch(keys, items):
        return lambda r: (r.lookup(1, 1, keys), r.fetch(1, 1, items))

    run("fetch_slot_nb", lookup_fetch([0, 1], [(0, 3, 1), (1, X_BLOCKS, 1)]), "closed", True, 0)
    run("fetch_slot_huge", lookup_fetch([0, 1], [(0, 3, 1), (1, 0xFFFFFFFF, 1)]),
        "closed", True, 0)
    got = run("fetch_zero_keys", lookup_fetch([], []), "open", False, 0)
    check(("LOOKUP_RESP", []) in got, "fetch_zero_keys: the empty LOOKUP was not answered: %s" % got)
    run("fetch_no_lookup", lambda r: r.fetch(1, 9, [(0, 3, 1), (1, 4, 1)]), "failed", False, 0)
    run("fetch_unsupplied", lookup_fetch([0], [(7, 3, 1)]), "failed", False, 0)
    run("fetch_after_miss", lookup_fetch([999], [(999, 3, 1)]), "failed", False, 0)
    # the control: a valid fetch writes exactly one block into X's region
    run("fetch_ok", lookup_fetch([0], [(0, 3, 1)]), "ok", False, 1)
    # two keys into one destination slot: a protocol error, nothing more written
    # (X still holds only the one block fetch_ok wrote)
    run("fetch_dup_slots", lookup_fetch([0, 1], [(0, 5, 1), (1, 5, 1)]), "closed", True, 1)


# ------------------------------------------------------------- throughput

def throughput(D, fp, xblob, good, pairs, window, lim):
    """Alternate quiet and attack windows; returns (quiet median, attack
    median, ratio, quiet fetches, attack fetches, per-window lines)."""
    argv = [sys.executable, os.path.abspath(__file__), D.kvpeerd, "--attacker", "--target", D.peer,
            "--fp", str(fp), "--blob", xblob.hex(), "--lim", str(lim),
            "--seconds", str(window)]
    gap = 0.3  # D finishes the last refusals before the next window starts

    def one(idle):
        p = subprocess.Popen(argv + (["--idle"] if idle else []), stdout=subprocess.PIPE,
                             text=True)
        first = p.stdout.readline()
        check(first.startswith("ATTACK start"), "the attacker did not start: %r" % first)
        t1 = time.monotonic()
        done = p.stdout.readline()
        t2 = time.monotonic()
        rc = p.wait(scaled(30))
        check(rc == 0 and done.startswith("ATTACK done"), "attacker rc %d: %r" % (rc, done))
        f = relib.kv(done)
        check(idle or int(f["conns"]) > 0, "an attack window attacked nothing: %s" % done)
        check(int(f["unclosed"]) == 0, "an attack window left connections open: %s" %
              done.strip())
        time.sleep(gap)
        return rates(good.samples, t1, t2), int(f["conns"]), first.split()[2]

    quiet, attack, lines = [], [], []
    for i in range(pairs):
        q, _, pol = one(True)
        a, conns, _ = one(False)
        quiet += q
        attack += a
        lines.append("pair %d: quiet %5.0f MB/s (%2d fetches) | attack %5.0f MB/s (%2d fetches,"
                     " %d hostile connections) [%s]" % (i + 1, relib.median(q), len(q),
                                                       relib.median(a), len(a), conns, pol))
        log(lines[-1])
    qm, am = relib.median(quiet), relib.median(attack)
    return qm, am, (am / qm if qm else 0.0), len(quiet), len(attack), lines


# ------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvpeerd")
    ap.add_argument("--bench", action="store_true",
                    help="longer windows and more pairs; prints whether the goal was met")
    ap.add_argument("--pairs", type=int)
    ap.add_argument("--window", type=float)
    ap.add_argument("--attacker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--fp", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--blob", help=argparse.SUPPRESS)
    ap.add_argument("--lim", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--idle", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.attacker:
        attacker(a)
        return
    pairs = a.pairs or (10 if a.bench else 4)
    window = a.window or (6.0 if a.bench else 2.5)
    kvpeerd = os.path.abspath(a.kvpeerd)
    fp = fingerprint()
    common = ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin",
              "--block_size", "64K", "--compat", COMPAT,
              "--handshake_timeout_ms", str(HS_MS), "--shutdown_drain_ms", "500"]
    D = relib.Daemon(kvpeerd, "D", common + ["--num_blocks", str(NUM_BLOCKS)]).start()
    G = relib.Daemon(kvpeerd, "G", common + ["--num_blocks", str(NUM_BLOCKS),
                                             "--peers", D.peer]).start()
    X = relib.Daemon(kvpeerd, "X", common + ["--num_blocks", str(X_BLOCKS)]).start()
    wait_for(lambda: G.peer_ready(D.peer), "G's session to D", 20)
    D.put(0, 200)
    X.put(X_FIRST, X_BLOCKS)  # every slot of X holds a known block
    xblob = capture_blob(X.peer, fp, X_BLOCKS)
    log("X's blob: %d bytes (worker address %d B, rkey %d B)" % (
        len(xblob), blob_parts(xblob)[0][1], blob_parts(xblob)[1][1]))
    good = GoodPeer(G, D)
    good.start()
    # warm: the fetched keys cycle through both regions (first touches done)
    wait_for(lambda: good.ok >= 48, "the good peer's warm-up fetches", 60)
    rss0, fds0 = D.rss_kb(), fd_count(D.proc.pid)
    mem0 = D.mem()
    lim = scaled(HS_MS / 1000.0) + 3
    bat = battery(D.peer, fp, xblob, lim)

    def one_byte():
        s = connect(D.peer, "127.0.0.3")
        h = hello(fp)
        for b in h:
            s.send(bytes([b]))
            time.sleep(0.005)
        s.settimeout(scaled(3))
        first = s.recv(8)  # D's HELLO header: the byte-wise HELLO was parsed
        check(len(first) == 8 and struct.unpack("<IHH", first)[1] == T_HELLO,
              "one_byte: D did not answer the byte-wise HELLO with a HELLO (%r)" % first)
        return closed_by_peer(s, lim)  # then the handshake timeout (no HELLO_ACK from us)

    def slowloris():
        s = connect(D.peer, "127.0.0.4")
        h = hello(fp)
        t0 = time.monotonic()
        try:
            for b in h[:-1]:
                s.send(bytes([b]))
                time.sleep(0.1)
                if time.monotonic() - t0 > lim:
                    break
        except (BrokenPipeError, ConnectionResetError):
            return True, 0, time.monotonic() - t0
        c, got, secs = closed_by_peer(s, lim)
        return c, got, time.monotonic() - t0

    def no_read():
        s = connect(D.peer, "127.0.0.5")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(hello(fp))
        time.sleep(scaled(HS_MS / 1000.0) + 1)  # never read meanwhile
        return closed_by_peer(s, lim)

    def flood():
        return all_closed_by_peer([connect(D.peer, "127.0.0.2") for _ in range(200)], lim)

    case(D, "oversized", bat["oversized"], True)
    case(D, "prehs_list", bat["prehs_list"], True)
    case(D, "bad_str", bat["bad_str"], True)
    case(D, "truncated", bat["truncated"], False)
    case(D, "garbage", bat["garbage"], True)
    # the slow ones (each waits for D's handshake timeout) side by side
    slow = {"one_byte": one_byte, "slowloris": slowloris, "no_read": no_read, "flood": flood}
    res = {}
    threads = [threading.Thread(target=lambda n=n, f=f: res.__setitem__(n, f()))
               for n, f in slow.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for n in slow:
        check(n in res, "%s: the case raised (see above)" % n)
        case(D, n, lambda n=n: res[n], False)
    case(D, "burst50", bat["burst50"], True)
    # D's protocol-error log lines are rate limited (10 a second): let the
    # burst's second pass, so that the cases below can each find their line.
    time.sleep(1.1)
    ok0 = good.ok
    blob_cases(D, G, fp, xblob, lim)
    fetch_cases(D, G, X, fp, xblob, lim)
    check(good.ok > ok0 and good.bad == 0, "G did not keep fetching through the blob and FETCH "
          "cases (%d -> %d ok, %d failed)" % (ok0, good.ok, good.bad))
    rss_mid = D.rss_kb()
    time.sleep(1.0)  # settle: the cases' sessions are torn down
    qm, am, ratio, nq, na, lines = throughput(D, fp, xblob, good, pairs, window, lim)
    time.sleep(0.5)
    good.stop_evt.set()
    good.join(scaled(30))
    wait_for(lambda: fd_count(D.proc.pid) <= fds0 + 2, "D's fds back to %d" % fds0, 10)
    rss1, fds1 = D.rss_kb(), fd_count(D.proc.pid)
    log("D memory kB: start %s end %s" % (mem0, D.mem()))
    m = D.metrics()
    log("good peer: %d fetches ok, %d failed (last %s)" % (good.ok, good.bad, good.last_bad))
    log("D: RSS %d -> %d -> %d kB, fds %d -> %d, protocol_errors %d, sessions ready %d" % (
        rss0, rss_mid, rss1, fds0, fds1, m.get("kvpeer_protocol_errors_total", 0),
        m.get('kvpeer_sessions{state="ready"}', 0)))
    print("good peer throughput, median per fetch (%d pairs of %.1f s windows; attacker and "
          "the quiet windows' idle spinner at nice 19 + SCHED_IDLE):" % (pairs, window),
          flush=True)
    for line in lines:
        print("  " + line, flush=True)
    print("  quiet %.0f MB/s (%d fetches), under attack %.0f MB/s (%d fetches): ratio %.2f" %
          (qm, nq, am, na, ratio), flush=True)
    if a.bench:
        print("goal >= 0.80: %s" % ("met" if ratio >= 0.80 else "NOT met"), flush=True)
    # The goal (within 20 %) is a speed target: printed, not enforced in the
    # timed test on this shared machine. The check only guards against a collapse.
    check(nq >= pairs and na >= pairs, "too few fetches measured (%d quiet, %d attack)" % (nq, na))
    check(ratio >= 0.5, "the good peer's throughput fell to %.2f of the quiet windows'" % ratio)
    check(good.bad == 0, "the good peer's fetches failed %d times: %s" % (good.bad, good.last_bad))
    check(good.ok >= 5, "the good peer fetched only %d times" % good.ok)
    check(G.peer_ready(D.peer), "G's session to D is gone")
    if relib.MEM_CHECKS:
        check(rss1 - rss0 < 32 * 1024 * relib.MEM_SLACK, "D's RSS grew by %d kB" % (rss1 - rss0))
        # steady state: the sustained attack must not grow it further
        check(rss1 - rss_mid < 4 * 1024 * relib.MEM_SLACK,
              "D's RSS grew by %d kB under the sustained attack" % (rss1 - rss_mid))
    v = G.verify(0, 200)
    check(v["bad"] == 0, "G holds corrupt blocks: %s" % v)
    for x in (G, D, X):
        x.check_clean_exit(x.stop())
    print("PASS", flush=True)


if __name__ == "__main__":
    main()
