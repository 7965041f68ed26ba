"""kvpeer inside vLLM: vLLM's own TieringOffloadingManager (built by
OffloadingSpecFactory from a kv_connector_extra_config, CPU primary tier in
/dev/shm) with kvpeer.vllm.KVPeerSecondaryTier as its secondary tier, on two
processes: A stores (vLLM cascades to kvpeer), B looks up and loads (vLLM
promotes from kvpeer into its primary chunks), bytes compared.

Run by the python_vllm ctest with the project venv (.venv, made by
scripts/install-py.sh). Skipped, saying so, only when vllm cannot be imported
(KVPEER_NO_VLLM=1 installs, or a python without the venv).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pytest

pytest.importorskip("vllm.v1.kv_offload.tiering.spec",
                    reason="vllm is not installed in this python (scripts/install-py.sh "
                           "makes .venv; the python_vllm ctest runs this file with it)")

from conftest import scaled  # noqa: E402
import vllm  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402

import kvpeer  # noqa: E402
from kvpeer import vllm_compat  # noqa: E402
from kvpeer.vllm import KVPeerSecondaryTier, request_id_of  # noqa: E402
from vllm.v1.kv_offload.tiering.base import JobResult  # noqa: E402
from vllm_engine import CHUNK, Engine, block_bytes, make_key, spy_lookups  # noqa: E402

HERE = Path(__file__).resolve().parent
# kvpeer.vllm_compat.TESTED: 0.34.0 (CI, .venv) and 0.33.0 (make test-vllm033,
# which sets KVPEER_TEST_VLLM_VERSION so the run proves which one it used).
TESTED_VLLM = os.environ.get("KVPEER_TEST_VLLM_VERSION", "0.34.0")
NODE = {"heartbeat_ms": 200, "shutdown_drain_ms": 500, "backoff_min_ms": 50,
        "backoff_max_ms": 300}


# Zero copy needs JobResult.deferred_release (vllm 0.34; make test-vllm033
# runs these files against 0.33, where the tier runs staging).
ZC_OK = vllm_compat.zero_copy_supported(JobResult)
needs_zc = pytest.mark.skipif(not ZC_OK, reason=f"vllm {vllm.__version__}: no "
                              "JobResult.deferred_release, zero copy is refused")
BOTH_MODES = pytest.mark.parametrize("zero_copy", [False, pytest.param(True, marks=needs_zc)],
                                     ids=["staging", "zero-copy"])


def tier_cfg(**kw: Any) -> Dict[str, Any]:
    cfg = {"num_blocks": 64, "dead_after_ms": 1000, "hold_cap_ms": 3000, "node_options": NODE}
    cfg.update(kw)
    return cfg


def write_psk(path: Path, mode: int = 0o600) -> str:
    """A key file as the README says (`openssl rand -hex 32`, chmod 600)."""
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(mode)
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Child:
    """Engine A in its own process (python vllm_engine.py)."""

    def __init__(self, cfg: Dict[str, Any], spec: Optional[Dict[str, Any]] = None,
                 prefix: Sequence[str] = (), env: Optional[Dict[str, str]] = None) -> None:
        """``spec``: vllm_engine's offloading_config fields (model_name, ...);
        ``prefix``: a command the child runs under (ip netns exec NS)."""
        self.p = subprocess.Popen([*prefix, sys.executable, str(HERE / "vllm_engine.py"),
                                   json.dumps(cfg), json.dumps(spec or {})],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, **(env or {})})
        hello = self._read(scaled(60))
        self.peer_id = hello["peer_id"]
        self.compat = hello["compat"]

    def _read(self, timeout: float) -> Dict[str, Any]:
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(self.p.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if sel.select(0.2):
                    line = self.p.stdout.readline()
                    if not line:
                        raise RuntimeError(f"engine A exited ({self.p.poll()})")
                    if line.startswith("{"):
                        return json.loads(line)
            raise TimeoutError("engine A did not answer")
        finally:
            sel.close()

    def store(self, keys: List[bytes], seed: int, req_id: str = "",
              params: Optional[Dict[str, Any]] = None) -> List[bool]:
        self.p.stdin.write(json.dumps({"op": "store", "keys": [k.hex() for k in keys],
                                       "seed": seed, "timeout": scaled(10),
                                       "req_id": req_id or None, "params": params}) + "\n")
        self.p.stdin.flush()
        return self._read(scaled(30))["stored"]

    def load(self, keys: List[bytes], params: Optional[Dict[str, Any]] = None,
             timeout: float = 10.0) -> Dict[str, Any]:
        """Look keys up (stepping) and load them: {"results", "digests", "blocks_in"}."""
        self.p.stdin.write(json.dumps({"op": "load", "keys": [k.hex() for k in keys],
                                       "params": params, "timeout": scaled(timeout)}) + "\n")
        self.p.stdin.flush()
        return self._read(scaled(timeout) + scaled(30))

    def peers(self) -> Dict[str, str]:
        """peer -> the data path of A's session with it (its WRITEs)."""
        self.p.stdin.write(json.dumps({"op": "peers"}) + "\n")
        self.p.stdin.flush()
        return self._read(scaled(10))

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.p.poll() is None:
            self.p.send_signal(sig)
            if sig == signal.SIGSTOP:
                self._wait_stopped()

    def _wait_stopped(self) -> None:
        """SIGSTOP is asynchronous: return once every thread of the engine is
        stopped (state T in /proc), so nothing it does can race the test."""
        deadline = time.monotonic() + scaled(5)
        while time.monotonic() < deadline:
            try:
                tasks = list(Path(f"/proc/{self.p.pid}/task").iterdir())
                if all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
                       for t in tasks):
                    return
            except OSError:
                pass
            time.sleep(0.002)
        raise TimeoutError("engine A did not stop on SIGSTOP")

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self.p.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.p.stdin.flush()
                self.p.wait(scaled(20))
            except (OSError, subprocess.TimeoutExpired):
                self.p.kill()
        self.p.kill() if self.p.poll() is None else None
        self.p.wait()


