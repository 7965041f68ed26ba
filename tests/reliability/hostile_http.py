#!/usr/bin/env python3
"""hostile_http.py -- kvpeerd's HTTP door and its logs under attack (issue 27).

    hostile_http.py KVPEERD_BINARY [case ...]

Daemon D serves /healthz, /metrics and the admin API (--admin with a token
file, http_idle_ms 2000); G is a good peer fetching from D through its own
admin API; X (another layout) lends its address blob so that a hand-rolled
peer (hostile.py's Raw) can complete a handshake under a peer id of its
choosing. Cases (all by default):

  slowloris   80 sockets from one address (127.0.0.2) and 100 from 100
              addresses (127.0.1.x) each send one header line and stay:
              /healthz and /metrics answer within a scaled bound meanwhile;
              D closes every one of them within http_idle_ms + slack. Then
              more sockets than the total cap (D's http_max_conns): the
              probe is refused at first but answers once the idle timeout
              frees the slots (on main, with no timeout, never).
  trickle     96 sockets from 3 addresses against a total cap of 64, each
              sending a byte of its headers every 0.5 s (never idle), then 64
              from 2 addresses trickling a body after whole headers:
              /healthz and /metrics answer throughout, since the connection
              that waited longest is cut for a newcomer; T counts the cuts.
  flood       3 addresses open connections as fast as they can (each keeps
              16, one header line each, closing its oldest), against a cap of
              16: a good client from a fourth address that connects and
              sends its request only after a pause of 1 s (a slow round trip,
              under which the flood makes more than 16 newer connections) is
              answered every time, since a cut takes the oldest waiting
              connection of the busiest address (before the session of
              2026-12-06 12:00: the oldest of all, the good client).
  flood6      the same from 48 IPv6 addresses of one /64 (a network namespace
              made here; skipped without root): a /64 is one client address.
  per64       one slow socket from each of 24 IPv6 addresses of one /64
              against http_max_per_ip 4 (the namespace as flood6): T refuses
              all but 4 (libmicrohttpd's own cap counts each address: 24
              would stay); a client of another /64 is answered.
  fds         a daemon whose descriptors are all above 1023 (it inherits
              1100 open files): /healthz, /metrics and an admin put answer
              (select() could not serve them).
  inject      a URL with %0a and an ANSI escape, a query value and an admin
              peer add with them: no forged log line, no raw ESC in the log,
              one line per /peers entry, bodies escaped.
  peer_id     raw control-plane clients whose HELLO carries a peer id with a
              newline, a space-separated fake field and ESC: refused for its
              layout (a log line names it) and accepted with X's blob (it is
              in /peers and /metrics): no forged log line, /peers entry or
              metrics sample.
  token       every admin route without the token or with a wrong one: 401
              with WWW-Authenticate; nothing put, blocks unchanged.
  long_admin  an admin request blocking longer than http_idle_ms is answered.
  corrupt     /admin/corrupt exists only in test builds
              (KVPEER_TEST_ROUTES=1); otherwise 404 and no symbol.

After each case G fetches again; after all: D alive, /admin/verify bad=0
on D and G, G's fetches (hostile.GoodPeer, the whole time) all succeeded, every daemon exits cleanly (no sanitizer report).
"""
import os
import re
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import relib  # noqa: E402
from relib import check, log, scaled, wait_for  # noqa: E402
import hostile  # noqa: E402

IDLE_MS = 2000
PROBE_S = 2.0  # a probe during an attack answers within this (scaled)
FORGED = "forged"  # what every injection tries to start a line / field with


def tcp_socket(addr):
    """A socket for host:port or [v6]:port; (socket, (host, port))."""
    host, port = addr.rsplit(":", 1)
    v6 = host.startswith("[")
    s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_STREAM)
    return s, (host.strip("[]"), int(port))


def http_raw(addr, path, method="GET", headers=None, timeout=5.0, src=None):
    """One request on a fresh socket (optionally from source address src);
    returns (status, headers dict, body) or raises OSError."""
    host, port = addr.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        if src:
            s.bind((src, 0))
        s.connect((host, int(port)))
        h = "".join("%s: %s\r\n" % kv for kv in (headers or {}).items())
        s.sendall(("%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%sContent-Length: 0\r\n\r\n"
                   % (method, path, h)).encode())
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    finally:
        s.close()
    if not data:  # accepted and closed unanswered (a cap): like a refused connect
        raise ConnectionResetError("closed without an answer")
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    check(lines and lines[0].startswith("HTTP/1."), "not an HTTP answer: %r" % data[:200])
    hdrs = dict(l.split(": ", 1) for l in lines[1:] if ": " in l)
    return int(lines[0].split()[1]), hdrs, body.decode("utf-8", "replace")


