"""Issue 29 figure: RSS of one engine process (vLLM's own offloading stack, kvpeer tier) with a
CPU tier of TIER_GIB, after filling it: staging (kvpeer store of STORE_BLOCKS
chunks beside) vs kvpeer_zero_copy. Usage: rss.py staging|zc"""
import sys, time, os
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import vllm_engine as ve
from vllm_engine import CHUNK, Engine, make_key

mode = sys.argv[1]
tier_gib = int(os.environ.get("TIER_GIB", "4"))
store_blocks = int(os.environ.get("STORE_BLOCKS", "16384"))
n = tier_gib * (1 << 30) // CHUNK
cfg = {"dead_after_ms": 1000, "hold_cap_ms": 3000}
if mode == "zc":
    cfg["kvpeer_zero_copy"] = True
else:
    cfg.update(num_blocks=store_blocks, kvpeer_zero_copy=False)

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) * 1024
    return 0

r0 = rss()
e = Engine(cfg, num_chunks=n)
r1 = rss()
fill = bytes(range(256)) * (CHUNK // 256)
t0 = time.monotonic()
B = 512
for base in range(0, n, B):
    keys = [make_key(i) for i in range(base, min(n, base + B))]
    c = e.ctx()
    with e.manager.lock:
        out = e.manager.prepare_store(keys, c)
        if out is None:
            break
        for k, ch in zip(out.keys_to_store, out.store_spec.chunk_ids):
            e.view[int(ch) * CHUNK:(int(ch) + 1) * CHUNK] = fill
        e.manager.complete_store(out.keys_to_store, c, True)
    e.wait_idle(60)
    e.finish(c)
r2 = rss()
st = e.tier._tier.node.stats()
print(f"mode={mode} tier={tier_gib}GiB chunks={n} chunk={CHUNK} store_blocks="
      f"{store_blocks if mode != 'zc' else 0} rss_before={r0>>20}MiB rss_built={r1>>20}MiB "
      f"rss_filled={r2>>20}MiB bytes_copied_in={st['bytes_copied_in']} "
      f"fill_s={time.monotonic()-t0:.1f}", flush=True)
e.close()
