"""One vLLM engine's scheduler with kvpeer as its secondary tier, the way an
operator runs it (issue 28, must-show line 1): vLLM's real Scheduler ->
OffloadingConnector (scheduler role) -> TieringOffloadingSpec ->
TieringOffloadingManager -> kvpeer.vllm.KVPeerSecondaryTier, configured by a
``--kv-transfer-config`` JSON. Only the GPU worker is emulated (there is no
GPU): each step it executes the connector's metadata (GPU<->CPU chunk copies
between a dict of "GPU blocks" and vLLM's primary CPU tier) and reports the
jobs done in the next ModelRunnerOutput, and it "computes" a block by
writing bytes derived from the block's hash, so a loaded block can be
checked byte for byte.

The model is a tiny local config (no weights, no tokenizer: the scheduler
reads only the config). vLLM inspects the model class, which imports einops:
the project venv does not have it (python/requirements-vllm.txt is the
scheduler-side closure), so the caller puts an einops directory on
PYTHONPATH (test_vllm_sched.py installs it with pip into build/).

Child process: ``python vllm_sched.py MODEL_DIR KV_TRANSFER_CONFIG_JSON``,
prints {"peer_id": ...}, then one JSON line per command:
  {"op": "run", "prompt": [ints], "req_id": s, "params": {...}}
      -> {"prompt_len", "computed", "loaded_blocks", "stored_blocks",
          "bad_blocks", "steps"}   (computed: prompt tokens this engine ran)
  {"op": "stats"}  -> the kvpeer node's counters (kvp_node_stats)
  {"op": "quit"}
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

BLOCK_TOKENS = 16
KV_HEADS, HEAD_SIZE = 8, 64  # one layer, fp16: 2 x 16 x 8 x 64 x 2 B = 32 KiB a block
NUM_GPU_BLOCKS = 256


def tiny_model(path: Path) -> Path:
    """A model directory the scheduler can configure from (config only)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 512,
        "ffn_dim": 1024, "num_attention_heads": KV_HEADS, "num_hidden_layers": 1,
        "vocab_size": 1000, "max_position_embeddings": 2048, "word_embed_proj_dim": 512,
        "do_layer_norm_before": True, "torch_dtype": "float16", "bos_token_id": 2,
        "eos_token_id": 2, "pad_token_id": 1}))
    return path


def block_content(block_hash: bytes, n: int) -> bytes:
    """What the emulated model writes into a computed block (any engine)."""
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(block_hash + i.to_bytes(4, "little")).digest()
        i += 1
    return bytes(out[:n])


