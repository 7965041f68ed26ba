"""Issue 29 step 2, keys wanted, through kvpeer.Node: a source whose region
is this process's memory publishes nothing up front; a LOOKUP raises WANTED
there, the embedding publishes the chunk it holds and answers wanted_done;
the consumer's LOOKUP hits exactly that chunk (well before the source's
lookup_pending_ms) and fetch_into lands it byte-exact, with no copy
counted. The binding's fetch_into / publish / unpublish / slots_held /
wanted_keys / wanted_done line up with the header (test_layout)."""
from __future__ import annotations

import mmap
import time

import pytest

from kvpeer import Error, EventType, Node
from kvpeer import _lib as L

NB, BS = 8, 64 * 1024


def _region():
    m = mmap.mmap(-1, NB * BS)
    return m, None


def _node(m, **kw):
    return Node(listen_addr="127.0.0.1:0", num_blocks=NB, block_size=BS, external_slots=1,
                region=m, **kw)  # the mmap exported (pinned) until close()


def _event(node, etype, deadline):
    while time.monotonic() < deadline:
        for ev in node.poll(0.2):
            if ev.type == etype:
                return ev
    raise AssertionError(f"no {etype} event")


def test_wanted_answered_then_fetched_into():
    ms, sbuf = _region()
    md, dbuf = _region()
    src = _node(ms, external_wanted=1, lookup_pending_ms=5000)
    dst = _node(md)
    try:
        held, other = b"chunk-held", b"chunk-not-held"
        chunk = bytes((i * 13 + 5) & 0xFF for i in range(BS))
        dst.add_peer(src.peer_id)
        dst.wait_peer(src.peer_id)
        t0 = time.monotonic()
        lop = dst.lookup(src.peer_id, [held, other], 9)
        w = _event(src, EventType.WANTED, t0 + 10)
        assert (w.request_id, w.n_keys, w.peer) == (9, 2, dst.peer_id)
        keys = src.wanted_keys(w.op_id)
        assert keys == [held, other]
        # the tier asks for the event's n_keys (a small buffer), or fewer
        assert src.wanted_keys(w.op_id, w.n_keys) == keys
        assert src.wanted_keys(w.op_id, 1) == [held]
        ms[5 * BS:6 * BS] = chunk  # the embedding's chunk 5 holds it
        src.publish(held, 5)
        assert src.slots_held(5, 1) == b"\x02"
        assert src.wanted_done(w.op_id) is True
        assert src.wanted_done(w.op_id) is False  # answered
        assert src.wanted_keys(w.op_id) is None
        ev = dst.wait(lop, timeout=10)
        assert time.monotonic() - t0 < 4.0  # answered by done, not the 5 s deadline
        assert ev.results == [True, False]
        fop = dst.fetch_into(src.peer_id, [held], [2], 9)
        le = dst.wait(fop, timeout=10)
        assert (le.status, le.n_ok, le.n_held, le.block_status) == (0, 1, 0, [0])
        assert md[2 * BS:3 * BS] == chunk
        assert dst.slots_held() == bytes(NB)
        s = src.stats()
        assert (s["wanted_ops"], s["wanted_keys"], s["wanted_keys_missed"]) == (1, 2, 1)
        assert s["bytes_copied_in"] + s["bytes_copied_out"] == 0
        assert dst.stats()["bytes_copied_out"] == 0
        freed, slot = src.unpublish(held)
        assert slot == 5
        if not freed:  # a pin not yet dropped: SLOT_FREE follows
            assert _event(src, EventType.SLOT_FREE, time.monotonic() + 10).op_id == 5
        assert src.slots_held(5, 1) == b"\x00"
        with pytest.raises(Error) as e:
            src.unpublish(held)
        assert e.value.status == L.KVP_ERR_NOT_FOUND
        dst.finish_request(9)
    finally:
        dst.close()
        src.close()
        ms.close()  # BufferError if an export were still alive
        md.close()


def test_wanted_calls_refused_without_the_mode():
    ms, sbuf = _region()
    n = _node(ms)
    try:
        with pytest.raises(Error) as e:
            n.wanted_done(1)
        assert e.value.status == L.KVP_ERR_UNSUPPORTED
        with pytest.raises(Error):
            n.wanted_keys(1)
        with pytest.raises(Error):
            n.fetch_into(n.peer_id, [b"k"], [1, 2], 1)  # slots and keys differ
    finally:
        n.close()
        ms.close()


def test_publish_many_once_back_at_the_fetch():
    """Node.publish_many: one call for many chunks (checksums given), each
    key's status (a key published already: EXISTS), bad arguments refused
    whole (once_for without once too); once=True: the consumer's fetch hands
    the chunk back (SLOT_FREE, no unpublish), a later lookup misses it."""
    ms, _ = _region()
    md, _ = _region()
    src = _node(ms)
    dst = _node(md)
    try:
        keys = [b"pm-a", b"pm-b", b"pm-a"]
        for i in (1, 2, 3):
            ms[i * BS:(i + 1) * BS] = bytes([i]) * BS
        sums = [src.slot_checksum(i) for i in (1, 2, 3)]
        assert src.slot_checksums([1, 2, 3]) == sums  # one call for a job's chunks
        assert src.slot_checksums([]) == [] and len(set(sums)) == 3
        with pytest.raises(Error):
            src.slot_checksums([1, NB])  # out of range anywhere: refused whole
        with pytest.raises(Error):
            src.publish_many(keys, [1, 2, NB], sums)  # slot out of range: nothing published
        with pytest.raises(ValueError):
            src.publish_many(keys, [1, 2, 3], [b"short"] * 3)
        with pytest.raises(Error):
            src.publish_many(keys, [1, 2, 3], sums, once_for=3)  # a request, not once
        assert src.slots_held() == bytes(NB)
        st = src.publish_many(keys, [1, 2, 3], sums, once=True)
        assert st == [L.KVP_OK, L.KVP_OK, L.KVP_ERR_EXISTS]
        assert src.slots_held(1, 3) == b"\x02\x02\x00"
        dst.add_peer(src.peer_id)
        dst.wait_peer(src.peer_id)
        op = dst.fetch_into(src.peer_id, [b"pm-a"], [4], 3, wait_for_supply=True)
        ev = _event(dst, EventType.LOAD, time.monotonic() + 10)
        assert (ev.op_id, ev.status) == (op, L.KVP_OK)
        assert md[4 * BS:5 * BS] == bytes([1]) * BS
        fr = _event(src, EventType.SLOT_FREE, time.monotonic() + 10)
        assert fr.op_id == 1 and src.slots_held(1, 2) == b"\x00\x02"
        with pytest.raises(Error):
            src.unpublish(b"pm-a")  # NOT_FOUND: its fetch took it back
        dst.finish_request(3)
        assert src.unpublish(b"pm-b") == (True, 2)
        # hash_publish_many: hashed in the call (the same checksums), then published
        with pytest.raises(Error):
            src.hash_publish_many([b"hp-a", b"hp-b"], [1, NB])  # refused whole
        assert src.slots_held() == bytes(NB)
        st, got = src.hash_publish_many([b"hp-a", b"hp-b", b"hp-c"], [1, 2, 3])
        assert st == [L.KVP_OK] * 3 and got == sums
        assert src.slots_held(1, 3) == b"\x02\x02\x02"
        for k in (b"hp-a", b"hp-b", b"hp-c"):
            assert src.unpublish(k)[0]
    finally:
        dst.close()
        src.close()
        ms.close()
        md.close()
