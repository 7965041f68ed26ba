#!/usr/bin/env python3
"""hostile.py -- hostile control-plane clients against a live kvpeerd (issue 9).

    hostile.py KVPEERD_BINARY

Daemon D serves; daemon G is a well-behaved peer that keeps fetching from D
through the admin API the whole time. Meanwhile raw TCP clients speak the
wire format (SPEC §4) wrongly on purpose:
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
Asserts: every hostile connection is closed by D (EOF/reset) within the
handshake timeout (scaled); protocol errors are counted in /metrics; G's
fetches all succeed; D's RSS and fd count stay bounded; both daemons exit
cleanly (no sanitizer report).
"""
import ctypes
import ctypes.util
import os
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import relib
from relib import check, log, scaled, wait_for  # noqa: E402

KVPEERD = os.path.abspath(sys.argv[1])
COMPAT = "hostile-test"
NUM_BLOCKS, BLOCK_SIZE, HS_MS = 256, 65536, 2000
T_HELLO, T_LOOKUP = 1, 7


def fingerprint():
    """kvp_hash64(compat, seed 0) = XXH3_64bits_withSeed (libxxhash)."""
    name = ctypes.util.find_library("xxhash") or "libxxhash.so.0"
    lib = ctypes.CDLL(name)
    lib.XXH3_64bits_withSeed.restype = ctypes.c_uint64
    lib.XXH3_64bits_withSeed.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint64]
    b = COMPAT.encode()
    return lib.XXH3_64bits_withSeed(b, len(b), 0)


def frame(mtype, payload, flags=0, length=None):
    return struct.pack("<IHH", len(payload) if length is None else length, mtype, flags) + payload


def wstr(s):
    b = s.encode()
    return bytes([len(b)]) + b


def hello(fp, peer_id="127.0.0.1:9"):
    epoch = os.urandom(15) + b"\x01"
    return frame(T_HELLO, struct.pack("<HH", 1, 0) + wstr(peer_id) + wstr(peer_id) + epoch +
                 struct.pack("<IIQQ", NUM_BLOCKS, BLOCK_SIZE, fp, 0) + os.urandom(16) +
                 struct.pack("<I", 0))


def connect(addr):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
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


class GoodPeer(threading.Thread):
    """G fetches 8 blocks from D in a loop, a fresh request each time."""

    def __init__(self, G, D):
        super().__init__(daemon=True)
        self.G, self.D = G, D
        self.ok = self.bad = 0
        self.stop_evt = threading.Event()
        self.last_bad = None
        self.samples = []  # (end time, fetch_us) of every good fetch

    def run(self):
        req = 100
        while not self.stop_evt.is_set():
            req += 1
            first = 1000 + (req * 8) % 4000  # fresh keys: both LRUs evict old ones
            self.D.put(first, 8)
            r = self.G.fetch(self.D.peer, first, 8, req, timeout_ms=20000)
            if r.get("status_code") == "0" and r.get("n_ok") == "8":
                self.ok += 1
                self.samples.append((time.monotonic(), int(r.get("fetch_us", "0"))))
            else:
                self.bad += 1
                self.last_bad = r
            self.G.ok("/admin/finish?request=%d" % req, "POST")
            time.sleep(0.05)


