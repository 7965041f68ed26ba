"""Issue 29 figure: bytes copied per fetched byte, from the node counters: engine A stores N
chunks, engine B (same process, vLLM's own manager) looks them up and loads
them; staging vs kvpeer_zero_copy. Usage: copies.py staging|zc [N]"""
import os, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from vllm.v1.kv_offload.base import LookupResult
from vllm_engine import CHUNK, Engine, block_bytes, make_key

mode = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
cfg = {"dead_after_ms": 1000, "hold_cap_ms": 3000, "num_blocks": 64, "kvpeer_zero_copy": False}
if mode == "zc":
    cfg = {"dead_after_ms": 1000, "hold_cap_ms": 3000, "kvpeer_zero_copy": True}
a = Engine(cfg)
b = Engine({**cfg, "peers": [a.peer_id]})
keys = [make_key(i) for i in range(n)]
c = a.ctx()
with a.manager.lock:
    out = a.manager.prepare_store(keys, c)
    for k, ch in zip(out.keys_to_store, out.store_spec.chunk_ids):
        a.view[int(ch) * CHUNK:(int(ch) + 1) * CHUNK] = block_bytes(k, 3)
    a.manager.complete_store(out.keys_to_store, c, True)
a.wait_idle(30)
a.finish(c)
c = b.ctx()
deadline = time.monotonic() + 60
while True:
    with b.manager.lock:
        res = [b.manager.lookup(k, c) for k in keys]
    if all(r is LookupResult.HIT for r in res) or time.monotonic() > deadline:
        break
    b.step(); a.step(); time.sleep(0.005)
data = b.read(keys, c)
assert data == [block_bytes(k, 3) for k in keys], "bytes differ"
b.finish(c)
for _ in range(100):
    a.step(); time.sleep(0.01)
sa, sb = a.tier._tier.node.stats(), b.tier._tier.node.stats()
fetched = sb["bytes_in"]
print(f"mode={mode} chunks={n} chunk={CHUNK} fetched={fetched} "
      f"source_copied_in={sa['bytes_copied_in']} ({sa['bytes_copied_in']/fetched:.2f}/fetched B) "
      f"consumer_copied_out={sb['bytes_copied_out']} ({sb['bytes_copied_out']/fetched:.2f}/fetched B)")
b.close(); a.close()
