#!/usr/bin/env python3
"""peers_bench.py -- the transfer engines a user would pick instead of kvpeer,
moving the same bytes between two processes on this machine (issue 17 item 3):

  * Mooncake Transfer Engine (PyPI mooncake-transfer-engine-non-cuda):
    protocol tcp, and shm if the wheel offers it (the exact error otherwise);
    P2PHANDSHAKE metadata (no etcd).
  * NIXL (PyPI nixl): UCX backend, DRAM to DRAM, UCX's default transports
    (shared memory) and UCX_TLS=tcp.

For each: an initiator process (this one) WRITEs into a target process (a
child running this script with --role target), K batches outstanding, each
batch = one request of `req` bytes in blocks of `bs`, source blocks in order
and destination slots stride-7 permuted over regions larger than the LLC
(like bench/transport/ucx_bench and bench/e2e). Per cell: GB/s, batches/s,
p50/p99 batch latency, CPU seconds per GB of both processes (getrusage), and
the last batch verified byte-exact at the target.

Then bench/e2e/e2e_bench runs the same cells (kvpeer: lookup + fetch per
request, checksums off and on) in the same run, and one table puts them side
by side. CSV to --out/peers.csv.

  peers_bench.py [--quick] [--e2e-bench PATH] [--engines mooncake,nixl,kvpeer]
                 [--sizes KiB,..] [--req-mib M,..] [--depths K,..] [--secs S]
                 [--region-mib N] [--out DIR]

Run it with the venv that holds the wheels (make bench-peers creates
build/peers-venv; see bench/e2e/peers/README.md).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time
import traceback

import numpy as np

os.environ.setdefault("GLOG_minloglevel", "1")  # Mooncake's glog: warnings and up

# ---------------------------------------------------------------- helpers


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def block_fill(region, bs, nblocks):
    """Block i: every 8-byte word is (i << 32) | word index (cheap, checkable)."""
    words = bs // 8
    view = region.view(np.uint64).reshape(nblocks, words)
    idx = np.arange(words, dtype=np.uint64)
    for i in range(nblocks):
        view[i] = (np.uint64(i) << np.uint64(32)) | idx


def block_ok(region, bs, slot, src_block):
    words = bs // 8
    got = region[slot * bs:(slot + 1) * bs].view(np.uint64)
    want = (np.uint64(src_block) << np.uint64(32)) | np.arange(words, dtype=np.uint64)
    return bool(np.array_equal(got, want))


PROTO = sys.stdout  # the target's protocol channel (stdout is re-pointed at stderr)


def send(obj, f=None):
    f = f or PROTO
    f.write(json.dumps(obj) + "\n")
    f.flush()


# ---------------------------------------------------------------- engines
#
# Each engine: target side  setup(region) -> dict sent to the initiator
#              initiator    connect(info, src) ; submit(pairs) -> handle ;
#                           wait(handle) (blocks) ; close()


class Mooncake:
    def __init__(self, proto):
        from mooncake.engine import TransferEngine
        self.proto = proto
        self.te = TransferEngine()
        rc = self.te.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "")
        if rc != 0:
            raise RuntimeError(f"TransferEngine.initialize('127.0.0.1', 'P2PHANDSHAKE', "
                               f"'{proto}', '') returned {rc}")

    def register(self, region):
        addr = region.ctypes.data
        rc = self.te.register_memory(addr, region.nbytes)
        if rc != 0:
            raise RuntimeError(f"register_memory returned {rc}")
        return addr

    def target_info(self, region):
        return {"addr": self.register(region), "peer": f"127.0.0.1:{self.te.get_rpc_port()}"}

    def connect(self, info, src):
        self.peer, self.raddr = info["peer"], info["addr"]
        self.laddr = self.register(src)

    def prepare(self, info, src, bs):
        self.bs = bs

    def submit(self, pairs):
        bs = self.bs
        bid = self.te.batch_transfer_async_write(
            self.peer, [self.laddr + s * bs for s, _ in pairs],
            [self.raddr + d * bs for _, d in pairs], [bs] * len(pairs))
        if bid == 0 or bid is None or (isinstance(bid, int) and bid < 0):
            raise RuntimeError(f"batch_transfer_async_write returned {bid}")
        return bid

    def wait(self, h):
        rc = self.te.get_batch_transfer_status([h])
        if rc != 0:
            raise RuntimeError(f"get_batch_transfer_status returned {rc}")

    def close(self):
        pass


class Nixl:
    def __init__(self, name):
        from nixl._api import nixl_agent, nixl_agent_config
        self.agent = nixl_agent(name, nixl_agent_config(backends=["UCX"]))

    def register(self, region):
        addr = region.ctypes.data
        self.reg = self.agent.register_memory([(addr, region.nbytes, 0, "")], "DRAM")
        return addr

    def target_info(self, region):
        addr = self.register(region)
        return {"addr": addr, "meta": self.agent.get_agent_metadata().hex(),
                "nbytes": region.nbytes}

    def connect(self, info, src):
        self.laddr = self.register(src)
        self.remote = self.agent.add_remote_agent(bytes.fromhex(info["meta"]))

    def prepare(self, info, src, bs):
        self.bs, laddr = bs, self.laddr
        n = src.nbytes // bs
        self.lside = self.agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", [(laddr + i * bs, bs, 0) for i in range(n)], "DRAM")
        self.rside = self.agent.prep_xfer_dlist(
            self.remote, [(info["addr"] + i * bs, bs, 0) for i in range(info["nbytes"] // bs)],
            "DRAM")

    def submit(self, pairs):
        h = self.agent.make_prepped_xfer("WRITE", self.lside, [s for s, _ in pairs], self.rside,
                                         [d for _, d in pairs])
        st = self.agent.transfer(h)
        if st == "ERR":
            raise RuntimeError("nixl transfer() returned ERR")
        return h

    def wait(self, h):
        while True:
            st = self.agent.check_xfer_state(h)
            if st == "DONE":
                break
            if st == "ERR":
                raise RuntimeError("nixl check_xfer_state: ERR")
        self.agent.release_xfer_handle(h)

    def close(self):
        pass


def make_engine(kind, role):
    if kind == "mooncake-tcp":
        return Mooncake("tcp")
    if kind == "mooncake-shm":
        return Mooncake("shm")
    if kind in ("nixl-shm", "nixl-tcp"):
        return Nixl(f"{kind}-{role}")
    raise ValueError(kind)


def engine_env(kind):
    env = dict(os.environ)
    env.pop("UCX_TLS", None)
    env.setdefault("UCX_NET_DEVICES", "lo")
    if kind == "nixl-tcp":
        env["UCX_TLS"] = "tcp"
    return env


# ---------------------------------------------------------------- target


def target_main(a):
    global PROTO
    PROTO = os.fdopen(os.dup(1), "w")  # engines print to stdout: keep the channel clean
    os.dup2(2, 1)
    region = np.zeros(a.region_mib << 20, dtype=np.uint8)
    region[:] = 1  # first touch before timing
    try:
        eng = make_engine(a.engine, "target")
        send({"ok": True, **eng.target_info(region)})
    except Exception as e:  # the exact error goes to the initiator's table
        send({"ok": False, "error": f"{type(e).__name__}: {e}"})
        return
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "cpu":
            send({"cpu": cpu_s()})
        elif cmd["cmd"] == "verify":
            bad = sum(not block_ok(region, cmd["bs"], d, s) for s, d in cmd["pairs"])
            send({"bad": bad, "n": len(cmd["pairs"])})
        elif cmd["cmd"] == "quit":
            break


# ---------------------------------------------------------------- initiator


class Target:
    def __init__(self, a, kind):
        args = [sys.executable, os.path.abspath(__file__), "--role", "target", "--engine", kind,
                "--region-mib", str(a.region_mib)]
        self.log = os.path.join(a.out, f"peers-{kind}-target"
                                f"{'' if a.attempt == 1 else a.attempt}.log")
        with open(self.log, "w") as logf:
            self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=logf, text=True, env=engine_env(kind))
        line = self.p.stdout.readline()
        if not line:
            with open(self.log) as f:
                err = f.read().strip().splitlines()
            raise RuntimeError("target died: " + (err[-1] if err else "no output"))
        self.info = json.loads(line)

    def ask(self, obj):
        send(obj, self.p.stdin)
        return json.loads(self.p.stdout.readline())

    def close(self):
        try:
            send({"cmd": "quit"}, self.p.stdin)
            self.p.wait(timeout=30)
        except Exception:
            self.p.kill()
            self.p.wait()


def run_cell(eng, tgt, bs, req, depth, secs, nb, cursor):
    b = max(1, req // bs)
    inflight, lat = [], []
    done_bytes, batches, t0 = 0, 0, time.monotonic()
    c0, r0 = cpu_s(), tgt.ask({"cmd": "cpu"})["cpu"]
    end = t0 + secs
    last = None
    while True:
        while len(inflight) < depth and time.monotonic() < end:
            pairs = [((cursor + i) % nb, ((cursor + i) * 7) % nb) for i in range(b)]
            cursor += b
            ts = time.monotonic()  # latency counts the submit (it may complete inline)
            inflight.append((eng.submit(pairs), ts, pairs))
        if not inflight:
            break
        h, ts, pairs = inflight.pop(0)
        eng.wait(h)
        lat.append((time.monotonic() - ts) * 1e6)
        done_bytes += b * bs
        batches += 1
        last = pairs
    el = time.monotonic() - t0
    c1, r1 = cpu_s(), tgt.ask({"cmd": "cpu"})["cpu"]
    v = tgt.ask({"cmd": "verify", "bs": bs, "pairs": last})
    lat.sort()
    pick = lambda p: lat[min(len(lat) - 1, max(0, int(p / 100 * len(lat) + 0.5) - 1))]
    return cursor, {
        "gbps": done_bytes / el / 1e9, "per_s": batches / el, "p50_us": pick(50),
        "p99_us": pick(99), "cpu_s_per_gb": (c1 - c0 + r1 - r0) / (done_bytes / 1e9),
        "verified": v["n"] - v["bad"], "bad": v["bad"], "load": loadavg()}


def engine_cells(a):
    """The cells every engine runs, in order (initiator and parent agree on the
    indexes): block size, request bytes, K; a cell whose K requests would not
    fit half the region is left out."""
    cells = []
    for bs in a.sizes:
        for req in a.reqs:
            for k in a.depths:
                if k * max(req, bs) <= (a.region_mib << 20) // 2:
                    cells.append((bs, req, k))
    return cells


def run_engine(a, kind, rows):
    """The initiator of one engine, in its own process (engines keep global
    state: Mooncake's allocator, UCX's config); rows come back as JSON. A cell
    that fails ends that process and its target: the next cell runs on a fresh
    initiator and target (Mooncake's engine does not recover from a queue-full
    failure, and every later cell of the same engine failed with it), so the
    failure is recorded for that cell only."""
    print(f"== {kind}", flush=True)
    out = os.path.join(a.out, f"peers-{kind}.json")
    total, start, attempt = len(engine_cells(a)), 0, 0
    while start < total or attempt == 0:
        attempt += 1
        log = os.path.join(a.out, f"peers-{kind}-initiator{'' if attempt == 1 else attempt}.log")
        args = [sys.executable, os.path.abspath(__file__), "--role", "initiator-one",
                "--engine", kind, "--json", out, "--out", a.out, "--region-mib",
                str(a.region_mib), "--secs", str(a.secs), "--start", str(start),
                "--attempt", str(attempt),
                "--sizes", ",".join(str(x >> 10) for x in a.sizes),
                "--req-mib", ",".join(str(x >> 20) for x in a.reqs),
                "--depths", ",".join(str(x) for x in a.depths)]
        if os.path.exists(out):
            os.unlink(out)
        with open(log, "w") as logf:
            p = subprocess.run(args, stdout=logf, stderr=subprocess.STDOUT, env=engine_env(kind),
                               timeout=1800)
        with open(log) as f:
            text = f.read()
        for line in text.splitlines():
            if line.startswith("  " + kind):
                print(line, flush=True)
        seen = set()
        tlog = os.path.join(a.out, f"peers-{kind}-target{'' if attempt == 1 else attempt}.log")
        for lf in (log, tlog):
            try:
                with open(lf) as f:
                    for w in f.read().split():
                        if w.rstrip(":,.").endswith("Transport") and w[0].isupper():
                            seen.add(w.rstrip(":,."))
            except OSError:
                pass
        if seen:
            print(f"  {kind}: transports named in its logs: {', '.join(sorted(seen))}",
                  flush=True)
        try:
            with open(out) as f:
                got = json.load(f)
        except (OSError, ValueError):
            tail = text.strip().splitlines()[-1:] or ["no output"]
            rows.append({"engine": kind, "error": f"initiator exit {p.returncode}: {tail[0]}"})
            return
        for r in got["rows"]:
            if seen:
                r["transports"] = " ".join(sorted(seen))
        rows.extend(got["rows"])
        if got["next"] <= start:  # no cell ran (it could not start): nothing to resume
            return
        if got["next"] < total:
            print(f"  {kind}: restarting the engine and its target for the next cell",
                  flush=True)
        start = got["next"]


def initiator_one(a, kind):
    """Cells from --start on; the first that fails is recorded and ends this
    process (the parent starts a fresh one at the next cell). The JSON says
    which cell comes next."""
    rows = []
    cells = engine_cells(a)
    nxt = a.start
    tgt = eng = None
    try:
        tgt = Target(a, kind)
        if not tgt.info.get("ok"):
            raise RuntimeError(tgt.info["error"])
        eng = make_engine(kind, "initiator")
        src = np.zeros(a.region_mib << 20, dtype=np.uint8)
        src[:] = 1  # first touch before timing
        eng.connect(tgt.info, src)
        nb, cursor, prepared = 0, 0, None
        for i in range(a.start, len(cells)):
            bs, req, k = cells[i]
            nxt = i + 1
            try:
                if prepared != bs:
                    nb = src.nbytes // bs
                    block_fill(src, bs, nb)
                    eng.prepare(tgt.info, src, bs)
                    prepared = bs
                    cursor, _ = run_cell(eng, tgt, bs, 1 << 20, 4, 0.1, nb, 0)  # warm-up
                cursor, r = run_cell(eng, tgt, bs, req, k, a.secs, nb, cursor)
            except Exception as e:  # this cell failed: say so; a fresh engine runs the next
                r = {"error": f"{type(e).__name__}: {e}"}
                print(f"  {kind:13s} bs {bs >> 10:5d} KiB req {req / 2**20:6.2f} MiB "
                      f"K={k:<2d} FAILED: {r['error']}", flush=True)
                if os.environ.get("PEERS_DEBUG"):
                    traceback.print_exc()
                r.update(engine=kind, bs=bs, req=max(req, bs) // bs * bs, depth=k)
                rows.append(r)
                break
            r.update(engine=kind, bs=bs, req=max(req, bs) // bs * bs, depth=k)
            rows.append(r)
            print(f"  {kind:13s} bs {bs >> 10:5d} KiB req {r['req'] / 2**20:6.2f} MiB "
                  f"K={k:<2d} {r['gbps']:7.3f} GB/s {r['per_s']:8.1f}/s p50 "
                  f"{r['p50_us']:8.0f} us p99 {r['p99_us']:8.0f} us cpu "
                  f"{r['cpu_s_per_gb']:.3f} s/GB verified {r['verified']} bad "
                  f"{r['bad']} load {r['load']}", flush=True)
    except Exception as e:  # setup failed: the engine cannot run here (or no longer)
        msg = f"{type(e).__name__}: {e}"
        what = "CANNOT RUN HERE" if a.attempt == 1 else "CANNOT RESTART"
        print(f"  {kind}: {what}: {msg}", flush=True)
        if os.environ.get("PEERS_DEBUG"):
            traceback.print_exc()
        rows.append({"engine": kind, "error": msg if a.attempt == 1 else
                     f"restart {a.attempt} (for cell {a.start + 1} of {len(cells)}): {msg}"})
        nxt = a.start
    finally:
        if eng is not None:
            try:
                eng.close()
            except Exception:
                pass
        if tgt:
            tgt.close()
    with open(a.json, "w") as f:
        json.dump({"rows": rows, "next": nxt}, f)


def run_kvpeer(a, rows):
    """bench/e2e/e2e_bench on the same cells, both paths, checksums off and on."""
    print("== kvpeer (bench/e2e/e2e_bench)", flush=True)
    out = os.path.join(a.out, "peers-kvpeer")
    cmd = [a.e2e_bench, "--no-ceilings", "--no-plot", "--out", out, "--region-mib",
           str(a.region_mib // 2), "--secs", str(a.secs), "--lookups", "20",
           "--sizes", ",".join(str(s >> 10) for s in a.sizes),
           "--req-mib", ",".join(str(r >> 20) for r in a.reqs),
           "--depths", ",".join(str(k) for k in a.depths)]
    print("  " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout.splitlines():
        if line.startswith("  shm") or line.startswith("  tcp"):
            print(line, flush=True)
    try:
        with open(os.path.join(out, "e2e.csv")) as f:
            head = f.readline().strip().split(",")
            for line in f:
                v = dict(zip(head, line.strip().split(",")))
                if v["kind"] != "e2e":
                    continue
                rows.append({"engine": f"kvpeer-{v['path']}-cks{v['checksums']}",
                             "bs": int(v["block_size"]), "req": int(v["req_bytes"]),
                             "depth": int(v["depth"]), "gbps": float(v["gbps"]),
                             "per_s": float(v["fetches_s"]), "p50_us": float(v["p50_us"]),
                             "p99_us": float(v["p99_us"]),
                             "cpu_s_per_gb": float(v["cpu_s_per_gb"]), "load": v["load1"]})
    except OSError as e:
        rows.append({"engine": "kvpeer", "error": f"e2e_bench exit {p.returncode}: {e}"})


def summary(a, rows):
    print("\nSide by side (same bytes per request, K outstanding; GB/s, p50 us):")
    engines = []
    for r in rows:
        if r["engine"] not in engines and "bs" in r:
            engines.append(r["engine"])
    cells = sorted({(r["bs"], r["req"], r["depth"]) for r in rows if "bs" in r})
    print(f"{'bs_KiB':>6} {'req_MiB':>7} {'K':>3} " + " ".join(f"{e:>22}" for e in engines))
    for bs, req, k in cells:
        line = f"{bs >> 10:6d} {req / 2**20:7.2f} {k:3d} "
        for e in engines:
            m = [r for r in rows if r["engine"] == e and "bs" in r and
                 (r["bs"], r["req"], r["depth"]) == (bs, req, k)]
            cell = ("FAILED" if m and "error" in m[0] else
                    f"{m[0]['gbps']:.3f} / {m[0]['p50_us']:.0f}" if m else "-")
            line += f"{cell:>22} "
        print(line)
    for r in rows:
        if "error" in r and "bs" in r:
            print(f"  {r['engine']} bs {r['bs'] >> 10} KiB req {r['req'] / 2**20:.2f} MiB "
                  f"K={r['depth']}: FAILED: {r['error']}")
        elif "error" in r:
            print(f"  {r['engine']}: CANNOT RUN HERE: {r['error']}")
    os.makedirs(a.out, exist_ok=True)
    csv = os.path.join(a.out, "peers.csv")
    with open(csv, "w") as f:
        f.write("engine,block_size,req_bytes,depth,gbps,per_s,p50_us,p99_us,cpu_s_per_gb,"
                "verified,bad,load,error\n")
        for r in rows:
            f.write(",".join(str(r.get(k, "")) for k in
                             ("engine", "bs", "req", "depth", "gbps", "per_s", "p50_us", "p99_us",
                              "cpu_s_per_gb", "verified", "bad", "load")) +
                    f",\"{r.get('error', '')}\"\n")
    print(f"csv: {csv}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--role", default="initiator")
    ap.add_argument("--engine", default="")
    ap.add_argument("--engines", default="mooncake-tcp,mooncake-shm,nixl-shm,nixl-tcp,kvpeer")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", default="")
    ap.add_argument("--req-mib", default="")
    ap.add_argument("--depths", default="")
    ap.add_argument("--secs", type=float, default=0.0)
    ap.add_argument("--region-mib", type=int, default=0)
    ap.add_argument("--e2e-bench", default="build/release/bench/e2e/e2e_bench")
    ap.add_argument("--out", default="build/bench-out")
    ap.add_argument("--json", default="")
    ap.add_argument("--start", type=int, default=0)  # initiator-one: first cell index
    ap.add_argument("--attempt", type=int, default=1)  # initiator-one: 1 + restarts so far
    a = ap.parse_args()
    a.region_mib = a.region_mib or (128 if a.quick else 256)
    if a.role == "target":
        return target_main(a)
    a.sizes = [int(x) << 10 for x in (a.sizes or ("256,2048" if a.quick else "16,256,2048")).split(",")]
    a.reqs = [int(x) << 20 for x in (a.req_mib or ("4" if a.quick else "1,16")).split(",")]
    a.depths = [int(x) for x in (a.depths or ("1,4" if a.quick else "1,4,16")).split(",")]
    a.secs = a.secs or (0.3 if a.quick else 0.6)
    os.makedirs(a.out, exist_ok=True)
    if a.role == "initiator-one":
        return initiator_one(a, a.engine)
    print(f"peers_bench: region {a.region_mib} MiB per side; {loadavg()} (load average)", flush=True)
    rows = []
    for kind in a.engines.split(","):
        if kind == "kvpeer":
            run_kvpeer(a, rows)
        else:
            run_engine(a, kind, rows)
    summary(a, rows)
    print(f"machine load at end: {loadavg()}")


if __name__ == "__main__":
    sys.exit(main())
