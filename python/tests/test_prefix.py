"""Issue 19 from Python: prefix lookup (held prefix length, pins under a
lease that renews and expires), and the router-hinted fetch."""
from __future__ import annotations

import time

import kvpeer


def _pair(node_factory, **src_kw):
    src = node_factory(**src_kw)
    dst = node_factory()
    dst.add_peer(src.peer_id)
    dst.wait_peer(src.peer_id)
    return src, dst


def test_lookup_prefix_length_and_pins(node_factory):
    src, dst = _pair(node_factory)
    for k in (b"p0", b"p1", b"p2", b"p4"):  # p3 missing: the prefix is 3
        src.put(k, k)
    keys = [b"p0", b"p1", b"p2", b"p3", b"p4"]
    ev = dst.wait(dst.lookup_prefix(src.peer_id, keys, 11)).raise_for_status()
    assert ev.n_ok == 3
    assert ev.results == [True, True, True, False, False]
    assert src.stats()["pins"] == 3  # p4 is held but not part of the prefix
    ld = dst.wait(dst.fetch(src.peer_id, keys[:3], 11)).raise_for_status()
    assert ld.n_ok == 3
    with dst.get(b"p2") as b:
        assert b.tobytes()[:2] == b"p2"
    dst.finish_request(11)
    deadline = time.monotonic() + 5
    while src.stats()["pins"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert src.stats()["pins"] == 0


def test_lease_expires_unless_renewed(node_factory):
    src, dst = _pair(node_factory, pin_lease_ms=400)
    src.put(b"L0", b"x")
    ev = dst.wait(dst.lookup_prefix(src.peer_id, [b"L0"], 21)).raise_for_status()
    assert ev.n_ok == 1 and src.stats()["pins"] == 1
    for _ in range(4):  # 4 x 0.2 s = 0.8 s > the 0.4 s lease, renewed each time
        time.sleep(0.2)
        dst.lease_renew(src.peer_id, 21)
    deadline = time.monotonic() + 2  # the last renewal is a frame still on its way
    while src.stats()["leases_renewed"] < 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert src.stats()["pins"] == 1 and src.stats()["leases_renewed"] >= 4
    deadline = time.monotonic() + 5
    while src.stats()["pins"] and time.monotonic() < deadline:
        time.sleep(0.05)
    st = src.stats()
    assert st["pins"] == 0 and st["leases_expired"] == 1 and st["lease_pins_expired"] == 1


def test_hinted_fetch_fresh_and_stale(node_factory):
    src, dst = _pair(node_factory)
    src.put(b"h0", b"h0")
    assert dst.wait(dst.fetch(src.peer_id, [b"h0"], 31, hint=True)).ok
    t0 = time.monotonic()
    ev = dst.wait(dst.fetch(src.peer_id, [b"gone"], 32, hint=True))
    assert ev.status == kvpeer.KVP_ERR_NOT_FOUND
    assert time.monotonic() - t0 < 5  # a quick miss, far below the load timeout
    assert src.stats()["fetch_hints_stale"] == 1