def _reap(made: List[Child]) -> None:
    for c in made:
        try:
            os.kill(c.p.pid, signal.SIGCONT)
        except OSError:
            pass
        c.close()
    # A SIGKILLed engine leaves its /dev/shm region behind: remove it.
    for f in Path("/dev/shm").glob("vllm_offload_kvpeer-test-*"):
        pid = f.name.split("-")[2]
        if not Path(f"/proc/{pid}").exists():
            f.unlink(missing_ok=True)


@pytest.fixture
def procs():
    made: List[Child] = []
    yield lambda *a, **kw: made.append(Child(*a, **kw)) or made[-1]
    _reap(made)


@pytest.fixture(scope="module")
def psk(tmp_path_factory) -> str:
    p = tmp_path_factory.mktemp("psk") / "psk"
    return write_psk(p)


@pytest.fixture(scope="module")
def engine_a(psk):
    """Engine A, shared by the tests that do not kill it (starting an engine
    process imports torch and vllm: tens of seconds under ASan)."""
    made: List[Child] = [Child(tier_cfg(psk_file=psk))]
    yield made[0]
    _reap(made)


@pytest.fixture
def engines():
    made: List[Engine] = []

    def make(cfg: Dict[str, Any], **spec: Any) -> Engine:
        e = Engine(cfg, **spec)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def test_vllm_version_and_registration():
    """The vllm tested, and the registration path: the factory resolves the
    out-of-tree tier from type + module_path, no register_tier() call."""
    from kvpeer.vllm_compat import TESTED
    assert vllm.__version__ == TESTED_VLLM, f"tested with vllm {TESTED_VLLM}, got {vllm.__version__}"
    assert vllm.__version__ in TESTED
    cls = SecondaryTierFactory.get_tier_class({"type": "KVPeerSecondaryTier",
                                               "module_path": "kvpeer.vllm"})
    assert cls is KVPeerSecondaryTier
    with pytest.raises(ValueError, match="Unknown secondary tier type"):
        SecondaryTierFactory.get_tier_class({"type": "KVPeerSecondaryTier"})


