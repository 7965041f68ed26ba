"""kvpeer.tier: kvpeer as an inference engine's secondary KV tier.

The engine's scheduler thread drives the tier; the node's own progress thread
serves peers meanwhile, so the tier needs no thread of its own.

    tier = KVPeerTier(peers=["10.0.0.2:7000"], num_blocks=4096, block_size=1 << 20)
    r = tier.lookup(key, req)            # HIT / MISS / HIT_PENDING / RETRY
    tier.submit_load(LoadJob("j1", req, [key], dst=[gpu_staging_buffer]))
    tier.submit_store(StoreJob("j2", req, [key2], [block_bytes]))
    for done in tier.get_finished_jobs(): ...   # exactly one per job
    tier.on_request_finished(req)
    tier.shutdown()

Semantics (SPEC §5, §7):
* lookup() never blocks. The first call for a (request, key) sends a LOOKUP
  to the candidate peers and answers RETRY; later calls answer HIT once a
  peer answered HIT, MISS once every peer answered MISS. A peer with no ready
  session (down, dialling, on probation) counts as MISS at once (routing
  failure at once: the engine recomputes rather than waits).
* HIT_PENDING: the block is not loadable yet but is on its way: a load into
  this node is in flight for it, or the request names a ``supplier`` peer
  (fetch before supply, §5.3: the prefill node will put it).
* submit_load() fetches the keys from the peers that answered HIT (or, with a
  supplier, with WAIT_FOR_SUPPLY) into the local store and, on success,
  copies each block into ``job.dst[i]`` if given. Every job gets exactly one
  outcome in get_finished_jobs(): a key with no source, or a fetch the node
  refuses, fails the job at once (and cancels the parts already sent).
* ``partial_loads=True``: a load whose keys fail in part (no source, a
  source that died or refused) waits for its other parts and copies the keys
  that did arrive; its outcome names them (``FinishedJob.ok_keys``, vLLM's
  ``JobResult.successful_keys``). A key counts as arrived only if its block
  is READY (verified) in the local store when the copy pins it.
* When a source dies, its loads fail (once) and its HIT answers are
  forgotten, so lookups answer MISS. Slots a dead source might still write
  are quarantined and released by the node on proof or at the hold cap; the
  tier never touches them.
"""
from __future__ import annotations

import collections
import ctypes
import enum
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Hashable, List, Optional, Sequence, Set, Tuple, Union

from . import _lib as L
from ._trace import t as _T
from .dialer import DEFAULT_MAX_HINTED, Dialer
from .dns_peers import DnsPeers
from .node import Buffer, Error, Event, EventType, Node

# How long lookup_many(defer=True) trusts its list of ready peers (one
# kvp_node_peers call per step, not per key).
_READY_TTL_S = 0.01


class LookupResult(enum.Enum):
    HIT = "hit"                  # loadable now (local, or a peer pinned it for the request)
    MISS = "miss"                # nowhere: recompute
    HIT_PENDING = "hit_pending"  # on its way (load in flight, or a supplier will put it)
    RETRY = "retry"              # asked a peer; ask again on the next step


HIT = LookupResult.HIT
MISS = LookupResult.MISS
HIT_PENDING = LookupResult.HIT_PENDING
RETRY = LookupResult.RETRY


@dataclass
class Request:
    """The engine's request as the tier needs it. ``peers`` narrows the peers
    asked (default: the tier's peers); ``supplier`` is the peer that will
    produce the blocks (fetch before supply, e.g. the prefill node);
    ``decoder``: a peer will fetch this request's blocks (the prefill half of
    a P/D pair), so an embedding that serves from its own memory offers them
    as soon as they are stored."""

    request_id: int
    peers: Optional[Sequence[str]] = None
    supplier: Optional[str] = None
    decoder: bool = False


RequestLike = Union[Request, int]


@dataclass
class LoadJob:
    """Load ``keys`` for ``request``; ``dst`` (optional) gives one writable
    buffer per key that receives the block's bytes on success."""

    job_id: Hashable
    request: RequestLike
    keys: Sequence[bytes]
    dst: Optional[Sequence[Any]] = None
    # issue 29, zero_copy tiers: the node's region slots (the engine's own
    # chunks) the blocks land in, one per key; instead of dst.
    slots: Optional[Sequence[int]] = None


@dataclass
class StoreJob:
    """Store ``data[i]`` as the block of ``keys[i]`` (made available to peers)."""

    job_id: Hashable
    request: RequestLike
    keys: Sequence[bytes]
    data: Sequence[Buffer]


