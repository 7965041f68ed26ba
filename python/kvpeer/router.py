"""A router's view of a kvpeer cluster, built from the nodes' KV events.

Every node started with ``kv_events_endpoint`` publishes what its store holds
in vLLM's KV-event format (see docs/DESIGN.md "KV events"): a ZMQ PUB socket
sending ``[topic, seq (u64 big-endian), msgpack KVEventBatch]`` with topic
``kv@<peer id>@<model>`` and batch ``[ts, [event...], dp_rank, incarnation]``;
events ``["BlockStored", [key], ...]``, ``["BlockRemoved", [key], ...]``,
``["AllBlocksCleared"]``. A replay ROUTER answers ``[b"", start seq]`` with the
buffered batches ``[b"", seq, payload]`` and ``[b"", -1, b""]`` at the end.

:class:`ClusterMap` subscribes to several nodes, keeps one block set per node
and handles sequence numbers: per node and incarnation the batches are applied
in order exactly once; a gap (seq ahead of the next expected) or a stream seen
first in the middle (a late subscriber, or a restarted node whose first
batches went out before the subscription reached it) is filled from the
replay socket. A new incarnation replaces the node's old set (its stream
starts with AllBlocksCleared). The map is a hint: the owner re-checks and pins
at fetch time (``Node.lookup_prefix``, or ``Node.fetch(..., hint=True)`` which
misses at once if the hint is stale).

Needs pyzmq and msgpack (Debian python3-zmq, python3-msgpack), or instead of
msgpack msgspec (vLLM's venv has it, not msgpack).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import zmq

try:
    import msgpack

    def _unpack(b: bytes) -> Any:
        return msgpack.unpackb(b, raw=False)
except ImportError:  # vLLM's venv: msgspec decodes the same msgpack
    import msgspec.msgpack

    def _unpack(b: bytes) -> Any:
        return msgspec.msgpack.decode(b)

END_SEQ = (1 << 64) - 1  # -1 as the 8 bytes big-endian of vLLM's END_SEQ


@dataclass
class NodeState:
    """What the map knows of one node (by the peer id in its topic)."""

    node: str
    incarnation: int = 0
    next_seq: int = 0  # the next batch expected of this incarnation
    blocks: Set[bytes] = field(default_factory=set)
    replay_endpoint: Optional[str] = None


@dataclass
class Applied:
    """One event as applied, for tests and logs."""

    node: str
    incarnation: int
    seq: int
    kind: str  # "stored" | "removed" | "cleared"
    key: bytes = b""


class ClusterMap:
    """Subscribe to nodes' KV events; answer "which node holds the longest
    prefix of these keys". Not thread-safe: one thread calls poll()."""

    def __init__(self, sink: Optional[Callable[["Applied"], None]] = None,
                 keep_applied: bool = True, replay_timeout: float = 5.0) -> None:
        # sink: called with each event as applied (kvpeer.vllm_events);
        # keep_applied=False: not kept in ``applied`` (a long-lived map).
        self._sink = sink
        self._keep = keep_applied
        self.replay_timeout = replay_timeout
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self._sub.setsockopt(zmq.LINGER, 0)
        self._replay: Dict[str, zmq.Socket] = {}  # replay endpoint -> DEALER
        self._replay_of: Dict[str, str] = {}  # pub endpoint -> replay endpoint
        self._replay_node: Dict[str, str] = {}  # node -> replay endpoint
        self.nodes: Dict[str, NodeState] = {}
        self.applied: List[Applied] = []
        self.gaps = 0  # gaps seen (filled from replay when it still had them)
        self.replays = 0
        self.lost = 0  # batches neither received nor replayable (the map may be stale)
        self.stale_dropped = 0  # batches of an older incarnation, or duplicates

    def close(self) -> None:
        for s in self._replay.values():
            s.close(0)
        self._sub.close(0)
        self._ctx.term()

    def __enter__(self) -> "ClusterMap":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------- wiring
    def subscribe(self, endpoint: str, replay_endpoint: Optional[str] = None,
                  node: Optional[str] = None) -> None:
        """Connect to one node's PUB socket (and its replay socket). ``node``
        (its peer id, as in the topic) ties the replay socket to it; without
        it a gap is asked of every replay socket."""
        self._sub.connect(endpoint)
        if replay_endpoint:
            self._replay_of[endpoint] = replay_endpoint
            if node is not None:
                self._replay_node[node] = replay_endpoint
            if replay_endpoint not in self._replay:
                d = self._ctx.socket(zmq.DEALER)
                d.setsockopt(zmq.LINGER, 0)
                d.connect(replay_endpoint)
                self._replay[replay_endpoint] = d

    # ---------------------------------------------------------- receive
    def poll(self, timeout: float = 0.0) -> int:
        """Apply every batch that arrives within ``timeout`` seconds (at
        least what is already queued). Returns the number of batches applied."""
        n = 0
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            if not self._sub.poll(int(left * 1000)):
                return n
            topic, seqb, payload = self._sub.recv_multipart()
            n += self._on_batch(topic.decode(errors="replace"),
                                int.from_bytes(seqb, "big"), payload, live=True)

    def _node_of(self, topic: str) -> str:
        parts = topic.split("@")
        return parts[1] if len(parts) > 1 else topic

    def _on_batch(self, topic: str, seq: int, payload: bytes, live: bool) -> int:
        node = self._node_of(topic)
        batch = _unpack(payload)
        inc = int(batch[3]) if len(batch) > 3 else 0
        st = self.nodes.get(node)
        if st is None or inc != st.incarnation:
            # A new incarnation: its stream starts with AllBlocksCleared (seq 0),
            # which replaces what the node held in its previous life.
            st = self.nodes[node] = NodeState(node, inc, 0,
                                              st.blocks if st else set(),
                                              st.replay_endpoint if st else None)
            if seq > 0 and live:  # joined this incarnation late: fetch its start
                self.gaps += 1
                return self._replay_from(topic, st, 0) + self._on_batch(topic, seq, payload,
                                                                        live=False)
        if seq < st.next_seq:
            self.stale_dropped += 1
            return 0
        if seq > st.next_seq and live:
            self.gaps += 1
            applied = self._replay_from(topic, st, st.next_seq)
            return applied + self._on_batch(topic, seq, payload, live=False)
        if seq > st.next_seq:  # replay could not fill the gap: count it, move on
            self.lost += seq - st.next_seq
        self._apply(st, seq, batch[1])
        st.next_seq = seq + 1
        return 1

    def _record(self, a: Applied) -> None:
        if self._keep:
            self.applied.append(a)
        if self._sink is not None:
            self._sink(a)

    def _apply(self, st: NodeState, seq: int, events: Sequence) -> None:
        for ev in events:
            tag = ev[0]
            if tag == "BlockStored":
                for k in ev[1]:
                    st.blocks.add(bytes(k))
                    self._record(Applied(st.node, st.incarnation, seq, "stored", bytes(k)))
            elif tag == "BlockRemoved":
                for k in ev[1]:
                    st.blocks.discard(bytes(k))
                    self._record(Applied(st.node, st.incarnation, seq, "removed", bytes(k)))
            elif tag == "AllBlocksCleared":
                st.blocks.clear()
                self._record(Applied(st.node, st.incarnation, seq, "cleared"))

    def _replay_socket(self, node: str) -> List[zmq.Socket]:
        ep = self._replay_node.get(node)
        return [self._replay[ep]] if ep else list(self._replay.values())

    def _replay_from(self, topic: str, st: NodeState, start: int) -> int:
        """Ask the replay sockets for batches >= start of this node's current
        incarnation and apply them in order (waiting up to replay_timeout per
        socket). Returns the number applied."""
        timeout = self.replay_timeout
        applied = 0
        for sock in self._replay_socket(st.node):
            try:
                sock.send_multipart([b"", start.to_bytes(8, "big")], zmq.NOBLOCK)
            except zmq.Again:
                continue  # not connected (yet): nothing to ask
            got_any = False
            while sock.poll(int(timeout * 1000)):
                _, seqb, payload = sock.recv_multipart()
                seq = int.from_bytes(seqb, "big")
                if seq == END_SEQ:
                    break
                batch = _unpack(payload)
                inc = int(batch[3]) if len(batch) > 3 else 0
                if inc != st.incarnation or seq < st.next_seq:
                    continue  # another node's replay socket, or already applied
                if seq > st.next_seq:
                    self.lost += seq - st.next_seq
                self._apply(st, seq, batch[1])
                st.next_seq = seq + 1
                applied += 1
                got_any = True
            if got_any:
                break
        self.replays += 1
        return applied

    # ------------------------------------------------------------ route
    def prefix_len(self, node: str, keys: Sequence[bytes]) -> int:
        blocks = self.nodes[node].blocks if node in self.nodes else set()
        n = 0
        for k in keys:
            if k not in blocks:
                break
            n += 1
        return n

    def route(self, keys: Sequence[bytes]) -> Tuple[Optional[str], int]:
        """The node whose map holds the longest prefix of ``keys`` (ties: the
        first by name), and that length; (None, 0) if no node holds keys[0]."""
        best: Tuple[Optional[str], int] = (None, 0)
        for node in sorted(self.nodes):
            n = self.prefix_len(node, keys)
            if n > best[1]:
                best = (node, n)
        return best