def test_vllm_two_processes_store_lookup_load(engine_a, psk, engines):
    """A stores 8 blocks through vLLM's manager; B's vLLM manager looks them
    up (RETRY, then promotion), loads them into its primary chunks; the bytes
    B's vLLM reads are A's."""
    a = engine_a
    b = engines(tier_cfg(peers=[a.peer_id], psk_file=psk))
    b.tier._tier.node.wait_peer(a.peer_id, scaled(10))
    keys = [make_key(i) for i in range(8)]
    assert a.store(keys, seed=1) == [True] * 8
    c = b.ctx()
    first = b.lookup_all(keys, c, timeout=0)
    assert first == [LookupResult.RETRY] * 8  # asked the peer, answer not in yet
    res = b.lookup_all(keys, c, timeout=scaled(10))
    assert res == [LookupResult.HIT] * 8, res
    assert b.read(keys, c) == [block_bytes(k, 1) for k in keys]
    st = b.tier._tier.node.stats()
    assert st["fetches_ok"] >= 1 and st["blocks_in"] == 8
    # An unknown key: MISS (not RETRY forever) once the peer answered.
    assert b.lookup_all([make_key(99)], c, timeout=scaled(10)) == [LookupResult.MISS]
    b.finish(c)


def test_vllm_lookups_batched_per_step(engine_a, psk, engines):
    """vLLM looks keys up one call at a time; the tier sends one LOOKUP per
    (request, peer) per scheduler step with all the keys of the step, and
    none before the step ends. A down peer still answers MISS at once."""
    a = engine_a
    # no tier-poll thread: it would take events between the steps counted here
    b = engines(tier_cfg(peers=[a.peer_id, "127.0.0.1:9"], psk_file=psk), tier_poll_interval_s=0)
    b.tier._tier.node.wait_peer(a.peer_id, scaled(10))
    keys = [make_key(400 + i) for i in range(8)]
    assert a.store(keys, seed=7) == [True] * 8
    sent = spy_lookups(b)
    pumps: List[int] = []  # the tier taking the node's events
    orig_pump = b.tier._tier._pump
    b.tier._tier._pump = lambda *a, **kw: (pumps.append(1), orig_pump(*a, **kw))[1]
    c = b.ctx()
    with b.manager.lock:
        assert [b.manager.lookup(k, c) for k in keys] == [LookupResult.RETRY] * 8
        # events are taken at the step's first lookup only (issue 29: an
        # answer taken mid-pass split a request over two steps)
        n = len(pumps)
        assert 1 <= n <= 2, n  # vLLM's per-step poll + the first lookup
        b.manager.lookup(keys[0], c)
        assert len(pumps) == n
    assert sent == []  # queued until the step ends
    assert b.tier.has_pending_work()
    b.step()
    m = len(pumps)
    with b.manager.lock:
        b.tier.lookup(keys[0], c)  # a new step: its first lookup takes them again
    assert len(pumps) == m + 1
    assert [s for s in sent if s[0] == a.peer_id] == [(a.peer_id, 8)], sent
    res = b.lookup_all(keys, c, timeout=scaled(10))
    assert res == [LookupResult.HIT] * 8, res
    assert [s for s in sent if s[0] == a.peer_id] == [(a.peer_id, 8)], sent  # no re-ask
    assert b.read(keys, c) == [block_bytes(k, 7) for k in keys]
    b.finish(c)
    # Only a down peer to ask (no session to 127.0.0.1:9): MISS at once,
    # without waiting for the step.
    d = b.ctx({"kvpeer_peers": ["127.0.0.1:9"]})
    with b.manager.lock:
        assert b.manager.lookup(make_key(499), d) is LookupResult.MISS
    b.finish(d)


# A path whose handler lands only into expected slots (issue 29): a failed
# load's slots come back at once (AM_REFUSE), none is held.
AM_PATHS = ("am-shm", "am-tcp")


