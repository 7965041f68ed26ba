"""Issue 29 step 3: kvpeer's vLLM tier with ``kvpeer_zero_copy: true``,
through vLLM's own TieringOffloadingManager (vllm_engine.Engine: nothing of
vLLM stubbed). Engine A's node region is its primary_kv_view: a peer's
LOOKUP raises WANTED there, A's serve_external_requests answers it with
ParentManager.lookup + create_store_job + kvp_publish; engine B's promotion
lands straight in its primary chunks (fetch_into). Byte-exact, no byte
copied on either side (bytes_copied_in/out), A's store jobs completed.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import kvpeer
import pytest

pytest.importorskip("vllm.v1.kv_offload.tiering.spec",
                    reason="vllm is not installed in this python (scripts/install-py.sh)")

from conftest import scaled  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult  # noqa: E402

from vllm_engine import CHUNK, Engine, block_bytes, make_key, spy_lookups  # noqa: E402

from kvpeer import vllm_metrics as M  # noqa: E402

NODE = {"heartbeat_ms": 200, "shutdown_drain_ms": 500, "backoff_min_ms": 50,
        "backoff_max_ms": 300}


def zc_cfg(**kw: Any) -> Dict[str, Any]:
    cfg = {"kvpeer_zero_copy": True, "dead_after_ms": 1000, "hold_cap_ms": 3000,
           "node_options": NODE}
    cfg.update(kw)
    return cfg


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


def write_primary(e: Engine, keys: Sequence[bytes], seed: int, c: Any) -> None:
    """GPU->primary for request ``c``: the test writes the chunks; vLLM
    cascades them to the tier at the next step."""
    with e.manager.lock:
        out = e.manager.prepare_store(keys, c)
        for k, chunk in zip(out.keys_to_store, out.store_spec.chunk_ids):
            e.view[int(chunk) * CHUNK:(int(chunk) + 1) * CHUNK] = block_bytes(k, seed)
        e.manager.complete_store(out.keys_to_store, c, True)


def put_primary(e: Engine, keys: Sequence[bytes], seed: int) -> None:
    """write_primary and the cascade to kvpeer (nothing copied in zero-copy
    mode; the chunks hashed), done."""
    c = e.ctx()
    write_primary(e, keys, seed, c)
    assert e.wait_idle(scaled(10))
    e.finish(c)


def lookup_stepping(a: Engine, b: Engine, keys: Sequence[bytes], c: Any,
                    timeout: float) -> List[LookupResult]:
    """B looks keys up each step while both engines step (A serves its
    peers' WANTED ops in its step: serve_external_requests)."""
    deadline = time.monotonic() + timeout
    while True:
        with b.manager.lock:
            res = [b.manager.lookup(k, c) for k in keys]
        if all(r is LookupResult.HIT or r is LookupResult.MISS for r in res) or \
                time.monotonic() >= deadline:
            return res
        b.step()
        a.step()
        time.sleep(0.005)


def series(e: Engine, name: str) -> int:
    """The kvpeer tier's counter ``name`` in vLLM's manager's stats since
    the last call (the series vLLM's Prometheus registry shows)."""
    with e.manager.lock:
        stats = e.manager.get_stats()
    data = stats.data["data"] if stats is not None else {}
    return sum(data.get(name, {}).values())


def serves_back(a: Engine) -> None:
    """A steps until every chunk it served is back and every store job of
    it (vLLM's, or a serve's) is done: nothing of vLLM's stays pinned."""
    deadline = time.monotonic() + scaled(10)
    while time.monotonic() < deadline:
        a.step()
        with a.manager.lock:
            if not a.manager._jobs and not a.tier._serves:
                break
        time.sleep(0.01)
    with a.manager.lock:
        assert not a.manager._jobs and not a.tier._serves


def test_vllm_zero_copy_served_from_and_landed_in_primary(engines):
    a = engines(zc_cfg())
    b = engines(zc_cfg(peers=[a.peer_id]))
    keys = [make_key(i) for i in range(4)]
    held, absent = keys[:3], keys[3]
    put_primary(a, held, seed=7)
    c = b.ctx()
    res = lookup_stepping(a, b, keys, c, scaled(20))
    assert res == [LookupResult.HIT] * 3 + [LookupResult.MISS], res
    data = b.read(held, c)
    assert data == [block_bytes(k, 7) for k in held]
    b.finish(c)
    serves_back(a)  # A's serve store jobs come back
    sa, sb = a.tier._tier.node.stats(), b.tier._tier.node.stats()
    assert sa["wanted_ops"] >= 1 and sa["wanted_keys"] >= 4
    assert sa["wanted_keys_missed"] >= 1  # the absent key
    assert sb["blocks_in"] == 3
    # A's WRITEs into B: direct-cma here (one process, proven) -> B trusts
    # FETCH_DONE at once; an am-* path -> B waits for the landing
    path = {p.peer: p.data_path for p in a.tier._tier.node.peers()}[b.peer_id]
    assert (sb["loads_landing_awaited"] == 0) == path.startswith("direct"), (path, sb)
    assert sa["bytes_copied_in"] + sa["bytes_copied_out"] == 0
    assert sb["bytes_copied_in"] + sb["bytes_copied_out"] == 0
    assert a.tier._tier.node.slots_held() == bytes(a.num_chunks)  # nothing published left
    assert b.tier._tier.node.slots_held() == bytes(b.num_chunks)  # nothing lent left
    # A hashed each chunk at its cascade and published it with that checksum
    # (nothing hashed on the LOOKUP's path); B verified all three with it.
    assert a.tier.serve_sums == [3, 0], a.tier.serve_sums
    assert sb["checksum_mismatches"] == 0


def on_hashes(a: Engine, before: Callable[[Sequence[int]], None]) -> None:
    """``before(chunks)`` runs at each call of A's tier that hashes chunks:
    a cascade's (slot_checksums) and a prefill job's (hash_publish_many)."""
    real, node = a.tier._csums._checksum, a.tier._tier.node
    real_hp = node.hash_publish_many

    def sums(chunks: Sequence[int]) -> List[bytes]:
        before(chunks)
        return real(chunks)

    def hash_publish(keys: Sequence[bytes], chunks: Sequence[int], *args: Any) -> Any:
        before(chunks)
        return real_hp(keys, chunks, *args)

    a.tier._csums._checksum = sums
    node.hash_publish_many = hash_publish


def gate_hashes(a: Engine) -> Tuple[threading.Event, List[str]]:
    """A's tier hashes chunks only once the event is set (each call waits
    for it, at most 10 s scaled); the list names each call's thread."""
    gate = threading.Event()
    seen: List[str] = []

    def gated(chunks: Sequence[int]) -> None:
        seen.append(threading.current_thread().name)
        gate.wait(scaled(10))

    on_hashes(a, gated)
    return gate, seen


def test_vllm_zero_copy_cascade_hashed_off_the_scheduler_thread(engines):
    """vLLM's cascade of chunks to the tier is hashed on the tier's own
    thread (kvpeer-sums), not on the thread that steps the engine: the store
    job stays open (vLLM pins the chunks) until they are hashed, and a peer's
    LOOKUP is then served with those checksums (none hashed at the serve)."""
    a = engines(zc_cfg())
    b = engines(zc_cfg(peers=[a.peer_id]))
    gate, seen = gate_hashes(a)
    keys = [make_key(460 + i) for i in range(2)]
    c = a.ctx()
    t0 = time.monotonic()
    write_primary(a, keys, 5, c)
    for _ in range(3):
        a.step()  # the cascade: submit_store hands the chunks over
        time.sleep(0.02)
    assert time.monotonic() - t0 < scaled(2)  # nothing waited for the gate
    with a.manager.lock:
        assert a.manager._jobs, "the store job was reported before its chunks were hashed"
    assert seen and all(n.startswith("kvpeer-sums") for n in seen), seen
    gate.set()
    assert a.wait_idle(scaled(10))
    a.finish(c)
    cb = b.ctx()
    assert lookup_stepping(a, b, keys, cb, scaled(20)) == [LookupResult.HIT] * 2
    assert b.read(keys, cb) == [block_bytes(k, 5) for k in keys]
    b.finish(cb)
    serves_back(a)
    assert a.tier.serve_sums == [2, 0], a.tier.serve_sums
    assert len(seen) == 1  # one call for the job's chunks (one GIL hand-back)


def prefill(a: Engine, keys: Sequence[bytes], kv_id: str, hashed: bool = True) -> Any:
    """The prefill half of P/D: A stores ``keys`` (block_bytes seed 9) under
    a request naming a decoder (remote_decoder ``kv_id``), and steps once
    (the cascade: kvpeer's submit_store). ``hashed``: then waits, A not
    stepping, until the tier's prefill thread has hashed and published
    them. The request's context, open."""
    ca = a.ctx({"remote_decoder": {"kv_request_id": kv_id}}, req_id=f"prefill-{kv_id}")
    write_primary(a, keys, 9, ca)
    a.step()
    deadline = time.monotonic() + scaled(10)
    while hashed and any(sv.hashing for sv in list(a.tier._serves)):
        assert time.monotonic() < deadline, "the prefill chunks were never hashed"
        time.sleep(0.005)
    return ca


def decode(b: Engine, a: Engine, keys: Sequence[bytes], kv_id: str) -> None:
    """The decode half: B's request names A (remote_prefiller ``kv_id``); its
    lookups answer HIT at once (after B dialled A); B steps (A does not)
    until loaded and reads the bytes A stored."""
    host, port = a.peer_id.rsplit(":", 1)
    cb = b.ctx({"remote_prefiller": {"remote_host": host, "remote_port": port,
                                     "kv_request_id": kv_id}}, req_id=f"decode-{kv_id}")
    deadline = time.monotonic() + scaled(10)  # RETRY while B dials A, then HIT
    while b.tier.lookup(keys[0], cb) is LookupResult.RETRY and time.monotonic() < deadline:
        b.step()
        time.sleep(0.01)
    assert [b.tier.lookup(k, cb) for k in keys] == [LookupResult.HIT] * len(keys)
    res = b.lookup_all(keys, cb, timeout=scaled(10))  # B steps, A does not
    assert res == [LookupResult.HIT] * len(keys), res
    assert b.read(keys, cb) == [block_bytes(k, 9) for k in keys]
    b.finish(cb)


def test_vllm_zero_copy_pd_served_from_the_prefill_store(engines):
    """P/D with vLLM's p2p params, zero copy. The prefiller's store job for
    a request with remote_decoder publishes its chunks at the cascade (vLLM
    pins them for that job), each until its decoder fetched it (the prefill
    hold, 60 s, at most), so the decoder's FETCH is served by A's node
    thread alone, however late it comes (here: after a serve hold, 1 s): A
    runs no tier-poll thread and does not step while B loads. B's request
    names remote_prefiller: its lookups answer HIT at once, no LOOKUP sent.
    A's store job ends at B's fetch, its chunks back."""
    a = engines(zc_cfg(), tier_poll_interval_s=0)
    b = engines(zc_cfg())
    sent = spy_lookups(b)
    keys = [make_key(300 + i) for i in range(3)]
    ca = prefill(a, keys, "pd-zc-1")  # A steps no more until B has loaded
    with a.manager.lock:
        assert a.manager._jobs, "A's store job ended before any decoder fetched"
    time.sleep(1.2)  # past the serve hold (min(pin lease, 1 s)): the decoder comes late
    a.step()
    decode(b, a, keys, "pd-zc-1")
    assert sent == [], sent
    sa = a.tier._tier.node.stats()
    assert sa["wanted_ops"] == 0 and b.tier._tier.node.stats()["blocks_in"] == 3
    t0 = time.monotonic()
    serves_back(a)  # each chunk back at its fetch: the job with them, no hold to wait out
    assert time.monotonic() - t0 < scaled(0.5)
    assert a.tier.prefill_holds_expired == 0
    a.finish(ca)
    assert a.tier._tier.node.slots_held() == bytes(a.num_chunks)
    assert b.tier._tier.node.slots_held() == bytes(b.num_chunks)


def test_vllm_zero_copy_prefill_hashed_off_the_scheduler_thread(engines):
    """The prefill half of P/D is hashed on the tier's prefill thread
    (kvpeer-sums-prefill), not on the thread that steps the engine, and
    published from there once hashed: the decoder's FETCH, parked at A
    meanwhile, is served with A neither stepping nor polling (no tier-poll
    thread), and the job ends at that fetch."""
    a = engines(zc_cfg(), tier_poll_interval_s=0)
    b = engines(zc_cfg())
    gate, seen = gate_hashes(a)
    keys = [make_key(480 + i) for i in range(3)]
    t0 = time.monotonic()
    ca = prefill(a, keys, "pd-hashing", hashed=False)  # A steps no more
    assert time.monotonic() - t0 < scaled(2)  # the step did not wait for the gate
    assert seen and all(n.startswith("kvpeer-sums-prefill") for n in seen), seen
    assert a.tier._tier.node.slots_held().count(2) == 0  # nothing published yet
    with a.manager.lock:
        assert a.manager._jobs, "the prefill store job ended before it was hashed"
    threading.Timer(0.3, gate.set).start()  # B's FETCH parks at A until then
    decode(b, a, keys, "pd-hashing")
    assert len(seen) == 1 and a.tier._parked_serves == 0
    assert a.tier._tier.node.stats()["wanted_ops"] == 0
    serves_back(a)
    assert a.tier.prefill_holds_expired == 0
    a.finish(ca)
    assert a.tier._tier.node.slots_held() == bytes(a.num_chunks)


def test_vllm_zero_copy_prefill_fetched_before_recorded(engines):
    """The prefill thread hashes and publishes in one C call and records the
    chunks after it returned, outside the serves' lock: the decoder's fetch
    may take them back (SLOT_FREE, taken by A's step) in between. Those
    chunks are back, not left as published: the job ends at once, nothing
    of vLLM's stays pinned, nothing stays published."""
    a = engines(zc_cfg(), tier_poll_interval_s=0)
    b = engines(zc_cfg())
    node = a.tier._tier.node
    real_hp, gate = node.hash_publish_many, threading.Event()

    def published_then_wait(*args: Any) -> Any:
        out = real_hp(*args)
        gate.wait(scaled(10))  # published; not yet recorded
        return out

    node.hash_publish_many = published_then_wait
    keys = [make_key(500 + i) for i in range(3)]
    ca = prefill(a, keys, "pd-early", hashed=False)
    deadline = time.monotonic() + scaled(10)
    while node.slots_held().count(2) < 3:
        assert time.monotonic() < deadline, "the prefill chunks were never published"
        time.sleep(0.005)
    decode(b, a, keys, "pd-early")  # served by A's node thread: each slot freed
    for _ in range(5):
        a.step()  # takes the SLOT_FREEs while the prefill thread has not recorded
        time.sleep(0.01)
    assert len(a.tier._freed_early) == 3, a.tier._freed_early
    gate.set()
    serves_back(a)
    assert not a.tier._freed_early and not a.tier._publishing
    assert a.tier.prefill_holds_expired == 0
    a.finish(ca)
    assert node.slots_held() == bytes(a.num_chunks)


def test_vllm_zero_copy_pd_another_peer_leaves_the_decoders_chunks(engines):
    """A prefill request's chunks are published once for its request id: a
    symmetric peer C that looks the same keys up (a shared prefix) is served
    from them and leaves them published, so the decoder's FETCH finds them
    with A polling nothing (before, C's fetch took them back and B's FETCH
    parked until a serve round published them again)."""
    a = engines(zc_cfg(), tier_poll_interval_s=0)
    b = engines(zc_cfg())
    c = engines(zc_cfg(peers=[a.peer_id]))
    keys = [make_key(420 + i) for i in range(3)]
    ca = prefill(a, keys, "pd-shared")
    cc = c.ctx()
    assert lookup_stepping(a, c, keys, cc, scaled(20)) == [LookupResult.HIT] * 3
    assert c.read(keys, cc) == [block_bytes(k, 9) for k in keys]
    c.finish(cc)
    assert c.tier._tier.node.stats()["blocks_in"] == 3
    assert a.tier._tier.node.slots_held().count(2) == 3  # still published for the decoder
    with a.manager.lock:
        assert a.manager._jobs, "C's fetch ended the prefill store job"
    decode(b, a, keys, "pd-shared")  # A does not step
    assert b.tier._tier.node.stats()["blocks_in"] == 3
    serves_back(a)
    assert a.tier.prefill_holds_expired == 0
    a.finish(ca)
    assert a.tier._tier.node.slots_held() == bytes(a.num_chunks)


def test_vllm_zero_copy_pd_prefix_hits_served_too(engines):
    """A prefill request whose first blocks were in A's CPU tier already (a
    prefix hit): the tier asks vLLM for request-level offload (as p2p does),
    so vLLM cascades those chunks to it too and the decoder's FETCH finds
    every block published, with A polling nothing. Their chunks are hashed
    again at the prefill's store job (it cannot tell a chunk vLLM kept from
    one it wrote again); the decoder verifies every block."""
    a = engines(zc_cfg(), tier_poll_interval_s=0)
    b = engines(zc_cfg())
    calls: List[List[int]] = []
    on_hashes(a, lambda chunks: calls.append(list(chunks)))
    keys = [make_key(380 + i) for i in range(3)]
    put_primary(a, keys[:2], seed=9)  # an earlier request's blocks
    assert [len(c) for c in calls] == [2]
    ca = prefill(a, keys, "pd-prefix")
    assert sorted(len(c) for c in calls) == [1, 2, 2]  # the prefix's cascade, then all three
    decode(b, a, keys, "pd-prefix")
    serves_back(a)
    a.finish(ca)
    assert a.tier._tier.node.slots_held() == bytes(a.num_chunks)


def test_vllm_zero_copy_prefill_hold_releases_unfetched_chunks(engines, caplog):
    """A prefill store job whose decoder never comes: its chunks stay
    published for the prefill hold (prefill_hold_s, 0.3 s here), then are
    released, loudly (counted, a warning): the store job is done, vLLM's
    chunks are its own again, and a bad hold is refused at start-up."""
    with pytest.raises(ValueError, match="prefill_hold_s"):
        engines(zc_cfg(prefill_hold_s=0))
    a = engines(zc_cfg(prefill_hold_s=0.3))
    keys = [make_key(350 + i) for i in range(2)]
    ca = prefill(a, keys, "pd-nobody")
    assert a.tier._tier.node.slots_held().count(2) == 2  # published for the decoder
    time.sleep(0.15)
    a.step()
    with a.manager.lock:
        assert a.manager._jobs and a.tier.prefill_holds_expired == 0  # within the hold
    with caplog.at_level("WARNING", logger="kvpeer.vllm"):
        serves_back(a)
    assert a.tier.prefill_holds_expired == 1
    assert series(a, M.PREFILL_HOLDS_EXPIRED) == 1
    assert "not fetched by its decoder" in caplog.text
    assert a.tier._tier.node.slots_held() == bytes(a.num_chunks)
    a.finish(ca)


def test_vllm_zero_copy_greedy_peer_pins_only_its_budget(engines, node_factory):
    """The serve paths' door (zero copy). Peer X looks up every key A's vLLM
    holds, again and again, never fetching, and parks FETCHes (wait for
    supply) for them too: A pins in vLLM at most X's budget for its LOOKUPs
    (max_supply_pins_per_peer: 4 here) and the parked FETCHes' shared one
    (4), however fast X asks, and X's asks past it are refused (counted).
    Meanwhile a good peer B loads byte-exact and A's vLLM stores 16 new
    blocks (it evicts what X cannot pin). At the end every pin is back.
    (The keys X keeps pinned are out of B's reach while X holds them: a
    chunk whose serve hold ended is unpublishing until X's pins drop.)"""
    a = engines(zc_cfg(node_options={**NODE, "max_supply_pins_per_peer": 4}))
    b = engines(zc_cfg(peers=[a.peer_id]))
    held = [make_key(400 + i) for i in range(24)]  # of A's 32 chunks
    put_primary(a, held, seed=3)
    x = node_factory(num_blocks=64, block_size=CHUNK, compat=a.tier.compat)
    x.add_peer(a.peer_id)
    x.wait_peer(a.peer_id, scaled(10))
    stop = threading.Event()
    asked = [0, 0]

    def attack() -> None:
        rid = 1000
        while not stop.is_set():
            rid += 1
            try:
                x.lookup(a.peer_id, held, rid)
                asked[0] += 1
                if rid % 8 == 0:
                    x.fetch(a.peer_id, held[rid % 3::3], rid, wait_for_supply=True)
                    asked[1] += 1
            except kvpeer.Error:
                pass  # out of slots or rounds: what X can have at once
            x.poll(0.002)

    peak: Dict[Any, int] = collections.Counter()

    def sample() -> None:
        with a.manager.lock:
            by: Dict[Any, int] = collections.Counter()
            for sv in a.tier._serves:
                by[sv.who] += sv.held()
        for who, n in by.items():
            peak[who] = max(peak[who], n)

    t = threading.Thread(target=attack, daemon=True)
    t.start()
    try:
        end = time.monotonic() + scaled(1.5)
        while time.monotonic() < end:
            sample()
            time.sleep(0.005)
        c = b.ctx()
        mine = held[-2:]  # not among the 4 X keeps pinned (the first of its every LOOKUP)
        got = lookup_stepping(a, b, mine, c, scaled(20))
        assert got == [LookupResult.HIT] * 2, got
        assert b.read(mine, c) == [block_bytes(k, 3) for k in mine]
        b.finish(c)
        sample()
        new = [make_key(500 + i) for i in range(16)]
        cn = a.ctx()
        with a.manager.lock:
            out = a.manager.prepare_store(new, cn)
            assert out is not None, "A's vLLM could not store: X pinned its tier"
            a.manager.complete_store(out.keys_to_store, cn, True)
        a.finish(cn)
        sample()
    finally:
        stop.set()
        t.join(scaled(5))
    x_peaks = {w: n for w, n in peak.items() if w not in (None, b.peer_id)}
    assert asked[0] > 20 and asked[1] > 2, asked
    assert a.tier.serve_pins_refused > 0 and x_peaks, (a.tier.serve_pins_refused, dict(peak))
    assert series(a, M.SERVE_PINS_REFUSED) == a.tier.serve_pins_refused  # vLLM's Prometheus
    assert all(n <= 4 for n in x_peaks.values()), dict(peak)
    x.close()
    serves_back(a)  # X's pins and A's serves come back
    assert a.tier._tier.node.slots_held() == bytes(a.num_chunks)


def test_vllm_zero_copy_budget_counts_what_is_held_not_the_hold(engines):
    """A good peer that loads more than its pin budget (4 here) within one
    serve hold (1 s) is served in full: what it fetched already comes back
    when it needs the room (the hold gives way), only what is still pinned
    counts. Four requests of 3 keys, one after the other, all HIT."""
    a = engines(zc_cfg(node_options={**NODE, "max_supply_pins_per_peer": 4}))
    b = engines(zc_cfg(peers=[a.peer_id]))
    keys = [make_key(600 + i) for i in range(12)]
    put_primary(a, keys, seed=5)
    t0 = time.monotonic()
    for r in range(4):
        ks = keys[3 * r:3 * r + 3]
        c = b.ctx()
        got = lookup_stepping(a, b, ks, c, scaled(20))
        assert got == [LookupResult.HIT] * 3, (r, got)
        assert b.read(ks, c) == [block_bytes(k, 5) for k in ks]
        b.finish(c)
    took = time.monotonic() - t0  # within one hold (the test's point) unless very loaded
    print(f"four requests in {took * 1e3:.0f} ms (serve hold {a.tier._serve_hold_s} s)")
    assert a.tier.serve_pins_refused == 0
    if took < a.tier._serve_hold_s:  # within one hold: room came from holds that gave way
        assert a.tier.serve_holds_given_way > 0
    assert series(a, M.SERVE_HOLDS_GIVEN_WAY) == a.tier.serve_holds_given_way
    serves_back(a)


@pytest.mark.parametrize("zero_copy", [True, False])
def test_vllm_load_job_chunk_outside_the_primary_refused(engines, zero_copy):
    """A load job naming a chunk outside vLLM's primary tier is refused before
    anything starts (zero copy lands by chunk number, staging by a view of
    it): a clear error, no fetch, no job left behind."""
    from vllm.v1.kv_offload.tiering.base import TransferJob
    import numpy as np
    a = engines(zc_cfg(kvpeer_zero_copy=zero_copy))
    c = a.ctx()
    keys = [make_key(i) for i in range(2)]
    for bad in (a.num_chunks, -1):
        job = TransferJob(job_id=900, keys=keys, chunk_ids=np.array([0, bad]),
                          is_promotion=True, req_context=c)
        with pytest.raises(ValueError, match="outside the primary tier"):
            a.tier.submit_load(job)
    assert a.tier._tier.pending_jobs() == [] and not a.tier._submitted
    assert not a.tier._load_keys
    a.finish(c)


def chunk_of(e: Engine, key: bytes) -> int:
    c = e.ctx()
    with e.manager.lock:
        spec = e.manager.prepare_load([key], c)
        e.manager.complete_load([key], c)
        e.manager.on_request_finished(c)
    return int(spec.chunk_ids[0])


def test_vllm_zero_copy_stale_checksum_never_committed(engines):
    """A chunk rewritten after its cascade (no new store job: its checksum
    is stale) is served with the stale checksum: B's verify refuses that
    block (checksum mismatch, the key not loaded), the others load."""
    a = engines(zc_cfg())
    b = engines(zc_cfg(peers=[a.peer_id]))
    keys = [make_key(i) for i in range(3)]
    put_primary(a, keys, seed=7)
    ch = chunk_of(a, keys[1])
    a.view[ch * CHUNK:(ch + 1) * CHUNK] = block_bytes(keys[1], 99)  # behind the tier's back
    c = b.ctx()
    deadline = time.monotonic() + scaled(20)
    while True:  # vLLM asks again for the refused key each step: stop at the first refusal
        with b.manager.lock:
            res = [b.manager.lookup(k, c) for k in keys]
        sb = b.tier._tier.node.stats()
        if (res[0] is res[2] is LookupResult.HIT and sb["checksum_mismatches"] >= 1) or \
                time.monotonic() >= deadline:
            break
        b.step()
        a.step()
        time.sleep(0.005)
    assert sb["checksum_mismatches"] >= 1, (res, sb["checksum_mismatches"], sb["blocks_in"])
    assert res[0] is res[2] is LookupResult.HIT, (res, sb["checksum_mismatches"], sb["blocks_in"])
    assert res[1] is not LookupResult.HIT, res  # never committed, never a HIT
    assert a.tier.serve_sums[0] >= 3 and a.tier.serve_sums[1] == 0, a.tier.serve_sums
    assert b.read([keys[0], keys[2]], c) == [block_bytes(keys[0], 7), block_bytes(keys[2], 7)]
    b.finish(c)
