"""The prefiller's side of P/D in zero copy: how long the scheduler step that
completes a prefill request's store and cascades its chunks to the kvpeer
tier takes (vLLM's complete_store and a step end, its own manager,
in-process; kvpeer hashes those chunks for their publish), and how long from
there until they are published for the decoder (the tier has recorded them).
Without --decoder no decoder runs: each request's chunks are released at the
prefill hold's end of the run. With --decoder an engine process of its own
(vllm_tiers.py's engine B, zero copy, stepping every 0.2 ms) runs each
request's decode half, its FETCH parked at A before A completes the store;
"decoder loaded after" is from A's complete_store to B's scheduler seeing
every key HIT (one monotonic clock for both processes): what the decode
waits for, the GIL of A's busy scheduler included.

Usage: KVPEER_LIB=build/release/libkvpeer.so .venv/bin/python
python/bench/prefill_step.py [--chunk-kib 2048] [--req-blocks 16] [--requests 20] [--busy]
[--decoder]
Prints p50 / p90 of each, ms."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # kvpeer
from vllm_tiers import (Engine, Proc, block_bytes, free_port, make_key, pct, pd_id,  # noqa: E402
                        tier_entry)

SEED = 7


def start_decoder(a: argparse.Namespace, a_addr: str, chunks: int, log: str) -> Proc:
    """Engine B (vllm_tiers.py's engine role, zero copy) peered with A."""
    me = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       "vllm_tiers.py"),
          "--role", "engine", "--tier", "kvpeer-zc", "--block-kib", str(a.chunk_kib),
          "--port", str(free_port()), "--num-chunks", str(chunks), "--peer", a_addr]
    b = Proc(me, log)
    hello = b.read(60)
    if "error" in hello:
        raise RuntimeError(f"decoder: {hello['error']}")
    return b


def decode_cmd(b: Proc, a: argparse.Namespace, a_addr: str, first: int) -> None:
    """B starts the decode of the request whose first block is ``first``
    (its reply is read later)."""
    b.p.stdin.write(json.dumps({"op": "load", "peer": a_addr, "seed": SEED, "pd": True,
                                "first": first, "n": a.req_blocks, "req_blocks": a.req_blocks,
                                "step_s": 0.0002, "timeout": 60, "tag": "dec-"}) + "\n")
    b.p.stdin.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk-kib", type=int, default=2048)
    ap.add_argument("--req-blocks", type=int, default=16)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--busy", action="store_true",
                    help="the scheduler thread runs Python (never sleeps, never leaves the "
                         "GIL) while the chunks are hashed: the worst case for the GIL")
    ap.add_argument("--decoder", action="store_true",
                    help="a decoder engine process fetches each request's chunks (its FETCH "
                         "parked at A first): the time until it has them")
    a = ap.parse_args()
    chunk = a.chunk_kib * 1024
    warm = 1 if a.decoder else 0  # the decoder's first request dials A: not measured
    n = a.req_blocks * (a.requests + warm)
    port = free_port()
    a_addr = f"127.0.0.1:{port}"
    eng = Engine(dict(tier_entry("kvpeer-zc", port, [], n + 8), prefill_hold_s=600), chunk,
                 n + 8)
    tier = eng.tier
    step_ms: List[float] = []
    pub_ms: List[float] = []
    dec_ms: List[float] = []
    b = start_decoder(a, a_addr, n + 8, f"/tmp/prefill-step-decoder-{os.getpid()}.log") \
        if a.decoder else None
    try:
        for r in range(a.requests + warm):
            first = r * a.req_blocks
            keys = [make_key(i) for i in range(first, first + a.req_blocks)]
            before = tier._tier.node.slots_held().count(2)
            if b is not None:
                decode_cmd(b, a, a_addr, first)
                time.sleep(0.05)  # its FETCH parks at A
            c = eng.ctx({"remote_decoder": {"kv_request_id": pd_id(first)}}, f"prefill-step-{r}")
            eng._open.append(c)  # finished at close
            with eng.manager.lock:
                out = eng.manager.prepare_store(keys, c)
            for k, ch in zip(out.keys_to_store, out.store_spec.chunk_ids):  # the "GPU" copy
                o = int(ch) * chunk
                eng.view[o:o + chunk] = block_bytes(bytes(k), SEED, chunk)
            t0 = time.perf_counter()
            with eng.manager.lock:
                eng.manager.complete_store(out.keys_to_store, c, True)
            eng.step()  # the cascade: the tier's submit_store, here or at complete_store
            step_ms.append((time.perf_counter() - t0) * 1e3)
            deadline = time.monotonic() + 60
            while (any(sv.hashing for sv in tier._serves) if a.busy or b else
                   tier._tier.node.slots_held().count(2) < before + a.req_blocks):
                if time.monotonic() > deadline:
                    raise TimeoutError("the prefill chunks were never published")
                if not a.busy:
                    time.sleep(0.0002)
            pub_ms.append((time.perf_counter() - t0) * 1e3)
            if b is None:
                assert tier._tier.node.slots_held().count(2) == before + a.req_blocks
                continue
            t0m = time.monotonic() - (time.perf_counter() - t0)  # t0 on the shared clock
            res = b.read(60)
            if "error" in res or res["mismatches"] or res["blocks"] != a.req_blocks:
                raise RuntimeError(f"decoder: {res}")
            eng.step()  # A takes the chunks back (SLOT_FREE)
            if r >= warm:
                dec_ms.append((res["done_at"][0] - t0m) * 1e3)
        dec = f"; decoder loaded after p50 {pct(dec_ms, 50):.2f} p90 {pct(dec_ms, 90):.2f} ms" \
            if b is not None else ""
        print(f"prefill_step{' --busy' if a.busy else ''}{' --decoder' if b else ''}: "
              f"{a.requests} requests of {a.req_blocks} x {a.chunk_kib} KiB: "
              f"complete_store + step p50 {pct(step_ms, 50):.2f} p90 {pct(step_ms, 90):.2f} ms; "
              f"published after p50 {pct(pub_ms, 50):.2f} p90 {pct(pub_ms, 90):.2f} ms{dec}; "
              f"load average {os.getloadavg()[0]:.2f}")
    finally:
        if b is not None:
            b.close()
        eng.close()


if __name__ == "__main__":
    main()