@BOTH_MODES
def test_vllm_sigkill_mid_load_then_reconnect(procs, engines, zero_copy):
    """A answers the lookup, is stopped, B's promotion is submitted, A is
    SIGKILLed: the job fails exactly once, the keys answer MISS at once, the
    primary chunks B reserved go back to the free pool untouched. A new A on
    the same address: B reconnects and the load succeeds.

    Zero copy (issue 29): B's promotion lands straight in its primary chunks,
    so whether they are reusable at the failure depends on A's data path into
    B (A's kvp peer info data_path). On an active-message path (AM_PATHS) the
    handler lands only into expected slots: none is held, the job has no
    deferred_release, the chunks are free at once. On a direct path (a
    WRITE of A's may still land) the LOAD reports held slots: the JobResult
    carries deferred_release, vLLM keeps the chunks out of use, and the event
    is set only at KVP_EV_SLOTS_RELEASED (the tier's slot_records give the
    order), after which vLLM frees them."""
    port = free_port()
    extra = {"kvpeer_zero_copy": zero_copy}
    # zero copy: A serves B's LOOKUP from its primary tier on vLLM's tier-poll thread
    spec = {"tier_poll_interval_s": 0.001} if zero_copy else None
    a = procs(tier_cfg(listen=f"127.0.0.1:{port}", **extra), spec)
    b = engines(tier_cfg(peers=[a.peer_id], **extra))
    b.tier._tier.node.wait_peer(a.peer_id, scaled(10))
    keys = [make_key(i) for i in range(4)]
    assert a.store(keys, seed=2) == [True] * 4
    c = b.ctx()
    until(lambda: b.tier.lookup(keys[0], c) is LookupResult.HIT or b.step(), scaled(10))
    for k in keys[1:]:
        until(lambda: b.tier.lookup(k, c) is LookupResult.HIT or b.step(), scaled(10))
    a_path = a.peers().get(b.peer_id)  # A's WRITEs into B go this way
    a.kill(signal.SIGSTOP)
    finished: List[Any] = []
    set_at_result: List[bool] = []
    orig = b.tier.get_finished_jobs

    def spy():
        out = list(orig())
        finished.extend(out)
        for r in out:  # vllm 0.33's JobResult has no deferred_release
            d = getattr(r, "deferred_release", None)
            set_at_result.append(d is not None and d.is_set())
        return out

    b.tier.get_finished_jobs = spy  # type: ignore[method-assign]
    chunks: List[int] = []
    orig_load = b.tier.submit_load

    def spy_load(job):
        chunks.extend(int(x) for x in job.chunk_ids)
        return orig_load(job)

    b.tier.submit_load = spy_load  # type: ignore[method-assign]
    with b.manager.lock:  # the scheduler's lookups: HIT -> promotion queued
        assert [b.manager.lookup(k, c) for k in keys] == [LookupResult.HIT_PENDING] * 4
    b.step()  # on_schedule_end: submit_load
    assert b.tier.has_pending_work() and len(chunks) == 4
    a.kill(signal.SIGKILL)
    t0 = time.monotonic()
    assert until(lambda: (b.step(), bool(finished))[1], scaled(10))
    took = time.monotonic() - t0
    if zero_copy:
        check_zero_copy_failure(b, finished[0], set_at_result[0], chunks, a_path)
    time.sleep(0.3)
    b.step()
    assert len(finished) == 1 and not finished[0].success, finished  # failed, once
    assert took < scaled(5), f"load failure took {took:.2f}s"
    # vllm 0.34's deferred release (0.33 has none): none left over
    assert getattr(b.manager.primary_tier, "num_deferred_release_chunks", 0) == 0
    # MISS at once now: the dead peer is not waited for.
    with b.manager.lock:
        assert [b.manager.lookup(k, c) for k in keys] == [LookupResult.MISS] * 4
    b.finish(c)
    # Reconnect: a new engine A on the same address.
    a2 = procs(tier_cfg(listen=f"127.0.0.1:{port}", **extra), spec)
    b.tier._tier.node.wait_peer(a2.peer_id, scaled(10))
    assert a2.store(keys, seed=3) == [True] * 4
    c2 = b.ctx()
    res = b.lookup_all(keys, c2, timeout=scaled(15))
    assert res == [LookupResult.HIT] * 4, res
    assert b.read(keys, c2) == [block_bytes(k, 3) for k in keys]
    b.finish(c2)
    if zero_copy:  # nothing lent, nothing held, nothing left to release
        assert b.tier._tier.node.slots_held() == bytes(b.num_chunks)
        assert b.tier._tier.deferred_pending() == 0


