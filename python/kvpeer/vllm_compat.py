"""kvpeer.vllm_compat: the one place where the vLLM releases kvpeer's tier
supports differ (issue 28 item 5). Tested: vllm 0.34.0 (the project venv, CI)
and vllm 0.33.0 (``make test-vllm033``).

What differs between 0.33.0 and 0.34.0, as far as the tier is concerned (the
two wheels' vllm/v1/kv_offload compared):

* ``OffloadingEvent.req_context`` (the originating request of a stored event)
  is new in 0.34: :func:`offloading_event` leaves out fields a release's
  OffloadingEvent does not have.
* ``SecondaryTierManager.touch()`` exists in 0.33 only (a no-op by default,
  which kvpeer keeps: its node's own eviction order stands); 0.34 passes
  recency through ``on_request_finished``. Nothing to do.
* ``JobResult.deferred_release`` is new in 0.34. Zero copy (loads straight
  into vLLM's promotion chunks, the default) needs it: a failed load whose
  source may still WRITE keeps its chunks out of vLLM's free pool until the
  tier sets it. Without it (0.33) the tier runs staging, whose failed loads
  only ever wrote kvpeer's own slots (:func:`zero_copy_supported`).

Everything else the tier uses (ReqContext state, ScheduleEndContext, Locality,
CacheHitSource.P2P, TIER_LABEL, JobResult.successful_keys, FileMapper's
fingerprint, the hash seed) is the same in both.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Tuple

TESTED = ("0.33.0", "0.34.0")


def vllm_version() -> str:
    import vllm
    return str(getattr(vllm, "__version__", "unknown"))


def version_tuple(v: str) -> Tuple[int, ...]:
    out = []
    for part in v.split("+")[0].split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def zero_copy_supported(job_result_cls: Any) -> bool:
    """Whether this release's JobResult has ``deferred_release`` (0.34+)."""
    return "deferred_release" in {f.name for f in dataclasses.fields(job_result_cls)}


def offloading_event(cls: Any, **fields: Any) -> Any:
    """``cls(**fields)`` without the fields this release's OffloadingEvent
    lacks (0.33: req_context)."""
    have = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in have})
