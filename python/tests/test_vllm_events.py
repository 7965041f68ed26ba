"""kvpeer's KV events through vLLM's tier-owned event path (issue 28, build
item 4): with vLLM's KV events on, every block kvpeer's store takes in and
every block it evicts reaches vLLM's TieringOffloadingManager.take_events()
as an OffloadingEvent of the kvpeer tier, and vLLM's connector turns them into
BlockStored / BlockRemoved; kvpeer's own ZMQ publisher keeps working beside
it. Through vLLM's own manager (vllm_engine.Engine), as test_vllm.py.
"""
from __future__ import annotations

import os
import time
from typing import Any, List

import pytest

pytest.importorskip("vllm.v1.kv_offload.tiering.spec",
                    reason="vllm is not installed in this python (scripts/install-py.sh "
                           "makes .venv; the python_vllm ctest runs this file with it)")

from conftest import scaled  # noqa: E402
from vllm.v1.kv_offload.base import Locality, Medium  # noqa: E402

from test_vllm import engines, tier_cfg  # noqa: E402,F401 (fixture)
from vllm_engine import Engine, make_key  # noqa: E402

TIER_TYPE = "KVPeerSecondaryTier"


def drain(e: Any, want, timeout: float) -> List[Any]:
    """vLLM's manager's events (every tier's), stepping the engine, until
    ``want(kvpeer_events)`` holds or the bound; returns the kvpeer tier's."""
    got: List[Any] = []
    deadline = time.monotonic() + timeout
    while True:
        e.step()
        with e.manager.lock:
            got += [ev for ev in e.manager.take_events() if ev.ownership == TIER_TYPE]
        if want(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.01)


def keys_of(evs: List[Any], removed: bool) -> List[bytes]:
    return [bytes(k) for ev in evs if ev.removed == removed for k in ev.keys]


def test_store_and_evict_reach_vllm_take_events(engines):
    """A tier of 4 blocks: 3 stored -> 3 stored events (CPU, LOCAL, the
    tier's ownership) through vLLM's manager; 3 more stored -> 2 of the first
    evicted by kvpeer's store -> 2 removed events, and the 3 new stored.
    vLLM's connector translates them to BlockStored/BlockRemoved of the block
    hashes. The operator's ZMQ publisher, configured too, carries the same.
    Staging: zero copy has no store of kvpeer's own (vLLM's own events name
    its CPU tier, which is what a zero-copy node serves)."""
    from kvpeer.router import ClusterMap
    e = engines(tier_cfg(num_blocks=4, kvpeer_zero_copy=False, node_options={"kv_events_endpoint": "tcp://127.0.0.1:*",
                                                     "kv_events_replay_endpoint":
                                                         "tcp://127.0.0.1:*"}),
                kv_events=True)
    node = e.tier._tier.node
    pub, rep = node.kv_events_endpoints()
    assert pub.startswith("tcp://127.0.0.1:"), pub  # the operator's endpoint kept
    first = [make_key(4100 + i) for i in range(3)]
    assert e.store(first, seed=3, timeout=scaled(10)) == [True] * 3
    evs = drain(e, lambda g: set(keys_of(g, False)) >= set(first), scaled(10))
    assert set(keys_of(evs, False)) == set(first), evs
    for ev in evs:
        assert ev.medium == Medium.CPU and ev.locality == Locality.LOCAL
        assert ev.removal_expected
    assert not keys_of(evs, True)

    second = [make_key(4200 + i) for i in range(3)]
    assert e.store(second, seed=3, timeout=scaled(10)) == [True] * 3
    evs2 = drain(e, lambda g: len(keys_of(g, True)) >= 2 and
                 set(keys_of(g, False)) >= set(second), scaled(10))
    removed = keys_of(evs2, True)
    assert len(removed) == 2 and set(removed) <= set(first), evs2
    assert set(keys_of(evs2, False)) == set(second)
    held = {k for k in first + second if node.contains(k)}
    assert held == (set(first) - set(removed)) | set(second)

    # vLLM's connector's translation (what reaches vLLM's KV event publisher)
    from vllm.distributed.kv_events import BlockRemoved, BlockStored
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.events import (
        OffloadingEventsTracker)
    tr = OffloadingEventsTracker(e.spec.kv_events_config)
    out = list(tr.take_events(evs + evs2))
    stored = [h for x in out if isinstance(x, BlockStored) for h in x.block_hashes]
    gone = [h for x in out if isinstance(x, BlockRemoved) for h in x.block_hashes]
    from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash
    h = lambda k: maybe_convert_block_hash(BlockHash(k[:-4]))  # noqa: E731 (vLLM's form)
    assert sorted(stored) == sorted(h(k) for k in first + second)
    assert sorted(gone) == sorted(h(k) for k in removed)
    assert all(x.ownership == TIER_TYPE for x in out if isinstance(x, BlockStored))

    # kvpeer's own publisher, subscribed like a router: the same blocks held
    with ClusterMap() as cm:
        cm.subscribe(pub, rep, node=node.peer_id)
        deadline = time.monotonic() + scaled(10)
        while time.monotonic() < deadline and \
                cm.nodes.get(node.peer_id, None) is None:
            cm.poll(0.05)
        assert cm.nodes[node.peer_id].blocks == held


def test_no_vllm_kv_events_no_subscription(engines):
    """vLLM's KV events off (the default): the tier subscribes to nothing,
    opens no publisher of its own, and take_events yields nothing."""
    e = engines(tier_cfg())
    assert e.tier._events is None
    assert e.tier._tier.node.kv_events_endpoints() == (None, None)
    e.store([make_key(4300)], seed=3, timeout=scaled(10))
    assert list(e.tier.take_events()) == []


def test_tier_key_turns_events_off_and_ipc_dir_removed(engines):
    """kv_events: false keeps vLLM's path quiet though vLLM's events are on;
    with it on and no operator endpoint, the node publishes on ipc:// in a
    private directory, removed at shutdown."""
    off = engines(tier_cfg(kv_events=False), kv_events=True)
    assert off.tier._events is None
    with pytest.raises(ValueError, match="kv_events must be true or false"):
        engines(tier_cfg(kv_events="yes"), kv_events=True)
    on = Engine(tier_cfg(), kv_events=True)
    try:
        pub, rep = on.tier._tier.node.kv_events_endpoints()
        assert pub.startswith("ipc://") and rep.startswith("ipc://")
        d = os.path.dirname(pub[len("ipc://"):])
        assert (os.stat(d).st_mode & 0o777) == 0o700
    finally:
        on.close()
    assert not os.path.exists(d)