def timed_probe(addr, path, bound):
    """path answered 200 within bound seconds (retrying refused connects)."""
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < bound:
        try:
            code, _, body = http_raw(addr, path, timeout=max(0.2, bound - (time.monotonic() - t0)))
            if code == 200:
                return time.monotonic() - t0
            last = "HTTP %d %r" % (code, body[:100])
        except OSError as e:
            last = repr(e)
        time.sleep(0.05)
    relib.fail("%s on %s not answered within %.1f s (last: %s)" % (path, addr, bound, last))


def slow_sockets(addr, sources, more=b""):
    """One socket per source address, each sends one header line (and then
    ``more``) and stays. Connects that D refuses at once (per-address or
    total cap) are counted."""
    socks, refused = [], 0
    for src in sources:
        s, dst = tcp_socket(addr)
        try:
            s.bind((src, 0))
            s.connect(dst)
            s.sendall(b"GET /healthz HTTP/1.1\r\n" + more)  # one header line, never the end
            socks.append(s)
        except OSError:
            refused += 1
            s.close()
    return socks, refused


def closed_count(socks, timeout):
    """How many of socks D closed (EOF or reset) within timeout overall."""
    end = time.monotonic() + timeout
    open_ = list(socks)
    closed = 0
    while open_ and time.monotonic() < end:
        still = []
        for s in open_:
            s.settimeout(0.01)
            try:
                b = s.recv(4096)
                if not b:
                    closed += 1
                    continue
            except socket.timeout:
                pass
            except OSError:
                closed += 1
                continue
            still.append(s)
        open_ = still
        time.sleep(0.05)
    return closed


def case_slowloris(D, kvpeerd):
    bound = scaled(PROBE_S)
    # one address, more sockets than http_max_per_ip (32)
    socks, _ = slow_sockets(D.http, ["127.0.0.2"] * 80)
    time.sleep(0.3)
    t1, t2 = timed_probe(D.http, "/healthz", bound), timed_probe(D.http, "/metrics", bound)
    log("slowloris: 80 sockets from 127.0.0.2 (%d still open on our side): /healthz %.0f ms, "
        "/metrics %.0f ms" % (len(socks), t1 * 1e3, t2 * 1e3))
    # 80 more from 80 addresses (the per-address cap does not bite; with the
    # 32 above, 112 of the 128 slots are taken): the idle timeout does
    socks2, refused2 = slow_sockets(D.http, ["127.0.1.%d" % i for i in range(1, 81)])
    time.sleep(0.3)
    t3, t4 = timed_probe(D.http, "/healthz", bound), timed_probe(D.http, "/metrics", bound)
    log("slowloris: + 80 sockets from 80 addresses (%d connects refused): /healthz %.0f ms, "
        "/metrics %.0f ms" % (refused2, t3 * 1e3, t4 * 1e3))
    t0 = time.monotonic()
    n = closed_count(socks + socks2, scaled(IDLE_MS / 1000.0) + 5)
    log("slowloris: D closed %d of %d held sockets after %.1f s (http_idle_ms %d)" %
        (n, len(socks) + len(socks2), time.monotonic() - t0, IDLE_MS))
    check(n == len(socks) + len(socks2), "D kept %d slowloris sockets open past http_idle_ms" %
          (len(socks) + len(socks2) - n))
    for s in socks + socks2:
        s.close()
    # Past the total cap, on a daemon of its own (S: main's cap of 64, so
    # G's traffic to D is not refused meanwhile): 70 addresses, as in the
    # issue; the probe gets in once the idle timeout frees the slots (on
    # main, with no timeout, not while they stay).
    S = http_daemon(kvpeerd, "S", "127.0.0.1:0", ["--http_max_conns", "64"])
    socks3, refused3 = slow_sockets(S.http, ["127.0.2.%d" % i for i in range(1, 71)])
    t5 = timed_probe(S.http, "/healthz", scaled(IDLE_MS / 1000.0) + scaled(PROBE_S) + 3)
    log("slowloris: 70 sockets from 70 addresses on S (total cap 64, %d connects refused): "
        "/healthz answered after %.1f s" % (refused3, t5))
    for s in socks3:
        s.close()
    S.check_clean_exit(S.stop())