def check_zero_copy_failure(b: Engine, res: Any, set_at_result: bool, chunks: List[int],
                            a_path: Optional[str]) -> None:
    """issue 29: the failed zero-copy promotion's chunks are never reused
    while a WRITE of the dead source may land (see the test above)."""
    node = b.tier._tier.node
    recs = list(b.tier._tier.slot_records)
    loads = [r for r in recs if r[0] == "load"]  # the job's fetch ops (one per round)
    assert loads and all(r[3] != 0 for r in loads), recs  # every one failed
    ops = {r[1] for r in loads if r[2]}  # those with slots held
    n_held = sum(r[2] for r in loads)
    prim = b.manager.primary_tier
    # which branch ran (pytest -s shows it): held only on a direct path
    print(f"zero-copy SIGKILL: A->B data path {a_path}, {n_held} slot(s) held")
    if a_path in AM_PATHS:  # refused at once: every chunk is vLLM's now
        assert n_held == 0, (a_path, recs)
        assert res.deferred_release is None, recs
        assert not any(r[0] in ("deferred", "deferred_set") for r in recs), recs
        assert prim.num_deferred_release_chunks == 0
        assert all(node.slots_held(ch, 1) == b"\x00" for ch in chunks)
        return
    # A direct path: the slots a late WRITE may reach are held until proof
    # or the hold cap, and vLLM does not reuse them until then.
    assert a_path is not None and n_held > 0, (a_path, recs)
    ev = res.deferred_release
    assert ev is not None, recs
    if set_at_result:
        # The proof (A's exit, seen at once) came in the same batch of events
        # as the LOAD outcome: the release was already in when vLLM took the
        # result. The records still give the order (checked below).
        print("zero-copy SIGKILL: released in the outcome's batch")
    deadline = time.monotonic() + scaled(10)  # proof, or the hold cap (3 s)
    while True:
        # Under the manager's lock: the tier-poll thread (zero copy polls the
        # tier off the scheduler thread) sets ev and vLLM frees the chunks
        # only under it, so while ev is not set vLLM keeps every failed
        # key's chunk out of use. (Not a look at the node's own hold: the
        # node thread releases on A's exit proof at any moment, before ev.)
        with b.manager.lock:
            if ev.is_set():
                break
            assert prim.num_deferred_release_chunks == len(chunks)
        assert time.monotonic() < deadline, "deferred_release never set"
        b.step()
        time.sleep(0.02)
    assert ev.is_set(), "deferred_release never set"
    recs = list(b.tier._tier.slot_records)
    order = [r[0] for r in recs
             if (r[0] == "released" and r[1] in ops)
             or (r[0] in ("deferred", "deferred_set") and r[1] == res.job_id)]
    assert order == ["deferred"] + ["released"] * len(ops) + ["deferred_set"], recs
    assert all(node.slots_held(ch, 1) == b"\x00" for ch in chunks)
    b.step()  # vLLM frees the chunks at its next poll
    assert prim.num_deferred_release_chunks == 0


