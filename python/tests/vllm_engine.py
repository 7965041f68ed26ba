"""A vLLM offloading stack with kvpeer tiers, built the way vLLM builds it:
OffloadingSpecFactory.create_spec(OffloadingConfig with kv_connector_extra_config)
-> TieringOffloadingSpec.get_manager() -> TieringOffloadingManager over a CPU
primary tier (SharedOffloadRegion in /dev/shm) and SecondaryTierFactory's
out-of-tree path to kvpeer.vllm.KVPeerSecondaryTier. Nothing of vLLM is
stubbed; there is no GPU, so the GPU<->CPU step is the test writing the
primary chunks itself (what vLLM's offloading worker would copy in).

Also runs as a child process (``python vllm_engine.py``) driven by JSON lines
on stdin: {"op": "store", "keys": [hex], "seed": n} etc.; see main().
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402

from kvpeer.vllm import offloading_config  # noqa: E402

CHUNK = 65536
NUM_CHUNKS = 32
STEP_END = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())


def block_bytes(key: bytes, seed: int) -> bytes:
    """Deterministic content of one block (both processes compute it)."""
    out = bytearray()
    i = 0
    while len(out) < CHUNK:
        out += hashlib.sha256(key + seed.to_bytes(4, "little") + i.to_bytes(4, "little")).digest()
        i += 1
    return bytes(out[:CHUNK])


def make_key(i: int, group: int = 0) -> bytes:
    """An OffloadKey as vLLM makes it: block hash (32 B) + group index."""
    return hashlib.sha256(b"block-%d" % i).digest() + group.to_bytes(4, "big")


class Engine:
    """One engine's scheduler-side offloading stack."""

    def __init__(self, tier_config: Dict[str, Any], num_chunks: int = NUM_CHUNKS,
                 tiers_before: Sequence[Dict[str, Any]] = (), **spec: Any) -> None:
        """``spec``: offloading_config's model_name, dtype, tp_size, dp_index;
        ``tiers_before``: secondary tiers listed before kvpeer's."""
        self.engine_id = f"kvpeer-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tier = {"type": "KVPeerSecondaryTier", "module_path": "kvpeer.vllm", **tier_config}
        cfg = offloading_config(self.engine_id, CHUNK, num_chunks, [*tiers_before, tier],
                                **spec)
        self.spec = OffloadingSpecFactory.create_spec(cfg)
        self.manager = self.spec.get_manager()
        self.tier = self.manager.secondary_tiers[len(tiers_before)]
        self.view = self.manager.primary_tier.get_kv_memoryview().cast("B")  # flat bytes
        self.num_chunks = self.view.nbytes // CHUNK
        self._n = 0

    @property
    def peer_id(self) -> str:
        return self.tier.peer_id

    def ctx(self, params: Optional[Dict[str, Any]] = None,
            req_id: Optional[str] = None) -> ReqContext:
        self._n += 1
        c = ReqContext(req_id=req_id or f"{self.engine_id}-req{self._n}",
                       kv_transfer_params=params)
        with self.manager.lock:
            self.manager.on_new_request(c)
        return c

    def step(self) -> None:
        with self.manager.lock:
            self.manager.on_schedule_end(STEP_END)

    def store(self, keys: Sequence[bytes], seed: int, timeout: float,
              req_id: Optional[str] = None,
              params: Optional[Dict[str, Any]] = None) -> List[bool]:
        """GPU->primary store (the test writes the chunks), then vLLM cascades
        to the kvpeer tier; waits until no tier job is running."""
        c = self.ctx(params, req_id=req_id)
        with self.manager.lock:
            out = self.manager.prepare_store(keys, c)
            assert out is not None, "primary tier full"
            for k, chunk in zip(out.keys_to_store, out.store_spec.chunk_ids):
                self.view[int(chunk) * CHUNK:(int(chunk) + 1) * CHUNK] = block_bytes(k, seed)
            self.manager.complete_store(out.keys_to_store, c, True)
        self.wait_idle(timeout)
        with self.manager.lock:
            self.manager.on_request_finished(c)
        if self.tier._zc:  # zero copy: served from the primary tier itself
            with self.manager.lock:
                return [self.manager.primary_tier.lookup(k, c) is LookupResult.HIT
                        for k in keys]
        return [self.tier._tier.node.contains(k) for k in keys]

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.step()
            with self.manager.lock:
                if not self.manager._jobs:
                    return True
            time.sleep(0.01)
        return False

    def lookup_all(self, keys: Sequence[bytes], c: ReqContext, timeout: float,
                   until=(LookupResult.HIT,)) -> List[LookupResult]:
        """Step the engine like the scheduler does: look every key up each
        step until each answers one of ``until`` or MISS (or the bound)."""
        deadline = time.monotonic() + timeout
        res: List[LookupResult] = []
        while True:
            with self.manager.lock:
                res = [self.manager.lookup(k, c) for k in keys]
            if all(r in until or r is LookupResult.MISS for r in res) \
                    or time.monotonic() >= deadline:
                return res
            self.step()
            time.sleep(0.01)

    def read(self, keys: Sequence[bytes], c: ReqContext) -> List[bytes]:
        """primary -> GPU load (prepare_load, read the chunks, complete_load)."""
        with self.manager.lock:
            spec = self.manager.prepare_load(keys, c)
            data = [self.chunk(int(b)) for b in spec.chunk_ids]
            self.manager.complete_load(keys, c)
        return data

    def chunk(self, i: int) -> bytes:
        return bytes(self.view[i * CHUNK:(i + 1) * CHUNK])

    def finish(self, c: ReqContext) -> None:
        with self.manager.lock:
            self.manager.on_request_finished(c)

    def close(self) -> None:
        self.view.release()
        self.manager.shutdown()