class SchedEngine:
    """vLLM's Scheduler with the OffloadingConnector; the worker emulated."""

    def __init__(self, model_dir: str, kv_transfer_config: Dict[str, Any]) -> None:
        import torch
        from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                                 SchedulerConfig, VllmConfig)
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import (get_request_block_hasher, init_none_hash,
                                                 resolve_kv_cache_block_sizes)
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, KVCacheTensor)
        from vllm.v1.structured_output import StructuredOutputManager

        model = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float16",
                            seed=0, max_model_len=2048)
        sched = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512,
                                max_model_len=2048, enable_chunked_prefill=True,
                                is_encoder_decoder=False)
        cache = CacheConfig(block_size=BLOCK_TOKENS, enable_prefix_caching=True)
        cache.kv_cache_layout = "LBNHC"
        # The engine id names vLLM's /dev/shm region: test_vllm._reap removes
        # the region of an engine that was killed.
        ktc = {"engine_id": f"kvpeer-test-{os.getpid()}-{uuid.uuid4().hex[:8]}",
               **kv_transfer_config}
        self.config = VllmConfig(model_config=model, scheduler_config=sched,
                                 cache_config=cache, device_config=DeviceConfig("cpu"),
                                 kv_transfer_config=KVTransferConfig(**ktc))
        self.config.scheduler_config.async_scheduling = False
        spec = FullAttentionSpec(block_size=BLOCK_TOKENS, num_kv_heads=KV_HEADS,
                                 head_size=HEAD_SIZE, dtype=torch.float16)
        self.block_bytes = spec.page_size_bytes
        kv = KVCacheConfig(
            num_blocks=NUM_GPU_BLOCKS,
            kv_cache_tensors=[KVCacheTensor(size=self.block_bytes * NUM_GPU_BLOCKS,
                                            layers=["layer"],
                                            layer_stride=self.block_bytes * NUM_GPU_BLOCKS,
                                            block_stride=self.block_bytes)],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
        self.config.cache_config.num_gpu_blocks = NUM_GPU_BLOCKS
        sbs, hbs = resolve_kv_cache_block_sizes(kv, self.config)
        hash_fn = get_hash_fn_by_name(self.config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)  # as EngineCore does
        self.hasher = get_request_block_hasher(hbs, hash_fn,
                                               self.config.num_hash_lookahead_tokens)
        self.scheduler = Scheduler(vllm_config=self.config, kv_cache_config=kv, log_stats=True,
                                   structured_output_manager=StructuredOutputManager(
                                       self.config),
                                   block_size=sbs, hash_block_size=hbs)
        self.cs = self.scheduler.connector.connector_scheduler
        self.manager = self.cs.manager
        self.tier = self.manager.secondary_tiers[0]
        self.view = self.manager.primary_tier.get_kv_memoryview().cast("B")
        self.gpu: Dict[int, bytes] = {}          # block id -> bytes (the "GPU")
        self.expect: Dict[int, bytes] = {}       # block id -> hash a load must match
        self.done_jobs: List[int] = []           # reported in the next output
        self.recved: set = set()                 # requests whose async loads are done
        self.loaded = self.stored = self.bad = 0

    @property
    def peer_id(self) -> str:
        return self.tier.peer_id

    # ---- the emulated worker
    def _chunk(self, c: int) -> memoryview:
        n = self.block_bytes
        return self.view[c * n:(c + 1) * n]

    def _loads(self, meta: Any) -> None:
        """CPU -> GPU, before the forward pass (as the worker)."""
        for job_id, job in (meta.load_jobs or {}).items():
            for c, b in zip(job.src_spec.block_ids, job.dst_spec.block_ids):
                data = bytes(self._chunk(int(c)))
                self.gpu[int(b)] = data
                self.loaded += 1
                want = self.expect.get(int(b))
                if want is None or data != block_content(want, self.block_bytes):
                    self.bad += 1
            self.done_jobs.append(job_id)
            if not job.sync:  # an async load: the request waits for this report
                self.recved.add(job.req_id)

    def _stores(self, meta: Any) -> None:
        """GPU -> CPU, after the forward pass (as the worker)."""
        for job_id, job in (meta.store_jobs or {}).items():
            for b, c in zip(job.src_spec.block_ids, job.dst_spec.block_ids):
                self._chunk(int(c))[:] = self.gpu[int(b)]
                self.stored += 1
            self.done_jobs.append(job_id)

    def step(self, req: Any) -> int:
        """One engine step: schedule, run the connector's jobs and the
        'model', report. Returns the prompt tokens of ``req`` computed now."""
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
            OffloadingWorkerMetadata)
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        so = self.scheduler.schedule()
        # Blocks of the request, by position: what a load must bring.
        rid = req.request_id if req is not None else None
        if rid is not None and rid in self.scheduler.requests:
            ids = self.scheduler.kv_cache_manager.get_block_ids(rid)[0]
            for i, b in enumerate(ids):
                if i < len(req.block_hashes):
                    self.expect[int(b)] = bytes(req.block_hashes[i])
        meta_in = so.kv_connector_metadata
        if meta_in is not None:
            self._loads(meta_in)
        computed = 0
        sampled: List[List[int]] = []
        req_ids = list(so.num_scheduled_tokens)
        for r_id in req_ids:
            r = self.scheduler.requests[r_id]
            n = so.num_scheduled_tokens[r_id]
            end = r.num_computed_tokens  # schedule() has advanced it already
            start = end - n
            ids = self.scheduler.kv_cache_manager.get_block_ids(r_id)[0]
            for i in range(start // BLOCK_TOKENS, min(end // BLOCK_TOKENS, len(ids))):
                if i < len(r.block_hashes):  # the "model" computes this block
                    self.gpu[int(ids[i])] = block_content(bytes(r.block_hashes[i]),
                                                          self.block_bytes)
            if r_id == rid:
                computed += max(0, min(end, r.num_prompt_tokens) - start)
            sampled.append([7] if end >= r.num_prompt_tokens else [])
        if meta_in is not None:
            self._stores(meta_in)
        meta = OffloadingWorkerMetadata()
        for j in self.done_jobs:
            meta.mark_completed(j)
        self.done_jobs = []
        recved, self.recved = self.recved, set()
        # vllm 0.33's ModelRunnerOutput also takes req_id_to_index (0.34 derives it)
        idx = ({"req_id_to_index": {r: i for i, r in enumerate(req_ids)}}
               if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}
               else {})
        out = ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled, **idx,
                                kv_connector_output=KVConnectorOutput(
                                    finished_recving=recved or None,
                                    kv_connector_worker_meta=meta))
        self.scheduler.update_from_output(so, out)
        return computed

    def run(self, prompt: List[int], req_id: str, params: Optional[Dict[str, Any]],
            timeout: float) -> Dict[str, Any]:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request
        sp = SamplingParams(max_tokens=1)
        sp.update_from_generation_config({}, 2)
        req = Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=sp,
                      pooling_params=None, block_hasher=self.hasher)
        req.kv_transfer_params = params
        l0, s0, b0 = self.loaded, self.stored, self.bad
        self.scheduler.add_request(req)
        computed = steps = 0
        deadline = time.monotonic() + timeout
        while req_id in self.scheduler.requests and time.monotonic() < deadline:
            computed += self.step(req)
            steps += 1
            time.sleep(0.002)
        finished = req_id not in self.scheduler.requests
        # Let the offloading finish (stores to CPU, cascade to kvpeer).
        while time.monotonic() < deadline and (self.scheduler.has_requests() or
                                               self._busy()):
            self.step(None)
            time.sleep(0.005)
        return {"prompt_len": len(prompt), "computed": computed, "finished": finished,
                "loaded_blocks": self.loaded - l0, "stored_blocks": self.stored - s0,
                "bad_blocks": self.bad - b0, "steps": steps}

    def _busy(self) -> bool:
        with self.manager.lock:
            return bool(self.manager._jobs) or self.tier.has_pending_work() or \
                bool(self.done_jobs)

    def close(self) -> None:
        self.view.release()
        self.scheduler.shutdown()


def main() -> None:
    eng = SchedEngine(sys.argv[1], json.loads(sys.argv[2]))
    print(json.dumps({"peer_id": eng.peer_id, "compat": eng.tier.compat}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "run":
            print(json.dumps(eng.run(cmd["prompt"], cmd["req_id"], cmd.get("params"),
                                     cmd.get("timeout", 30.0))), flush=True)
        elif cmd["op"] == "stats":  # this engine's kvpeer node counters
            print(json.dumps(eng.tier._tier.node.stats()), flush=True)
        elif cmd["op"] == "quit":
            break
    eng.close()
    print(json.dumps({"closed": True}), flush=True)


if __name__ == "__main__":
    main()