@needs_zc
def test_vllm_zero_copy_drain_waits_for_cancelled_loads(procs, engines):
    """drain_jobs (vLLM's cache reset) cancels the loads still running at its
    bound. In zero copy their slots are vLLM's promotion chunks, lent to the
    node until each load's LOAD event (and held ones until SLOTS_RELEASED):
    drain_jobs returns only once those are in, so nothing is lent afterwards
    (no WRITE can land in a chunk vLLM resets). A is stopped with B's FETCH
    sent, so the cancel is decided only when B gives up on A (dead_after).
    On an AM path the handler refuses the rest at once; on a direct path
    (direct-cma) the slots are held and the failed job carries
    deferred_release, set at the hold cap."""
    zc = {"kvpeer_zero_copy": True}
    a = procs(tier_cfg(**zc), {"tier_poll_interval_s": 0.001})
    b = engines(tier_cfg(peers=[a.peer_id], **zc))
    b.tier._tier.node.wait_peer(a.peer_id, scaled(10))
    keys = [make_key(600 + i) for i in range(4)]
    assert a.store(keys, seed=6) == [True] * 4
    c = b.ctx()
    for k in keys:
        until(lambda: b.tier.lookup(k, c) is LookupResult.HIT or b.step(), scaled(10))
    a_path = a.peers().get(b.peer_id)  # A's WRITEs into B go this way
    a.kill(signal.SIGSTOP)
    with b.manager.lock:
        assert [b.manager.lookup(k, c) for k in keys] == [LookupResult.HIT_PENDING] * 4
    b.step()  # submit_load: the FETCH goes to the stopped A
    node = b.tier._tier.node
    assert b.tier._tier.pending_jobs() and 1 in node.slots_held()
    b.tier._load_bound_s = lambda: 0.0  # drain's bound has passed: cancel at once
    with b.manager.lock:
        b.tier.drain_jobs()
    assert b.tier._tier.pending_jobs() == []
    res = list(b.tier.get_finished_jobs())
    assert len(res) == 1 and not res[0].success, res  # its one outcome, failed
    print(f"zero-copy drain: A->B data path {a_path}, "
          f"{b.tier._tier.deferred_pending()} load(s) with slots held")
    if a_path in AM_PATHS:  # our handler refused the rest: nothing lent or held
        assert b.tier._tier.deferred_pending() == 0
        assert node.slots_held() == bytes(b.num_chunks)
    else:
        # A direct path (direct-cma here): the stopped A may still WRITE into
        # the cancelled load's chunks, so they are held, not lent: the job's
        # deferred_release is unset until the hold cap (A is alive: no proof).
        ev = res[0].deferred_release
        assert ev is not None and not ev.is_set(), res
        assert b.tier._tier.deferred_pending() > 0
        assert until(lambda: (b.step(), ev.is_set())[1], scaled(10))
        assert b.tier._tier.deferred_pending() == 0
        assert node.slots_held() == bytes(b.num_chunks)  # nothing lent or held any more
    with b.manager.lock:
        b.manager._process_finished_jobs()
    b.finish(c)


@BOTH_MODES
def test_vllm_failed_load_never_writes_primary(engine_a, psk, engines, procs, zero_copy):
    """Late landings: A is stopped while B's load is in flight; B declares it
    dead (dead_after), the job fails; then A resumes and may still WRITE. The
    primary chunks vLLM had reserved for that promotion (returned to the free
    pool at the failure) never change: kvpeer only writes its own (then
    quarantined) slots and copies into vLLM's chunks after a verified load.
    Zero copy (issue 29): the load lands in those chunks themselves; a chunk
    vLLM got back at the failure (no slot held: this host's am-shm path,
    whose handler drops a late WRITE) never changes; a held one comes with
    deferred_release and vLLM keeps it out of use until it is set."""
    zc = {"kvpeer_zero_copy": zero_copy}
    a = procs(tier_cfg(psk_file=psk, **zc), {"tier_poll_interval_s": 0.001}) if zero_copy \
        else engine_a
    b = engines(tier_cfg(peers=[a.peer_id], psk_file=psk, **zc))
    b.tier._tier.node.wait_peer(a.peer_id, scaled(10))
    keys = [make_key(300 + i) for i in range(4)]
    assert a.store(keys, seed=4) == [True] * 4
    sentinel = b"\xab" * CHUNK
    b.view[:] = sentinel * b.num_chunks
    c = b.ctx()
    for k in keys:
        until(lambda: b.tier.lookup(k, c) is LookupResult.HIT or b.step(), scaled(10))
    loads: List[Any] = []
    orig_load = b.tier.submit_load

    def spy_load(job):
        loads.append([int(x) for x in job.chunk_ids])
        return orig_load(job)

    b.tier.submit_load = spy_load  # type: ignore[method-assign]
    a.kill(signal.SIGSTOP)
    try:
        with b.manager.lock:
            assert [b.manager.lookup(k, c) for k in keys] == [LookupResult.HIT_PENDING] * 4
        b.step()
        assert len(loads) == 1
        assert until(lambda: (b.step(), not b.tier.has_pending_work())[1], scaled(10))
        with b.manager.lock:
            assert [b.manager.lookup(k, c) for k in keys] == [LookupResult.MISS] * 4
    finally:
        a.kill(signal.SIGCONT)  # A's late WRITEs, if any, may land now
    held = 0
    if zero_copy:
        recs = list(b.tier._tier.slot_records)
        held = sum(r[2] for r in recs if r[0] == "load")
        assert held == 0 or any(r[0] == "deferred" for r in recs), recs
    time.sleep(scaled(1.5))
    b.step()
    if held:  # a direct path: held chunks may be written until released, never reused
        assert b.manager.primary_tier.num_deferred_release_chunks == 4 or \
            any(r[0] == "deferred_set" for r in b.tier._tier.slot_records)
    else:
        for chunk in loads[0]:
            assert b.chunk(chunk) == sentinel, f"primary chunk {chunk} was written"
    if zero_copy:  # which way it went (pytest -s): late WRITEs dropped by the handler
        st = b.tier._tier.node.stats()
        print(f"zero-copy late landing: held {held}, am_refuse_releases "
              f"{st['am_refuse_releases']}, late_bytes_dropped {st['late_bytes_dropped']}")
    b.finish(c)


