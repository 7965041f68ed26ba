"""kvpeer.vllm: kvpeer as a secondary tier of vLLM's KV-offloading tiering
framework (``vllm.v1.kv_offload.tiering``, vllm 0.34.0 tested).

vLLM loads it without any patch, as an out-of-tree tier named in the
TieringOffloadingSpec's ``secondary_tiers`` (SecondaryTierFactory.get_tier_class:
``type`` is the class name, ``module_path`` the module); the same JSON on
every host, each host's address in VLLM_P2P_SIDE_CHANNEL_HOST::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 8589934592,
        "secondary_tiers": [{"type": "KVPeerSecondaryTier", "module_path": "kvpeer.vllm",
                             "port": 7000, "peers": ["10.0.0.1:7000", "10.0.0.2:7000"],
                             "psk_file": "/etc/kvpeer/psk"}]}}'

Config keys (the tier's entry in ``secondary_tiers``; python/README.md):
  peers          list of "host:port" of the other engines' kvpeer tiers (this
                 engine's own id, if listed, is skipped)
  host, port     vLLM's p2p tier's keys: bind and advertise host:port; default
                 $VLLM_P2P_SIDE_CHANNEL_HOST / $VLLM_P2P_SIDE_CHANNEL_PORT, else
                 127.0.0.1 and an ephemeral port; DP rank i binds port + i
  listen         instead: the bind address ("0.0.0.0:7000"); advertised is then
                 host, else $VLLM_P2P_SIDE_CHANNEL_HOST, else vLLM's get_ip();
                 a wildcard is never advertised (refused, naming the key)
  psk_file       the pre-shared key file (kvp_psk_load: kvpeerd's format);
                 required beyond loopback unless ``insecure: true``
  block_size     bytes per kvpeer block; must equal vLLM's primary chunk size
                 (default: that size, ``primary_kv_view.strides[0]``)
  num_blocks     staging only: kvpeer store capacity in blocks (default 1024):
                 host memory of num_blocks x chunk size, beside vLLM's CPU tier
  compat         override of the fingerprint; default: vLLM's own p2p fingerprint
                 fields (FileMapper.from_offloading_spec) + the hash seed
                 (kvpeer.vllm_setup), so engines of different models never
                 exchange a block
  dead_after_ms  a silent peer is dead after this long (kvpeer default 2000)
  hold_cap_ms    bound on quarantined slots / retained transfers (default 120000)
  max_hinted_peers  peers dialled because a request named them (default 64)
  batch_lookups  one LOOKUP per (request, peer) per scheduler step (default
                 true); false sends one per lookup() call (for comparison)
  copy_thread    staging only: copy a finished load into vLLM's chunks on a
                 kvpeer thread (default true); false: on the scheduler thread
  node_options   any other kvp_config_t field, e.g. {"heartbeat_ms": 200}
  peers_dns      "name:port": peers from a DNS name resolving to many addresses
                 (a Kubernetes headless service), beside ``peers``; resolved on
                 a thread of its own every peers_dns_interval_s (default 30),
                 new addresses dialled on demand, vanished ones dropped once
                 idle; at most peers_dns_max (default 64) addresses
                 (kvpeer.dns_peers)
  kv_events      staging only: with vLLM's KV events on (--kv-events-config),
                 the store's stored/removed blocks also go through vLLM's tier
                 event path (take_events; kvpeer.vllm_events), default true;
                 false: only kvpeer's own ZMQ publisher (node_options
                 kv_events_endpoint). Zero copy has no store: what a node
                 serves is its vLLM's CPU tier, which vLLM's own events name
  kvpeer_zero_copy  (issue 29) left out: true wherever vLLM has
                 JobResult.deferred_release (vllm >= 0.34), else false.
                 true: no store of kvpeer's own -- the node's region is vLLM's
                 primary_kv_view (external slots): loads land in the promotion
                 chunks (fetch_into; a slot a failed load may still be written
                 is reported as JobResult.deferred_release), and peers are
                 served from pinned primary chunks (KVP_EV_WANTED and parked
                 FETCHes -> ParentManager.lookup + create_store_job -> publish;
                 the store job completes once the chunk is unpublished and its
                 last transfer is terminal); a node serves what its vLLM's CPU
                 tier holds. false: staging (below), a store of kvpeer's own.

Data path and safety (docs/DESIGN.md, "vLLM tier" and "vLLM zero copy"):
zero copy (the default) is described under kvpeer_zero_copy. Staging: the
kvpeer node keeps its own store; loads land in kvpeer-owned slots and are
copied into the primary-tier chunks vLLM named only after every block of
the job verified (on the tier's copy thread; the job is reported once the
copy is done); stores copy the primary chunks into the store. A WRITE whose
outcome is unknown (dead or stalled source) can therefore only land in a
kvpeer slot, which the node quarantines until proof or the hold cap -- never
in a chunk vLLM has taken back -- so a failed load is reported at once and
``JobResult.deferred_release`` is not needed.

Lookup: HIT / MISS / RETRY (vLLM's secondary-tier contract). The first call
for a (request, key) answers RETRY and queues the key; at the end of the
scheduler step (on_schedule_end) the tier sends one LOOKUP per (request, peer)
with every key queued in the step. A dead or unready peer counts as MISS at
once. With a supplier named in ``kv_transfer_params``
(``{"kvpeer_supplier": "host:port"}``, prefill -> decode) no peer is asked: a
key not here answers HIT at once, and the load is a FETCH with
wait-for-supply from that peer, served as soon as the supplier holds the key
(at once if it does; one scheduler step sooner than a LOOKUP first).
``{"kvpeer_peers": [...]}`` narrows the peers asked for that request. A
named peer without a session is dialled on demand (kvpeer.dialer): RETRY
while it is dialled, MISS if that fails or outlasts the handshake wait.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from vllm.v1.kv_offload.base import (
    Locality,
    OffloadKey as _OffloadKey,
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload import base as _kv_base
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from . import _lib as L
from ._trace import t as _T
from . import psk
from . import vllm_metrics as metrics
from . import vllm_compat as compat
from . import vllm_events as events
from . import vllm_params as params
from . import vllm_setup as setup
from .vllm_sums import ChunkSums
from .vllm_params import request_id_of  # noqa: F401 (kvpeer.vllm.request_id_of)
from .dialer import DEFAULT_MAX_HINTED
from .dns_peers import DnsPeers
from .node import CONFIG_FIELDS, Node, config_defaults, status_str
from .node import Error as L_Error
from .tier import HIT, HIT_PENDING, MISS, RETRY, KVPeerTier, LoadJob, Request, StoreJob

log = logging.getLogger("kvpeer.vllm")

_REQUEST_LEVEL = getattr(getattr(_kv_base, "OffloadPolicy", None), "REQUEST_LEVEL", None)

# The pin budget that parked FETCHes share (the node does not say whose they are).
_PARKED = "(parked fetches)"
_ANY = "(any peer)"  # _reap_serves(early=_ANY): every peer's serve holds

DEFAULT_NUM_BLOCKS = 1024
# Zero copy: how long a prefiller keeps a P/D store job's chunks published
# for its decoder at most (vLLM's p2p tier: unbound_store_timeout_s, 60 s).
DEFAULT_PREFILL_HOLD_S = 60.0
_PAGE = os.sysconf("SC_PAGE_SIZE")


class _Serve:
    """Zero copy: a store job whose chunks the tier publishes to peers (a
    serve of theirs, or the prefill half of P/D), until its chunks are back."""
    __slots__ = ("job", "ctx", "waiting", "published", "hashing", "until", "who", "once")

    def __init__(self, job: Optional[TransferJob], ctx: Optional[ReqContext],
                 until: float, who: Optional[str], once: bool) -> None:
        self.job = job              # vLLM pins its chunks until it is reported
        self.ctx = ctx              # our request that holds it (None: vLLM's own job)
        self.waiting: set = set()   # slots unpublished while pinned: back at SLOT_FREE
        self.published: Dict[bytes, int] = {}  # key -> slot, still published
        self.hashing: Tuple[bytes, ...] = ()  # keys published once hashed (prefill)
        self.until = until          # unpublished then (the serve or prefill hold)
        self.who = who              # the peer whose budget it counts in (None: no peer's)
        self.once = once            # published once: back at its fetch (prefill)

    def held(self) -> int:
        return len(self.waiting) + len(self.published) + len(self.hashing)


class _ReqParams:
    """The kvpeer part of a request's kv_transfer_params, parsed once."""

    __slots__ = ("request", "counted")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.counted: set = set()  # keys whose HIT/MISS the metrics counted