class Trickle:
    """Slow clients that stay past the idle timeout: sockets from the given
    source addresses each send one header line, then one byte of a header
    every TRICKLE_S (``body``: whole headers with a Content-Length, then a
    byte of the body every TRICKLE_S); a socket D cuts is replaced at the
    next round (a client that comes straight back). Runs on a thread until
    stop(); the first round connects one socket every ``pace`` s."""
    TRICKLE_S = 0.5
    BODY = b"Host: x\r\nContent-Length: 100000\r\n\r\n"

    def __init__(self, addr, sources, body=False, pace=0.0):
        self.addr, self.sources, self.body, self.pace = addr, sources, body, pace
        self.socks = {}  # source slot -> socket
        self.cut = 0
        self.stop_evt = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def connect(self, i):
        s, _ = slow_sockets(self.addr, [self.sources[i]], self.BODY if self.body else b"")
        if s:
            s[0].setblocking(False)
            self.socks[i] = s[0]

    def run(self):
        for i in range(len(self.sources)):
            self.connect(i)
            time.sleep(self.pace)
        while not self.stop_evt.wait(self.TRICKLE_S):
            for i in range(len(self.sources)):
                s = self.socks.get(i)
                if s is not None:
                    try:
                        s.send(b"x")
                        continue
                    except OSError:  # cut (reset or shut down)
                        s.close()
                        self.cut += 1
                        del self.socks[i]
                self.connect(i)

    def stop(self):
        self.stop_evt.set()
        self.t.join(10)
        for s in self.socks.values():
            s.close()


def probe_for(T, secs):
    """/healthz and /metrics probed back to back for secs: each answered
    within the scaled bound; returns the probe times."""
    probes = []
    end = time.monotonic() + secs
    while time.monotonic() < end:
        probes.append(timed_probe(T.http, "/healthz", scaled(PROBE_S)))
        probes.append(timed_probe(T.http, "/metrics", scaled(PROBE_S)))
        time.sleep(0.2)
    return probes


def cut_total(T):
    """T's kvpeer_http_cut_total."""
    return int(re.search(r"^kvpeer_http_cut_total (\d+)$", T.ok("/metrics"), re.M).group(1))


def http_daemon(kvpeerd, name, http, caps, ns=None):
    """A small kvpeerd for an HTTP case, its HTTP on ``http`` with the
    options ``caps`` (http_max_conns, ...) and http_idle_ms IDLE_MS."""
    return relib.Daemon(kvpeerd, name, ["--listen", "127.0.0.1:0", "--http", http,
                                        "--num_blocks", "16", "--block_size", "64K",
                                        "--http_idle_ms", str(IDLE_MS),
                                        "--shutdown_drain_ms", "200"] + caps, ns=ns).start()