@BOTH_MODES
def test_vllm_supplier_fetch_before_supply(engine_a, psk, engines, procs, zero_copy):
    """kv_transfer_params names the supplier (prefill -> decode): B's lookup
    answers HIT before A has the blocks, with no LOOKUP sent; B's load is
    open before A stores and ends with A's store.
    Zero copy: B's FETCH parks at A (kvp_parked_keys); A's tier publishes
    the chunks once vLLM holds them (its tier-poll round), straight from
    vLLM's primary tier into B's."""
    zc = {"kvpeer_zero_copy": zero_copy}
    a = procs(tier_cfg(psk_file=psk, **zc), {"tier_poll_interval_s": 0.001}) if zero_copy \
        else engine_a
    b = engines(tier_cfg(peers=[a.peer_id], psk_file=psk, **zc,
                         node_options={**NODE, "parked_demand_ms": 20000}))
    b.tier._tier.node.wait_peer(a.peer_id, scaled(10))
    sent = spy_lookups(b)
    keys = [make_key(100 + i) for i in range(2)]
    c = b.ctx({"kvpeer_supplier": a.peer_id}, req_id="pd-request-1")  # one id, both engines
    # the supplier will put them: HIT at once, nobody asked
    assert [b.tier.lookup(k, c) for k in keys] == [LookupResult.HIT] * 2
    with b.manager.lock:
        assert [b.manager.lookup(k, c) for k in keys] == [LookupResult.HIT_PENDING] * 2
    b.step()  # the fetch (wait-for-supply) is on its way
    assert sent == [] and b.tier._tier.node.stats()["loads_inflight"] == 1
    time.sleep(scaled(0.2))
    assert not b.tier._tier.get_finished_jobs()  # parked at A, not failed
    assert a.store(keys, seed=5, req_id="pd-request-1") == [True, True]
    res = b.lookup_all(keys, c, timeout=scaled(10))
    assert res == [LookupResult.HIT] * 2, res
    assert b.read(keys, c) == [block_bytes(k, 5) for k in keys]
    b.finish(c)


def test_vllm_zero_copy_is_the_default(engines, monkeypatch):
    """Left out, kvpeer_zero_copy is true where vLLM has
    JobResult.deferred_release (0.34, here): the node's slots are vLLM's
    chunks. A vLLM without it (0.33) gets staging; asking for zero copy there
    is a clear error; a non-bool is refused."""
    e = engines(tier_cfg())
    if not ZC_OK:  # vllm 0.33 (make test-vllm033): staging, and zero copy refused
        assert not e.tier._zc
        with pytest.raises(ValueError, match="deferred_release"):
            Engine(tier_cfg(kvpeer_zero_copy=True))
        return
    assert e.tier._zc and e.tier.tolerates_off_thread_polling
    assert e.tier._tier.node.num_blocks == e.num_chunks  # vLLM's chunks, not num_blocks=64
    monkeypatch.setattr(vllm_compat, "zero_copy_supported", lambda cls: False)
    s = engines(tier_cfg())
    assert not s.tier._zc and not s.tier.tolerates_off_thread_polling
    assert s.tier._tier.node.num_blocks == 64
    before = set(Path("/dev/shm").glob("vllm_offload_kvpeer-test-*"))  # e's and s's
    with pytest.raises(ValueError, match="kvpeer_zero_copy must be true or false"):
        Engine(tier_cfg(kvpeer_zero_copy="yes"))
    with pytest.raises(ValueError, match="deferred_release"):
        Engine(tier_cfg(kvpeer_zero_copy=True))
    assert set(Path("/dev/shm").glob("vllm_offload_kvpeer-test-*")) == before