def _parse_params(req_context: ReqContext) -> Request:
    return params.parse(req_context.req_id, req_context.kv_transfer_params)



def _zero_copy_mode(asked: Optional[bool]) -> bool:
    """kvpeer_zero_copy: true, false, or left out (None): zero copy wherever
    this vLLM can be told a failed load's chunks are not free yet
    (JobResult.deferred_release, vllm >= 0.34), else staging."""
    if asked is not None and not isinstance(asked, bool):
        raise ValueError(f"kvpeer: kvpeer_zero_copy must be true or false, got {asked!r}")
    ok = compat.zero_copy_supported(JobResult)
    if asked and not ok:
        raise ValueError(f"kvpeer: kvpeer_zero_copy needs JobResult.deferred_release "
                         f"(vllm >= 0.34; this is {compat.vllm_version()})")
    if asked is None and not ok:
        log.info("kvpeer: vllm %s has no JobResult.deferred_release: staging "
                 "(kvpeer's own store) instead of zero copy", compat.vllm_version())
    return ok if asked is None else asked

class KVPeerSecondaryTier(SecondaryTierManager):
    """A vLLM secondary tier backed by one kvpeer node (see the module doc).

    Runs in vLLM's scheduler process; every method is called under the
    tiering manager's lock. Staging: the kvpeer node's own progress thread
    serves the peers from its store, so the tier does not ask for off-thread
    polling. Zero copy: peers are served from vLLM's chunks through the
    ParentManager, so it does (vLLM's tier-poll thread, between steps too).
    """

    medium = Medium.CPU
    cache_hit_source = CacheHitSource.P2P
    tolerates_off_thread_polling = False
    # A primary chunk that is not a whole number of pages is stored in a
    # zero-padded kvpeer block (kvpeer's blocks are page multiples). Off by
    # default: every engine of a fleet must agree on it (the block size is
    # part of the session's compatibility check); vLLM's own tests (16-byte
    # chunks) run with it on (python/tests/vllm_suite).
    _pad_blocks = False

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, *, peers: Sequence[str] = (),
                 listen: Optional[str] = None, host: Optional[str] = None,
                 port: Optional[int] = None, psk_file: Optional[str] = None,
                 insecure: bool = False,
                 block_size: Optional[int] = None, num_blocks: int = DEFAULT_NUM_BLOCKS,
                 compat: Optional[str] = None, dead_after_ms: Optional[int] = None,
                 hold_cap_ms: Optional[int] = None, batch_lookups: bool = True,
                 copy_thread: bool = True, max_hinted_peers: int = DEFAULT_MAX_HINTED,
                 locality: Any = None, kv_events: bool = True,
                 peers_dns: Optional[str] = None, peers_dns_interval_s: float = 30.0,
                 peers_dns_max: int = 64,
                 node_options: Optional[Dict[str, Any]] = None,
                 kvpeer_zero_copy: Optional[bool] = None,
                 prefill_hold_s: float = DEFAULT_PREFILL_HOLD_S) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality.REMOTE
        mine = dict(peers=list(peers) or None, listen=listen, host=host, port=port,
                    psk_file=psk_file, compat=compat)
        self._metrics = metrics.TierMetrics(metrics.tier_label(
            offloading_spec, tier_type, {k: v for k, v in mine.items() if v is not None}))
        if primary_kv_view.ndim != 2 or not primary_kv_view.c_contiguous:
            raise ValueError("kvpeer: primary_kv_view must be a C-contiguous "
                             "(num_chunks, chunk_bytes) view")
        chunk = self.block_size_bytes
        if self._pad_blocks:  # kvpeer blocks are whole pages; a chunk zero-padded
            chunk = -(-chunk // _PAGE) * _PAGE
        if block_size is None:
            block_size = chunk
        if not isinstance(block_size, int) or block_size != chunk:
            raise ValueError(f"kvpeer: block_size={block_size!r} must equal vLLM's primary "
                             f"chunk size ({chunk} B); leave it out to use that")
        if not isinstance(batch_lookups, bool):
            raise ValueError(f"kvpeer: batch_lookups must be true or false, got {batch_lookups!r}")
        self._defer_lookups = batch_lookups
        if not isinstance(copy_thread, bool):
            raise ValueError(f"kvpeer: copy_thread must be true or false, got {copy_thread!r}")
        self._zc = _zero_copy_mode(kvpeer_zero_copy)
        if self._zc and self._pad_blocks and chunk != self.block_size_bytes:
            if kvpeer_zero_copy:  # a padded block is not vLLM's chunk
                raise ValueError("kvpeer: kvpeer_zero_copy needs a primary chunk of whole pages")
            self._zc = False
        if isinstance(peers, str) or not all(isinstance(p, str) and p for p in peers):
            raise ValueError(f"kvpeer: peers must be a list of 'host:port' strings, got {peers!r}")
        opts: Dict[str, Any] = dict(node_options or {})
        for k in ("listen_addr", "peer_id", "block_size", "num_blocks", "psk", "compat",
                  "insecure"):
            if k in opts:
                raise ValueError(f"kvpeer: give {k} as the tier key, not in node_options")
        if not isinstance(insecure, bool):
            raise ValueError(f"kvpeer: insecure must be true or false, got {insecure!r}")
        bind, advertised = self._identity(opts, offloading_spec, listen, host, port,
                                          psk_file, insecure, compat)
        _check_version()
        # vLLM's KV events on: the store's events through take_events too.
        self._events: Optional[events.TierEvents] = (
            events.TierEvents(tier_type, opts) if events.wanted(offloading_spec, kv_events)
            else None)
        opts.update(block_size=block_size, num_blocks=num_blocks)
        if dead_after_ms is not None:
            opts["dead_after_ms"] = dead_after_ms
        if hold_cap_ms is not None:
            opts["hold_cap_ms"] = hold_cap_ms
        self._load_timeout_ms = int(opts.get("load_timeout_ms",
                                             config_defaults()["load_timeout_ms"]))
        self._hold_cap_s = int(opts.get("hold_cap_ms", config_defaults()["hold_cap_ms"])) / 1000.0
        # zero copy: a served chunk stays published (and pinned in vLLM) for
        # the pin lease, at most 1 s: the other load jobs of the request fetch
        # it with wait-for-supply meanwhile (only one FETCH uses a round).
        d = config_defaults()
        lease_ms = int(opts.get("pin_lease_ms", d["pin_lease_ms"]) or
                       opts.get("supply_pin_ms", d["supply_pin_ms"]))
        self._serve_hold_s = min(lease_ms, 1000) / 1000.0
        # the prefill half of P/D: published once, each chunk back at its fetch,
        # all of them at this hold at the latest (released loudly)
        if isinstance(prefill_hold_s, bool) or not isinstance(prefill_hold_s, (int, float)) \
                or not 0 < prefill_hold_s < float("inf"):
            raise ValueError(f"kvpeer: prefill_hold_s must be a positive number of seconds, "
                             f"got {prefill_hold_s!r}")
        self._prefill_hold_s = float(prefill_hold_s)
        self.prefill_holds_expired = 0  # prefill chunks released unfetched at the hold
        # vLLM's view is (num_chunks, chunk_bytes); a 2-D memoryview has no
        # row indexing, so chunks are addressed in a flat byte view of it.
        self._view = primary_kv_view.cast("B")
        self._num_chunks = primary_kv_view.shape[0]
        self._serves: List[_Serve] = []  # zero copy: store jobs whose chunks are published
        self._serve_lock = threading.Lock()  # _Serve fields and _slot_serve (see _publish)
        # slot -> its serve and, while published once, its key (its fetch frees it);
        # None once unpublished (SLOT_FREE ends the wait): one lookup per event
        self._slot_serve: Dict[int, Tuple[_Serve, Optional[bytes]]] = {}
        # prefill chunks being hashed and published (how many jobs each), and
        # those of them whose fetch freed them before they were recorded
        self._publishing: Dict[int, int] = {}
        self._freed_early: Set[int] = set()
        self._serve_done: List[Any] = []  # their ReqContexts, finished at the next serve
        self._parked_serves = 0   # zero copy: serve rounds for parked FETCHes
        # zero copy: what one peer's LOOKUPs (and, all together, the parked
        # FETCHes, whose peers the node does not name) may keep pinned in
        # vLLM at once, and all peers together: the node's supply-pin
        # budgets (their defaults: a quarter, and half, of vLLM's chunks).
        nb = self._num_chunks
        self._pin_budget = int(opts.get("max_supply_pins_per_peer") or
                               max(nb // 4, min(64, nb // 2)))
        self._pin_total = int(opts.get("max_supply_pins") or nb // 2)
        self.serve_pins_refused = 0  # keys not pinned for a peer past its budget
        self.serve_holds_given_way = 0  # serves unpublished early for a peer's room
        if self._zc:  # issue 29: the node's slots are vLLM's chunks
            opts.update(num_blocks=self._num_chunks, external_slots=1, external_wanted=1,
                        region=self._view)
            num_blocks = self._num_chunks
            self.tolerates_off_thread_polling = True  # peers are served between steps too
        try:
            node = Node(**opts)
        except L_Error as e:  # a bind failure names the address kvpeer tried
            if self._events is not None:
                self._events.close()
            raise L_Error(e.status, f"kvpeer tier on {bind}"
                          f"{' (advertised ' + advertised + ')' if advertised else ''}: "
                          f"{e.detail}") from None
        self.peer_id = node.peer_id
        # One JSON for the whole fleet may list this engine too: not a peer.
        peers = [p for p in peers if p != self.peer_id]
        dns: Optional[DnsPeers] = None
        try:
            if self._events is not None:
                self._events.start(node)
            if peers_dns is not None:
                dns = DnsPeers(peers_dns, peers_dns_interval_s, peers_dns_max,
                               exclude=[self.peer_id])
            self._tier = KVPeerTier(node=node, peers=peers,
                                    copy_thread=copy_thread and not self._zc,
                                    owns_node=True, max_hinted_peers=max_hinted_peers,
                                    dial_wait_s=_dial_wait_s(opts), partial_loads=True,
                                    dns=dns, zero_copy=self._zc)
        except BaseException:
            if dns is not None:
                dns.close()
            if self._events is not None:
                self._events.close()
            node.close()
            raise
        self._submitted: Dict[int, float] = {}
        self._load_keys: Dict[int, Sequence[OffloadKey]] = {}  # job -> vLLM's keys
        self._results: List[JobResult] = []
        # zero copy: each cascaded chunk's checksum, taken at its store job off
        # the scheduler thread (kvpeer.vllm_sums)
        self._csums = ChunkSums(node.slot_checksums) if self._zc else None
        log.info("kvpeer tier %s: %d blocks of %d B, compat %s, peers %s", self.peer_id,
                 num_blocks, block_size, self.compat, list(peers))

    def _identity(self, opts: Dict[str, Any], offloading_spec: Any, listen: Optional[str],
                  host: Optional[str], port: Any, psk_file: Optional[str], insecure: bool,
                  compat: Optional[str]) -> Tuple[str, Optional[str]]:
        """Who this tier is and whom it may talk to (issue 28): bind address
        and advertised peer id (kvpeer.vllm_setup.addresses), the compat
        fingerprint, the PSK. Sets them in ``opts``; returns (bind, advertised)."""
        if not isinstance(insecure, bool):
            raise ValueError(f"kvpeer: insecure must be true or false, got {insecure!r}")
        parallel = offloading_spec.config.parallel
        bind, advertised = setup.addresses(listen, host, port, parallel.data_parallel_index)
        # The default compat: the fields vLLM's own p2p tier fingerprints
        # (model, dtype, parallel layout, tokens per hash, KV groups, layout)
        # and the hash seed, so engines of different models never share a block.
        self._hash_seed = setup.hash_seed()
        self._seed_checked = self._seed_mismatch = False
        self._pumped = False  # events taken since the last step end (lookup)
        if compat is not None and not (isinstance(compat, str) and compat):
            raise ValueError(f"kvpeer: compat must be a non-empty string, got {compat!r}")
        self.compat = compat if compat is not None else setup.fingerprint(offloading_spec,
                                                                          self._hash_seed)
        opts.update(listen_addr=bind, peer_id=advertised, compat=self.compat)
        if psk_file is not None:
            try:
                opts["psk"] = psk.load(psk_file)
            except L_Error as e:
                raise ValueError(f"kvpeer: {e.detail or e}") from None
        elif not insecure and not _loopback(bind):
            raise ValueError(f"kvpeer: listening on {bind} (beyond loopback) needs a "
                             f"pre-shared key: set psk_file (one key file for every peer "
                             f"and kvpeerd), or insecure: true to run without one")
        if insecure and "insecure" in CONFIG_FIELDS:  # the library refuses otherwise
            opts["insecure"] = 1
        return bind, advertised

    # ------------------------------------------------------------ lookup
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if not self._seed_checked:
            self._check_seed()
        if self._seed_mismatch:
            return LookupResult.MISS
        st = self._state(req_context)
        req = st.request
        # vLLM looks keys up one call at a time: the asks are queued and
        # on_schedule_end sends one LOOKUP per (request, peer) for the step.
        # Events are taken at the step's first lookup only: a LOOKUP answer
        # arriving mid-step would otherwise split a request's keys over two
        # steps (two promotions, two fetches, one step later for the rest).
        # A request naming its supplier asks nobody: the supplier holds the
        # key or will, so the load goes at this step's end (one LOOKUP round
        # trip, a scheduler step, less; its FETCH parks until the supply).
        r = self._tier.lookup_many([bytes(key)], req, defer=self._defer_lookups,
                                   pump=not self._pumped,
                                   ask_peers=req.supplier is None)[0]
        self._pumped = True
        if r is HIT or r is MISS:
            k = bytes(key)
            if k not in st.counted:  # once per (request, key), as vLLM's own
                st.counted.add(k)
                self._metrics.on_lookup(r is HIT)
            return LookupResult.HIT if r is HIT else LookupResult.MISS
        if r is HIT_PENDING and req.supplier is not None and \
                (self._zc or not self._tier.node.contains(bytes(key))):
            # Not here, and the supplier holds it or will: load with
            # wait-for-supply (fetch before supply).
            if not self._tier.load_in_flight(bytes(key)):
                return LookupResult.HIT
        return LookupResult.RETRY  # asked a peer, or a load of it is in flight

    def _check_seed(self) -> None:
        """Once, at the first lookup (vLLM resolves its hash seed after the
        tier is built): the seed fingerprinted must be the one in use."""
        self._seed_checked = True
        why = setup.check_hash_seed(self._hash_seed)
        if why is not None:
            self._seed_mismatch = True
            log.error("kvpeer tier %s: %s; every lookup answers MISS", self.peer_id, why)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """End of the scheduler step: send this step's lookups, one LOOKUP
        per (request, peer) with all the keys asked for it."""
        _T('step')
        self._tier.flush_lookups()
        self._pumped = False

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        request = _parse_params(req_context)
        req_context.set_state(_ReqParams(request))
        if self._zc and request.decoder and _REQUEST_LEVEL is not None:
            # the prefill half of P/D: every block of the request comes to
            # submit_store (vLLM cascades prefix hits too), all published for
            # the decoder (p2p asks the same)
            return RequestOffloadingContext(policy=_REQUEST_LEVEL)
        return RequestOffloadingContext()

    def _request(self, req_context: ReqContext) -> Request:
        return self._state(req_context).request

    def _state(self, req_context: ReqContext) -> _ReqParams:
        st = req_context.get_state(_ReqParams)
        if st is None:  # a context this tier never saw on_new_request for
            st = _ReqParams(_parse_params(req_context))
            req_context.set_state(st)
        return st

    # ------------------------------------------------------------ jobs
    def _chunk_id(self, chunk_id: int) -> int:
        c = int(chunk_id)
        if not 0 <= c < self._num_chunks:
            raise ValueError(f"kvpeer: chunk id {c} outside the primary tier "
                             f"(0..{self._num_chunks - 1})")
        return c

    def _chunk(self, chunk_id: int) -> memoryview:
        return self._slice(self._chunk_id(chunk_id))

    def _slice(self, c: int) -> memoryview:  # c checked by _chunk_id
        n = self.block_size_bytes
        return self._view[c * n:(c + 1) * n]

    def submit_store(self, job_metadata: TransferJob) -> None:
        """Copy the pinned primary chunks into the kvpeer store (served to
        peers from there); the outcome comes from get_finished_jobs().
        Zero copy: nothing to copy -- peers are served from vLLM's own chunks
        on demand (serve_external_requests) -- so the job is done once its
        chunks are hashed on the tier's own thread (kvpeer.vllm_sums); the
        prefill half of P/D publishes them from its hashing thread once
        hashed, done at their fetch."""
        if self._zc:
            # Hash each chunk while vLLM pins it for this job: a LOOKUP it serves
            # later publishes it with this checksum (the node hashes nothing then).
            keys = [bytes(k) for k in job_metadata.keys]
            chunks = [self._chunk_id(c) for c in job_metadata.chunk_ids]
            req = self._request(job_metadata.req_context)
            if req.decoder:
                # The prefill half of P/D: its decoder will fetch these. vLLM pins
                # them for this job, so they are served as soon as they are
                # hashed, from the hashing thread (the decoder's FETCH, parked
                # or not, needs no tier-poll round nor step), each once: a
                # chunk is back when fetched, all at the prefill hold (as p2p's
                # parked store job); the job is done then (_reap_serves).
                sv = self._hold(job_metadata, None, None, once=True)
                with self._serve_lock:
                    sv.hashing = tuple(keys)
                    for c in chunks:
                        self._publishing[c] = self._publishing.get(c, 0) + 1
                rid = req.request_id
                self._csums.publish_later(keys, chunks, lambda: self._publish_hashed(
                    sv, keys, chunks, rid))
                return
            # vLLM's cascade: hashed on the tier's own thread, done when hashed
            self._csums.hash_later(job_metadata.job_id, keys, chunks)
            return
        keys = [bytes(k) for k in job_metadata.keys]
        data = [self._chunk(c) for c in job_metadata.chunk_ids]
        if len(data) != len(keys):
            raise ValueError("kvpeer: a store job needs one chunk id per key")
        self._submitted[job_metadata.job_id] = time.monotonic()
        try:
            self._tier.submit_store(StoreJob(job_metadata.job_id,
                                             self._request(job_metadata.req_context),
                                             keys, data))
        finally:
            for d in data:
                d.release()

    @property
    def serve_sums(self) -> List[int]:
        """Zero copy: chunks served with their store job's checksum / hashed then."""
        return self._csums.served if self._csums is not None else [0, 0]

    def _take_hashed(self) -> None:
        for job_id in self._csums.take() if self._csums is not None else ():
            self._results.append(JobResult(job_id=job_id, success=True,
                                           transfer_time=0.0, transfer_bytes=0))

    def submit_load(self, job_metadata: TransferJob) -> None:
        """Zero copy: fetch the keys straight into the primary chunks
        ``chunk_ids``. Staging: into kvpeer's own slots, then, on success,
        copied into those chunks (see the module doc). Chunk ids outside the
        primary tier: ValueError, nothing started."""
        keys = [bytes(k) for k in job_metadata.keys]
        chunks = [self._chunk_id(c) for c in job_metadata.chunk_ids]
        if len(chunks) != len(keys):
            raise ValueError("kvpeer: a load job needs one chunk id per key")
        # zero copy: straight into the promotion chunks (issue 29), by number
        dst = None if self._zc else [self._slice(c) for c in chunks]
        _T('submit_load', job_metadata.job_id, len(keys))
        self._submitted[job_metadata.job_id] = time.monotonic()
        self._load_keys[job_metadata.job_id] = list(job_metadata.keys)
        self._tier.submit_load(LoadJob(job_metadata.job_id,
                                       self._request(job_metadata.req_context), keys, dst,
                                       slots=chunks if self._zc else None))

    def get_finished_jobs(self) -> Iterable[JobResult]:
        self._collect(self._tier.get_finished_jobs())
        self._take_hashed()
        out, self._results = self._results, []
        return out

    def _collect(self, done: Iterable[Any]) -> None:
        now = time.monotonic()
        for f in done:
            _T('job_result', f.job_id, f.kind, f.ok)
            t0 = self._submitted.pop(f.job_id, now)
            keys = self._load_keys.pop(f.job_id, ())
            self._metrics.on_job(f, now - t0, self.block_size_bytes)
            # A load that failed in part: the keys that arrived are vLLM's
            # successful_keys (vLLM's own objects, a subset of the job's).
            ok = set(f.ok_keys) if f.kind == "load" and not f.ok else set()
            good = tuple(k for k in keys if bytes(k) in ok) or None
            if not f.ok:
                log.warning("kvpeer %s job %s failed: %s (%s)%s", f.kind, f.job_id,
                            L.STATUS_NAMES.get(f.status, f.status), f.detail,
                            f"; {len(good)} of {len(keys)} keys loaded" if good else "")
            held = {"deferred_release": f.deferred_release} if \
                getattr(f, "deferred_release", None) is not None else {}  # zero copy only
            self._results.append(JobResult(
                job_id=f.job_id, success=f.ok, successful_keys=good,
                transfer_time=now - t0,
                transfer_bytes=(f.n_ok * self.block_size_bytes) if f.ok or good else None,
                **held))

    def has_pending_work(self) -> bool:
        return bool(self._tier.pending_jobs()) or self._tier.queued_lookups() > 0 or \
            bool(self._serves) or bool(self._serve_done) or \
            (self._csums is not None and self._csums.pending > 0)

    # ------------------------------------------------------------ serving (zero copy)
    def serve_external_requests(self, parent: Any) -> None:
        """Zero copy (issue 29): answer peers' WANTED ops from vLLM's primary
        chunks, under the manager's lock: per op, ParentManager.lookup per key,
        create_store_job pins the hits, kvp_publish serves each pinned chunk,
        kvp_wanted_done answers the LOOKUP, and each chunk is unpublished at
        once (the LOOKUP's pins keep it served; SLOT_FREE when the last one
        drops). The store job completes when every chunk is back.
        Parked FETCHes (a decoder's wait-for-supply from this prefiller) are
        served the same way once vLLM holds their keys."""
        if not self._zc or getattr(self, "_tier", None) is None:
            return
        self._reap_serves()  # first: the chunks back since, out of their peers' budgets
        done, self._serve_done = self._serve_done, []
        for ctx in done:
            parent.on_request_finished(ctx)
        node = self._tier.node
        for ev in self._tier.take_wanted():
            _T('serve_start', ev.op_id)
            keys = node.wanted_keys(ev.op_id, max(1, ev.n_keys))  # never more than raised
            if keys is None:  # answered already (its deadline)
                continue
            n = self._serve(parent, keys, f"kvpeer:{ev.peer}:{ev.request_id}:w{ev.op_id}",
                            ev.peer)
            node.wanted_done(ev.op_id)
            _T('serve_done', ev.op_id, n)
        # keys we publish already wait for the peer's supply budget, not for us:
        # no new store job for them each round
        parked = node.parked_keys()
        if parked:  # or published once hashed (a prefill store job)
            with self._serve_lock:
                live = {k for sv in self._serves for k in (*sv.published, *sv.hashing)}
            parked = [k for k in parked if k not in live]
        if parked:
            self._parked_serves += 1
            self._serve(parent, parked, f"kvpeer:parked:{self._parked_serves}", _PARKED)

    def _serve(self, parent: Any, keys: List[bytes], req_id: str, who: str) -> int:
        """Publish the chunks of ``keys`` vLLM's primary tier holds, pinned by
        one store job of a request of ours, for peer ``who``: no more than
        its pin budget at once, nor than all peers' (the keys past it answer
        MISS); how many were published. A budget counts what is still
        published or not back; short of room, the serve holds give way
        first (``who``'s, then every peer's): a chunk already fetched comes
        back at once, one a LOOKUP still pins stays counted until it is."""
        want = list(dict.fromkeys(keys))
        room = self._room(who)
        for early in (who, _ANY):
            if len(want) <= room:
                break
            self._reap_serves(early=early)
            room = self._room(who)
        if len(want) > room:
            self._refuse_pins(who, len(want) - max(room, 0))
            want = want[:max(room, 0)]
        if not want:
            return 0
        ctx = ReqContext(req_id=req_id)
        parent.on_new_request(ctx)
        hits = [_OffloadKey(k) for k in want
                if parent.lookup(_OffloadKey(k), ctx) is LookupResult.HIT]
        if not hits:  # nothing to pin: the context ends now, not a round later
            parent.on_request_finished(ctx)
            return 0
        return self._offer(parent.create_store_job(hits, ctx), ctx, who)

    def _room(self, who: str) -> int:
        """How many more chunks ``who`` may have pinned now."""
        mine = theirs = 0
        for sv in self._serves:
            n = sv.held()
            mine += n if sv.who == who else 0
            theirs += n if sv.who is not None else 0
        return min(self._pin_budget - mine, self._pin_total - theirs)

    def _refuse_pins(self, who: str, n: int) -> None:
        """Count keys not pinned for ``who`` past its budget; logged at 1, 2,
        4, ... refusals (the peer id escaped)."""
        before = self.serve_pins_refused
        self.serve_pins_refused += n
        self._metrics.count(metrics.SERVE_PINS_REFUSED, n)
        if self.serve_pins_refused.bit_length() > before.bit_length():
            log.warning("kvpeer tier %s: %d keys not pinned for %s: at its budget of %d "
                        "chunks pinned in vLLM (max_supply_pins_per_peer) or all peers' "
                        "(%d, max_supply_pins); %d refused so far", self.peer_id, n,
                        ascii(who), self._pin_budget, self._pin_total, self.serve_pins_refused)

    def _offer(self, job: Optional[TransferJob], ctx: ReqContext, who: str) -> int:
        """Publish the chunks of ``job`` (a store job of ``ctx``, our request:
        vLLM pins them until it is reported) for the serve hold, in ``who``'s
        pin budget; how many were published. (The prefill half of P/D is
        published from its hashing thread: submit_store.)"""
        sv = self._hold(job, ctx, who, once=False)
        if job is None or not len(job.keys):
            return 0
        keys = [bytes(k) for k in job.keys]
        chunks = [int(c) for c in job.chunk_ids]
        sums = [self._csums.stored(k, c) for k, c in zip(keys, chunks)]
        miss = [i for i, x in enumerate(sums) if x is None]  # hashed now, in one call
        for i, x in zip(miss, self._tier.node.slot_checksums([chunks[i] for i in miss])
                        if miss else []):
            sums[i] = x
        with self._serve_lock:
            try:
                st = self._tier.node.publish_many(keys, chunks, sums, False, 0)
            except L_Error as e:  # the node closing (shutdown): nothing published
                log.warning("kvpeer tier %s: served chunks not published: %s", self.peer_id, e)
                st = []
            self._record(sv, keys, chunks, st)
            return len(sv.published)

    def _hold(self, job: Optional[TransferJob], ctx: Optional[ReqContext],
              who: Optional[str], once: bool) -> _Serve:
        hold = self._prefill_hold_s if once else self._serve_hold_s
        sv = _Serve(job, ctx, time.monotonic() + hold, who, once)
        self._serves.append(sv)
        return sv

    def _publish_hashed(self, sv: _Serve, keys: List[bytes], chunks: List[int],
                        rid: int) -> Optional[List[bytes]]:
        """The prefill thread: hash ``sv``'s chunks and publish them, once for
        request ``rid`` (its decoder's fetch, not another peer's that looked
        the prefix up), in one C call (the GIL taken back once, after they
        are served), outside the serves' lock: a vLLM thread that reaps
        SLOT_FREEs or serves meanwhile is not held up by the hash. Then
        recorded under it; a chunk whose fetch freed it before that (its
        SLOT_FREE taken meanwhile: _reap_serves keeps it in _freed_early)
        is back. Their checksums (None: nothing published)."""
        st: List[int] = []
        sums = None
        try:
            st, sums = self._tier.node.hash_publish_many(keys, chunks, True, rid)
        except L_Error as e:  # the node closing (shutdown): nothing published
            log.warning("kvpeer tier %s: prefill chunks not published: %s", self.peer_id, e)
        finally:
            with self._serve_lock:  # whatever happened: the job ends with what is back
                self._record(sv, keys, chunks, st)
                for c in chunks:
                    n = self._publishing.pop(c, 1) - 1
                    if n:
                        self._publishing[c] = n
                    else:  # no publish of it in flight: nothing of it is early
                        self._freed_early.discard(c)
                sv.hashing = ()
        return sums

    def _record(self, sv: _Serve, keys: List[bytes], chunks: List[int], st: List[int]) -> None:
        """Under the serves' lock: the chunks published (status OK) are
        ``sv``'s until unpublished; a chunk published once is its fetch's to
        free (SLOT_FREE), and one freed already (_freed_early) is back."""
        for k, c, s in zip(keys, chunks, st):
            if s != L.KVP_OK:  # served already (another op's pin): a MISS here
                log.debug("kvpeer tier %s: chunk %d not published: %s", self.peer_id, c,
                          status_str(s))
                continue
            if sv.once and c in self._freed_early:
                self._freed_early.discard(c)
                continue
            sv.published[k] = c
            if sv.once:
                self._slot_serve[c] = (sv, k)

    def _reap_serves(self, force: bool = False, early: Optional[str] = None) -> None:
        """A served chunk stays published for the pin lease, at most 1 s (a later FETCH
        of the request -- another load job of it, with wait-for-supply --
        finds it), then is unpublished (BUSY: until SLOT_FREE, its last
        transfer terminal); a prefill chunk until its fetch unpublished it,
        the prefill hold at most. Serves whose chunks are all back: their
        store jobs are done. ``force``: unpublish now (drain); ``early``:
        the serves of that peer (_ANY: of every peer) now (its pin budget)."""
        with self._serve_lock:  # the prefill thread publishes and records too
            self._reap_serves_locked(force, early)

    def _reap_serves_locked(self, force: bool, early: Optional[str]) -> None:
        now = time.monotonic()
        node = self._tier.node
        # SLOT_FREE first: a prefill chunk freed by its fetch is never
        # unpublished below (the key may be published again since, by a serve)
        for slot in self._tier.take_slot_free():
            owner = self._slot_serve.pop(slot, None)
            if owner is None:
                if self._publishing.get(slot):  # fetched before its publish was recorded
                    self._freed_early.add(slot)
                continue
            if owner[1] is not None:  # a prefill chunk its fetch unpublished
                owner[0].published.pop(owner[1], None)
            owner[0].waiting.discard(slot)
        for sv in self._serves:
            mine = early is not None and sv.who is not None and early in (sv.who, _ANY)
            if sv.published and (force or mine or now >= sv.until):
                if mine and not force and now < sv.until:
                    self.serve_holds_given_way += 1
                    self._metrics.count(metrics.SERVE_HOLDS_GIVEN_WAY)
                if sv.once and not force:
                    self._prefill_expired(sv)
                for k, slot in sv.published.items():
                    self._slot_serve.pop(slot, None)
                    try:
                        freed, slot = node.unpublish(k)
                    except L_Error:
                        if not sv.once:
                            raise
                        freed = False  # served once just now: its SLOT_FREE follows
                    if not freed:
                        sv.waiting.add(slot)
                        self._slot_serve[slot] = (sv, None)
                sv.published = {}
        still = []
        for sv in self._serves:
            if sv.held():
                still.append(sv)
                continue
            if sv.job is not None:
                self._results.append(JobResult(job_id=sv.job.job_id, success=True))
            if sv.ctx is not None:
                self._serve_done.append(sv.ctx)
        self._serves = still

    def _prefill_expired(self, sv: _Serve) -> None:
        """The prefill hold ended with chunks not fetched: released, loudly
        (counted; logged at 1, 2, 4, ... such jobs)."""
        self.prefill_holds_expired += 1
        self._metrics.count(metrics.PREFILL_HOLDS_EXPIRED)
        if self.prefill_holds_expired & (self.prefill_holds_expired - 1) == 0:
            log.warning("kvpeer tier %s: %d chunks of a prefill store job (job %s) not fetched "
                        "by its decoder within prefill_hold_s=%g: no longer served (%d such "
                        "jobs so far)", self.peer_id, len(sv.published),
                        getattr(sv.job, "job_id", "?"), self._prefill_hold_s,
                        self.prefill_holds_expired)

    def drain_jobs(self) -> None:
        """Wait (bounded by the node's load timeout) for running loads; the
        rest are cancelled. Loads only ever write kvpeer's own slots until
        they finish, so after this nothing touches the primary view."""
        deadline = time.monotonic() + self._load_bound_s()
        while self._tier.pending_jobs() and time.monotonic() < deadline:
            self._collect(self._tier.wait_jobs(0.05))
        for job_id in self._tier.pending_jobs():
            self._tier.cancel_load(job_id, "drained (vLLM cache reset)")
        self._tier.wait_copies()  # a running copy into vLLM's chunks ends first
        self._collect(self._tier.get_finished_jobs())
        if self._zc:  # every deferred_release set, no peer reading a chunk, before returning
            end = time.monotonic() + self._load_bound_s() + self._hold_cap_s
            while (self._tier.deferred_pending() or self._serves or self._csums.pending) and \
                    time.monotonic() < end:
                time.sleep(0.01)
                self._collect(self._tier.get_finished_jobs())  # SLOTS_RELEASED sets them
                self._take_hashed()  # the store jobs being hashed: done
                self._reap_serves(force=True)

    def _load_bound_s(self) -> float:
        return 2.0 * self._load_timeout_ms / 1000.0

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._tier.on_request_finished(self._request(req_context))

    def shutdown(self) -> None:
        """Cancel running loads (their outcomes are dropped: vLLM is shutting
        down), close the node."""
        if getattr(self, "_tier", None) is None:
            return
        if self._csums is not None:
            self._csums.close()  # it hashes through the node: stopped before the node closes
        try:
            self._collect(self._tier.shutdown())
        finally:
            self._tier = None  # type: ignore[assignment]
            self._view.release()
            if getattr(self, "_events", None) is not None:
                self._events.close()

    def take_events(self) -> Iterable[Any]:
        """The store's stored/removed blocks since the last call, as vLLM's
        OffloadingEvents (kvpeer.vllm_events); none unless vLLM's KV events
        are on."""
        if self._events is None or getattr(self, "_tier", None) is None:
            return []
        return self._events.take()

    # ------------------------------------------------------------ metrics
    @classmethod
    def build_metric_definitions(cls, extra_config: Dict[str, Any]) -> Dict[str, Any]:
        """kvpeer's series for vLLM's Prometheus registry (kvpeer.vllm_metrics)."""
        return metrics.definitions()

    def get_stats(self) -> Any:
        """kvpeer's observations since the last call, and its gauges now,
        labelled with this tier's ``tier`` label as vLLM's own series."""
        if getattr(self, "_tier", None) is None:
            return None
        return self._metrics.take(self._tier.node.stats())

    # ------------------------------------------------------------ info
    @classmethod
    def config_info_keys(cls, tier_config: Dict[str, Any]) -> tuple:
        return ("kvpeer_peer_id",)

    def config_info(self) -> Dict[str, Any]:
        return {"kvpeer_peer_id": self.peer_id}


def offloading_config(engine_id: str, chunk_bytes: int, num_chunks: int,
                       secondary_tiers: List[Dict[str, Any]], model_name: str = "none",
                       dtype: str = "float16", tp_size: int = 1, dp_index: int = 0,
                       kv_events: bool = False, **extra: Any):
    """vLLM's OffloadingConfig for a TieringOffloadingSpec of one KV group
    (16 tokens per block, one layer) on one rank: a primary CPU tier of
    ``num_chunks`` chunks of ``chunk_bytes`` and ``secondary_tiers`` (entries
    as in kv_connector_extra_config, e.g. {"type": "KVPeerSecondaryTier",
    "module_path": "kvpeer.vllm", ...}). ``kv_events``: vLLM's KV events on
    (what --kv-events-config does). ``extra`` adds keys to its
    extra_config (e.g. tier_poll_interval_s). For tests and benchmarks that
    drive vLLM's manager without a model; an engine builds this itself."""
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig,
        OffloadingModelConfig, OffloadingParallelConfig)
    extra_config = {"spec_name": "TieringOffloadingSpec",
                    "cpu_bytes_to_use": num_chunks * chunk_bytes,
                    "secondary_tiers": list(secondary_tiers), **extra}
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",), group_id=0),),
        worker_kv_bytes_per_block=chunk_bytes, enable_kv_cache_events=kv_events,
        extra_config=extra_config, engine_id=engine_id,
        model=OffloadingModelConfig(name=model_name, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=tp_size, tp_size=tp_size, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=dp_index, data_parallel_size=dp_index + 1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False))



_version_checked = False


def _check_version() -> None:
    """Once per process: say so if this vLLM is not one kvpeer was tested with."""
    global _version_checked
    if _version_checked:
        return
    _version_checked = True
    v = compat.vllm_version()
    if v not in compat.TESTED:
        log.warning("kvpeer tier: vllm %s; kvpeer is tested with vllm %s", v,
                    " and ".join(compat.TESTED))


def _dial_wait_s(opts: Dict[str, Any]) -> float:
    """How long a lookup waits for a peer being dialled: what kvpeer's own
    remote calls wait for a handshake in progress."""
    d = config_defaults()
    return min(int(opts.get("handshake_timeout_ms", d["handshake_timeout_ms"])),
               int(opts.get("dead_after_ms", d["dead_after_ms"]))) / 1000.0


def _loopback(addr: str) -> bool:
    host = addr.rpartition(":")[0].strip("[]")
    return host == "localhost" or host == "::1" or host.startswith("127.")