def case_trickle(kvpeerd):
    """Slow clients that are never idle for http_idle_ms, against a total cap
    of 64 (main's; 32 per address): /healthz and /metrics answer throughout,
    because the connection that waited longest is cut for each newcomer
    (before issue 29's session of 2026-12-06: refused for as long as the
    trickle ran). (1) 96 sockets from 3 addresses trickling header bytes,
    for three idle timeouts; (2) 64 from 2 addresses, each connected and its
    headers in before the next, trickling a body (a request whose body is not
    complete is not in a handler: cut like the others)."""
    T = http_daemon(kvpeerd, "T", "127.0.0.1:0", ["--http_max_conns", "64"])
    for what, sources, body, pace, secs in (
            ("headers", ["127.0.3.%d" % (1 + i // 32) for i in range(96)], False, 0.0,
             3 * IDLE_MS / 1000.0),
            ("a body", ["127.0.4.%d" % (1 + i // 32) for i in range(64)], True, 0.01,
             IDLE_MS / 1000.0)):
        before = cut_total(T)
        tr = Trickle(T.http, sources, body, pace)
        try:
            time.sleep(len(sources) * pace + 1.0)
            probes = probe_for(T, secs)
            # each /metrics read is a newcomer too: once the trickle holds the
            # cap, it cuts one, and the trickle sees it at its next round
            wait_for(lambda: cut_total(T) > before and tr.cut > 0,
                     "a connection of this trickle (%s) cut" % what, 10)
            held = len(tr.socks)
        finally:
            tr.stop()
        cut = cut_total(T)
        log("trickle: %d sockets from %d addresses trickling %s on T (cap 64, a byte every %.1f s) "
            "for %.0f s: %d probes answered, the slowest in %.0f ms; %d sockets held at the end, "
            "T's cuts so far %d (this trickle saw %d)" %
            (len(sources), len(set(sources)), what, Trickle.TRICKLE_S, secs, len(probes),
             max(probes) * 1e3, held, cut, tr.cut))
    check(any("event=http_cap_full" in l for l in log_lines(T)), "trickle: no http_cap_full line")
    T.check_clean_exit(T.stop())


class Flood:
    """Threads, each opening connections back to back (one header line
    each) from its source addresses in turn and keeping its newest ``keep``
    (closing the oldest): every connect past T's cap makes T cut one. In
    network namespace ``ns`` if given. Counts connects."""

    def __init__(self, addr, thread_sources, keep, ns=None):
        self.addr, self.keep = addr, keep
        self.connects = 0
        self.stop_evt = threading.Event()
        self.ts = [threading.Thread(target=relib.in_netns, args=(ns, self.run, srcs), daemon=True)
                   for srcs in thread_sources]
        for t in self.ts:
            t.start()

    def run(self, srcs):
        socks, i = [], 0
        while not self.stop_evt.is_set():
            s, _ = slow_sockets(self.addr, [srcs[i % len(srcs)]])
            i += 1
            socks += s
            self.connects += len(s)
            while len(socks) > self.keep:
                socks.pop(0).close()
        for s in socks:
            s.close()

    def stop(self):
        self.stop_evt.set()
        for t in self.ts:
            t.join(10)


def slow_request(addr, src, pause):
    """A GET /healthz from src whose request goes ``pause`` s after the
    connect (a client at the end of a slow link): its status, or None if T
    closed it unanswered."""
    s, dst = tcp_socket(addr)
    try:
        s.settimeout(scaled(PROBE_S) + pause)
        s.bind((src, 0))
        s.connect(dst)
        time.sleep(pause)
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = s.recv(4096)
        except OSError:  # cut: reset
            return None
    finally:
        s.close()
    return int(data.split()[1]) if data.startswith(b"HTTP/1.") else None


FLOOD_CAP = 16


def flood_run(kvpeerd, http, thread_sources, good, what, ns=None):
    """Daemon T (cap FLOOD_CAP) on ``http``; the flood (Flood: 8 connections
    per thread) on T while a good client from ``good`` sends requests 1 s
    (half the idle time) after each connect, until T cut a cap's worth on
    average during each (at least 8 requests): every one answered (200), T
    exits clean. ``what`` names the flood in the log line."""
    T = http_daemon(kvpeerd, "T", http, ["--http_max_conns", str(FLOOD_CAP)], ns)
    fl = Flood(T.http, thread_sources, 8, ns)
    codes, cuts = [], []
    try:
        wait_for(lambda: cut_total(T) > 2 * FLOOD_CAP, "the flood past T's cap", 20)
        while len(codes) < 8 or sum(cuts) < 8 * FLOOD_CAP:
            check(len(codes) < 40, "the flood too slow to test anything: %s cuts in %d requests"
                  % (sum(cuts), len(codes)))
            c0 = cut_total(T)
            codes.append(relib.in_netns(ns, slow_request, T.http, good, 1.0))
            cuts.append(cut_total(T) - c0)
    finally:
        fl.stop()
    log("%s replaced back to back (%d connects) against a cap of %d, %d slow requests from %s: "
        "%s; T's cuts during each: %s" % (what, fl.connects, FLOOD_CAP, len(codes), good, codes,
                                          cuts))
    check(codes == [200] * len(codes), "a slow good request cut by the flood: %s" % codes)
    T.check_clean_exit(T.stop())


def case_flood(kvpeerd):
    """A connect flood faster than a good client's round trip, against a total
    cap of FLOOD_CAP (32 per address): the flood's 3 addresses keep 16
    connections each (two threads each) and replace them back to back (as
    fast as T accepts: the kernel drops SYNs while T's accept queue is full);
    a good client from 127.0.6.9 sends each request 1 s after its connect,
    while the flood makes more than a cap's worth of connections on average
    (counted: T's cuts). Every such request is answered: T cuts the oldest
    waiting connection of the busiest address, the flood's own."""
    flood_run(kvpeerd, "127.0.0.1:0", [["127.0.6.%d" % (1 + i % 3)] for i in range(6)],
              "127.0.6.9", "flood: 3 addresses x 16 connections")


def flood6_ns(what):
    """A network namespace of case ``what`` with 2001:db8:a::1..48 and
    2001:db8:b::1 on its lo; None (logged: ``what`` skipped) without root or
    `ip netns`, a failure when CI=true (partition.py's rule). Named per case:
    the namespaces go at exit (relib), not between cases."""
    ns = "kvp%s-%d" % (what, os.getpid())
    try:
        relib.netns_add(ns)
        for a in ["2001:db8:a::%x" % i for i in range(1, 49)] + ["2001:db8:b::1"]:
            relib.sh("ip", "-6", "addr", "add", a + "/128", "dev", "lo", "nodad", ns=ns)
    except (OSError, RuntimeError) as e:
        if os.environ.get("CI") == "true":  # as partition.py: a skip in CI is a failure
            relib.fail("%s: no network namespace in CI: %s" % (what, e))
        log("%s: skipped (no network namespace: %s)" % (what, e))
        return None
    return ns


def case_per64(kvpeerd):
    """24 addresses of one /64 each open one socket (one header line, held)
    against http_max_per_ip 4 and a total cap of 64 (never reached): T
    refuses all but 4 at once and counts them; a client of another /64 gets
    /healthz. Skipped (logged) without a network namespace."""
    ns = flood6_ns("per64")
    if ns is None:
        return
    T = http_daemon(kvpeerd, "T", "[::1]:0", ["--http_max_conns", "64", "--http_max_per_ip", "4"],
                    ns)

    def refusals():
        return int(re.search(r"^kvpeer_http_addr_refused_total (\d+)$", T.ok("/metrics"),
                             re.M).group(1))

    sources = ["2001:db8:a::%x" % i for i in range(1, 25)]
    t0 = time.monotonic()
    socks, refused = relib.in_netns(ns, slow_sockets, T.http, sources)
    try:
        # T's own count first (the idle timeout closes sockets too, and
        # counts nothing here); then the sockets it shut down are closed
        wait_for(lambda: refusals() >= 20, "T's refusals of the /64's sockets past its cap of 4",
                 10)
        secs = time.monotonic() - t0
        n = refusals()
        closed = closed_count(socks, 0.5)
        code = relib.in_netns(ns, slow_request, T.http, "2001:db8:b::1", 0.0)
    finally:
        for s in socks:
            s.close()
    log("per64: 24 sockets from 24 addresses of one /64, max_per_ip 4: %d refused at connect, "
        "kvpeer_http_addr_refused_total %d after %.2f s, then %d found closed; another /64's "
        "/healthz: %s" % (refused, n, secs, closed, code))
    check(n == 20, "per64: T refused %d of 24 sockets of one /64 against its cap of 4, want 20" % n)
    check(refused + closed >= 20, "per64: %d of 24 sockets of one /64 still open past its cap "
          "of 4" % (24 - refused - closed))
    check(code == 200, "per64: another /64's /healthz answered %s" % code)
    check(any("event=http_addr_full" in l for l in log_lines(T)), "per64: no http_addr_full line")
    T.check_clean_exit(T.stop())


def case_flood6(kvpeerd):
    """The flood from 48 IPv6 addresses of one /64 (2001:db8:a::/64, on lo
    of a network namespace made here), each holding about as many
    connections as the good client from another /64: T counts a /64 as one
    client address, so the flood cuts its own (by whole address, every
    address would hold ~1 and the good client, oldest, would be cut).
    Skipped (logged) without root or `ip netns`."""
    ns = flood6_ns("flood6")
    if ns is None:
        return
    flood_run(kvpeerd, "[::1]:0", [["2001:db8:a::%x" % i for i in range(1 + t, 49, 6)]
                                   for t in range(6)],
              "2001:db8:b::1", "flood6: 48 addresses of one /64 x ~1 connection", ns)


def case_fds(kvpeerd):
    """A kvpeerd whose every new descriptor is above 1023."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 8192)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    check(want >= 2048, "RLIMIT_NOFILE hard limit %d: cannot test past 1024 fds" % hard)
    null = os.open("/dev/null", os.O_RDONLY)
    fds = [os.dup(null) for _ in range(1100)]
    os.close(null)

    def child_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    try:
        F = relib.Daemon(kvpeerd, "F", ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                                        "--admin", "--num_blocks", "16", "--block_size", "64K",
                                        "--shutdown_drain_ms", "200"],
                         popen_kw={"pass_fds": fds, "preexec_fn": child_limit}).start()
    finally:
        for fd in fds:
            os.close(fd)
    low = sorted(int(f) for f in os.listdir("/proc/%d/fd" % F.proc.pid))
    check(len([f for f in low if 3 <= f < 1024]) >= 1000, "F does not hold the low descriptors")
    host, port = F.http.rsplit(":", 1)
    socks = [socket.create_connection((host, int(port))) for _ in range(20)]  # more fds
    bound = scaled(PROBE_S)
    t1, t2 = timed_probe(F.http, "/healthz", bound), timed_probe(F.http, "/metrics", bound)
    check(F.put(0, 4) == "put 4 0\n", "admin put on F")
    top = max(int(f) for f in os.listdir("/proc/%d/fd" % F.proc.pid))
    log("fds: F holds descriptors up to %d: /healthz %.0f ms, /metrics %.0f ms, admin put ok" %
        (top, t1 * 1e3, t2 * 1e3))
    check(top > 1100, "F's HTTP descriptors are not above 1023 (max %d)" % top)
    for s in socks:
        s.close()
    F.check_clean_exit(F.stop())


# Under the valgrind gate (KVPEER_DAEMON_WRAP) the daemon's stderr also holds
# valgrind's own lines, "==PID== ...", with the daemon's pid: not log lines.
def log_lines(d):
    lines = d.logtext().splitlines()
    if os.environ.get("KVPEER_DAEMON_WRAP"):
        tool = re.compile(r"^(==|--)%d(==|--) " % d.proc.pid)  # valgrind's own lines
        lines = [l for l in lines if not tool.match(l)]
    return lines


LOGFMT = re.compile(r'([^\s=]+)=("(?:[^"\\]|\\.)*"|\S*)')


def check_log_clean(d, what):
    """Every line of d's log is one logfmt event of its own: it starts with
    ts=, its fields (key=value or key="...") cover the whole line, level and
    event occur once, no field is named or valued FORGED outside a quoted
    value, and no raw ESC anywhere. (Lines of sanitizer or UCX output would
    fail this too: none are expected.)"""
    for line in log_lines(d):
        check("\x1b" not in line, "%s: raw ESC in %s's log: %r" % (what, d.name, line))
        fields = LOGFMT.findall(line)
        keys = [k for k, _ in fields]
        rebuilt = " ".join("%s=%s" % kv for kv in fields)
        check(line.startswith("ts=") and rebuilt == line and keys.count("level") == 1 and
              keys.count("ts") == 1 and keys.count("event") <= 1 and FORGED not in keys and
              not any(v.startswith(FORGED) for _, v in fields),
              "%s: forged line or field in %s's log: %r" % (what, d.name, line))


def check_peers_clean(d, what):
    """/peers: one line per entry, each starting with peer=, and no field
    named or valued FORGED."""
    body = d.ok("/peers")
    for line in body.splitlines():
        check(line.startswith("peer="), "%s: /peers line not starting with peer=: %r" % (what, line))
        f = relib.kv(line)
        check(FORGED not in f and f.get("ready") in ("0", "1") and "\x1b" not in line,
              "%s: forged /peers entry: %r" % (what, line))
    return body


def check_metrics_clean(d, what):
    for line in d.ok("/metrics").splitlines():
        check(line.startswith("#") or line.startswith("kvpeer_"),
              "%s: a /metrics line that is no sample: %r" % (what, line))


def case_inject(D):
    time.sleep(1.1)  # error access lines are rate limited (20 a second): a fresh second
    esc = "%0a" + FORGED + "%20level=error%20event=" + FORGED + "%1b[2J%0d"
    code, _, body = http_raw(D.http, "/nope" + esc)
    check(code == 404 and body.count("\n") == 1 and "\\x0a" in body and "\x1b" not in body,
          "inject: 404 body %r" % body)
    tok = {"Authorization": "Bearer " + relib.ADMIN_TOKEN}
    code, _, body = http_raw(D.http, "/admin/put?first=1" + esc + "&count=1", "POST", tok)
    check(code == 400 and body.count("\n") == 1 and "\\x0a" in body, "inject: 400 body %r" % body)
    # a wanted peer whose name holds the injection (kvp_peer_add may refuse it)
    code, _, body = http_raw(D.http, "/admin/peer?add=x" + esc + ":1", "POST", tok)
    check(body.count("\n") == 1 and "\x1b" not in body, "inject: peer add body %r" % body)
    log("inject: peer add of the injected name answered %d %r" % (code, body.strip()))
    time.sleep(0.3)
    check_peers_clean(D, "inject")
    check_metrics_clean(D, "inject")
    check_log_clean(D, "inject")
    check(any("path=/nope\\x0a" + FORGED in l for l in log_lines(D)),
          "inject: the access line of the injected URL is missing (not escaped?)")
    if code == 200:
        http_raw(D.http, "/admin/peer?remove=x" + esc + ":1", "POST", tok)


def case_peer_id(D, X, fp):
    bad_id = "evil\n2026-01-01T00:00:00Z ERROR [x] " + FORGED + " ready=1\x1b[31m:1"
    # refused for its layout: the refusal line names the peer id
    r = hostile.Raw(D.peer, fp, hostile.NUM_BLOCKS + 1)
    r.peer_id = bad_id
    r.handshake(timeout=scaled(3))
    r.close()
    wait_for(lambda: any("evil\\x0a2026" in l for l in log_lines(D)),
             "D's refusal line naming the escaped peer id", 10)
    # refused at HELLO (issue 27: ids that are not printable ASCII), even
    # with X's real blob at hand: no session, no /peers entry
    xblob = hostile.capture_blob(X.peer, fp, hostile.X_BLOCKS)
    r = hostile.Raw(D.peer, fp, hostile.X_BLOCKS)
    r.peer_id = bad_id
    check(not r.handshake(timeout=scaled(5)), "peer_id: D acked an unprintable peer id")
    check(xblob is not None, "peer_id: X's blob not captured")
    r.close()
    body = check_peers_clean(D, "peer_id")
    check("evil" not in body, "peer_id: the refused id is in /peers: %r" % body[:200])
    check_metrics_clean(D, "peer_id")
    check_log_clean(D, "peer_id")
    log("peer_id: refused at HELLO, logged escaped, absent from /peers")


def case_token(D):
    routes = [("/admin/put?first=900&count=4", "POST"), ("/admin/fetch?peer=x:1&first=0&count=1"
              "&request=1", "POST"), ("/admin/finish?request=1", "POST"),
              ("/admin/peer?add=127.0.0.1:1", "POST"), ("/admin/verify?first=0&count=1", "GET"),
              ("/admin/corrupt?key=0", "POST")]
    for hdr in ({}, {"Authorization": "Bearer " + "0" * 48},
                {"Authorization": "Basic " + relib.ADMIN_TOKEN},
                {"Authorization": "Bearer " + relib.ADMIN_TOKEN + "x"}):
        for path, method in routes:
            code, h, body = http_raw(D.http, path, method, hdr)
            if path.startswith("/admin/corrupt") and not TEST_ROUTES:
                check(code in (401, 404), "token: %s answered %d" % (path, code))
                continue
            check(code == 401 and h.get("WWW-Authenticate", "").startswith("Bearer"),
                  "token: %s %s with %r answered %d %r" % (method, path, hdr, code, body))
    v = D.verify(900, 4)
    check(v["present"] == 0, "token: an unauthorised put wrote blocks: %s" % v)
    check("127.0.0.1:1" not in D.ok("/peers"), "token: an unauthorised peer add took effect")
    log("token: %d admin routes x 4 bad Authorization headers: all 401, nothing changed" %
        len(routes))


TEST_ROUTES = os.environ.get("KVPEER_TEST_ROUTES") == "1"


def case_long_admin(D, G):
    """An authenticated admin request may block longer than http_idle_ms
    (a WAIT_FOR_SUPPLY fetch that nobody supplies): it is answered, not cut
    by the idle timeout meant for silent clients."""
    t0 = time.monotonic()
    ms = int(2.5 * IDLE_MS)
    f = D.fetch(G.peer, 9000, 2, 777, timeout_ms=ms, wait=True)  # D.ok: HTTP 200 or fail
    secs = time.monotonic() - t0
    D.ok("/admin/finish?request=777", "POST")
    log("long_admin: a %d ms wait fetch answered after %.1f s (http_idle_ms %d): %s" %
        (ms, secs, IDLE_MS, " ".join("%s=%s" % kv for kv in sorted(f.items()))))
    check(secs >= ms / 1000.0 * 0.9 and f.get("status") != "ok",
          "long_admin: answered after %.1f s: %s" % (secs, f))


def case_corrupt(D, kvpeerd):
    tok = {"Authorization": "Bearer " + relib.ADMIN_TOKEN}
    code, _, body = http_raw(D.http, "/admin/corrupt?key=999999", "POST", tok)
    syms = subprocess.run(["nm", kvpeerd], capture_output=True, text=True).stdout
    if TEST_ROUTES:
        check(code == 404 and body.startswith("block 999999"), "corrupt (test build): %d %r" %
              (code, body))
        check("kvpd_admin_corrupt" in syms, "corrupt: symbol missing from a test build")
    else:
        check(code == 404 and body.startswith("not found: /admin/corrupt"),
              "corrupt route in a build without test routes: %d %r" % (code, body))
        check("kvpd_admin_corrupt" not in syms, "kvpd_admin_corrupt linked into the daemon")
    log("corrupt: test routes %s: %d %r" % ("on" if TEST_ROUTES else "off", code, body.strip()))


def main():
    kvpeerd = os.path.abspath(sys.argv[1])
    cases = sys.argv[2:] or ["token", "corrupt", "inject", "peer_id", "long_admin", "slowloris",
                             "trickle", "flood", "flood6", "per64", "fds"]
    fp = hostile.fingerprint()
    common = ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin", "--block_size",
              "64K", "--compat", hostile.COMPAT, "--shutdown_drain_ms", "500",
              "--handshake_timeout_ms", "3000"]
    D = relib.Daemon(kvpeerd, "D", common + ["--num_blocks", str(hostile.NUM_BLOCKS),
                                             "--http_idle_ms", str(IDLE_MS)]).start()
    G = relib.Daemon(kvpeerd, "G", common + ["--num_blocks", "64", "--peers", D.peer]).start()
    X = relib.Daemon(kvpeerd, "X", common + ["--num_blocks", str(hostile.X_BLOCKS)]).start()
    wait_for(lambda: G.peer_ready(D.peer), "G's session to D", 20)
    check(D.put(0, 32) == "put 32 0\n", "put on D")
    good = hostile.GoodPeer(G, D)  # fresh keys each fetch, put on D first
    good.start()
    wait_for(lambda: good.ok >= 3, "the good peer's first fetches", 30)
    for c in cases:
        ok0 = good.ok
        if c == "slowloris":
            case_slowloris(D, kvpeerd)
        elif c == "trickle":
            case_trickle(kvpeerd)
        elif c == "flood":
            case_flood(kvpeerd)
        elif c == "flood6":
            case_flood6(kvpeerd)
        elif c == "per64":
            case_per64(kvpeerd)
        elif c == "fds":
            case_fds(kvpeerd)
        elif c == "inject":
            case_inject(D)
        elif c == "peer_id":
            case_peer_id(D, X, fp)
        elif c == "token":
            case_token(D)
        elif c == "long_admin":
            case_long_admin(D, G)
        elif c == "corrupt":
            case_corrupt(D, kvpeerd)
        else:
            relib.fail("unknown case %s" % c)
        wait_for(lambda: good.ok > ok0, "a good fetch after case %s" % c, 30)
    good.stop_evt.set()
    good.join(scaled(30))
    check(good.bad == 0, "the good peer's fetches failed %d times: %s" % (good.bad, good.last_bad))
    for d in (D, G):
        v = d.verify(0, 5000)
        check(v["bad"] == 0, "%s holds corrupt blocks: %s" % (d.name, v))
    log("good peer: %d fetches ok, 0 failed; verify bad=0 on D and G" % good.ok)
    for d in (G, D, X):
        d.check_clean_exit(d.stop())
    print("PASS", flush=True)


if __name__ == "__main__":
    main()
