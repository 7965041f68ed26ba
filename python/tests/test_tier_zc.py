"""Issue 29: the zero-copy KVPeerTier's held-slot contract, with the node's
LOAD / SLOTS_RELEASED events scripted (the node and its region are real;
its fetches are stubbed). On this host the same-host path refuses a late
WRITE at once (am-shm), so no real load ever reports held slots here; this
pins the tier's side of the rule on any path: a job whose failed slots are
still held gets a deferred_release event that is set only once every such
slot's KVP_EV_SLOTS_RELEASED arrived -- never at the outcome -- and a job
with none held gets none. The vLLM SIGKILL test runs the real thing
(test_vllm.py, zero-copy)."""
from __future__ import annotations

import mmap
from typing import Dict, List

import pytest

from kvpeer import EventType
from kvpeer import _lib as L
from kvpeer.node import Event
from kvpeer.tier import KVPeerTier, LoadJob

NB, BS = 8, 64 * 1024
P1, P2 = "127.0.0.1:1", "127.0.0.1:2"
K = [b"key-%d" % i for i in range(4)]
RID = 5


@pytest.fixture
def zc_tier():
    region = mmap.mmap(-1, NB * BS)
    tier = KVPeerTier(zero_copy=True, partial_loads=True, listen_addr="127.0.0.1:0",
                      num_blocks=NB, block_size=BS, external_slots=1, external_wanted=1,
                      region=region)
    ops: Dict[int, List[bytes]] = {}

    def fetch_into(peer, keys, slots, rid, wait_for_supply=False):
        op = 100 + len(ops)
        ops[op] = list(keys)
        return op

    tier.node.fetch_into = fetch_into  # type: ignore[method-assign]
    tier.node.cancel = lambda op: None  # type: ignore[method-assign]
    # k0, k1 from P1, k2, k3 from P2: two fetch ops per job
    for i, k in enumerate(K):
        tier._answers[(RID, k)] = {P1 if i < 2 else P2: True}
    yield tier, ops
    tier.shutdown(timeout=0.1)
    region.close()


def load_ev(op: int, keys: List[bytes], status: int, n_held: int) -> Event:
    bst = [L.KVP_ERR_BUSY] * n_held + [status] * (len(keys) - n_held) if status else \
        [L.KVP_OK] * len(keys)
    ev = Event(EventType.LOAD, status, op, RID, len(keys), 0 if status else len(keys),
               keys=list(keys), block_status=bst)
    ev.n_held = n_held
    return ev


def released(op: int, status: int = L.KVP_OK) -> Event:
    return Event(EventType.SLOTS_RELEASED, status, op, RID, 2)


def test_held_slots_defer_until_released(zc_tier):
    """A failed part with held slots: the job's outcome (after every part)
    carries deferred_release, unset; it is set at that op's SLOTS_RELEASED,
    and not before; the records give the order."""
    tier, ops = zc_tier
    tier.submit_load(LoadJob("j1", RID, K, slots=[0, 1, 2, 3]))
    (o1, k1), (o2, k2) = ops.items()
    tier._on_event(load_ev(o1, k1, L.KVP_ERR_TIMEOUT, n_held=2))  # held: a WRITE may land
    assert tier.get_finished_jobs() == []  # the outcome waits for every part
    tier._on_event(load_ev(o2, k2, L.KVP_OK, 0))
    (res,) = tier.get_finished_jobs()
    assert not res.ok and res.ok_keys == k2
    assert res.deferred_release is not None
    assert not res.deferred_release.is_set()  # not at the outcome
    assert tier.deferred_pending() == 1
    tier._on_event(released(999))  # another op's release: nothing
    assert not res.deferred_release.is_set()
    tier._on_event(released(o1))
    assert res.deferred_release.is_set()
    assert tier.deferred_pending() == 0
    assert [r[0] for r in tier.slot_records] == \
        ["load", "load", "deferred", "released", "deferred_set"]
    assert tier.slot_records[2] == ("deferred", "j1", (o1,))


def test_every_held_op_released_before_set(zc_tier):
    """Two parts with held slots: set only once both are released."""
    tier, ops = zc_tier
    tier.submit_load(LoadJob("j2", RID, K, slots=[0, 1, 2, 3]))
    (o1, k1), (o2, k2) = ops.items()
    tier._on_event(load_ev(o1, k1, L.KVP_ERR_UNREACHABLE, n_held=1))
    tier._on_event(load_ev(o2, k2, L.KVP_ERR_UNREACHABLE, n_held=2))
    (res,) = tier.get_finished_jobs()
    assert not res.ok and res.ok_keys == []
    tier._on_event(released(o2, L.KVP_ERR_TIMEOUT))  # the hold cap: released too
    assert not res.deferred_release.is_set()
    tier._on_event(released(o1))
    assert res.deferred_release.is_set()


def test_released_before_outcome_needs_no_deferral(zc_tier):
    """A held part released before the job's last part decides: at the
    outcome every slot is the engine's, so no deferred_release."""
    tier, ops = zc_tier
    tier.submit_load(LoadJob("j3", RID, K, slots=[0, 1, 2, 3]))
    (o1, k1), (o2, k2) = ops.items()
    tier._on_event(load_ev(o1, k1, L.KVP_ERR_TIMEOUT, n_held=2))
    tier._on_event(released(o1))
    tier._on_event(load_ev(o2, k2, L.KVP_ERR_TIMEOUT, 0))
    (res,) = tier.get_finished_jobs()
    assert not res.ok and res.deferred_release is None
    assert tier.deferred_pending() == 0


def test_failure_with_nothing_held_is_not_deferred(zc_tier):
    """Refused at once (AM_REFUSE) or never sent: the chunks are the
    engine's at the outcome; a deferred_release there would keep vLLM's
    chunks out of use for nothing."""
    tier, ops = zc_tier
    tier.submit_load(LoadJob("j4", RID, K, slots=[0, 1, 2, 3]))
    (o1, k1), (o2, k2) = ops.items()
    tier._on_event(load_ev(o1, k1, L.KVP_ERR_UNREACHABLE, 0))
    tier._on_event(load_ev(o2, k2, L.KVP_ERR_UNREACHABLE, 0))
    (res,) = tier.get_finished_jobs()
    assert not res.ok and res.deferred_release is None
    assert not any(r[0].startswith("deferred") for r in tier.slot_records)
