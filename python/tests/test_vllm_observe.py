"""kvpeer.vllm and vLLM's own observability (issue 28, build item 4): a load
that fails in part reports JobResult.successful_keys (vLLM keeps those keys)
instead of failing whole; the tier's metrics reach vLLM through its tier
metric API (build_metric_definitions / get_stats) with vLLM's tier label.
Through vLLM's own TieringOffloadingManager, as test_vllm.py. Runs in the
python_vllm ctest (project venv); skips, saying so, without vllm.
"""
from __future__ import annotations

import signal
from typing import Any, Dict, List

import pytest

pytest.importorskip("vllm.v1.kv_offload.tiering.spec",
                    reason="vllm is not installed in this python (scripts/install-py.sh "
                           "makes .venv; the python_vllm ctest runs this file with it)")

from conftest import scaled  # noqa: E402
from vllm.v1.kv_offload.base import (  # noqa: E402
    LookupResult, OffloadingCounterMetadata, OffloadingGaugeMetadata,
    OffloadingHistogramMetadata)
from vllm.v1.kv_offload.tiering.base import TIER_LABEL, TieringOffloadingMetrics  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

from kvpeer import vllm_metrics as M  # noqa: E402
from test_vllm import engines, procs, tier_cfg, until  # noqa: E402,F401 (fixtures)
from vllm_engine import CHUNK, Engine, block_bytes, make_key  # noqa: E402

KVPEER_TIER = {"type": "KVPeerSecondaryTier", "module_path": "kvpeer.vllm"}


def spy_results(e: Engine) -> List[Any]:
    """Every JobResult engine e's tier hands vLLM's manager."""
    got: List[Any] = []
    orig = e.tier.get_finished_jobs

    def spy():
        out = list(orig())
        got.extend(out)
        return out

    e.tier.get_finished_jobs = spy  # type: ignore[method-assign]
    return got


def tier_data(e: Engine) -> Dict[str, Any]:
    """vLLM's manager's stats of this step (primary, vLLM's per-tier series
    and the tiers' own), by metric name -> {labelvalues: value}."""
    with e.manager.lock:
        stats = e.manager.get_stats()
    return stats.data["data"] if stats is not None else {}


def until_tier_hits(e: Engine, keys: List[bytes], c: Any) -> None:
    """Ask the tier (not the manager: no promotion yet) until each key is HIT."""
    for k in keys:
        assert until(lambda: e.tier.lookup(k, c) is LookupResult.HIT or e.step(),
                     scaled(10)), k


# ------------------------------------------------------------------ partial
def test_partial_load_reports_successful_keys(procs, engines):
    """One promotion of four keys from two peers; the peer of the last two
    stops (SIGSTOP) after answering HIT. The job fails in part: vLLM gets
    success=False with successful_keys = the first two; its primary tier
    then holds those two, byte-exact, and not the other two; vLLM's own
    per-tier read bytes and kvpeer's series count two chunks. The slots the
    stopped peer might still write are quarantined (gauge)."""
    a1 = procs(tier_cfg())
    a2 = procs(tier_cfg())
    keys = [make_key(1200 + i) for i in range(4)]
    assert a1.store(keys[:2], seed=21) == [True] * 2
    assert a2.store(keys[2:], seed=21) == [True] * 2
    b = engines(tier_cfg(peers=[a1.peer_id, a2.peer_id]))
    for p in (a1.peer_id, a2.peer_id):
        b.tier._tier.node.wait_peer(p, scaled(10))
    c = b.ctx()
    until_tier_hits(b, keys, c)
    results = spy_results(b)
    a2.kill(signal.SIGSTOP)
    try:
        with b.manager.lock:  # the scheduler's lookups: HIT -> one promotion job
            assert [b.manager.lookup(k, c) for k in keys] == [LookupResult.HIT_PENDING] * 4
        b.step()  # on_schedule_end: submit_load
        assert until(lambda: (b.step(), bool(results))[1], scaled(15)), "no outcome"
        (r,) = results
        assert r.success is False
        assert r.successful_keys is not None, "the load failed whole"
        assert sorted(bytes(k) for k in r.successful_keys) == sorted(keys[:2])
        b.step()
        with b.manager.lock:
            prim = [b.manager.primary_tier.lookup(k, c) for k in keys]
        assert prim == [LookupResult.HIT, LookupResult.HIT,
                        LookupResult.MISS, LookupResult.MISS], prim
        assert b.read(keys[:2], c) == [block_bytes(k, 21) for k in keys[:2]]
        data = tier_data(b)
        label = b.manager._metrics.tier_label(0)
        assert data[TieringOffloadingMetrics.READ_BYTES][label] == 2 * CHUNK
        assert data[M.LOADED_BYTES][label] == 2 * CHUNK
        assert data[M.LOAD_FAILURES][label] == 1
        assert data[M.PARTIAL_LOADS][label] == 1
        assert data[M.FAILED_KEYS][label] == 2
        assert data[M.QUARANTINED][label] >= 1, data[M.QUARANTINED]
    finally:
        a2.kill(signal.SIGCONT)
    b.finish(c)