def spy_lookups(e: "Engine") -> List[Any]:
    """Record (peer, number of keys) of every LOOKUP engine e's tier sends."""
    node = e.tier._tier.node
    sent: List[Any] = []
    orig = node.lookup

    def spy(peer, ks, rid):
        sent.append((peer, len(ks)))
        return orig(peer, ks, rid)

    node.lookup = spy  # type: ignore[method-assign]
    return sent


def main() -> None:
    """Child process: build an Engine from argv[1] (JSON tier config) and
    argv[2] (JSON offloading_config fields, optional), print {"peer_id":
    ...}, then answer one JSON line per command line."""
    spec = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    eng = Engine(json.loads(sys.argv[1]), **spec)
    print(json.dumps({"peer_id": eng.peer_id, "compat": eng.tier.compat}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "store":
            keys = [bytes.fromhex(k) for k in cmd["keys"]]
            ok = eng.store(keys, cmd["seed"], cmd.get("timeout", 10.0), cmd.get("req_id"),
                           cmd.get("params"))
            print(json.dumps({"stored": ok}), flush=True)
        elif op == "load":  # look up (stepping) and load: digests of what vLLM reads
            keys = [bytes.fromhex(k) for k in cmd["keys"]]
            c = eng.ctx(cmd.get("params"))
            res = eng.lookup_all(keys, c, timeout=cmd.get("timeout", 10.0))
            data = eng.read(keys, c) if all(r is LookupResult.HIT for r in res) else []
            eng.finish(c)
            st = eng.tier._tier.node.stats()
            print(json.dumps({"results": [r.name for r in res],
                              "digests": [hashlib.sha256(d).hexdigest() for d in data],
                              "blocks_in": st["blocks_in"],
                              "loads_landing_awaited": st["loads_landing_awaited"]}), flush=True)
        elif op == "peers":  # the data path of each session (its WRITEs to the peer)
            print(json.dumps({p.peer: p.data_path for p in eng.tier._tier.node.peers()}),
                  flush=True)
        elif op == "quit":
            break
    eng.close()
    print(json.dumps({"closed": True}), flush=True)


if __name__ == "__main__":
    main()