@dataclass
class FinishedJob:
    """The one outcome of a job. ``status`` is the first failure (kvp_status_t)
    or KVP_OK; ``block_status`` per key when known."""

    job_id: Hashable
    kind: str  # "load" | "store"
    ok: bool
    status: int
    n_ok: int = 0
    block_status: List[int] = field(default_factory=list)
    detail: str = ""
    # Loads: the keys whose bytes are in dst (all of them when ok; with
    # partial_loads, the ones that arrived when others failed).
    ok_keys: List[bytes] = field(default_factory=list)
    # issue 29, zero_copy loads: set once the slots of the failed keys that
    # were still held at the outcome (a WRITE might land) are released
    # (proof or the hold cap); None when every slot was free at the outcome.
    deferred_release: Optional[threading.Event] = None


@dataclass
class _Round:
    """The latest LOOKUP op of one (request, peer). kvp_fetch without
    WAIT_FOR_SUPPLY fetches against the request's latest lookup round, once;
    HIT keys of older ops are fetched with WAIT_FOR_SUPPLY (the source then
    serves them from its store at once)."""

    op: int
    keys: Set[bytes]
    done: bool = False
    fetched: bool = False


@dataclass
class _Copy:
    """A load's copy into its dst buffers, running on the copy thread. The
    blocks stay pinned and the dst exports held until it is done."""

    future: "Future[None]"
    blocks: List[Any]
    exports: List[Any]  # ctypes arrays over the dst buffers
    views: List[memoryview]
    fail: Optional[Tuple[int, str]] = None  # _fail_load while copying: published after
    keys: List[bytes] = field(default_factory=list)  # the keys copied


@dataclass
class _Load:
    job: LoadJob
    rid: int
    ops: Set[int] = field(default_factory=set)  # fetch ops still running
    n_ok: int = 0
    status: Dict[bytes, int] = field(default_factory=dict)
    copy: Optional[_Copy] = None
    fail: Optional[Tuple[int, str]] = None  # partial_loads: the first part that failed
    held: Set[int] = field(default_factory=set)  # zero_copy: fetch ops with slots still held
    deferred: Optional[threading.Event] = None


def _check_writable(buf: Any) -> None:
    """dst buffers are checked at submit time, so that the copy at the end of
    a load cannot fail for a reason the engine could have seen up front."""
    try:
        m = memoryview(buf)
    except TypeError:
        raise TypeError(f"dst buffer must support the buffer protocol, got {type(buf).__name__}")
    try:
        if m.readonly or not m.c_contiguous:
            raise ValueError("dst buffers must be writable and C-contiguous")
    finally:
        m.release()


def _rid(request: RequestLike) -> int:
    if isinstance(request, Request):
        return request.request_id
    if isinstance(request, int) and not isinstance(request, bool):
        return request
    raise TypeError(f"request must be a kvpeer.tier.Request or an int, got {type(request).__name__}")


