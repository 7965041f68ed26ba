"""Two nodes in two processes exchange blocks over UCX, byte-exact."""
from __future__ import annotations

import hashlib
import time

import pytest

import kvpeer
from peer_proc import block_bytes

BS = 65536


def test_two_process_exchange_byte_exact(node_factory, peer_factory):
    src = peer_factory()
    dst = node_factory()
    keys = [b"blk-%03d" % i for i in range(8)] + [bytes(range(64))]
    assert src.call("put_pattern", keys, BS, 0) == len(keys)
    src.call("put", b"short", b"tail-is-zero", 0)

    info = dst.wait_peer(src.peer_id, timeout=10)
    assert info.ready and info.data_path  # e.g. "direct-shm" on one host

    want = keys + [b"short", b"absent"]
    lk = dst.wait(dst.lookup(src.peer_id, want, request_id=11), 10).raise_for_status()
    assert lk.results == [True] * (len(keys) + 1) + [False]
    assert lk.n_ok == len(keys) + 1

    ld = dst.wait(dst.fetch(src.peer_id, want[:-1], request_id=11), 10).raise_for_status()
    assert ld.n_ok == len(keys) + 1 and ld.block_status == [0] * (len(keys) + 1)
    for k in keys:
        with dst.get(k) as b:
            assert len(b.view) == BS
            assert hashlib.sha256(b.view).digest() == hashlib.sha256(block_bytes(k, BS)).digest()
            assert b.view == block_bytes(k, BS)
    with dst.get(b"short") as b:
        assert b.view[:12] == b"tail-is-zero" and not any(b.view[12:])
    dst.finish_request(11)

    st = dst.stats()
    assert st["pins"] == 0 and st["slots_filling"] == 0
    assert st["slots_ready"] == len(keys) + 1 and st["bytes_in"] == (len(keys) + 1) * BS


def test_two_process_exchange_other_direction(node_factory, peer_factory):
    """The child pulls from us: our node is the source this time."""
    src = node_factory()
    keys = [b"up-%d" % i for i in range(4)]
    for k in keys:
        src.put(k, block_bytes(k, BS))
    dst = peer_factory()
    assert dst.call("wait_peer", src.peer_id, 10)
    results, (status, bst) = dst.call("pull", src.peer_id, keys, 5, 10)
    assert results == [True] * 4 and status == 0 and bst == [0] * 4
    for k in keys:
        assert dst.call("read", k) == block_bytes(k, BS)
    assert src.stats()["pins"] == 0  # supply unpinned after FETCH_DONE


def test_lookup_without_session_is_unreachable_at_once(node_factory):
    n = node_factory()
    with pytest.raises(kvpeer.Error) as ei:
        n.lookup("127.0.0.1:1", [b"k"], 1)
    assert ei.value.status == kvpeer.KVP_ERR_UNREACHABLE
    assert n.pending_ops() == []


def test_cancel_parked_load_gives_one_outcome(node_factory):
    """cancel() of a load parked on the source: exactly one LOAD event
    (KVP_ERR_CANCELED), the op's buffers are dropped, the slots come back."""
    src = node_factory()
    dst = node_factory()
    dst.wait_peer(src.peer_id, 10)
    op = dst.fetch(src.peer_id, [b"later-0", b"later-1"], 77, wait_for_supply=True)
    assert dst.pending_ops() == [op]
    assert dst.poll(0.3) == [] or all(e.op_id != op for e in dst.poll(0))
    dst.cancel(op)
    ev = dst.wait(op, 10)
    assert ev.type == kvpeer.EventType.LOAD and ev.status == kvpeer.KVP_ERR_CANCELED
    assert ev.keys == [b"later-0", b"later-1"] and len(ev.block_status) == 2
    assert dst.pending_ops() == []
    with pytest.raises(kvpeer.Error):
        dst.wait(op, 0.2)  # taken: no second outcome
    assert not [e for e in dst.events(timeout=0.3) if e.op_id == op]

    def settled() -> bool:
        st = dst.stats()
        return st["slots_filling"] == 0 and st["slots_quarantined"] == 0
    deadline = time.monotonic() + 10
    while not settled() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert settled(), dst.stats()
    # the source's parked demand is gone too: a later put is not sent anywhere
    src.put(b"later-0", b"x")
    assert src.stats()["pins"] == 0


def test_events_iterator_and_request_finish(node_factory):
    """events() yields PEER_UP, LOOKUP and LOAD in order; finish_request
    during a parked load fails it once (F7)."""
    src = node_factory()
    dst = node_factory()
    src.put(b"e", b"e")
    dst.add_peer(src.peer_id)
    up = next(e for e in dst.events(timeout=10))
    assert up.type == kvpeer.EventType.PEER_UP and up.peer == src.peer_id
    lk = dst.lookup(src.peer_id, [b"e"], 5)
    ld = dst.fetch(src.peer_id, [b"never"], 6, wait_for_supply=True)
    dst.finish_request(6)
    seen = {}
    for e in dst.events(timeout=5):
        seen.setdefault(e.op_id, []).append(e)
        if lk in seen and ld in seen:
            break
    assert [e.results for e in seen[lk]] == [[True]]
    assert len(seen[ld]) == 1 and not seen[ld][0].ok
    dst.finish_request(5)
