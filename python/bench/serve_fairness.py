"""What one consumer's big fetches cost another peer's LOOKUPs at the same
source (issue 29's leftover: a direct-cma write runs on the source's node
thread, split with one helper thread, and the node thread answered nothing
else meanwhile; since 2026-12-06 12:00 on a writer thread of its own).

Source A (external slots, this process's memory) publishes --blocks blocks;
peer C (this process) sends one-key LOOKUPs to A back to back and times each
(lookup -> its event); consumer B (a process of its own, so A writes into
another process: direct-cma on one host) fetches all of A's blocks into its
own memory again and again. Phases: C alone, then C while B fetches.
Phases: C alone, B alone, C while B fetches. Prints C's LOOKUP latency p50 /
p99 / max, and B's GB/s alone and beside C (B's figure covers its first
second too, before C starts). With --at consumer, C's LOOKUPs go to B
instead (B publishes one block of its own): what B's fetches (its
checksum verify, off its node thread since 2026-12-06 evening) cost the
peers B serves; C alone is then C while B is idle. KVPEER_CMA_WRITER (0: A
writes on its node thread), KVPEER_CMA_SLICE_KIB (the writer's slices;
unset: whole writes), KVPEER_CMA_NICE (the writer's nice; default 10) and
KVPEER_HELPER_THREAD in the environment apply to A and B.

Usage: KVPEER_LIB=build/release/libkvpeer.so .venv/bin/python
python/bench/serve_fairness.py [--block-kib 2048] [--blocks 16] [--seconds 3]
[--at source|consumer] [--loads N] [--sources N]

--loads N: B keeps N fetches of every block open at once (each into slots
of its own): with --at consumer, what B's verify of several loads at once
costs C (one at a time on B's verifier thread, the others waiting their
turn since 2026-12-06 21:50; before, hashed on B's node thread).
--sources N: N sources (each its own node and writer in this process)
publish the same blocks, B's load j comes from source j mod N: with
--loads 2 --sources 2 B's two FETCH_DONEs come about together.
"""
from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import sys
import time
from typing import List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kvpeer import EventType, Node  # noqa: E402


def pct(xs: List[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p / 100))] if s else float("nan")


def consumer(a_addrs: List[str], keys: List[bytes], bs: int, stop: mp.Event, out: mp.Queue,
             fetch: bool = True, loads: int = 1) -> None:
    """B: its address on ``out``, then fetches of ``keys`` from the sources
    ``a_addrs`` until ``stop`` (idle if not ``fetch``), ``loads`` at a time
    (each into slots of its own, load j from source j mod their number),
    then (its GB/s, loads it verified later, of those the ones that waited
    their turn) on ``out``. It publishes B_KEY (the slot
    after the fetched ones) for --at consumer."""
    nk = len(keys)
    m = mmap.mmap(-1, (loads * nk + 1) * bs)
    n = Node(listen_addr="127.0.0.1:0", num_blocks=loads * nk + 1, block_size=bs,
             external_slots=1, region=m)
    n.publish(B_KEY, loads * nk)
    out.put(n.peer_id)
    for a in a_addrs:
        n.add_peer(a)
    for a in a_addrs:
        n.wait_peer(a)
    src = [a_addrs[j % len(a_addrs)] for j in range(loads)]
    moved, t0, rid = 0, time.monotonic(), 1
    while fetch and not stop.is_set():
        for j in range(loads):
            ev = n.wait(n.lookup(src[j], keys, rid + j), 10)
            assert all(ev.results), "B's lookup missed"
        ops = [n.fetch_into(src[j], keys, list(range(j * nk, (j + 1) * nk)), rid + j)
               for j in range(loads)]
        for j, op in enumerate(ops):
            ev = n.wait(op, 10)
            assert ev.ok, ev
            n.finish_request(rid + j)
        moved += loads * nk * bs
        rid += loads
    stop.wait()
    st = n.stats()
    out.put((moved / (time.monotonic() - t0) / 1e9, st["loads_verified_later"],
             st.get("loads_verify_queued", 0)))
    n.close()
    m.close()


B_KEY = b"fair-b"