def window_mbps(samples, t0, t1):
    """Median per-fetch throughput (MB/s of 8 x 64 KiB) of fetches ending in [t0, t1)."""
    rates = sorted(8 * 65536 / us for t, us in samples if t0 <= t < t1 and us > 0)
    return rates[len(rates) // 2] if rates else 0.0, len(rates)


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def case(D, name, fn, want_proto):
    p0 = D.metrics().get("kvpeer_protocol_errors_total", 0)
    closed, got, secs = fn()
    p1 = D.metrics().get("kvpeer_protocol_errors_total", 0)
    log("%-10s closed=%s after %.2f s, %d bytes from D, protocol_errors +%d" %
        (name, closed, secs, got, p1 - p0))
    check(closed, "%s: D did not close the connection" % name)
    if want_proto:
        check(p1 > p0, "%s: no protocol error counted" % name)
    return got


def main():
    fp = fingerprint()
    common = ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin",
              "--num_blocks", str(NUM_BLOCKS), "--block_size", "64K", "--compat", COMPAT,
              "--handshake_timeout_ms", str(HS_MS), "--shutdown_drain_ms", "500"]
    D = relib.Daemon(KVPEERD, "D", common).start()
    G = relib.Daemon(KVPEERD, "G", common + ["--peers", D.peer]).start()
    wait_for(lambda: G.peer_ready(D.peer), "G's session to D", 20)
    D.put(0, 200)
    good = GoodPeer(G, D)
    good.start()
    # warm: the fetched keys cycle through both regions (first touches done)
    wait_for(lambda: good.ok >= 48, "the good peer's warm-up fetches", 60)
    t_base = time.monotonic()
    time.sleep(4)  # the undisturbed run the attacked one is compared with
    t_attack = time.monotonic()
    rss0, fds0 = D.rss_kb(), fd_count(D.proc.pid)
    mem0 = D.mem()
    lim = scaled(HS_MS / 1000.0) + 3

    def oversized():
        s = connect(D.peer)
        s.sendall(frame(T_HELLO, b"", length=0xFFFFFFF0))
        return closed_by_peer(s, lim)

    def prehs_list():
        s = connect(D.peer)
        s.sendall(frame(T_LOOKUP, os.urandom(32) + struct.pack("<QQI", 1, 1, 0xFFFFFFFF)))
        return closed_by_peer(s, lim)

    def bad_str():
        s = connect(D.peer)
        s.sendall(frame(T_HELLO, struct.pack("<HH", 1, 0) + bytes([255]) + b"x" * 20))
        return closed_by_peer(s, lim)

    def truncated():
        s = connect(D.peer)
        h = hello(fp)
        s.sendall(h[: len(h) // 2])
        s.close()
        return True, 0, 0.0

    def garbage():
        s = connect(D.peer)
        s.sendall(hello(fp) + os.urandom(256))
        return closed_by_peer(s, lim)

    def one_byte():
        s = connect(D.peer)
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
        s = connect(D.peer)
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
        s = connect(D.peer)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(hello(fp))
        time.sleep(scaled(HS_MS / 1000.0) + 1)  # never read meanwhile
        return closed_by_peer(s, lim)

    def flood():
        socks = [connect(D.peer) for _ in range(200)]
        t0 = time.monotonic()
        n_closed = 0
        for s in socks:
            c, _, _ = closed_by_peer(s, max(0.1, lim - (time.monotonic() - t0)))
            n_closed += c
            s.close()
        return n_closed == len(socks), 0, time.monotonic() - t0

    case(D, "oversized", oversized, True)
    case(D, "prehs_list", prehs_list, True)
    case(D, "bad_str", bad_str, True)
    case(D, "truncated", truncated, False)
    case(D, "garbage", garbage, True)
    case(D, "one_byte", one_byte, False)
    case(D, "slowloris", slowloris, False)
    case(D, "no_read", no_read, False)
    case(D, "flood", flood, False)
    rss_mid = D.rss_kb()
    for _ in range(3):  # the battery again: nothing accumulates
        for fn in (oversized, prehs_list, bad_str, garbage):
            fn()
    flood()
    t_end = time.monotonic()
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
    base, nb = window_mbps(good.samples, t_base, t_attack)
    att, na = window_mbps(good.samples, t_attack, t_end)
    ratio = att / base if base else 0.0
    log("good peer throughput (median per fetch): undisturbed %.0f MB/s (%d fetches), "
        "under attack %.0f MB/s (%d fetches), ratio %.2f" % (base, nb, att, na, ratio))
    # The goal (within 20 % of the undisturbed run) is a speed target: on this
    # shared 2-core machine it is reported as a figure, not enforced (a timed
    # assertion would flake). The check only guards against a collapse.
    check(ratio >= 0.5, "the good peer's throughput fell to %.2f of the undisturbed run" % ratio)
    check(good.bad == 0, "the good peer's fetches failed %d times: %s" % (good.bad, good.last_bad))
    check(good.ok >= 5, "the good peer fetched only %d times" % good.ok)
    check(G.peer_ready(D.peer), "G's session to D is gone")
    check(rss1 - rss0 < 32 * 1024 * relib.MEM_SLACK, "D's RSS grew by %d kB" % (rss1 - rss0))
    # steady state: the second battery (and flood) must not grow it further
    check(rss1 - rss_mid < 4 * 1024 * relib.MEM_SLACK, "D's RSS grew by %d kB in the repeated battery" %
          (rss1 - rss_mid))
    v = G.verify(0, 200)
    check(v["bad"] == 0, "G holds corrupt blocks: %s" % v)
    for x in (G, D):
        x.check_clean_exit(x.stop())
    print("PASS", flush=True)


if __name__ == "__main__":
    main()
