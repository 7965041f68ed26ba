"""relib.py -- helpers of the reliability scripts (stdlib only).

kvpeerd children (optionally inside a network namespace), their admin HTTP
API, Prometheus parsing, RSS, and network namespaces that are removed on
every exit path. Bounds scale with KVPEER_TEST_TIME_SCALE.
"""
import atexit
import ctypes
import http.client
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

SCALE = float(os.environ.get("KVPEER_TEST_TIME_SCALE", "1"))
TMP = tempfile.mkdtemp(prefix="kvp-rel-")
DAEMONS = []
NAMESPACES = []
SANITIZER_MARKS = ("LeakSanitizer", "AddressSanitizer", "ThreadSanitizer",
                   "UndefinedBehaviorSanitizer", "runtime error:")
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def log(msg):
    print("[%7.2f] %s" % (time.monotonic() - T0, msg), flush=True)


T0 = time.monotonic()


def exit_report():
    """One line per daemon: name, how it ended *before* cleanup killed it
    ("alive", "exit N" or "signal N"), its log file. Written to
    $KVPEER_REL_REPORT at exit (the repeat harnesses read it, e.g.
    partition_loop.py); keep the logs with KVPEER_KEEP_TMP=1."""
    path = os.environ.get("KVPEER_REL_REPORT")
    if not path:
        return
    with open(path, "w") as f:
        for d in DAEMONS:
            rc = d.proc.poll() if d.proc is not None else None
            how = ("alive" if rc is None else "signal %d" % -rc if rc < 0 else "exit %d" % rc)
            if d.stopped and rc is not None:
                how = "stopped " + how  # ended by stop(): the script asked for it
            f.write("%s\t%s\t%s\t%s\n" % (d.name, how, d.proc.pid if d.proc else 0,
                                           d.logpath))


def cleanup():
    try:
        exit_report()
    except OSError:
        pass
    for d in DAEMONS:
        d.kill()
    for ns in reversed(NAMESPACES):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    NAMESPACES.clear()
    if os.environ.get("KVPEER_KEEP_TMP") is None:
        shutil.rmtree(TMP, ignore_errors=True)


atexit.register(cleanup)
for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(_sig, lambda *_: sys.exit(3))  # atexit runs on sys.exit