# ------------------------------------------------------------------ metrics
def test_metric_definitions_reach_vllms_registry():
    """TieringOffloadingSpec gathers kvpeer's definitions from the tier
    config alone (the class named by module_path), each with vLLM's tier
    label and its kind."""
    defs = TieringOffloadingSpec.build_metric_definitions(
        {"secondary_tiers": [dict(KVPEER_TIER)]})
    kinds = {M.HITS: OffloadingCounterMetadata, M.MISSES: OffloadingCounterMetadata,
             M.LOADED_BYTES: OffloadingCounterMetadata,
             M.STORED_BYTES: OffloadingCounterMetadata,
             M.LOAD_LATENCY: OffloadingHistogramMetadata,
             M.LOAD_FAILURES: OffloadingCounterMetadata,
             M.PARTIAL_LOADS: OffloadingCounterMetadata,
             M.QUARANTINED: OffloadingGaugeMetadata, M.RETAINED: OffloadingGaugeMetadata}
    for name, kind in kinds.items():
        assert isinstance(defs[name], kind), name
        assert defs[name].labelnames == (TIER_LABEL,), name
    assert TieringOffloadingMetrics.CHUNK_HITS in defs  # vLLM's own, beside ours


def test_metrics_of_lookups_and_a_load(procs, engines):
    """A stores four keys; B (kvpeer as its second tier, after another)
    loads them and misses one: through vLLM's manager.get_stats(), kvpeer's
    hits, misses, loaded bytes and one load latency, labelled as vLLM
    labels this tier ("2:KVPeerSecondaryTier"), and the gauges now."""
    a = procs(tier_cfg())
    keys = [make_key(1300 + i) for i in range(4)]
    assert a.store(keys, seed=22) == [True] * 4
    b = engines(tier_cfg(peers=[a.peer_id]), tiers_before=[{"type": "example"}])
    assert b.tier.tier_type == "KVPeerSecondaryTier"
    b.tier._tier.node.wait_peer(a.peer_id, scaled(10))
    tier_data(b)  # what B's store of nothing and the handshake left
    c = b.ctx()
    assert b.lookup_all(keys, c, timeout=scaled(10)) == [LookupResult.HIT] * 4
    assert b.read(keys, c) == [block_bytes(k, 22) for k in keys]
    assert b.lookup_all([make_key(1399)], c, timeout=scaled(10)) == [LookupResult.MISS]
    b.finish(c)
    data = tier_data(b)
    label = b.manager._metrics.tier_label(1)
    assert label == ("2:KVPeerSecondaryTier",)
    assert data[M.HITS] == {label: 4}, data.get(M.HITS)
    assert data[M.MISSES] == {label: 1}
    assert data[M.LOADED_BYTES] == {label: 4 * CHUNK}
    assert len(data[M.LOAD_LATENCY][label]) == 1 and data[M.LOAD_LATENCY][label][0] > 0
    assert M.LOAD_FAILURES not in data and M.PARTIAL_LOADS not in data
    assert data[M.QUARANTINED] == {label: 0} and data[M.RETAINED] == {label: 0}
    assert data[M.PEERS_READY] == {label: 1}
    assert data[TieringOffloadingMetrics.READ_BYTES][label] == 4 * CHUNK  # vLLM agrees
    # Taken once: the next step reports only the gauges.
    again = tier_data(b)
    assert M.HITS not in again and again[M.PEERS_READY] == {label: 1}


def test_tier_label_follows_the_tier_list():
    spec = type("S", (), {"secondary_tier_configs": [
        {"type": "example"}, {"type": "KVPeerSecondaryTier", "port": 1},
        {"type": "KVPeerSecondaryTier", "port": 2}]})()
    assert M.tier_label(spec, "KVPeerSecondaryTier", {"port": 2}) == "3:KVPeerSecondaryTier"
    assert M.tier_label(spec, "KVPeerSecondaryTier", {"port": 9}) == "2:KVPeerSecondaryTier"
    assert M.tier_label(object(), "KVPeerSecondaryTier", {}) == "KVPeerSecondaryTier"


def test_store_bytes_counted(engines):
    """Staging: the bytes copied into kvpeer's store (zero copy stores none)."""
    e = engines(tier_cfg(kvpeer_zero_copy=False))
    tier_data(e)
    keys = [make_key(1400 + i) for i in range(3)]
    assert e.store(keys, seed=23, timeout=scaled(10)) == [True] * 3
    data = tier_data(e)
    label = e.manager._metrics.tier_label(0)
    assert data[M.STORED_BYTES] == {label: 3 * CHUNK}