class KVPeerTier:
    """A secondary KV tier backed by one kvpeer Node. Pass ``node`` to share an
    existing Node (the tier then does not close it), or keyword arguments to
    create one (kvp_config_t options); ``owns_node=True`` hands a given node
    to the tier (closed by shutdown()). ``peers`` are dialled at once.
    ``dns`` (kvpeer.dns_peers.DnsPeers, owned by the tier from here on): its
    latest answer is asked beside ``peers``, each address dialled on demand."""

    def __init__(self, node: Optional[Node] = None, peers: Sequence[str] = (),
                 copy_thread: bool = False, owns_node: bool = False,
                 max_hinted_peers: int = DEFAULT_MAX_HINTED, dial_wait_s: float = 2.0,
                 partial_loads: bool = False, dns: Optional[DnsPeers] = None,
                 zero_copy: bool = False,
                 **node_config: Any) -> None:
        if node is not None and node_config:
            raise TypeError("give either node= or node config options, not both")
        self._owns = node is None or owns_node
        self.node: Node = node if node is not None else Node(**node_config)
        self.peers: List[str] = list(peers)
        for p in self.peers:
            self.node.add_peer(p)
        # Peers a request names that the node does not know are dialled on
        # demand (bounded); their lookups wait in _pending until ready.
        self._dialer = Dialer(self.node, self.peers, max_hinted_peers, dial_wait_s)
        self._pending: Dict[Tuple[int, str], Tuple[List[bytes], float]] = {}
        # (rid, key) -> {peer: True (HIT) | False (MISS) | None (asked)}
        self._answers: Dict[Tuple[int, bytes], Dict[str, Optional[bool]]] = {}
        self._lookup_ops: Dict[int, Tuple[int, str]] = {}
        self._rounds: Dict[Tuple[int, str], _Round] = {}
        self._loads: Dict[Hashable, _Load] = {}
        self._load_ops: Dict[int, Hashable] = {}
        self._inflight_keys: Dict[bytes, int] = {}  # key -> loads in flight for it
        self._done: List[FinishedJob] = []
        # lookup_many(defer=True): rid -> (request, keys to ask), sent by
        # flush_lookups(); _queued_keys holds their (rid, key).
        self._queued: Dict[int, Tuple[RequestLike, List[bytes]]] = {}
        self._queued_keys: Set[Tuple[int, bytes]] = set()
        # Peers with a ready session, for this step's lookup_many(defer=True)
        # calls: cleared by flush_lookups() and at most _READY_TTL_S old, so
        # a caller that ends no step (every answer MISS) still sees a peer
        # come up.
        self._ready: Optional[Set[str]] = None
        self._ready_at = 0.0
        # copy_thread: a finished load's copy into dst runs on this thread
        # (kvp_blocks_copy: one C call per job, without the GIL), not on the
        # caller's.
        self._copier: Optional[ThreadPoolExecutor] = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvpeer-copy")
            if copy_thread else None)
        self._copying: List[_Load] = []
        self._partial = bool(partial_loads)
        self._dns = dns
        self._dns_peers: List[str] = []
        self._closed = False
        # issue 29, zero_copy: the node runs in external-slots mode over the
        # engine's memory; loads land in LoadJob.slots (fetch_into); WANTED
        # and SLOT_FREE events wait for the engine's serving side
        # (take_wanted / take_slot_free); held load slots -> deferred_release.
        self._zc = bool(zero_copy)
        self._wanted: List[Event] = []
        self._slot_free: List[int] = []
        self._held_ops: Dict[int, _Load] = {}  # fetch op -> its job, slots still held
        # The last zero-copy slot events, in order, for tests and debugging:
        # ("load", op, n_held, status), ("released", op, status),
        # ("deferred", job_id, held ops), ("deferred_set", job_id).
        self.slot_records: Deque[Tuple[Any, ...]] = collections.deque(maxlen=1024)

    # ---------------------------------------------------------- lookup
    def lookup(self, key: bytes, request: RequestLike) -> LookupResult:
        """Where ``key`` stands for ``request`` (never blocks; see module doc)."""
        return self.lookup_many([key], request)[0]

    def lookup_many(self, keys: Sequence[bytes], request: RequestLike,
                    defer: bool = False, pump: bool = True,
                    ask_peers: bool = True) -> List[LookupResult]:
        """lookup() for several keys, with one LOOKUP per peer for the new ones.

        ``defer=True`` (an engine that looks keys up one call at a time within
        a step): the new keys are queued instead, and flush_lookups() (at the
        end of the step) sends one LOOKUP per (request, peer) for every key
        queued since the last flush; a queued key answers RETRY. Peers without
        a ready session are answered MISS at once, as without defer.
        ``pump=False``: answer from the events taken so far (an engine that
        looks a request's keys up one call at a time takes events once per
        step, so that one LOOKUP's answer reaches all of them in one step).
        ``ask_peers=False`` (a request naming its supplier): no peer is asked; a
        key not here answers HIT_PENDING once the supplier's session is
        ready (its load is a fetch with wait-for-supply from it), RETRY while
        the supplier is dialled, MISS if it cannot be reached."""
        self._check_open()
        rid = _rid(request)
        if pump:
            self._pump()
        out: List[Optional[LookupResult]] = []
        ask: List[bytes] = []
        for k in keys:
            r = self._local_state(k)
            if r is None and ask_peers and (rid, k) not in self._answers \
                    and (rid, k) not in self._queued_keys:
                ask.append(k)
            out.append(r)
        if self._pending:
            self._poll_pending()
        if ask:
            if defer:
                self._queue(rid, request, ask)
            else:
                self._ask(rid, ask, *self._reach(request))
        sup = request.supplier if isinstance(request, Request) else None
        if not ask_peers:
            far = self._supply_state(sup) if None in out else MISS
            return [far if r is None else r for r in out]
        return [r if r is not None
                else RETRY if (rid, k) in self._queued_keys
                else self._remote_state(rid, k, sup)
                for k, r in zip(keys, out)]

    def _supply_state(self, supplier: Optional[str]) -> LookupResult:
        """A key not here, for a request that asks nobody: HIT_PENDING if its
        supplier can be fetched from now, RETRY while it is dialled (bounded
        by the node's handshake timeout), else MISS."""
        if supplier is None:
            return MISS
        ready, coming = self._dialer.reach([supplier], self._ready_peers())
        return HIT_PENDING if ready else RETRY if coming else MISS

    def _ready_peers(self) -> Set[str]:
        now = time.monotonic()
        if self._ready is None or now - self._ready_at > _READY_TTL_S:
            self._ready = {p.peer for p in self.node.peers() if p.ready and not p.probation}
            self._ready_at = now
        return self._ready

    def _reach(self, request: RequestLike) -> Tuple[List[str], List[str]]:
        """(peers to ask now, peers being dialled: asked once ready)."""
        return self._dialer.reach(self._candidates(request), self._ready_peers())

    def _queue(self, rid: int, request: RequestLike, keys: List[bytes]) -> None:
        cands = self._candidates(request)
        ready, coming = self._reach(request)
        if not ready and not coming:  # no peer to ask: answered at once (MISS)
            for k in keys:
                self._answers[(rid, k)] = {p: False for p in cands}
            return
        q = self._queued.setdefault(rid, (request, []))[1]
        for k in keys:
            if (rid, k) not in self._queued_keys:
                self._queued_keys.add((rid, k))
                q.append(k)

    def flush_lookups(self) -> int:
        """Send the lookups lookup_many(defer=True) queued: one LOOKUP per
        (request, peer). Returns the number of keys sent."""
        self._check_open()
        queued, self._queued = self._queued, {}
        self._queued_keys.clear()
        self._ready = None
        if self._pending:
            self._poll_pending()
        n = 0
        for rid, (request, keys) in queued.items():
            self._ask(rid, keys, *self._reach(request))
            n += len(keys)
        return n

    def _poll_pending(self) -> None:
        """Lookups waiting for a peer being dialled: sent once it is ready,
        MISS once the dial failed or took longer than dial_wait_s."""
        now = time.monotonic()
        ready = self._ready_peers()
        for (rid, p), (keys, deadline) in list(self._pending.items()):
            if p in ready:
                del self._pending[(rid, p)]
                self._send(rid, keys, p)
            elif now >= deadline or self._dialer.settled(p):
                del self._pending[(rid, p)]
                for k in keys:
                    ans = self._answers.get((rid, k))
                    if ans is not None and ans.get(p, False) is None:
                        ans[p] = False

    def queued_lookups(self) -> int:
        """Keys queued by lookup_many(defer=True) and not sent yet, and keys
        waiting for a peer being dialled."""
        return len(self._queued_keys) + sum(len(v[0]) for v in self._pending.values())

    def _local_state(self, key: bytes) -> Optional[LookupResult]:
        if self._zc:  # nothing is indexed here: the engine's own tier answers first
            return HIT_PENDING if self._inflight_keys.get(key) else None
        st, b = self.node.try_get(key)  # no exception per miss: asked per key, per step
        if b is not None:
            b.release()
            return HIT
        if st == L.KVP_ERR_PENDING or self._inflight_keys.get(key):
            return HIT_PENDING
        if st != L.KVP_ERR_NOT_FOUND:
            raise Error(st, "kvp_get")
        return None

    def _remote_state(self, rid: int, key: bytes, supplier: Optional[str]) -> LookupResult:
        ans = self._answers.get((rid, key), {})
        if any(v is True for v in ans.values()):
            return HIT
        if any(v is None for v in ans.values()):
            return RETRY
        return HIT_PENDING if supplier is not None else MISS

    def _candidates(self, request: RequestLike) -> List[str]:
        if isinstance(request, Request) and request.peers is not None:
            return list(request.peers)
        if self._dns is not None:
            self._sync_dns()
            return self.peers + self._dns_peers
        return list(self.peers)

    def _sync_dns(self) -> None:
        """The DNS answer's peers count as static (no hinted cap: the answer
        is capped itself); a vanished one is no longer asked, and forgotten
        now unless its session is up (then the node closes it once idle)."""
        me = self.node.peer_id
        static = set(self.peers)
        got = [p for p in self._dns.peers() if p != me and p not in static]
        if got != self._dns_peers:
            self._dns_peers = got
            self._dialer.static = static | set(got)
        gone = self._dns.take_vanished() - self._dialer.static
        if gone:
            states = self._dialer.states(fresh=True)
            for p in gone:
                st = states.get(p)
                try:
                    if st is not None and st[0] not in ("ready", "probation"):
                        self.node.remove_peer(p)
                    else:  # up: not kept past its idle close (kvp_peer_forget)
                        self.node.forget_peer(p)
                except Error:
                    pass  # already gone

    def _ask(self, rid: int, keys: List[bytes], peers: List[str],
             coming: Sequence[str] = ()) -> None:
        for k in keys:
            self._answers[(rid, k)] = {}
        for p in peers:
            self._send(rid, keys, p)
        deadline = time.monotonic() + self._dialer.wait_s
        for p in coming:
            old = self._pending.get((rid, p))
            self._pending[(rid, p)] = ((old[0] if old else []) + list(keys),
                                       old[1] if old else deadline)
            for k in keys:
                self._answers[(rid, k)][p] = None

    def _send(self, rid: int, keys: List[bytes], p: str) -> None:
        try:
            op = self.node.lookup(p, keys, rid)
        except Error as e:  # routing failure: MISS at once, the node redials
            if e.status == L.KVP_ERR_INVALID:
                raise
            for k in keys:
                ans = self._answers.get((rid, k))
                if ans is not None:
                    ans[p] = False
            return
        self._lookup_ops[op] = (rid, p)
        _T('lookup_sent', op, rid, len(keys))
        self._rounds[(rid, p)] = _Round(op, set(keys))
        for k in keys:
            ans = self._answers.get((rid, k))
            if ans is not None:
                ans[p] = None

    # ---------------------------------------------------------- jobs
    def submit_load(self, job: LoadJob) -> None:
        """Start a load job; its one outcome comes from get_finished_jobs()."""
        self._check_open()
        if job.job_id in self._loads:
            raise ValueError(f"load job {job.job_id!r} is already running")
        if self._zc and (job.slots is None or len(job.slots) != len(job.keys)):
            raise ValueError("zero_copy: a load needs one slot per key (LoadJob.slots)")
        if job.dst is not None:
            if len(job.dst) != len(job.keys):
                raise ValueError("dst must give one buffer per key")
            for d in job.dst:
                _check_writable(d)
        rid = _rid(job.request)
        ld = _Load(job, rid)
        self._loads[job.job_id] = ld
        sup = job.request.supplier if isinstance(job.request, Request) else None
        by_peer: Dict[Tuple[str, bool], List[bytes]] = {}
        slot_of = dict(zip(job.keys, job.slots)) if self._zc else {}
        for k in job.keys:
            if not self._zc and self.node.contains(k):
                ld.status[k] = L.KVP_OK
                ld.n_ok += 1
                continue
            ans = self._answers.get((rid, k), {})
            src = next((p for p, v in ans.items() if v is True), None)
            if src is not None:
                rnd = self._rounds.get((rid, src))
                latest = rnd is not None and rnd.done and not rnd.fetched and k in rnd.keys
                by_peer.setdefault((src, not latest), []).append(k)
            elif sup is not None:
                by_peer.setdefault((sup, True), []).append(k)
            elif self._partial:
                self._part_failed(ld, [k], L.KVP_ERR_NOT_FOUND, "no source")
            else:
                return self._fail_load(ld, L.KVP_ERR_NOT_FOUND, f"no source for key {k!r}")
        for (peer, wait), ks in by_peer.items():
            try:
                if self._zc:
                    op = self.node.fetch_into(peer, ks, [slot_of[k] for k in ks], rid,
                                              wait_for_supply=wait)
                else:
                    op = self.node.fetch(peer, ks, rid, wait_for_supply=wait)
            except Error as e:
                if self._partial:
                    self._part_failed(ld, ks, e.status, f"fetch from {peer}: {e}")
                    continue
                return self._fail_load(ld, e.status, f"fetch from {peer}: {e}")
            ld.ops.add(op)
            _T('fetch', op, wait, len(ks))
            self._load_ops[op] = job.job_id
            rnd = self._rounds.get((rid, peer))
            if not wait and rnd is not None:
                rnd.fetched = True
            for k in ks:
                self._inflight_keys[k] = self._inflight_keys.get(k, 0) + 1
        if not ld.ops:
            self._finish_load(ld)

    def submit_store(self, job: StoreJob) -> None:
        """Put the job's blocks into the local store (tied to the request, so
        parked WAIT_FOR_SUPPLY demand is served at once). A key already READY
        counts as stored. The outcome comes from get_finished_jobs()."""
        self._check_open()
        if len(job.data) != len(job.keys):
            raise ValueError("data must give one buffer per key")
        rid = _rid(job.request)
        status: List[int] = []
        for k, d in zip(job.keys, job.data):
            try:
                self.node.put(k, d, request_id=rid)
                status.append(L.KVP_OK)
            except Error as e:
                status.append(L.KVP_OK if e.status == L.KVP_ERR_EXISTS else e.status)
        first = next((s for s in status if s != L.KVP_OK), L.KVP_OK)
        self._done.append(FinishedJob(job.job_id, "store", first == L.KVP_OK, first,
                                      sum(s == L.KVP_OK for s in status), status))

    def get_finished_jobs(self) -> List[FinishedJob]:
        """Jobs finished since the last call, each exactly once."""
        if not self._closed:
            self._pump()
        out, self._done = self._done, []
        return out

    def pending_jobs(self) -> List[Hashable]:
        """Load jobs without an outcome yet."""
        return list(self._loads)

    def load_in_flight(self, key: bytes) -> bool:
        """A load job of this tier is fetching ``key`` now (its outcome is not
        in yet)."""
        return bool(self._inflight_keys.get(key))

    def cancel_load(self, job_id: Hashable, detail: str = "canceled") -> bool:
        """Fail the pending load job ``job_id`` with KVP_ERR_CANCELED now (its
        one outcome; the parts still running are cancelled, and a job whose
        copy into dst runs is failed when the copy is done). False if the job
        has no pending outcome (unknown, or finished)."""
        ld = self._loads.get(job_id)
        if ld is None:
            return False
        self._fail_load(ld, L.KVP_ERR_CANCELED, detail)
        return True

    def wait_jobs(self, timeout: float) -> List[FinishedJob]:
        """get_finished_jobs(), waiting up to ``timeout`` seconds while load
        jobs are pending and none has finished (a helper for tests/tools)."""
        deadline = time.monotonic() + timeout
        out = self.get_finished_jobs()
        while not out and self._loads and time.monotonic() < deadline:
            self._pump(min(0.05, max(0.0, deadline - time.monotonic())))
            out = self.get_finished_jobs()
        return out

    def on_request_finished(self, request: RequestLike) -> None:
        """The engine is done with ``request``: its pending loads fail (once),
        its lookups' pinned supply on peers and its parked demand here are
        released, and its lookup answers are forgotten."""
        self._check_open()
        rid = _rid(request)
        self.node.finish_request(rid)
        if self._queued.pop(rid, None) is not None:
            self._queued_keys = {q for q in self._queued_keys if q[0] != rid}
        for k in [k for k in self._answers if k[0] == rid]:
            del self._answers[k]
        for k in [k for k in self._rounds if k[0] == rid]:
            del self._rounds[k]
        for k in [k for k in self._pending if k[0] == rid]:
            del self._pending[k]

    def shutdown(self, timeout: float = 5.0) -> List[FinishedJob]:
        """Cancel pending loads, wait (bounded) for their outcomes, close the
        node if the tier created it. Returns the outcomes not yet taken; jobs
        still undecided at the bound are reported failed with KVP_ERR_CLOSED."""
        if self._closed:
            return []
        for op in list(self._load_ops):
            try:
                self.node.cancel(op)
            except Error:
                pass  # already decided: its event is on the way
        deadline = time.monotonic() + timeout
        while self._load_ops and time.monotonic() < deadline:
            self._pump(0.05)
        for ld in list(self._loads.values()):
            self._fail_load(ld, L.KVP_ERR_CLOSED, "tier shut down")
        self.wait_copies()
        out = self.get_finished_jobs()
        self._closed = True
        if self._dns is not None:
            self._dns.close()
        if self._copier is not None:
            self._copier.shutdown(wait=True)
        if self._owns:
            self.node.close()
        return out

    def wait_copies(self) -> None:
        """Wait for the running copies into dst buffers (bounded: memcpy) and
        publish their jobs; afterwards nothing writes a dst buffer."""
        for ld in list(self._copying):
            ld.copy.future.exception()  # waits
        self._reap_copies()

    def __enter__(self) -> "KVPeerTier":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ---------------------------------------------------------- events
    def _check_open(self) -> None:
        if self._closed:
            raise Error(L.KVP_ERR_CLOSED, "tier is shut down")

    def _pump(self, timeout: float = 0.0) -> None:
        if self._copying:
            self._reap_copies()
            if self._copying:
                timeout = min(timeout, 0.001)
        for ev in self.node.poll(timeout):
            self._on_event(ev)
        if self._copying:
            self._reap_copies()

    def _reap_copies(self) -> None:
        """Publish the loads whose copy is done; unpin their blocks."""
        still: List[_Load] = []
        for ld in self._copying:
            cp = ld.copy
            if not cp.future.done():
                still.append(ld)
                continue
            exc = cp.future.exception()
            cp.exports.clear()
            for v in cp.views:
                v.release()
            for b in cp.blocks:
                b.release()
            ld.copy = None
            if cp.fail is not None:
                self._publish(ld, *cp.fail)
            elif exc is not None:
                self._publish(ld, L.KVP_ERR_IO, f"copy into dst: {exc!r}")
            else:  # ld.fail: partial_loads, some keys did not arrive
                self._publish(ld, *(ld.fail or (L.KVP_OK, "")), ok_keys=cp.keys)
        self._copying = still

    def _on_event(self, ev: Event) -> None:
        if ev.type == EventType.LOOKUP:
            self._on_lookup(ev)
        elif ev.type == EventType.LOAD:
            self._on_load(ev)
        elif ev.type == EventType.PEER_DOWN:
            self._forget_peer(ev.peer)
        elif ev.type == EventType.SLOTS_RELEASED:
            self._on_released(ev)
        elif ev.type == EventType.WANTED:
            _T('wanted_ev', ev.op_id)
            self._wanted.append(ev)
        elif ev.type == EventType.SLOT_FREE:
            self._slot_free.append(ev.op_id)

    # ---------------------------------------------------------- zero_copy
    def take_wanted(self) -> List[Event]:
        """WANTED events (zero_copy serving) since the last call."""
        if not self._closed:
            self._pump()
        out, self._wanted = self._wanted, []
        return out

    def take_slot_free(self) -> List[int]:
        """Slots unpublished while pinned whose last pin dropped since the
        last call (SLOT_FREE): the engine's again."""
        out, self._slot_free = self._slot_free, []
        return out

    def deferred_pending(self) -> int:
        """Fetch ops whose held slots are not released yet."""
        return len(self._held_ops)

    def _on_released(self, ev: Event) -> None:
        ld = self._held_ops.pop(ev.op_id, None)
        if ld is None:
            return
        self.slot_records.append(("released", ev.op_id, ev.status))
        ld.held.discard(ev.op_id)
        if not ld.held and ld.deferred is not None:
            self.slot_records.append(("deferred_set", ld.job.job_id))
            ld.deferred.set()  # every slot of the job the engine's again

    def _on_lookup(self, ev: Event) -> None:
        _T('lookup_ev', ev.op_id, ev.status)
        rid, peer = self._lookup_ops.pop(ev.op_id, (None, None))
        if rid is None:
            return
        rnd = self._rounds.get((rid, peer))
        if rnd is not None and rnd.op == ev.op_id:
            rnd.done = True
        res = ev.results if ev.results is not None else [False] * len(ev.keys)
        # A LOOKUP a source answered at one of its budgets (KVP_ERR_LIMIT,
        # issue 27: supply pins, rounds, the key rate) still holds the hits
        # it granted, pinned for the request (Node keeps exactly those).
        granted = ev.ok or ev.status == L.KVP_ERR_LIMIT
        for k, hit in zip(ev.keys, res):
            ans = self._answers.get((rid, k))
            if ans is not None and peer in ans:
                ans[peer] = bool(hit) and granted

    def _forget_peer(self, peer: str) -> None:
        """A source went down: its HITs are gone (its pins died with it)."""
        for ans in self._answers.values():
            if peer in ans:
                ans[peer] = False

    def _on_load(self, ev: Event) -> None:
        _T('load_ev', ev.op_id, ev.status, ev.n_held)
        job_id = self._load_ops.pop(ev.op_id, None)
        if job_id is None:
            return
        for k in ev.keys:
            left = self._inflight_keys.get(k, 0) - 1
            if left > 0:
                self._inflight_keys[k] = left
            else:
                self._inflight_keys.pop(k, None)
        ld = self._loads.get(job_id)
        if ld is None:
            return  # the job already had its outcome (failed at once)
        ld.ops.discard(ev.op_id)
        if self._zc:
            self.slot_records.append(("load", ev.op_id, ev.n_held, ev.status))
        if ev.n_held:  # zero_copy: slots a WRITE may still reach until SLOTS_RELEASED
            ld.held.add(ev.op_id)
            self._held_ops[ev.op_id] = ld
        bst = ev.block_status or [ev.status] * len(ev.keys)
        for k, s in zip(ev.keys, bst):
            # zero copy: a block the node reports OK is verified and in its
            # slot, in a failed op too (one block's checksum failed, say)
            ld.status[k] = s if ev.ok or s != L.KVP_OK or self._zc else ev.status
        if not ev.ok and self._partial:
            self._part_failed(ld, [], ev.status, f"load from {ev.peer}")
            if not ld.ops:
                self._finish_load(ld)
            return
        if not ev.ok:
            return self._fail_load(ld, ev.status, f"load from {ev.peer}")
        ld.n_ok += ev.n_ok
        if not ld.ops:
            self._finish_load(ld)

    def _part_failed(self, ld: _Load, keys: Sequence[bytes], status: int, detail: str) -> None:
        """partial_loads: some keys of the job failed; the first failure is
        the job's status and detail. The other parts go on."""
        for k in keys:
            ld.status[k] = status
        if ld.fail is None:
            ld.fail = (status, detail)

    def _finish_load(self, ld: _Load) -> None:
        """Every part is decided (all succeeded, or partial_loads): copy into
        dst (if any) and publish."""
        if self._zc:  # the blocks are in the slots: nothing to copy
            return self._publish(ld, *(ld.fail or (L.KVP_OK, "")),
                                 ok_keys=[k for k in ld.job.keys
                                          if ld.status.get(k) == L.KVP_OK])
        if ld.job.dst is not None and self._copier is not None:
            return self._start_copy(ld)
        done: List[bytes] = []
        for i, k in enumerate(ld.job.keys):
            if ld.job.dst is None:
                if ld.fail is None or self.node.contains(k):
                    done.append(k)
                continue
            try:
                with self.node.get(k) as b, memoryview(ld.job.dst[i]) as m, m.cast("B") as out:
                    n = min(len(b.view), out.nbytes)
                    out[:n] = b.view[:n]
                done.append(k)
            except Error as e:  # evicted (or being refilled) between commit and copy
                if not self._partial:
                    return self._fail_load(ld, e.status, f"copy of {k!r}")
                self._part_failed(ld, [k], e.status, f"copy of {k!r}")
        self._publish(ld, *(ld.fail or (L.KVP_OK, "")), ok_keys=done)

    def _start_copy(self, ld: _Load) -> None:
        """Pin the job's blocks here, copy them on the copy thread; the job
        is published by _reap_copies once the copy is done."""
        blocks: List[Any] = []
        views: List[memoryview] = []
        exports: List[Any] = []
        keys: List[bytes] = []
        try:
            for k, dst in zip(ld.job.keys, ld.job.dst):
                if self._partial:  # a key that did not arrive is skipped
                    st, b = self.node.try_get(k)
                    if b is None:
                        self._part_failed(ld, [k], st, f"copy of {k!r}")
                        continue
                else:
                    b = self.node.get(k)
                keys.append(k)
                blocks.append(b)
                v = memoryview(dst).cast("B")
                views.append(v)
                arr = (ctypes.c_char * v.nbytes).from_buffer(v)
                exports.append(arr)
        except Error as e:  # evicted (or being refilled) between commit and copy
            exports.clear()
            for v in views:
                v.release()
            for b in blocks:
                b.release()
            return self._fail_load(ld, e.status, "pin for the copy")

        if not keys:  # partial_loads and nothing arrived
            return self._publish(ld, *(ld.fail or (L.KVP_ERR_NOT_FOUND, "nothing arrived")))

        # one C call for the job's blocks: the copy thread takes the GIL back
        # once, not per block (each may wait out the 5 ms switch interval
        # while the scheduler runs Python: 16 x 2 MiB took 92 ms, not 3-5)
        copy = self.node._copy_call(blocks, [ctypes.addressof(a) for a in exports],
                                    [len(a) for a in exports])
        ld.copy = _Copy(self._copier.submit(copy), blocks, exports, views, keys=keys)
        self._copying.append(ld)

    def _fail_load(self, ld: _Load, status: int, detail: str) -> None:
        """Publish the failure now; cancel the parts still running (their
        events are then swallowed: the job has its one outcome). A job whose
        copy into dst runs is published (failed) when the copy is done."""
        if ld.copy is not None:
            if ld.copy.fail is None:
                ld.copy.fail = (status, detail)
            return
        for op in list(ld.ops):
            try:
                self.node.cancel(op)
            except Error:
                pass
        if self._zc and ld.ops:  # the outcome waits for every part's slots (held or free)
            if ld.fail is None:
                ld.fail = (status, detail)
            return
        self._publish(ld, status, detail)

    def _publish(self, ld: _Load, status: int, detail: str,
                 ok_keys: Optional[List[bytes]] = None) -> None:
        """The job's one outcome. ``ok_keys`` (partial_loads, every part
        decided): the keys whose bytes are in dst although the job failed."""
        if self._loads.pop(ld.job.job_id, None) is None:
            return
        ok = status == L.KVP_OK
        bst = [ld.status.get(k, status if status != L.KVP_OK else L.KVP_OK)
               for k in ld.job.keys]
        n_ok = sum(s == L.KVP_OK for s in bst) if ok else ld.n_ok
        good = list(ld.job.keys) if ok else []
        if not ok and ok_keys:
            gset = set(ok_keys)
            good = [k for k in ld.job.keys if k in gset]
            bst = [L.KVP_OK if k in gset else s if s != L.KVP_OK else status
                   for k, s in zip(ld.job.keys, bst)]
            n_ok = len(good)
        if ld.held:  # zero_copy: some failed slots are the engine's only at SLOTS_RELEASED
            ld.deferred = threading.Event()
            self.slot_records.append(("deferred", ld.job.job_id, tuple(sorted(ld.held))))
        self._done.append(FinishedJob(ld.job.job_id, "load", ok, status, n_ok, bst, detail,
                                      ok_keys=good, deferred_release=ld.deferred))