def fail(msg):
    print("FAIL: " + msg, flush=True)
    for d in DAEMONS:  # a live daemon that no longer answers: show where it is stuck
        if d.proc is not None and d.proc.poll() is None and not d.responsive():
            print("%s does not answer HTTP:%s" % (d.name, d.stacks()), flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def scaled(s):
    return s * SCALE


# Memory bounds: sanitizer runtimes keep shadow and metadata of their own.
MEM_SLACK = 1 if SCALE <= 1 else 3

# KVPEER_DAEMON_WRAP: a command every kvpeerd runs under (the valgrind gate:
# memcheck, its exit code 99 on any error or leak fails check_clean_exit).
# RSS is then valgrind's, so memory bounds are not checked; nor under TSan
# (KVPEER_MEM_CHECKS=0), whose shadow memory and history only grow.
WRAP = os.environ.get("KVPEER_DAEMON_WRAP", "").split()
MEM_CHECKS = not WRAP and os.environ.get("KVPEER_MEM_CHECKS", "1") != "0"


def wait_for(cond, what, timeout):
    end = time.monotonic() + scaled(timeout)
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    fail("timed out after %.1f s waiting for %s" % (scaled(timeout), what))


# ------------------------------------------------------------ namespaces

def sh(*args, ns=None, check_rc=True):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check_rc and r.returncode != 0:
        raise RuntimeError("%s: rc %d: %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r


def netns_add(name):
    sh("ip", "netns", "add", name)
    NAMESPACES.append(name)
    sh("ip", "link", "set", "lo", "up", ns=name)


def in_netns(ns, fn, *args):
    """Run fn(*args) on a fresh thread that joined network namespace ns
    (setns is per thread); returns its result or re-raises its exception."""
    box = {}

    def body():
        try:
            if ns is not None:
                fd = os.open("/var/run/netns/" + ns, os.O_RDONLY)
                try:
                    if _libc.setns(fd, _CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns " + ns)
                finally:
                    os.close(fd)
            box["v"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 -- re-raised in the caller
            box["e"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


# ---------------------------------------------------------------- daemons

def parse_metrics(text):
    """Prometheus text: {'name{labels}': value} (format checked elsewhere)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


# Issue 27: kvpeerd --admin needs a bearer token file of mode 0600; every
# daemon started here with --admin shares this one, and every /admin/ request
# of Daemon.req carries it.
ADMIN_TOKEN = os.urandom(24).hex()


def admin_token_file():
    path = os.path.join(TMP, "admin.token")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(ADMIN_TOKEN + "\n")
    return path


def kv(text):
    """'a=1 b=x' -> {'a': '1', 'b': 'x'}"""
    return dict(f.split("=", 1) for f in text.split() if "=" in f)


class Daemon:
    """One kvpeerd child. Output goes to a log file kept for failure messages.
    `ns`: run inside that network namespace (HTTP is then reached from a
    thread that joined it)."""

    def __init__(self, kvpeerd, name, args, ns=None, env=None, popen_kw=None):
        self.name, self.ns = name, ns
        self.popen_kw = popen_kw or {}
        if "--admin" in args and not any(a.startswith("--admin_token_file") for a in args):
            args = args + ["--admin_token_file", admin_token_file()]
        self.ready = os.path.join(TMP, name + ".ready")
        self.logpath = os.path.join(TMP, name + ".log")
        self.kvpeerd = kvpeerd
        self.args = WRAP + [kvpeerd] + args + ["--ready_file", self.ready, "--name", name]
        self.env = dict(os.environ, **(env or {}))
        if "ASAN_OPTIONS" in self.env:  # a small free-quarantine: RSS then tracks leaks
            self.env["ASAN_OPTIONS"] += ":quarantine_size_mb=4"
        self.proc = None
        self.stopped = False
        self.peer = self.http = None
        DAEMONS.append(self)

    def start(self, timeout=30):
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        self.log = open(self.logpath, "a")
        cmd = (["ip", "netns", "exec", self.ns] if self.ns else []) + self.args
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env,
                                     **self.popen_kw)
        end = time.monotonic() + scaled(timeout)
        while time.monotonic() < end:
            if os.path.exists(self.ready):
                text = open(self.ready).read()
                if text.endswith("\n") or "http=" in text:
                    f = kv(text)
                    if "peer" in f and "http" in f:
                        self.peer, self.http = f["peer"], f["http"]
                        return self
            if self.proc.poll() is not None:
                fail("%s exited with %d before ready:\n%s" %
                     (self.name, self.proc.returncode, self.logtext()[-4000:]))
            time.sleep(0.05)
        fail("%s not ready within %.0f s:\n%s" % (self.name, scaled(timeout),
                                                  self.logtext()[-4000:]))

    def logtext(self):
        try:
            with open(self.logpath) as f:
                return f.read()
        except OSError:
            return ""

    def _req(self, path, method, timeout):
        r = urllib.request.Request("http://%s%s" % (self.http, path), method=method,
                                   data=b"" if method == "POST" else None)
        if path.startswith("/admin/"):
            r.add_header("Authorization", "Bearer " + ADMIN_TOKEN)
        try:
            with urllib.request.urlopen(r, timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def req(self, path, method="GET", timeout=60):
        try:
            return in_netns(self.ns, self._req, path, method, scaled(timeout))
        except (OSError, http.client.HTTPException) as e:
            alive = self.proc.poll() is None
            fail("%s %s on %s: %r; daemon %s:\n%s%s" % (
                method, path, self.name, e,
                "alive" if alive else "exited %s" % self.proc.poll(),
                self.logtext()[-4000:], self.stacks() if alive else ""))

    def responsive(self):
        try:
            return in_netns(self.ns, self._req, "/held", "GET", 3)[0] == 200  # through the node thread
        except Exception:  # noqa: BLE001 -- any failure means "no"
            return False

    def stacks(self):
        """Every thread's stack of a live but unresponsive daemon (gdb, if any)."""
        gdb = shutil.which("gdb")
        if gdb is None:
            return "\n(no gdb: no stacks)"
        r = subprocess.run([gdb, "-p", str(self.proc.pid), "-batch", "-nx",
                            "-ex", "thread apply all bt 30"],
                           capture_output=True, text=True, timeout=120)
        return "\n--- %s: threads ---\n%s" % (self.name, r.stdout[-12000:])

    def ok(self, path, method="GET", timeout=60):
        code, body = self.req(path, method, timeout)
        check(code == 200, "%s %s on %s: HTTP %d: %s" % (method, path, self.name, code, body))
        return body

    def metrics(self):
        return parse_metrics(self.ok("/metrics"))

    def held(self):
        """(retained lines, quarantined lines, suspect lines) of /held."""
        lines = self.ok("/held").splitlines()
        return ([l for l in lines if l.startswith("retained")],
                [l for l in lines if l.startswith("quarantined")],
                [l for l in lines if l.startswith("suspect")])

    def peers(self):
        return [kv(l) for l in self.ok("/peers").splitlines() if l.strip()]

    def peer_ready(self, peer):
        return any(p.get("peer") == peer and p.get("ready") == "1" for p in self.peers())

    def fetch(self, peer, first, count, request, timeout_ms=60000, wait=False):
        body = self.ok("/admin/fetch?peer=%s&first=%d&count=%d&request=%d&timeout_ms=%d%s" %
                       (peer, first, count, request, timeout_ms, "&wait=1" if wait else ""),
                       "POST", timeout=timeout_ms / 1000.0 / SCALE + 30)
        return kv(body)

    def put(self, first, count, request=0):
        return self.ok("/admin/put?first=%d&count=%d&request=%d" % (first, count, request),
                       "POST")

    def verify(self, first, count):
        return {k: int(v) for k, v in kv(self.ok("/admin/verify?first=%d&count=%d" %
                                                 (first, count))).items()}

    def rss_kb(self, field="VmRSS"):
        """VmRSS (or RssAnon: private heap, RssShmem: mapped shared regions) in kB."""
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return -1

    def mem(self):
        return {k: self.rss_kb(k) for k in ("VmRSS", "RssAnon", "RssShmem")}

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.stopped = True
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(scaled(timeout))
        except subprocess.TimeoutExpired:
            fail("%s did not exit within %.0f s after %s:\n%s" %
                 (self.name, scaled(timeout), sig, self.logtext()[-4000:]))
        self.log.close()
        return rc

    def check_clean_exit(self, rc):
        text = self.logtext()
        check(rc == 0, "%s exit code %s (want 0):\n%s" % (self.name, rc, text[-4000:]))
        for m in SANITIZER_MARKS:
            check(m not in text, "%s: sanitizer report (%s):\n%s" % (self.name, m, text[-6000:]))

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def hostile_args(compat, num_blocks, *extra):
    """kvpeerd flags of the hostile scripts' daemons: loopback, ephemeral
    control and HTTP ports, the admin API, 64 KiB blocks, a short drain."""
    return ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin",
            "--block_size", "64K", "--compat", compat, "--num_blocks", str(num_blocks),
            "--shutdown_drain_ms", "500"] + list(extra)


def serving_pair(kvpeerd, common, d_extra=()):
    """D, a daemon that serves (common + d_extra), and G, a good peer of D
    whose session to D is ready."""
    D = Daemon(kvpeerd, "D", common + list(d_extra)).start()
    G = Daemon(kvpeerd, "G", common + ["--peers", D.peer]).start()
    wait_for(lambda: G.peer_ready(D.peer), "G's session to D", 20)
    return D, G


def attacker_go(p):
    """One window of an attacker process (stdin/stdout pipes) that speaks the
    hostile scripts' protocol: it printed "ATTACK ready", waits for "go",
    prints "ATTACK start ...", attacks, prints "ATTACK done k=v ..." and
    exits 0. Returns (t_start, t_done, the done line's fields as text)."""
    p.stdin.write("go\n")
    p.stdin.flush()
    first = p.stdout.readline()
    check(first.startswith("ATTACK start"), "the attacker did not go: %r" % first)
    t1 = time.monotonic()
    done = p.stdout.readline()
    t2 = time.monotonic()
    rc = p.wait(scaled(60))
    check(rc == 0 and done.startswith("ATTACK done"), "attacker rc %s: %r" % (rc, done))
    return t1, t2, done[len("ATTACK done"):].strip()


def median(xs):
    """Median of a list of numbers (0.0 for an empty one)."""
    s = sorted(xs)
    if not s:
        return 0.0
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2.0
