"""vLLM's own p2p tier (NIXL) next to kvpeer's tier, moving the same blocks
between two processes of this machine through vLLM's TieringOffloadingManager.

Each tier runs in two fresh engine processes built the same way (vLLM's
OffloadingSpecFactory -> TieringOffloadingSpec -> TieringOffloadingManager over
a CPU primary tier in /dev/shm, one secondary tier):

* engine A stores N blocks: prepare_store, the bench writes the chunks (what
  vLLM's offloading worker copies in from the GPU), complete_store; vLLM then
  cascades them to the secondary tier (kvpeer: a copy into kvpeer's store;
  p2p: nothing, A serves them from its primary tier);
* engine B runs requests of R blocks one after the other, the scheduler's
  way: every step it calls manager.lookup() on each key of the request, then
  on_schedule_end(), then sleeps --step-ms; RETRY (the tier asked its peer)
  becomes HIT_PENDING (vLLM started the promotion: a submit_load into B's
  primary chunks) and then HIT (loaded). B then reads each chunk
  (prepare_load) and compares it with the bytes A wrote.

Per request: lookup latency = first lookup() until no key answers RETRY;
load latency = from there until every key answers HIT; sched/req = the time
B's scheduler thread spent inside the manager for the request (its lookup()
calls and step ends, which run the tier's polling and copies; it grows with
the number of steps a slow load takes), /step = that time per step (p50, us:
what one scheduler step costs while a request waits); passes = the
scheduler passes (lookups and a step end) a request took, p50 and p90: with
a short --step-ms a request's time is mostly its passes. Throughput = blocks
(and bytes) of all measured requests over their total wall time. A warm-up
request opens the sessions first (p2p answers MISS until its NIXL handshake
is done; kvpeer dials at start-up).

vLLM's KVCR tier (``type: kvcr``, PyPI kvcr, NIXL/UCX) runs with the python
of --kvcr-python (build/kvcr-venv: kvcr 0.1.1 pins nixl 1.5.0, the p2p row
uses 1.5.1). As shipped it does not import under vllm 0.34.0: vLLM's adapter
imports ``ZmqPeerControlChannel`` from kvcr's top level, which kvcr 0.1.1 (and
0.1.0) do not export (it is in kvcr.control_channels); the ``kvcr`` row prints
that ImportError (not counted as a failed run). ``kvcr-shim`` binds that one
name before vLLM imports the adapter and runs the tier unchanged otherwise:
B's requests carry a router hint in ``kv_hints`` (kvcr.hint_parser's
``kv.fetch`` action: A's control endpoint, the block hashes), the tier's
``router_capabilities: ["router_hint"]``; A serves pin requests only in a
scheduler step, so an idle engine steps every 1 ms while its manager has
pending work (vLLM's engine keeps stepping then too).

Tier configurations (the same for both, as a vLLM user would write them):
  p2p     {"type": "p2p", "host": "127.0.0.1", "port": P}; B's requests carry
          kv_transfer_params {"remote_kv_source": {"kv_request_id": ...,
          "remote_host": "127.0.0.1", "remote_port": P_A}} (vLLM's symmetric
          P2P: B probes A, A pins the blocks from its primary tier and WRITEs
          them into B's primary chunks with NIXL/UCX).
  kvpeer  {"type": "KVPeerSecondaryTier", "module_path": "kvpeer.vllm",
          "peers": [A], "listen": "127.0.0.1:0"}; no request parameters.
          Variants with the tier's hot-path options off, for before/after in
          one run: kvpeer-perkey ("batch_lookups": false: one LOOKUP per
          lookup() call), kvpeer-synccopy ("copy_thread": false: the copy
          into B's chunks on the scheduler thread), kvpeer-before (both).
Two modes (--modes, both by default), the same request params for p2p and
kvpeer in each:
  sym     symmetric P2P, as above: p2p's requests name A in remote_kv_source
          (p2p probes A: a LOOKUP round trip), kvpeer's name nothing (it asks
          its one peer, A: the same round trip, plus A's tier-poll round in
          zero copy, where vLLM pins what it serves).
  pd      prefill -> decode: A stores each request's blocks under a request
          carrying remote_decoder {kv_request_id}, and B's request names
          remote_prefiller {remote_host, remote_port, kv_request_id}. Both
          tiers answer HIT at B's first lookup (no probe, no LOOKUP) and the
          prefiller serves the request's stored blocks to the decoder (p2p
          parks A's store job until B fetched; kvpeer zero copy publishes the
          chunks at the store job, until the serve hold is over). kvcr is not
          run in this mode (it takes a router hint, not P/D params).
Both engines run vLLM's tier-poll thread at its default interval (1 ms); the
p2p tier asks for it (tolerates_off_thread_polling), kvpeer's does not (its
node thread serves peers).

Needs a python where vllm imports, and for p2p the `nixl` wheel:
``make bench-vllm-tiers`` makes build/nixl-venv (a venv layered on the
project venv: a .pth names .venv's site-packages; nixl installed from PyPI),
never the system python. A tier that cannot start here is reported with its
exact error and the other one still runs.

With --inflight N, B keeps N requests open at a time (each pass looks up
every key of every open request, as vLLM's scheduler does for its waiting
requests): their lookups and loads overlap, and blocks/s is what the tier
moves when the data path, not one request's passes, is the limit. A list
(--inflight 1,4) gives a table per size and count in one run.

    vllm_tiers.py [--tiers p2p,kvpeer] [--blocks 256] [--block-kib 256]
                  [--req-blocks 16] [--inflight 1,4] [--step-ms 1] [--tier-poll-ms MS]
                  [--quick] [--json OUT]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import trace_phases

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SHM_PREFIX = "vllm_offload_kvpeer-bench-"


# ---------------------------------------------------------------- shared bits
def pd_id(i: int) -> str:
    """--modes pd: the kv_request_id of the P/D pair whose first block is ``i``."""
    return f"pd-{i}"


def make_key(i: int, group: int = 0) -> bytes:
    """An OffloadKey as vLLM makes one: block hash (32 B) + group index."""
    return hashlib.sha256(b"bench-block-%d" % i).digest() + group.to_bytes(4, "big")


def block_bytes(key: bytes, seed: int, n: int) -> bytes:
    """Deterministic content of one block (both processes compute it)."""
    import numpy as np
    s = int.from_bytes(hashlib.sha256(key + seed.to_bytes(4, "little")).digest()[:8], "little")
    return np.random.default_rng(s).bytes(n)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank) of xs."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


# ---------------------------------------------------------------- one engine
class Engine:
    """One engine's scheduler-side offloading stack with one secondary tier
    (``tier_entry``: its entry in kv_connector_extra_config's secondary_tiers)."""

    def __init__(self, tier_entry: Dict[str, Any], chunk: int, num_chunks: int,
                 tier_poll_ms: Optional[float] = None) -> None:
        from vllm.v1.kv_offload.base import ScheduleEndContext
        from vllm.v1.kv_offload.factory import OffloadingSpecFactory
        from kvpeer.vllm import offloading_config

        self.chunk = chunk
        self.engine_id = f"kvpeer-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._step_end = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
        # tier_poll_interval_s: vLLM's default (1 ms) unless --tier-poll-ms
        poll = {} if tier_poll_ms is None else {"tier_poll_interval_s": tier_poll_ms / 1e3}
        cfg = offloading_config(self.engine_id, chunk, num_chunks, [tier_entry], "bench", **poll)
        self.spec = OffloadingSpecFactory.create_spec(cfg)
        self.manager = self.spec.get_manager()
        self.tier = self.manager.secondary_tiers[0]
        self.view = self.manager.primary_tier.get_kv_memoryview().cast("B")
        self._n = 0
        self._open: List[Any] = []  # P/D prefill requests (--modes pd), finished at close

    def ctx(self, params: Optional[Dict[str, Any]], req_id: str,
            hints: Optional[Dict[str, Any]] = None):
        from vllm.v1.kv_offload.base import ReqContext
        c = ReqContext(req_id=req_id, kv_transfer_params=params, kv_hints=hints)
        with self.manager.lock:
            self.manager.on_new_request(c)
        return c

    def step(self) -> None:
        with self.manager.lock:
            self.manager.on_schedule_end(self._step_end)

    def idle(self) -> bool:
        with self.manager.lock:
            return not self.manager._jobs

    def store(self, keys: Sequence[bytes], seed: int, timeout: float,
              decoder_id: Optional[str] = None) -> int:
        """GPU->primary store of ``keys`` (the bench writes the chunks), vLLM
        cascades to the secondary tier; returns the keys written.
        ``decoder_id``: the prefill half of a P/D pair (kv_transfer_params
        ``remote_decoder``): the store is not waited for (p2p parks its job
        until the decoder has fetched) and its request stays open until the
        engine closes."""
        params = None if decoder_id is None else {"remote_decoder": {"kv_request_id": decoder_id}}
        c = self.ctx(params, f"{self.engine_id}-store{self._n}")
        self._n += 1
        with self.manager.lock:
            out = self.manager.prepare_store(keys, c)
            if out is None:
                raise RuntimeError("primary tier full")
            for k, ch in zip(out.keys_to_store, out.store_spec.chunk_ids):
                o = int(ch) * self.chunk
                self.view[o:o + self.chunk] = block_bytes(bytes(k), seed, self.chunk)
            self.manager.complete_store(out.keys_to_store, c, True)
        if decoder_id is not None:
            self._open.append(c)
            return len(out.keys_to_store)
        deadline = time.monotonic() + timeout
        while not self.idle():
            if time.monotonic() > deadline:
                raise TimeoutError("store jobs did not finish")
            self.step()
            time.sleep(0.001)
        with self.manager.lock:
            self.manager.on_request_finished(c)
        return len(out.keys_to_store)

    def close(self) -> None:
        with self.manager.lock:
            for c in self._open:
                self.manager.on_request_finished(c)
        self.view.release()
        self.manager.shutdown()


# kvpeer's tier in staging (its own store), and with its hot-path options
# off: one LOOKUP per lookup() call, the copy into vLLM's chunks on the
# scheduler thread, or both (the tier before issue 16's hot-path work).
_STAGING = {"kvpeer_zero_copy": False}
KVPEER_VARIANTS: Dict[str, Dict[str, Any]] = {
    "kvpeer": _STAGING,
    "kvpeer-perkey": {**_STAGING, "batch_lookups": False},
    "kvpeer-synccopy": {**_STAGING, "copy_thread": False},
    "kvpeer-before": {**_STAGING, "batch_lookups": False, "copy_thread": False},
    # issue 29, the tier's default: no store of kvpeer's own; served from and
    # landed in vLLM's chunks
    "kvpeer-zc": {"kvpeer_zero_copy": True},
}


# vLLM's KVCR tier (PyPI kvcr, NIXL): needs the router-hint capability (a
# request names its source in kv_hints); "kvcr-shim" is the same tier with the
# one name vllm 0.34.0's adapter imports from kvcr's top level and kvcr 0.1.1
# no longer exports there (ZmqPeerControlChannel) bound before the import.
KVCR_TIERS = ("kvcr", "kvcr-shim")

# How B's requests name their source (--modes).
MODES = {"sym": "symmetric", "pd": "prefill -> decode"}


def kvcr_import(tier: str) -> None:
    """Import vLLM's KVCR adapter as the engine will (the exact error if not)."""
    if tier == "kvcr-shim":
        import kvcr
        import kvcr.control_channels as cc
        if not hasattr(kvcr, "ZmqPeerControlChannel"):
            kvcr.ZmqPeerControlChannel = cc.ZmqPeerControlChannel
    import vllm.v1.kv_offload.tiering.kvcr.manager  # noqa: F401


def kvcr_hint(a_host: str, a_port: int, keys: Sequence[bytes]) -> Dict[str, Any]:
    """The router hint KVCR takes (kvcr.hint_parser): fetch ``keys`` from A's
    control endpoint; block hashes as 64-bit ints (vLLM's router form)."""
    return {"protocol_version": "0.1", "message_id": uuid.uuid4().hex,
            "actions": [{"action_id": "0", "action_type": "kv.fetch", "action_version": "1.0",
                         "payload": {"source_control_endpoint": f"tcp://{a_host}:{a_port}",
                                     "block_hashes": [int.from_bytes(k[:-4], "big") & ((1 << 64) - 1)
                                                      for k in keys]}}]}


def tier_entry(tier: str, port: int, peers: Sequence[str], num_chunks: int) -> Dict[str, Any]:
    if tier == "p2p":
        return {"type": "p2p", "host": "127.0.0.1", "port": port}
    if tier in KVCR_TIERS:
        return {"type": "kvcr", "router_capabilities": ["router_hint"],
                "control_host": "127.0.0.1", "control_ports": [port],
                "control_advertise_host": "127.0.0.1"}
    if tier in KVPEER_VARIANTS:
        # staging: kvpeer's store as large as the CPU tier (not its default
        # 1024 blocks: 2 GiB per engine at 2 MiB chunks); zero copy has none
        return {"type": "KVPeerSecondaryTier", "module_path": "kvpeer.vllm",
                "listen": f"127.0.0.1:{port}", "peers": list(peers), "num_blocks": num_chunks,
                **KVPEER_VARIANTS[tier]}
    raise ValueError(f"unknown tier {tier!r}")


# ---------------------------------------------------------------- engine B
def run_loads(eng: Engine, tier: str, a_addr: str, keys: List[bytes], seed: int,
              req_blocks: int, step_s: float, timeout: float, tag: str,
              inflight: int = 1, first: int = 0, pd: bool = False) -> Dict[str, Any]:
    """Requests of ``req_blocks`` keys, ``inflight`` of them open at a time
    (1: one after the other), the scheduler's way (see module doc): every
    pass looks up each key of every open request, then a step end, then a
    sleep. A request's bytes are compared with A's once all are done (the
    chunks are not reused: B's CPU tier holds every block of the run).
    ``pd``: each request is the decode half of a P/D pair: its params name A
    as the prefiller of the request ``pd_id(first + r)`` (--modes pd)."""
    from vllm.v1.kv_offload.base import LookupResult as LR
    from kvpeer._trace import t as _T  # --trace: timestamps through each request
    host, port = a_addr.rsplit(":", 1)
    lookup_ms: List[float] = []
    load_ms: List[float] = []
    sched_ms: List[float] = []
    pass_us: List[float] = []  # scheduler time per pass (a step's lookups + its end)
    passes: List[float] = []  # scheduler passes per request (lookups, then a step end)
    done_at: List[float] = []  # time.monotonic() of each request's end (one clock per host)
    misses = mismatches = 0
    todo = [(r, keys[r:r + req_blocks]) for r in range(0, len(keys), req_blocks)]
    todo.reverse()
    active: List[Dict[str, Any]] = []
    loaded: List[Tuple[List[bytes], List[int]]] = []  # compared at the end
    t_start = time.perf_counter()
    while todo or active:
        while todo and len(active) < inflight:
            r, rk = todo.pop()
            rid = f"{eng.engine_id}-{tag}{r}"
            params = hints = None
            if pd and tier not in KVCR_TIERS:  # the same P/D params for p2p and kvpeer
                params = {"remote_prefiller": {"kv_request_id": pd_id(first + r),
                                               "remote_host": host, "remote_port": int(port)}}
            elif tier == "p2p":
                params = {"remote_kv_source": {"kv_request_id": rid, "remote_host": host,
                                               "remote_port": int(port)}}
            elif tier in KVCR_TIERS:
                hints = kvcr_hint(host, int(port), rk)
            _T('req_start', f"{tag}{r}")
            active.append({"r": r, "rk": rk, "c": eng.ctx(params, rid, hints),
                           "t0": time.perf_counter(), "t_res": None, "busy": 0.0, "passes": 0,
                           "deadline": time.monotonic() + timeout})
        tb = time.perf_counter()
        with eng.manager.lock:
            results = [[eng.manager.lookup(k, q["c"]) for k in q["rk"]] for q in active]
        now = time.perf_counter()
        still = []
        for q, res in zip(active, results):
            q["busy"] += (now - tb) / len(active)  # a pass's time, shared by its requests
            q["passes"] += 1
            if q["t_res"] is None and all(x is not LR.RETRY for x in res):
                q["t_res"] = now
                _T('req_resolved', q["r"])
            miss = sum(x is LR.MISS for x in res)
            if not miss and not all(x is LR.HIT for x in res):
                if time.monotonic() > q["deadline"]:
                    raise TimeoutError(f"{tier}: request {q['r'] // req_blocks} still "
                                       f"{res[:4]}... after {timeout} s")
                still.append(q)
                continue
            _T('req_done', q["r"])
            done_at.append(time.monotonic())
            sched_ms.append(q["busy"] * 1e3)
            pass_us.append(q["busy"] * 1e6 / q["passes"])
            passes.append(q["passes"])
            misses += miss
            with eng.manager.lock:
                if not miss:
                    lookup_ms.append((q["t_res"] - q["t0"]) * 1e3)
                    load_ms.append((now - q["t_res"]) * 1e3)
                    spec = eng.manager.prepare_load(q["rk"], q["c"])
                    loaded.append((q["rk"], [int(ch) for ch in spec.chunk_ids]))
                    eng.manager.complete_load(q["rk"], q["c"])
                eng.manager.on_request_finished(q["c"])
        active = still
        if not active:
            continue
        tb = time.perf_counter()
        eng.step()
        dt = time.perf_counter() - tb
        for q in active:
            q["busy"] += dt / len(active)
        time.sleep(step_s)
    wall = time.perf_counter() - t_start
    for rk, chunks in loaded:  # the byte check is not timed
        for k, ch in zip(rk, chunks):
            o = ch * eng.chunk
            if bytes(eng.view[o:o + eng.chunk]) != block_bytes(k, seed, eng.chunk):
                mismatches += 1
    n_ok = len(lookup_ms) * req_blocks
    return {"requests": len(lookup_ms), "blocks": n_ok, "misses": misses,
            "mismatches": mismatches, "wall_s": wall,
            "lookup_ms": lookup_ms, "load_ms": load_ms, "sched_ms": sched_ms,
            "pass_us": pass_us, "passes": passes, "done_at": done_at}


def idle_steps(eng: Engine, f: Any, step_s: float = 0.001) -> Any:
    """The lines of ``f``; between them, a step every ``step_s`` while the
    manager has pending work (vLLM's engine keeps stepping then: KVCR serves
    its peers' pin requests only in a step)."""
    sel = selectors.DefaultSelector()
    sel.register(f, selectors.EVENT_READ)
    try:
        while True:
            with eng.manager.lock:
                busy = eng.manager.has_pending_work()
            if busy and not sel.select(step_s):
                eng.step()
                continue
            line = f.readline()
            if not line:
                return
            yield line
    finally:
        sel.close()


# ---------------------------------------------------------------- child role
def child(args: argparse.Namespace) -> None:
    """An engine process driven by JSON lines on stdin (see orchestrate)."""
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    sys.path.insert(0, str(REPO / "python"))
    chunk = args.block_kib * 1024
    # Replies go to the real stdout; whatever vLLM, NIXL or UCX print goes
    # to stderr (the engine's log file).
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        if args.tier in KVCR_TIERS:
            kvcr_import(args.tier)
        eng = Engine(tier_entry(args.tier, args.port, args.peer or [], args.num_chunks), chunk,
                     args.num_chunks, args.tier_poll_ms)
    except Exception as e:  # reported as the tier's result: the exact error
        print(json.dumps({"error": f"{type(e).__name__}: {e}",
                          "trace": traceback.format_exc()}), file=out, flush=True)
        return
    print(json.dumps({"ready": True, "addr": f"127.0.0.1:{args.port}"}), file=out, flush=True)
    for line in idle_steps(eng, sys.stdin):
        cmd = json.loads(line)
        try:
            if cmd["op"] == "store":
                keys = [make_key(i) for i in range(cmd["n"])]
                t0 = time.perf_counter()
                if cmd.get("pd_blocks"):  # --modes pd: one prefill request per decode request
                    r = cmd["pd_blocks"]
                    n = sum(eng.store(keys[i:i + r], cmd["seed"], cmd["timeout"], pd_id(i))
                            for i in range(0, len(keys), r))
                else:
                    n = eng.store(keys, cmd["seed"], cmd["timeout"])
                reply: Dict[str, Any] = {"stored": n, "store_s": time.perf_counter() - t0}
            elif cmd["op"] == "load":
                keys = [make_key(i) for i in range(cmd["first"], cmd["first"] + cmd["n"])]
                reply = run_loads(eng, args.tier, cmd["peer"], keys, cmd["seed"],
                                  cmd["req_blocks"], cmd["step_s"], cmd["timeout"], cmd["tag"],
                                  cmd.get("inflight", 1), cmd["first"], cmd.get("pd", False))
            elif cmd["op"] == "quit":
                break
            else:
                reply = {"error": f"unknown op {cmd['op']!r}"}
        except Exception as e:
            reply = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
        print(json.dumps(reply), file=out, flush=True)
    eng.close()
    print(json.dumps({"closed": True}), file=out, flush=True)


# ---------------------------------------------------------------- orchestrator
class Proc:
    def __init__(self, argv: List[str], log: Path, trace: Optional[str] = None) -> None:
        self.log = open(log, "w")
        env = dict(os.environ, KVPEER_TRACE=trace) if trace else None
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.log, text=True, env=env)

    def read(self, timeout: float) -> Dict[str, Any]:
        sel = selectors.DefaultSelector()
        sel.register(self.p.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if sel.select(0.2):
                    line = self.p.stdout.readline()
                    if not line:
                        return {"error": f"engine process exited (status {self.p.wait()}); "
                                         f"see {self.log.name}"}
                    if line.startswith("{"):
                        return json.loads(line)
            return {"error": f"no answer in {timeout:.0f} s; see {self.log.name}"}
        finally:
            sel.close()

    def call(self, cmd: Dict[str, Any], timeout: float) -> Dict[str, Any]:
        try:
            self.p.stdin.write(json.dumps(cmd) + "\n")
            self.p.stdin.flush()
        except OSError as e:
            return {"error": f"engine process gone ({e}); see {self.log.name}"}
        return self.read(timeout)

    def close(self) -> Optional[str]:
        """Quit the engine; returns how it ended when that was not a clean
        exit after the manager's shutdown ({"closed": true})."""
        closed = False
        if self.p.poll() is None:
            try:
                self.p.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.p.stdin.flush()
                closed = self.read(30).get("closed", False)
                self.p.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.p.send_signal(signal.SIGKILL)
        rc = self.p.wait()
        self.log.close()
        if rc == 0:
            return None
        how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"status {rc}"
        when = "after a clean manager shutdown" if closed else "before its shutdown finished"
        return f"exited with {how} {when} (log {self.log.name})"


exit_notes: Dict[str, List[str]] = {}


def run_tier(tier: str, a: argparse.Namespace, outdir: Path, kib: int,
             blocks: int, inflight: int = 1, pd: bool = False) -> Dict[str, Any]:
    """A and B for one tier, ``blocks`` blocks of ``kib`` KiB; returns B's
    figures or {"error": ...}. ``pd``: as a P/D pair (--modes pd)."""
    py = a.kvcr_python if tier in KVCR_TIERS and a.kvcr_python else sys.executable
    me = [py, str(Path(__file__).resolve()), "--role", "engine", "--tier", tier,
          "--block-kib", str(kib)]
    if a.tier_poll_ms is not None:
        me += ["--tier-poll-ms", str(a.tier_poll_ms)]
    n_total = blocks + a.req_blocks  # measured blocks + the warm-up request
    # Each engine's CPU tier: every block of the run (no eviction), and with
    # requests in flight room for kvpeer's per-peer supply-pin budget (half
    # the source's region) to cover all of them at once -- a CPU tier of a
    # real engine is far larger than what a few requests load.
    chunks = max(n_total + 8, 2 * inflight * a.req_blocks + 8)
    tag = f"{tier}-{kib}k" + (f"-x{inflight}" if inflight > 1 else "") + ("-pd" if pd else "")
    trace = str(outdir / f"trace-{tag}") if a.trace else None
    if trace:
        for f in outdir.glob(f"trace-{tag}.*"):
            f.unlink()
    procs: List[Tuple[str, Proc]] = []

    def start(name: str, extra: List[str]) -> Tuple[Proc, Dict[str, Any]]:
        """An engine on a free port: a port picked free can be taken before
        the engine binds it (the other engine's own sockets open meanwhile),
        so an engine that could not listen is started again on another."""
        for attempt in range(3):
            p = Proc(me + ["--port", str(free_port()), "--num-chunks", str(chunks)] + extra,
                     outdir / f"vllm-tiers-{tag}-{name}.log", trace)
            procs.append((name, p))
            hello = p.read(a.timeout)
            if "Address already in use" not in str(hello.get("error", "")) or attempt == 2:
                return p, hello
        raise AssertionError("unreachable")

    try:
        A, hello = start("A", [])
        if "error" in hello:
            return hello
        st = A.call({"op": "store", "n": n_total, "seed": a.seed, "timeout": a.timeout,
                     "pd_blocks": a.req_blocks if pd else 0}, a.timeout * 2)
        if "error" in st:
            return st
        if st["stored"] != n_total:
            return {"error": f"engine A stored {st['stored']} of {n_total} blocks"}
        B, hello_b = start("B", ["--peer", hello["addr"]])
        if "error" in hello_b:
            return hello_b
        common = {"op": "load", "peer": hello["addr"], "seed": a.seed, "pd": pd,
                  "req_blocks": a.req_blocks, "step_s": a.step_ms / 1e3, "timeout": a.timeout}
        # Warm-up: one request opens the session (p2p: NIXL handshake); the
        # p2p tier answers MISS until it is ready, so repeat it until a HIT.
        deadline = time.monotonic() + a.timeout
        w = 0
        while True:
            warm = B.call(dict(common, first=blocks, n=a.req_blocks, tag=f"warm{w}-"),
                          a.timeout * 2)
            if "error" in warm:
                return warm
            if warm["blocks"] == a.req_blocks or time.monotonic() > deadline:
                break
            w += 1
            time.sleep(0.2)
        if warm["blocks"] != a.req_blocks:
            return {"error": f"warm-up request never hit ({warm})"}
        res = B.call(dict(common, first=0, n=blocks, tag="run-", inflight=inflight),
                     a.timeout * 4)
        res["store_s"] = st["store_s"]
        res["warmups"] = w + 1
        if trace and "error" not in res:  # the files are line-buffered: complete
            res["phases"] = trace_phases.phases(trace)
        return res
    finally:
        exits = [(name, p.close()) for name, p in reversed(procs)]
        notes = [f"engine {name} {how}" for name, how in exits if how]
        if notes:
            exit_notes.setdefault(tag, []).extend(notes)
        for f in Path("/dev/shm").glob(SHM_PREFIX + "*"):
            pid = f.name[len(SHM_PREFIX):].split("-")[0]
            if not Path(f"/proc/{pid}").exists():
                f.unlink(missing_ok=True)


def blocks_for(a: argparse.Namespace, kib: int) -> int:
    """Measured blocks at ``kib`` KiB: --blocks, fewer where that would move
    more than --max-mib (a multiple of --req-blocks, at least one request);
    the same count for every tier of a size."""
    n = min(a.blocks, (a.max_mib * 1024) // kib)
    return max(a.req_blocks, n - n % a.req_blocks)


def row(tier: str, r: Dict[str, Any], chunk: int, blocks: int) -> Tuple[str, bool]:
    """One line of a size's table; False if the tier failed the run."""
    if "error" in r:
        # kvcr as shipped does not import under vllm 0.34.0 (see
        # KVCR_TIERS): reported, not a failure of the run.
        known = tier == "kvcr" and r["error"].startswith("ImportError")
        return f"{tier:13} ERROR: {r['error']}", known
    ok = r["mismatches"] == 0 and r["misses"] == 0 and r["blocks"] == blocks
    bps = rate(r)
    line = (f"{tier:13} {r['blocks']:>6} {('yes' if ok else 'NO'):>8} {bps:>9.0f} "
            f"{bps * chunk / 1e9:>6.2f} {pct(r['lookup_ms'], 50):>10.2f} "
            f"{pct(r['lookup_ms'], 99):>7.2f} {pct(r['load_ms'], 50):>9.2f} "
            f"{pct(r['load_ms'], 99):>7.2f} {pct(r['sched_ms'], 50):>13.2f} "
            f"{pct(r['sched_ms'], 99):>7.2f} {pct(r.get('pass_us', []), 50):>7.0f} "
            f"{pct(r.get('passes', []), 50):>4.0f} {pct(r.get('passes', []), 90):>3.0f}")
    if not ok:
        line += (f"\n              misses {r['misses']}, byte mismatches {r['mismatches']}, "
                 f"blocks {r['blocks']} of {blocks}")
    return line, ok


def rate(r: Dict[str, Any]) -> float:
    return r["blocks"] / r["wall_s"] if r.get("wall_s", 0) > 0 else float("nan")


def goal_line(kib: int, res: Dict[str, List[Dict[str, Any]]]) -> Optional[str]:
    """issue 29's goal at this size: kvpeer-zc >= 2x p2p's blocks/s (at >=
    256 KiB chunks) and a lower load p99. With --repeat N, repeat i pairs the
    i-th run of each tier (run back to back, the order turned each repeat):
    the verdict is on the median of the N ratios and of each tier's N load
    p99s. Printed, never asserted."""
    zcs, p2ps = res.get("kvpeer-zc", []), res.get("p2p", [])
    pairs = [(z, q) for z, q in zip(zcs, p2ps) if "error" not in z and "error" not in q]
    if not pairs:
        return None
    ratios = [rate(z) / rate(q) for z, q in pairs]
    zp = statistics.median([pct(z["load_ms"], 99) for z, _ in pairs])
    pp = statistics.median([pct(q["load_ms"], 99) for _, q in pairs])
    ratio = statistics.median(ratios)
    goal = kib >= 256
    met = "met" if ratio >= 2 and zp < pp else "NOT met"
    each = (f" (repeats: {' '.join(f'{x:.2f}x' for x in ratios)}; medians)"
            if len(pairs) > 1 else "")
    return (f"goal {kib} KiB: kvpeer-zc / p2p blocks/s = {ratio:.2f}x, load p99 "
            f"{zp:.2f} vs {pp:.2f} ms{each}" + (f" (>= 2x and lower p99: {met})" if goal
                                                else " (no goal below 256 KiB)"))


def orchestrate(a: argparse.Namespace) -> int:
    outdir = Path(a.out)
    outdir.mkdir(parents=True, exist_ok=True)
    sizes = [int(x) for x in a.sizes.split(",")]
    infl = [int(x) for x in a.inflight.split(",")]
    modes = a.modes.split(",")
    if any(m not in MODES for m in modes):
        raise SystemExit(f"--modes: each of {', '.join(MODES)}, got {a.modes!r}")
    la = os.getloadavg()
    print(f"vllm_tiers: tiers {a.tiers}; modes {a.modes}; chunks of {a.sizes} KiB "
          f"({', '.join(f'{blocks_for(a, k)} blocks of {k} KiB' for k in sizes)}) A -> B, "
          f"requests of {a.req_blocks} blocks, {a.inflight} open at a time, "
          f"scheduler step sleep {a.step_ms} ms"
          + ("" if a.tier_poll_ms is None else f", tier-poll interval {a.tier_poll_ms} ms")
          + f"; load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} ({os.cpu_count()} CPUs)",
          flush=True)
    t_all = time.monotonic()
    # Each row's tiers run back to back, --repeat times, the order turned by
    # one each repeat (a drift of the machine's load meets every tier).
    results: Dict[Tuple[str, int, int], Dict[str, List[Dict[str, Any]]]] = {}
    for mode in modes:
        tiers = [t for t in a.tiers.split(",")  # kvcr: a router hint, not P/D params
                 if not (mode == "pd" and t in KVCR_TIERS)]
        for n_in in infl:
            for kib in sizes:
                results[mode, kib, n_in] = {t: [] for t in tiers}
                for i in range(a.repeat if tiers else 0):
                    for tier in tiers[i % len(tiers):] + tiers[:i % len(tiers)]:
                        t0 = time.monotonic()
                        results[mode, kib, n_in][tier].append(run_tier(
                            tier, a, outdir, kib, blocks_for(a, kib), n_in, mode == "pd"))
                        print(f"  {MODES[mode]}: {kib} KiB {tier}, {n_in} open"
                              + (f", repeat {i + 1}" if a.repeat > 1 else "")
                              + f": done in {time.monotonic() - t0:.1f} s", flush=True)
    rc = 0
    hdr = (f"{'tier':13} {'blocks':>6} {'bytes ok':>8} {'blocks/s':>9} {'GB/s':>6} "
           f"{'lookup p50':>10} {'p99 ms':>7} {'load p50':>9} {'p99 ms':>7} "
           f"{'sched/req p50':>13} {'p99 ms':>7} {'/step us':>7} {'passes p50 p90':>8}")
    for (mode, kib, n_in), res in results.items():
        n = blocks_for(a, kib)
        open_ = "one request at a time" if n_in == 1 else f"{n_in} requests open at a time"
        print(f"\n{MODES[mode]}: {kib} KiB chunks, {n} blocks, {open_}")
        print(hdr)
        for tier, runs in res.items():
            for i, r in enumerate(runs):
                line, ok = row(tier + (f" #{i + 1}" if len(runs) > 1 else ""), r, kib * 1024, n)
                rc |= 0 if ok else 1
                print(line)
        g = goal_line(kib, res)
        if g:
            print(g)
    if a.trace:
        print("\nphases of a request, p50 ms (kvpeer._trace; python/bench/trace_phases.py; "
              "one request at a time only)")
        for (mode, kib, n_in), res in results.items():
            for tier, runs in res.items():
                for r in runs:
                    ph = r.get("phases")
                    if ph and n_in == 1:
                        print(f"  {mode:3} {kib:>5} KiB {tier:13} " + "  ".join(
                            f"{k} {pct(v, 50):.2f}" for k, v in ph.items()))
    la = os.getloadavg()
    print(f"\ntotal {time.monotonic() - t_all:.0f} s; load average at the end "
          f"{la[0]:.2f} {la[1]:.2f} {la[2]:.2f}")
    for tag, notes in exit_notes.items():
        for n in dict.fromkeys(notes):  # once per engine and way out, with its count
            times = notes.count(n)
            print(f"note: {tag} {n}" + (f" ({times} runs)" if times > 1 else ""))
    for (mode, kib, n_in), res in results.items():
        for tier, runs in res.items():
            for r in runs:
                if "error" in r and r.get("trace"):
                    print(f"--- {mode} {kib} KiB {tier}, {n_in} open: {r['trace']}")
    if a.json:
        Path(a.json).write_text(json.dumps(
            {"args": vars(a),
             "results": {f"{m}-{k}k-x{i}": {t: runs if a.repeat > 1 else runs[0]
                                             for t, runs in v.items()}
                         for (m, k, i), v in results.items()}}, indent=1))
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiers", default="kvpeer-zc,kvpeer,p2p,kvcr,kvcr-shim")
    ap.add_argument("--sizes", default="64,256,2048",
                    help="KiB per block (vLLM chunk), one table per size")
    ap.add_argument("--blocks", type=int, default=256, help="measured blocks per size")
    ap.add_argument("--max-mib", type=int, default=512,
                    help="fewer blocks at a size where --blocks would move more than this")
    ap.add_argument("--block-kib", type=int, help="one size only (as --sizes N)")
    ap.add_argument("--trace", action="store_true",
                    help="kvpeer tiers: timestamps through each request (kvpeer._trace), "
                    "per-phase medians printed")
    ap.add_argument("--req-blocks", type=int, default=16, help="blocks per request")
    ap.add_argument("--inflight", default="1,4",
                    help="B's requests open at a time (1: one after the other); a list: a "
                    "table per size and count")
    ap.add_argument("--tier-poll-ms", type=float,
                    help="vLLM's tier_poll_interval_s of both engines, in ms (default: "
                         "vLLM's, 1 ms): how long a peer's request can wait for a serve round")
    ap.add_argument("--step-ms", type=float, default=1.0,
                    help="B's sleep between scheduler steps")
    ap.add_argument("--modes", default="sym,pd",
                    help="sym: B's requests as in symmetric P2P (p2p: remote_kv_source; "
                         "kvpeer: none, it asks its peers); pd: prefill -> decode, A's stores "
                         "and B's requests carry vLLM's P/D params (remote_decoder / "
                         "remote_prefiller), the same for p2p and kvpeer (not kvcr)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each row's tiers N times, back to back, the order turned by one "
                         "each repeat; the goal line takes the median of the N ratios")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--quick", action="store_true", help="32 blocks of 64 KiB, requests of 8")
    ap.add_argument("--out", default=str(REPO / "build" / "bench-out"))
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--kvcr-python", help="the python of the kvcr tiers' engines (a venv "
                    "with kvcr and its nixl pin; default: this one)")
    # engine-process role (internal)
    ap.add_argument("--role", default="orchestrator", choices=["orchestrator", "engine"])
    ap.add_argument("--tier")
    ap.add_argument("--port", type=int)
    ap.add_argument("--num-chunks", type=int)
    ap.add_argument("--peer", action="append")
    a = ap.parse_args()
    if a.role == "engine":
        child(a)
        return 0
    if a.repeat < 1:
        ap.error(f"--repeat: at least 1, got {a.repeat}")
    if a.quick:
        a.blocks, a.sizes, a.req_blocks = 32, "64", 8
    if a.block_kib is not None:
        a.sizes = str(a.block_kib)
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes: a list of KiB, got {a.sizes!r}")
    if a.blocks <= 0 or a.req_blocks <= 0 or min(sizes) <= 0 or a.blocks % a.req_blocks \
            or a.max_mib <= 0 or not all(x.isdigit() and int(x) > 0
                                         for x in a.inflight.split(",")):
        ap.error("--blocks, --req-blocks, --sizes, --max-mib, --inflight must be positive and "
                 "--blocks a multiple of --req-blocks")
    return orchestrate(a)


if __name__ == "__main__":
    sys.exit(main())
