"""Issue 19: KV events. A subscriber (kvpeer.router.ClusterMap) sees every
put and eviction of two nodes, in order, exactly once, with no gaps -- across
a restart of one node (a new incarnation) -- and routes by the map."""
from __future__ import annotations

import time

import pytest

import kvpeer

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
from kvpeer.router import ClusterMap  # noqa: E402  (needs zmq and msgpack)

EP = "tcp://127.0.0.1:*"


def _events_node(node_factory, **kw):
    return node_factory(kv_events_endpoint=EP, kv_events_replay_endpoint=EP, **kw)


def _subscribe(cm, n):
    pub, rep = n.kv_events_endpoints()
    assert pub and rep and pub.startswith("tcp://127.0.0.1:")
    cm.subscribe(pub, rep, node=n.peer_id)


def _wait_map(cm, pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        cm.poll(0.05)
    return pred()


def _seq_per_incarnation(cm, node):
    out = {}
    for a in cm.applied:
        if a.node == node:
            out.setdefault(a.incarnation, []).append(a)
    return out


def _kinds(applied):
    return [(a.kind, a.key) for a in applied]


def _in_order(applied):
    """Events applied in sequence order from the incarnation's first batch.
    Their seqs need not be contiguous: a node publishes an empty batch after
    each second of silence (a slow step on a loaded machine leaves such a
    seq between two events). That no batch went missing is cm.lost == 0."""
    seqs = [a.seq for a in applied]
    return bool(seqs) and seqs[0] == 0 and seqs == sorted(seqs)


def test_every_put_and_evict_in_order_across_restart(node_factory):
    a = _events_node(node_factory, num_blocks=16)
    b = _events_node(node_factory, num_blocks=16)
    cm = ClusterMap()
    try:
        _subscribe(cm, a)
        _subscribe(cm, b)
        ka = [b"a%02d" % i for i in range(40)]
        for k in ka:  # 16 slots: the 17th put evicts the oldest (LRU), and so on
            a.put(k, k)
        kb = [b"b%02d" % i for i in range(10)]
        for k in kb:
            b.put(k, k)
        b.add_peer(a.peer_id)
        b.wait_peer(a.peer_id)
        ev = b.wait(b.lookup_prefix(a.peer_id, ka[37:], 1)).raise_for_status()
        assert ev.n_ok == 3
        b.wait(b.fetch(a.peer_id, ka[37:], 1)).raise_for_status()  # stored on b too
        b.finish_request(1)
        assert a.stats()["evictions"] == 24
        assert _wait_map(cm, lambda: cm.nodes.get(a.peer_id) is not None and
                         len(cm.nodes[a.peer_id].blocks) == 16 and
                         cm.nodes.get(b.peer_id) is not None and
                         len(cm.nodes[b.peer_id].blocks) == 13)

        # Node a: exactly the model's sequence, in order.
        want_a = [("cleared", b"")] + [("stored", k) for k in ka[:16]]
        for i in range(16, 40):
            want_a += [("removed", ka[i - 16]), ("stored", ka[i])]
        inc_a = _seq_per_incarnation(cm, a.peer_id)
        assert len(inc_a) == 1
        (seq_a,) = inc_a.values()
        assert _kinds(seq_a) == want_a
        assert _in_order(seq_a)
        assert cm.nodes[a.peer_id].blocks == set(ka[24:])

        # Restart b under the same peer id and endpoints: a new incarnation.
        bid, (bpub, brep) = b.peer_id, b.kv_events_endpoints()
        old_inc = cm.nodes[bid].incarnation
        b.close()
        b2 = node_factory(listen_addr=bid, kv_events_endpoint=bpub,
                          kv_events_replay_endpoint=brep, num_blocks=16)
        assert b2.peer_id == bid
        kc = [b"c%02d" % i for i in range(5)]
        for k in kc:
            b2.put(k, k)
        assert _wait_map(cm, lambda: cm.nodes[bid].incarnation != old_inc and
                         cm.nodes[bid].blocks == set(kc))
        inc_b = _seq_per_incarnation(cm, bid)
        assert set(inc_b) == {old_inc, cm.nodes[bid].incarnation}
        old = inc_b[old_inc]
        want_old = [("cleared", b"")] + [("stored", k) for k in kb] + \
            [("stored", k) for k in ka[37:]]
        assert _kinds(old)[:len(want_old)] == want_old
        assert _kinds(old)[len(want_old):] in ([], [("cleared", b"")])  # the goodbye
        assert _in_order(old)
        new = inc_b[cm.nodes[bid].incarnation]
        assert _kinds(new) == [("cleared", b"")] + [("stored", k) for k in kc]
        assert _in_order(new)
        assert cm.lost == 0  # every gap (late joins) was filled from replay
        assert cm.replays >= 1  # the late joins really went through replay

        # Route by the map: the longest prefix of a's keys is on a.
        assert cm.route(ka[30:]) == (a.peer_id, 10)
        assert cm.route(kc[:2] + [b"zz"]) == (bid, 2)
        assert cm.route([b"nowhere"]) == (None, 0)
        st = a.stats()
        assert st["kv_event_batches"] >= 1 and st["kv_events"] == len(want_a)
        assert st["kv_event_batches_dropped"] == 0
    finally:
        cm.close()


def test_bad_events_endpoint_is_a_clean_error():
    with pytest.raises(kvpeer.Error) as ei:
        kvpeer.Node(kv_events_endpoint="nonsense://x")
    assert ei.value.status == kvpeer.KVP_ERR_INVALID
    with pytest.raises(kvpeer.Error):  # replay without a PUB endpoint
        kvpeer.Node(kv_events_replay_endpoint=EP)
    n = kvpeer.Node()
    assert n.kv_events_endpoints() == (None, None)
    n.close()


def test_route_demo(capsys):
    """python/examples/kv_route_demo.py routes by the map, confirms with one
    prefix lookup, fetches byte-exact, and sees a stale hint miss."""
    import pathlib
    import runpy

    demo = pathlib.Path(__file__).resolve().parents[1] / "examples" / "kv_route_demo.py"
    assert runpy.run_path(str(demo))["main"]() == 0
    out = capsys.readouterr().out
    assert "route: request of 12 blocks -> node A" in out
    assert "hinted fetch of a stale entry on B: KVP_ERR_NOT_FOUND" in out