def lookups(c: Node, a_addr: str, key: bytes, secs: float) -> List[float]:
    lat: List[float] = []
    end, rid = time.monotonic() + secs, 10 ** 9
    while time.monotonic() < end:
        t0 = time.perf_counter()
        ev = c.wait(c.lookup(a_addr, [key], rid), 10)
        lat.append((time.perf_counter() - t0) * 1e3)
        assert ev.type == EventType.LOOKUP and ev.results == [True]
        c.finish_request(rid)
        rid += 1
    return lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-kib", type=int, default=2048)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--at", choices=("source", "consumer"), default="source",
                    help="whose LOOKUPs C times: A's (the source's) or B's (the consumer's)")
    ap.add_argument("--loads", type=int, default=1,
                    help="B's fetches open at once (each of every block, into its own slots)")
    ap.add_argument("--sources", type=int, default=1,
                    help="sources publishing the same blocks (B's load j from source j mod N; "
                         "C's LOOKUPs at --at source go to the first)")
    a = ap.parse_args()
    if min(a.loads, a.sources, a.blocks, a.block_kib) < 1:
        ap.error("--loads, --sources, --blocks and --block-kib must be positive")
    bs, nb = a.block_kib * 1024, a.blocks + 1
    keys = [b"fair-%d" % i for i in range(nb)]
    regions, srcs = [], []
    for _ in range(a.sources):
        ma = mmap.mmap(-1, nb * bs)
        regions.append(ma)
        s = Node(listen_addr="127.0.0.1:0", num_blocks=nb, block_size=bs, external_slots=1,
                 region=ma, max_supply_pins_per_peer=nb * a.loads,
                 max_supply_pins=nb * a.loads)  # B pins all its blocks at once
        srcs.append(s)
        for i, k in enumerate(keys):
            ma[i * bs:(i + 1) * bs] = bytes([i % 251]) * bs
            s.publish(k, i)
    A = srcs[0]
    C = Node(listen_addr="127.0.0.1:0", num_blocks=4, block_size=bs)
    C.add_peer(A.peer_id)
    C.wait_peer(A.peer_id)
    ctx = mp.get_context("spawn")

    verified = [0, 0]  # the last B's loads verified later, and of those queued

    def with_b(during, fetch=True):  # B fetching while during(B) runs: (B's GB/s, its result)
        stop, out = ctx.Event(), ctx.Queue()
        b = ctx.Process(target=consumer,
                        args=([x.peer_id for x in srcs], keys[:-1], bs, stop, out, fetch,
                              a.loads))
        b.start()
        try:
            b_addr = out.get(timeout=30)
            time.sleep(1.0)  # B connected and fetching
            got = during(b_addr)
        finally:
            stop.set()
        gbs, later, queued = out.get(timeout=30)
        b.join(30)
        verified[:] = [later, queued]
        return gbs, got

    def c_lookups(b_addr):  # C's LOOKUPs at A, or at B (--at consumer)
        if a.at == "source":
            return lookups(C, A.peer_id, keys[-1], a.seconds)
        C.wait_peer(b_addr)  # each B: a new address
        return lookups(C, b_addr, B_KEY, a.seconds)

    try:
        if a.at == "source":
            alone = c_lookups(None)
        else:
            _, alone = with_b(c_lookups, fetch=False)
        gbs_alone, _ = with_b(lambda _: time.sleep(a.seconds))
        gbs, busy = with_b(c_lookups)
        for name, lat in (("C alone", alone), ("C while B fetches", busy)):
            print(f"serve_fairness: {name}: {len(lat)} LOOKUPs at {a.at}, p50 {pct(lat, 50):.3f} "
                  f"p99 {pct(lat, 99):.3f} max {max(lat):.3f} ms")
        print(f"serve_fairness: B alone fetched {a.blocks} x {a.block_kib} KiB, {a.loads} at once "
              f"from {a.sources} source(s), at {gbs_alone:.2f} GB/s")
        sts = [x.stats() for x in srcs]
        print(f"serve_fairness: B fetched {a.blocks} x {a.block_kib} KiB at {gbs:.2f} GB/s; "
              f"the sources wrote {sum(st['cma_bytes_written'] for st in sts) / 1e9:.1f} GB by "
              f"direct-cma ({sum(st['cma_writes_failed'] for st in sts)} failed); "
              f"B verified {verified[0]} loads off its node thread, {verified[1]} of them "
              f"after waiting their turn; "
              f"load average {os.getloadavg()[0]:.2f}")
    finally:
        C.close()
        for x in srcs:
            x.close()
        for ma in regions:
            ma.close()


if __name__ == "__main__":
    main()
