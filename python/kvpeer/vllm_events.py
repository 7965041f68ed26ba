"""kvpeer.vllm_events: the kvpeer store's KV events through vLLM's tier-owned
event path (``SecondaryTierManager.take_events``), issue 28 item 4.

The node publishes every block its store commits (a local put, a block fetched
from a peer) and every block it drops (eviction, a suspect block) on its ZMQ
publisher (docs/DESIGN.md "KV events"). When vLLM's KV events are on
(``kv_events_config.enable_kv_cache_events``), the tier subscribes to its own
node's publisher in-process (kvpeer.router.ClusterMap: sequence numbers, gaps
filled from the replay socket) and hands each event to vLLM as an
``OffloadingEvent`` (medium CPU, locality LOCAL: the blocks are in this
engine's host memory; ownership the tier's type; ``removal_expected``: every
stored block is announced removed when it leaves). vLLM's connector turns them
into ``BlockStored`` / ``BlockRemoved`` on vLLM's own publisher.

The operator's own ZMQ endpoints (``node_options: {"kv_events_endpoint": ...}``,
for routers that subscribe to kvpeer directly) are kept and subscribed to as
well; without them the node publishes on ipc:// sockets in a private (0700)
directory made for it. With vLLM's KV events off nothing is subscribed (vLLM
does not drain take_events then).
"""
from __future__ import annotations

import logging
import shutil
import tempfile
from typing import Any, Dict, List, Optional, Set

from vllm.v1.kv_offload.base import Locality, Medium, OffloadingEvent, OffloadKey

from . import vllm_compat as compat

log = logging.getLogger("kvpeer.vllm")

# A replay the node has not answered in this long is counted lost (the
# scheduler thread waits for it): the node answers in its next poll round.
_REPLAY_TIMEOUT_S = 0.2


def wanted(offloading_spec: Any, kv_events: Any) -> bool:
    """The tier emits events iff vLLM's KV events are on and the tier's
    ``kv_events`` key (default true) does not turn them off."""
    if not isinstance(kv_events, bool):
        raise ValueError(f"kvpeer: kv_events must be true or false, got {kv_events!r}")
    cfg = getattr(offloading_spec, "kv_events_config", None)
    return kv_events and bool(getattr(cfg, "enable_kv_cache_events", False))


class TierEvents:
    """The tier's subscription to its node's KV events. Ownership: owns the
    ClusterMap (its ZMQ context) and the ipc directory; borrows nothing."""

    def __init__(self, tier_type: str, opts: Dict[str, Any]) -> None:
        """Before the node is made: give it endpoints in ``opts`` if the
        operator gave none."""
        self.tier_type = tier_type
        self._dir: Optional[str] = None
        if not opts.get("kv_events_endpoint"):
            self._dir = tempfile.mkdtemp(prefix="kvpeer-ev-")  # 0700
            opts["kv_events_endpoint"] = f"ipc://{self._dir}/pub"
            opts["kv_events_replay_endpoint"] = f"ipc://{self._dir}/replay"
        self._held: Set[bytes] = set()
        self._out: List[OffloadingEvent] = []
        self._cm: Any = None

    def start(self, node: Any) -> None:
        """Subscribe to ``node``'s publisher (and its replay socket)."""
        from .router import ClusterMap
        pub, rep = node.kv_events_endpoints()
        self._cm = ClusterMap(sink=self._on, keep_applied=False,
                              replay_timeout=_REPLAY_TIMEOUT_S)
        self._cm.subscribe(pub, rep, node=node.peer_id)

    def _on(self, a: Any) -> None:
        if a.kind == "cleared":  # a new incarnation: whatever was held is gone
            keys, self._held = list(self._held), set()
            removed = True
        elif a.kind == "stored":
            if a.key in self._held:
                return
            self._held.add(a.key)
            keys, removed = [a.key], False
        else:
            if a.key not in self._held:
                return
            self._held.discard(a.key)
            keys, removed = [a.key], True
        if not keys:
            return
        last = self._out[-1] if self._out else None
        if last is not None and last.removed == removed:
            last.keys.extend(OffloadKey(k) for k in keys)  # one event per run of a kind
            return
        self._out.append(compat.offloading_event(
            OffloadingEvent, keys=[OffloadKey(k) for k in keys], medium=Medium.CPU,
            removed=removed, locality=Locality.LOCAL, ownership=self.tier_type,
            removal_expected=True))

    def take(self) -> List[OffloadingEvent]:
        """The events since the last call (non-blocking, but for a replay
        the node has not answered yet: at most _REPLAY_TIMEOUT_S)."""
        if self._cm is None:
            return []
        try:
            self._cm.poll(0)
        except Exception as e:  # a broken subscription must not stop the scheduler
            log.warning("kvpeer tier: KV events not read: %r", e)
        out, self._out = self._out, []
        return out

    @property
    def lost(self) -> int:
        return self._cm.lost if self._cm is not None else 0

    def close(self) -> None:
        if self._cm is not None:
            self._cm.close()
            self._cm = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
