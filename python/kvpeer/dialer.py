"""kvpeer.dialer: which of a request's candidate peers can be asked now, and
dialling the ones the node does not know (issue 28 item 4).

A request may name peers the tier was not configured with (vLLM's
``kv_transfer_params``: ``kvpeer_peers``, ``kvpeer_supplier``), and the node
closes a session that stayed idle for ``idle_session_ms`` and stops
redialling it. Either way the peer is unknown to the node when a lookup
wants it: it is dialled on demand and its lookup is sent once its session
is ready (the caller answers RETRY meanwhile), or answered MISS when the dial
fails or takes longer than ``wait_s``. Peers dialled for requests only (not
in the static list) are bounded by ``max_hinted``: past it a new name is
answered MISS at once and logged; the node's idle reaping frees the places.
"""
from __future__ import annotations

import logging
import time
from typing import Dict, Iterable, List, Set, Tuple

from . import _lib as L
from .node import Error, Node

log = logging.getLogger("kvpeer.dialer")

DEFAULT_MAX_HINTED = 64
_COMING = ("dialing", "wanted")


class Dialer:
    """Ownership: borrows ``node`` (the tier's); holds only peer names."""

    def __init__(self, node: Node, static: Iterable[str], max_hinted: int = DEFAULT_MAX_HINTED,
                 wait_s: float = 2.0) -> None:
        if isinstance(max_hinted, bool) or not isinstance(max_hinted, int) or max_hinted < 0:
            raise ValueError(f"max_hinted_peers must be an int >= 0, got {max_hinted!r}")
        self.node = node
        self.static: Set[str] = set(static)
        self.max_hinted = max_hinted
        self.wait_s = wait_s
        self.hinted: Set[str] = set()     # dialled for requests, not static
        self.refused = 0                  # names answered MISS for the cap
        self._states_at = -1.0
        self._states: Dict[str, Tuple[str, int, bool]] = {}

    def states(self, fresh: bool = False) -> Dict[str, Tuple[str, int, bool]]:
        """peer -> (state, failures, wanted), at most 10 ms old."""
        now = time.monotonic()
        if fresh or now - self._states_at > 0.01:
            self._states = {s.peer: (s.state, s.failures, s.wanted)
                            for s in self.node.peer_states()}
            self._states_at = now
        return self._states

    def reach(self, cands: List[str], ready: Set[str]) -> Tuple[List[str], List[str]]:
        """(asked now, asked once dialled) among ``cands``; the rest are down."""
        now_ready = [p for p in cands if p in ready]
        rest = [p for p in cands if p not in ready]
        if not rest:
            return now_ready, []
        states = self.states()
        coming: List[str] = []
        for p in rest:
            st = states.get(p)
            if st is None or not st[2]:  # unknown, or reaped idle: dial it
                if self._dial(p):
                    coming.append(p)
            elif st[0] == "ready" or (st[0] in _COMING and st[1] == 0):
                coming.append(p)  # up since ``ready`` was taken, or first attempt under way
        return now_ready, coming

    def settled(self, peer: str) -> bool:
        """A dial of ``peer`` is over without a session (failed, gone)."""
        st = self.states().get(peer)
        return st is None or st[1] > 0 or st[0] not in _COMING + ("ready", "probation")

    def _dial(self, peer: str) -> bool:
        if peer not in self.static:
            known = self.states()
            self.hinted = {p for p in self.hinted if p in known and known[p][2]}
            if peer not in self.hinted and len(self.hinted) >= self.max_hinted:
                self.refused += 1
                if self.refused & (self.refused - 1) == 0:  # 1, 2, 4, ...: bounded log
                    log.warning("peer %r named by a request: not dialled, %d peers dialled "
                                "for requests already (max_hinted_peers); %d refused so far",
                                peer, len(self.hinted), self.refused)
                return False
        try:
            self.node.add_peer(peer)
        except Error as e:
            if e.status != L.KVP_ERR_INVALID:
                raise
            log.error("peer %r named by a request is not a 'host:port' address: %s", peer, e)
            return False
        if peer not in self.static:
            self.hinted.add(peer)
        self._states_at = -1.0
        return True
