#!/usr/bin/env python3
"""Routing by the KV-event map, end to end on one host (real nodes, UCX).

Two source nodes hold different prefixes of a request's blocks; a router
(kvpeer.router.ClusterMap) builds the cluster map from their KV events and
sends the request to the node with the longest prefix; the requesting node
confirms with one prefix lookup (pinned under the source's lease) and
fetches. A hinted fetch against a node whose map entry went stale misses at
once. Run:  KVPEER_LIB=build/release/libkvpeer.so python3 python/examples/kv_route_demo.py
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kvpeer  # noqa: E402
from kvpeer.router import ClusterMap  # noqa: E402

EP = "tcp://127.0.0.1:*"


def main() -> int:
    cfg = dict(num_blocks=64, block_size=65536, compat="demo-model/fp16/16tok")
    a = kvpeer.Node(kv_events_endpoint=EP, kv_events_replay_endpoint=EP, **cfg)
    b = kvpeer.Node(kv_events_endpoint=EP, kv_events_replay_endpoint=EP, **cfg)
    engine = kvpeer.Node(**cfg)
    cm = ClusterMap()
    try:
        for n in (a, b):
            pub, rep = n.kv_events_endpoints()
            cm.subscribe(pub, rep, node=n.peer_id)
        req = [b"req7-blk%02d" % i for i in range(12)]
        for k in req[:9]:  # a: 9 leading blocks of the request
            a.put(k, k * 100)
        for k in req[:4] + [b"other-%d" % i for i in range(20)]:  # b: 4 of them, and more
            b.put(k, k * 100)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
                cm.prefix_len(a.peer_id, req) < 9 or cm.prefix_len(b.peer_id, req) < 4):
            cm.poll(0.05)
        for n, name in ((a, "A"), (b, "B")):
            st = cm.nodes[n.peer_id]
            print(f"map: node {name} {n.peer_id} incarnation {st.incarnation:016x} "
                  f"next seq {st.next_seq}: {len(st.blocks)} blocks, "
                  f"prefix of the request {cm.prefix_len(n.peer_id, req)}/{len(req)}")
        target, plen = cm.route(req)
        name = "A" if target == a.peer_id else "B"
        print(f"route: request of {len(req)} blocks -> node {name} {target} "
              f"(map prefix {plen})")

        engine.add_peer(target)
        engine.wait_peer(target)
        t0 = time.monotonic()
        ev = engine.wait(engine.lookup_prefix(target, req, 7)).raise_for_status()
        dt = (time.monotonic() - t0) * 1e3
        print(f"lookup_prefix on {name}: held prefix {ev.n_ok} (one round trip, {dt:.2f} ms), "
              f"pins there {(a if target == a.peer_id else b).stats()['pins']}")
        ld = engine.wait(engine.fetch(target, req[:ev.n_ok], 7)).raise_for_status()
        ok = all(engine.get(k).tobytes()[:len(k) * 100] == k * 100 for k in req[:ev.n_ok])
        print(f"fetch: {ld.n_ok} blocks committed, byte-exact {ok}")
        engine.finish_request(7)

        # Router hints: the map says b holds b"other-0"; a hinted fetch (no
        # lookup) is served. Then b lets b"other-1" go by eviction (64
        # slots) and a hint taken from the map before that is stale.
        engine.add_peer(b.peer_id)
        engine.wait_peer(b.peer_id)
        assert b"other-0" in cm.nodes[b.peer_id].blocks
        ev = engine.wait(engine.fetch(b.peer_id, [b"other-0"], 8, hint=True))
        print(f"hinted fetch of a fresh entry on B: {ev.status_name}")
        assert b"other-1" in cm.nodes[b.peer_id].blocks
        for i in range(80):
            b.put(b"churn-%03d" % i, b"x")
        t0 = time.monotonic()
        ev = engine.wait(engine.fetch(b.peer_id, [b"other-1"], 9, hint=True))
        dt = (time.monotonic() - t0) * 1e3
        print(f"hinted fetch of a stale entry on B: {ev.status_name} in {dt:.2f} ms "
              f"(stale hints counted on B: {b.stats()['fetch_hints_stale']})")
        cm.poll(0.5)
        print(f"map after B's evictions: B holds other-1: "
              f"{b'other-1' in cm.nodes[b.peer_id].blocks}, B prefix "
              f"{cm.prefix_len(b.peer_id, req)}; gaps {cm.gaps}, replays {cm.replays}, "
              f"lost {cm.lost}")
        stale_ok = ev.status == kvpeer.KVP_ERR_NOT_FOUND
        return 0 if ok and plen == 9 and name == "A" and stale_ok else 1
    finally:
        cm.close()
        for n in (engine, b, a):
            n.close()


if __name__ == "__main__":
    sys.exit(main())