def test_vllm_tier_config_errors(tmp_path, engines):
    """Bad tier config: a clear error from vLLM's spec, nothing left behind."""
    before = set(Path("/dev/shm").glob("vllm_offload_kvpeer-test-*"))
    with pytest.raises(ValueError, match="block_size"):
        Engine(tier_cfg(block_size=4096))
    with pytest.raises(ValueError, match="psk_file"):
        Engine(tier_cfg(psk_file=str(tmp_path / "nope")))
    (tmp_path / "empty").write_bytes(b"\n")
    (tmp_path / "empty").chmod(0o600)
    with pytest.raises(ValueError, match="psk_file .*empty"):  # kvp_psk_load's words
        Engine(tier_cfg(psk_file=str(tmp_path / "empty")))
    with pytest.raises(ValueError, match="chmod 600"):
        Engine(tier_cfg(psk_file=write_psk(tmp_path / "open", mode=0o644)))
    with pytest.raises(ValueError, match="peers"):
        Engine(tier_cfg(peers="127.0.0.1:1"))
    with pytest.raises(ValueError, match="batch_lookups"):
        Engine(tier_cfg(batch_lookups="yes"))
    with pytest.raises(ValueError, match="listen"):
        Engine(tier_cfg(listen="not-an-address"))
    with pytest.raises(kvpeer.Error, match="nosuchhost.invalid"):  # names the address
        Engine(tier_cfg(listen="nosuchhost.invalid:1", insecure=True))
    assert set(Path("/dev/shm").glob("vllm_offload_kvpeer-test-*")) == before
    # Bad kv_transfer_params are logged and ignored, not raised into the scheduler.
    e = engines(tier_cfg())
    c = e.ctx({"kvpeer_supplier": 7, "kvpeer_peers": "x"})
    assert e.tier._request(c).supplier is None and e.tier._request(c).peers is None
    assert e.tier._request(c).request_id == request_id_of(c.req_id)
    e.finish(c)


def test_vllm_psk_mismatch_is_a_miss(tmp_path, engine_a, engines):
    """Peers with different PSKs never get a session: lookups MISS."""
    write_psk(tmp_path / "k2")
    a = engine_a
    b = engines(tier_cfg(peers=[a.peer_id], psk_file=str(tmp_path / "k2")))
    keys = [make_key(200)]
    a.store(keys, seed=6)
    c = b.ctx()
    assert b.lookup_all(keys, c, timeout=scaled(5)) == [LookupResult.MISS]
    b.finish(c)


def until(cond, timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return bool(cond())


def test_vllm_readme_kv_transfer_config(tmp_path, engines):
    """python/README.md's --kv-transfer-config is valid JSON that vLLM's own
    factories accept: the connector is registered, the spec is the tiering
    spec, and the tier entry builds a working KVPeerSecondaryTier (peers,
    listen and psk_file pointed at this machine)."""
    import re

    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    text = (HERE.parent / "README.md").read_text()
    cfg = json.loads(re.search(r"--kv-transfer-config '(\{.*?\})'", text, re.S).group(1))
    assert cfg["kv_connector"] in KVConnectorFactory._registry
    extra = cfg["kv_connector_extra_config"]
    assert OffloadingSpecFactory.get_spec_cls(extra) is TieringOffloadingSpec
    (tier,) = extra["secondary_tiers"]
    assert SecondaryTierFactory.get_tier_class(tier) is KVPeerSecondaryTier
    write_psk(tmp_path / "psk")
    local = {k: v for k, v in tier.items() if k not in ("type", "module_path", "port", "host")}
    local.update(peers=[], listen="127.0.0.1:0", psk_file=str(tmp_path / "psk"), num_blocks=16)
    e = engines(local)
    assert e.tier.peer_id.startswith("127.0.0.1:")
