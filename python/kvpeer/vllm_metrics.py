"""kvpeer.vllm_metrics: the kvpeer tier's metrics through vLLM's own tier
metric API (issue 28, build item 4): TieringOffloadingSpec gathers
``build_metric_definitions`` of every secondary tier into its Prometheus
registry; the manager aggregates each tier's ``get_stats()`` every step.

Every series carries vLLM's tier label (``tier``) with the value vLLM's
manager gives this tier ("<n>:<type>", n = its place in secondary_tiers), so
kvpeer's series line up with vLLM's own per-tier series (chunk hits, read
bytes, promotion latency...). vLLM's series count what the manager sees;
these count what only kvpeer knows: which answers came from a peer, what the
peers sent, partial loads, and the slots a dead or stalled peer still holds.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingHistogramMetadata,
    OffloadingMetricMetadata,
)
from vllm.v1.kv_offload.tiering.base import TIER_LABEL

P = "vllm:kv_offload_kvpeer_"
HITS = P + "lookup_hits"
MISSES = P + "lookup_misses"
LOADED_BYTES = P + "loaded_bytes"
STORED_BYTES = P + "stored_bytes"
LOAD_LATENCY = P + "load_latency_seconds"
LOAD_FAILURES = P + "load_failures"
PARTIAL_LOADS = P + "partial_loads"
FAILED_KEYS = P + "load_failed_keys"
STORE_FAILURES = P + "store_failures"
QUARANTINED = P + "quarantined_slots"
RETAINED = P + "retained_transfers"
PEERS_READY = P + "peers_ready"
SERVE_PINS_REFUSED = P + "serve_pins_refused"
SERVE_HOLDS_GIVEN_WAY = P + "serve_holds_given_way"
PREFILL_HOLDS_EXPIRED = P + "prefill_holds_expired"

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def definitions() -> Dict[str, OffloadingMetricMetadata]:
    lab = (TIER_LABEL,)
    c, g = OffloadingCounterMetadata, OffloadingGaugeMetadata
    return {
        HITS: c("Keys the kvpeer tier answered HIT (held here or by a peer).", lab),
        MISSES: c("Keys the kvpeer tier answered MISS (no peer holds them).", lab),
        LOADED_BYTES: c("Bytes the kvpeer tier loaded into vLLM's primary tier.", lab),
        STORED_BYTES: c("Bytes vLLM stored into the kvpeer tier (served to peers).", lab),
        LOAD_LATENCY: OffloadingHistogramMetadata(
            "Time from submit to outcome of a kvpeer load job, in seconds.", lab,
            buckets=_LATENCY_BUCKETS),
        LOAD_FAILURES: c("kvpeer load jobs that failed, in whole or in part.", lab),
        PARTIAL_LOADS: c("kvpeer load jobs that failed in part (successful_keys reported).",
                         lab),
        FAILED_KEYS: c("Keys of kvpeer load jobs that did not arrive.", lab),
        STORE_FAILURES: c("kvpeer store jobs that failed.", lab),
        QUARANTINED: g("kvpeer slots held until proof from a dead or stalled peer "
                       "(or the hold cap).", lab),
        RETAINED: g("kvpeer outgoing transfers retained until the peer's proof.", lab),
        PEERS_READY: g("kvpeer peers with a ready session.", lab),
        SERVE_PINS_REFUSED: c("Keys a peer asked for that the kvpeer tier did not pin in "
                              "vLLM: past that peer's budget or all peers' (zero copy).", lab),
        SERVE_HOLDS_GIVEN_WAY: c("kvpeer serves unpublished before their hold ended, to make "
                                 "room in a peer's pin budget (zero copy).", lab),
        PREFILL_HOLDS_EXPIRED: c("kvpeer prefill store jobs (P/D) released with chunks their "
                                 "decoder had not fetched within prefill_hold_s (zero copy).",
                                 lab),
    }


def tier_label(offloading_spec: Any, tier_type: str, config: Dict[str, Any]) -> str:
    """The value vLLM's manager gives this tier's ``tier`` label: "<n>:<type>"
    with n its 1-based place in secondary_tiers (the first entry of that type
    whose keys match ``config``); "<type>" if the spec does not tell."""
    tiers: Sequence[Any] = getattr(offloading_spec, "secondary_tier_configs", None) or ()
    if not isinstance(tiers, (list, tuple)):
        return tier_type
    match = None
    for i, t in enumerate(tiers):
        if not isinstance(t, dict) or t.get("type") != tier_type:
            continue
        if all(t.get(k) == v for k, v in config.items()):
            return f"{i + 1}:{tier_type}"
        match = i if match is None else match
    return f"{match + 1}:{tier_type}" if match is not None else tier_type


class TierMetrics:
    """Observations of one kvpeer tier between two get_stats() calls."""

    def __init__(self, label: str) -> None:
        self.label = (label,)
        self._stats = OffloadingConnectorStats()

    def on_lookup(self, hit: bool) -> None:
        self._stats.increase_counter(HITS if hit else MISSES, 1, self.label)

    def count(self, name: str, n: int = 1) -> None:
        """A counter of the tier's own (SERVE_PINS_REFUSED, ...) rose by n."""
        if n:
            self._stats.increase_counter(name, n, self.label)

    def on_job(self, f: Any, seconds: float, chunk_bytes: int) -> None:
        """One finished kvpeer job (kvpeer.tier.FinishedJob)."""
        n_ok = len(f.ok_keys) if f.kind == "load" else f.n_ok
        if f.kind == "store":
            if n_ok:
                self._stats.increase_counter(STORED_BYTES, n_ok * chunk_bytes, self.label)
            if not f.ok:
                self._stats.increase_counter(STORE_FAILURES, 1, self.label)
            return
        if n_ok:
            self._stats.increase_counter(LOADED_BYTES, n_ok * chunk_bytes, self.label)
        self._stats.observe_histogram(LOAD_LATENCY, seconds, self.label)
        if not f.ok:
            self._stats.increase_counter(LOAD_FAILURES, 1, self.label)
            self._stats.increase_counter(FAILED_KEYS, len(f.block_status) - n_ok, self.label)
            if n_ok:
                self._stats.increase_counter(PARTIAL_LOADS, 1, self.label)

    def take(self, node_stats: Optional[Dict[str, int]]) -> OffloadingConnectorStats:
        """The observations since the last call, with the gauges of now."""
        out, self._stats = self._stats, OffloadingConnectorStats()
        if node_stats is not None:
            out.set_gauge(QUARANTINED, node_stats.get("quarantined_slots", 0), self.label)
            out.set_gauge(RETAINED, node_stats.get("retained_transfers", 0), self.label)
            out.set_gauge(PEERS_READY, node_stats.get("sessions_ready", 0), self.label)
        return out
