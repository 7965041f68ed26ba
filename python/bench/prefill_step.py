"""The prefiller's side of P/D in zero copy: how long the scheduler step that
completes a prefill request's store and cascades its chunks to the kvpeer
tier takes (vLLM's complete_store and a step end, its own manager,
in-process; kvpeer hashes those chunks for their publish), and how long from
there until they are published for the decoder. No decoder runs: each
request's chunks are released at the prefill hold's end of the run.

Usage: KVPEER_LIB=build/release/libkvpeer.so .venv/bin/python
python/bench/prefill_step.py [--chunk-kib 2048] [--req-blocks 16] [--requests 20] [--busy]
Prints p50 / p90 of each, ms."""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # kvpeer
from vllm_tiers import Engine, block_bytes, make_key, pct  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk-kib", type=int, default=2048)
    ap.add_argument("--req-blocks", type=int, default=16)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--busy", action="store_true",
                    help="the scheduler thread runs Python (never sleeps, never leaves the "
                         "GIL) while the chunks are hashed: the worst case for the GIL")
    a = ap.parse_args()
    chunk = a.chunk_kib * 1024
    n = a.req_blocks * a.requests
    eng = Engine({"type": "KVPeerSecondaryTier", "module_path": "kvpeer.vllm",
                  "kvpeer_zero_copy": True, "prefill_hold_s": 600}, chunk, n + 8)
    tier = eng.tier
    step_ms: List[float] = []
    pub_ms: List[float] = []
    try:
        for r in range(a.requests):
            keys = [make_key(i) for i in range(r * a.req_blocks, (r + 1) * a.req_blocks)]
            before = tier._tier.node.slots_held().count(2)
            c = eng.ctx({"remote_decoder": {"kv_request_id": f"prefill-step-{r}"}},
                        f"prefill-step-{r}")
            eng._open.append(c)  # finished at close
            with eng.manager.lock:
                out = eng.manager.prepare_store(keys, c)
            for k, ch in zip(out.keys_to_store, out.store_spec.chunk_ids):  # the "GPU" copy
                o = int(ch) * chunk
                eng.view[o:o + chunk] = block_bytes(bytes(k), 7, chunk)
            t0 = time.perf_counter()
            with eng.manager.lock:
                eng.manager.complete_store(out.keys_to_store, c, True)
            eng.step()  # the cascade: the tier's submit_store, here or at complete_store
            step_ms.append((time.perf_counter() - t0) * 1e3)
            deadline = time.monotonic() + 60
            while (any(sv.hashing for sv in tier._serves) if a.busy else
                   tier._tier.node.slots_held().count(2) < before + a.req_blocks):
                if time.monotonic() > deadline:
                    raise TimeoutError("the prefill chunks were never published")
                if not a.busy:
                    time.sleep(0.0002)
            pub_ms.append((time.perf_counter() - t0) * 1e3)
            assert tier._tier.node.slots_held().count(2) == before + a.req_blocks
        print(f"prefill_step{' --busy' if a.busy else ''}: {a.requests} requests of "
              f"{a.req_blocks} x {a.chunk_kib} KiB: "
              f"complete_store + step p50 {pct(step_ms, 50):.2f} p90 {pct(step_ms, 90):.2f} ms; "
              f"published after p50 {pct(pub_ms, 50):.2f} p90 {pct(pub_ms, 90):.2f} ms; "
              f"load average {os.getloadavg()[0]:.2f}")
    finally:
        eng.close()


if __name__ == "__main__":
    main()
