"""kvpeer.Node: a Pythonic wrapper around one kvp_node_t.

Ownership, in one place:
* The Node owns the C node; close() (or leaving the ``with`` block) drains and
  destroys it. Every method after close() raises ``Error(KVP_ERR_CLOSED)``.
* A Block owns one pin on a READY slot. Its ``view`` is a read-only memoryview
  straight onto the slot (zero copy) and is valid until ``release()``; the
  release invalidates the view (access then raises ValueError). While views
  *derived* from it (slices, casts) are alive, release() refuses with
  ``Error(KVP_ERR_BUSY)`` and the slot stays pinned, so no Python object can
  ever read a slot that was handed back to the store.
* Remote operations (lookup, fetch) complete through events. The ``results``
  and ``block_status`` buffers the C call fills in later are owned by the Node
  in a dict keyed by op id until that op's event has been taken.
"""
from __future__ import annotations

import collections
import ctypes
import math
import sys
import threading
import time
import weakref
from ctypes import POINTER, c_char, c_int32, c_uint8, c_uint32, c_uint64, c_void_p
from dataclasses import dataclass, field
from enum import IntEnum
from typing import (Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple,
                    Union)

from . import _lib as L

Buffer = Union[bytes, bytearray, memoryview]


# ------------------------------------------------------------------ errors
def status_str(status: int) -> str:
    """kvp_status_str(status): static English text for a status code."""
    try:
        s = L.lib().kvp_status_str(int(status))
        return s.decode() if s else "unknown status"
    except OSError:
        return L.STATUS_NAMES.get(status, "unknown status")


class Error(Exception):
    """A kvpeer failure: ``status`` is the kvp_status_t code (negative),
    ``status_name`` its enum name, ``status_str`` the library's text."""

    def __init__(self, status: int, detail: str = "") -> None:
        self.status = int(status)
        self.status_name = L.STATUS_NAMES.get(self.status, f"status {self.status}")
        self.status_str = status_str(self.status)
        self.detail = detail
        msg = f"{self.status_name}: {self.status_str}"
        super().__init__(f"{detail}: {msg}" if detail else msg)


def _check(status: int, what: str) -> None:
    if status != L.KVP_OK:
        raise Error(status, what)


# ------------------------------------------------------------ buffer access
class _Py_buffer(ctypes.Structure):
    _fields_ = [
        ("buf", c_void_p), ("obj", c_void_p), ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p), ("shape", c_void_p), ("strides", c_void_p),
        ("suboffsets", c_void_p), ("internal", c_void_p),
    ]


_PyObject_GetBuffer = ctypes.pythonapi.PyObject_GetBuffer
_PyObject_GetBuffer.argtypes = [ctypes.py_object, POINTER(_Py_buffer), ctypes.c_int]
_PyObject_GetBuffer.restype = ctypes.c_int
_PyBuffer_Release = ctypes.pythonapi.PyBuffer_Release
_PyBuffer_Release.argtypes = [POINTER(_Py_buffer)]
_PyBuffer_Release.restype = None
_PyBUF_SIMPLE = 0


class _Exported:
    """Borrow (address, length) of any C-contiguous buffer, read-only ones too
    (bytes, a Block's view), without copying; the export pins the object's
    memory until the ``with`` block ends."""

    def __init__(self, obj: Any) -> None:
        if isinstance(obj, str) or not _has_buffer(obj):
            raise TypeError(f"expected a bytes-like object, got {type(obj).__name__}")
        self._obj = obj
        self._view = _Py_buffer()

    def __enter__(self) -> Tuple[int, int]:
        try:
            _PyObject_GetBuffer(self._obj, ctypes.byref(self._view), _PyBUF_SIMPLE)
        except (BufferError, ValueError) as e:
            raise TypeError(f"need a C-contiguous buffer: {e}") from e
        return self._view.buf or 0, self._view.len

    def __exit__(self, *exc: Any) -> None:
        _PyBuffer_Release(ctypes.byref(self._view))


def _has_buffer(obj: Any) -> bool:
    try:
        memoryview(obj).release()
        return True
    except TypeError:
        return False


def _key_bytes(key: Any) -> bytes:
    """A key as bytes: 1..64 bytes of bytes/bytearray/memoryview."""
    if isinstance(key, bytes):
        k = key
    elif isinstance(key, (bytearray, memoryview)):
        k = bytes(key)
    else:
        raise TypeError(f"key must be bytes, got {type(key).__name__}")
    if not 1 <= len(k) <= L.KEY_MAX:
        raise Error(L.KVP_ERR_INVALID, f"key must be 1..{L.KEY_MAX} bytes, got {len(k)}")
    return k


def _keys_arrays(keys: Sequence[Any]) -> Tuple[List[bytes], Any, Any]:
    """(keys as bytes, concatenated key buffer, length array) for the C call."""
    if isinstance(keys, (bytes, bytearray, memoryview, str)):
        raise TypeError("keys must be a sequence of bytes keys, not a single key")
    ks = [_key_bytes(k) for k in keys]
    if not 1 <= len(ks) <= L.LIST_MAX:
        raise Error(L.KVP_ERR_INVALID, f"need 1..{L.LIST_MAX} keys, got {len(ks)}")
    blob = b"".join(ks)
    kbuf = (c_uint8 * len(blob)).from_buffer_copy(blob)
    lens = (c_uint32 * len(ks))(*[len(k) for k in ks])
    return ks, kbuf, lens


def _peer_bytes(peer: Any) -> bytes:
    if not isinstance(peer, str):
        raise TypeError(f"peer must be a 'host:port' str, got {type(peer).__name__}")
    b = peer.encode()
    if not 1 <= len(b) <= L.PEER_MAX:
        raise Error(L.KVP_ERR_INVALID, f"peer id must be 1..{L.PEER_MAX} bytes")
    return b


def _u64(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{what} must be an int, got {type(v).__name__}")
    if not 0 <= v < 1 << 64:
        raise Error(L.KVP_ERR_INVALID, f"{what} must fit in 64 bits unsigned")
    return v


# ------------------------------------------------------------------ events
class EventType(IntEnum):
    LOOKUP = L.KVP_EV_LOOKUP
    LOAD = L.KVP_EV_LOAD
    PEER_UP = L.KVP_EV_PEER_UP
    PEER_DOWN = L.KVP_EV_PEER_DOWN
    OVERFLOW = L.KVP_EV_OVERFLOW
    SLOTS_RELEASED = L.KVP_EV_SLOTS_RELEASED  # issue 29: external slots
    SLOT_FREE = L.KVP_EV_SLOT_FREE
    WANTED = L.KVP_EV_WANTED                  # issue 29 step 2: keys wanted


@dataclass
class Event:
    """One kvp_event_t. For LOOKUP/LOAD events of ops issued through this Node,
    ``keys`` lists the op's keys and ``results`` (lookup: True = HIT) or
    ``block_status`` (load: kvp_status_t per key) the per-key answers."""

    type: EventType
    status: int
    op_id: int = 0
    request_id: int = 0
    n_keys: int = 0
    n_ok: int = 0
    fault: bool = False
    peer: str = ""
    keys: List[bytes] = field(default_factory=list)
    results: Optional[List[bool]] = None
    block_status: Optional[List[int]] = None
    n_held: int = 0  # issue 29: LOAD of fetch_into: slots held until SLOTS_RELEASED

    @property
    def ok(self) -> bool:
        return self.status == L.KVP_OK

    @property
    def status_name(self) -> str:
        return L.STATUS_NAMES.get(self.status, str(self.status))

    def raise_for_status(self) -> "Event":
        """Raise Error(status) unless the event reports KVP_OK."""
        if not self.ok:
            raise Error(self.status, f"{self.type.name} op {self.op_id}")
        return self


@dataclass
class _Op:
    """A remote op in flight; its C-filled buffers live here until its event."""

    kind: EventType
    peer: str
    request_id: int
    keys: List[bytes]
    results: Any = None       # (c_uint8 * n), lookup
    block_status: Any = None  # (c_int32 * n), fetch


@dataclass
class PeerInfo:
    """One kvp_peer_info_t."""

    peer: str
    instance: str
    data_path: str
    ready: bool
    probation: bool
    rtt_ns: int
    loads_inflight: int
    bytes_inflight: int


@dataclass
class PeerState:
    """One kvp_peer_state_t: a wanted peer or one with a session; state is
    ready, probation, dialing, failed, wanted or closing."""

    peer: str
    state: str
    last_error: str
    wanted: bool
    failures: int


@dataclass
class HeldItem:
    """One kvp_held_item_t: kind is 'retained', 'quarantined' or 'suspect'."""

    kind: str
    slot: int
    id: int
    age_ms: int
    peer: str


_HELD_KINDS = {1: "retained", 2: "quarantined", 3: "suspect"}


# ------------------------------------------------------------------ blocks
class Block:
    """A pinned READY block of a Node. ``view`` is a zero-copy read-only
    memoryview of the slot, valid until release(). Use as a context manager
    (``with node.get(key) as b: ...``) or call release() explicitly; a Block
    that is garbage collected without release() releases its pin then."""

    def __init__(self, node: "Node", key: bytes, cb: L.kvp_block_t) -> None:
        self._node: Optional[Node] = node
        self._cb = cb
        self.key = key
        self.slot: int = cb.slot
        self.gen: int = cb.gen
        self.len: int = int(cb.len)
        arr = (c_char * self.len).from_address(cb.data)
        # The slot array keeps its Block alive: while any view of it lives the
        # pin lives (a dropped Block never unpins under a live view).
        arr._kvp_block = self  # type: ignore[attr-defined]
        self._arr: Any = arr
        self._base: Optional[memoryview] = memoryview(arr)
        self._view: Optional[memoryview] = self._base.cast("B").toreadonly()

    @property
    def released(self) -> bool:
        return self._node is None

    @property
    def view(self) -> memoryview:
        """The read-only memoryview of the slot (zero copy)."""
        if self._view is None:
            why = "block already released" if self._node is None else \
                "view released; the pin stays until derived views are gone"
            raise Error(L.KVP_ERR_STALE, why)
        return self._view

    def tobytes(self) -> bytes:
        """A copy of the block's bytes."""
        return self.view.tobytes()

    def release(self) -> None:
        """Unpin the slot and invalidate ``view``. Raises Error(KVP_ERR_BUSY),
        keeping the pin, while other buffers still export or derive from the
        view (numpy arrays, slices); Error(KVP_ERR_STALE) if already released."""
        node = self._node
        if node is None:
            raise Error(L.KVP_ERR_STALE, "block already released")
        node._release_block(self)

    def _drop_views(self) -> bool:
        """Release our own views; True when no other view of the slot lives."""
        try:
            if self._view is not None:
                self._view.release()
            if self._base is not None:
                self._base.release()
        except BufferError:
            return False  # something holds a buffer export of our view
        self._view = None
        self._base = None
        # Now only derived views (slices, casts) keep the array's buffer
        # exported; they hold a reference to the array. 2 = self._arr + arg.
        return sys.getrefcount(self._arr) <= 2

    def _finish_release(self) -> None:
        self._arr._kvp_block = None  # break the cycle
        self._node = None

    def __enter__(self) -> "Block":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._node is not None:
            self.release()

    def __len__(self) -> int:
        return self.len

    def __del__(self) -> None:
        node = self._node
        if node is not None and not node.closed:
            try:
                node._release_block(self)
            except Exception:  # interpreter teardown, node closing meanwhile
                pass

    def __repr__(self) -> str:
        state = "released" if self.released else "pinned"
        return f"<kvpeer.Block key={self.key!r} slot={self.slot} gen={self.gen} {state}>"


# kvp_wait_events is called in chunks this long (ms): close() waits for the
# threads inside it, and each is back within one chunk.
_WAIT_CHUNK_MS = 50
_EVENT_BATCH = 64  # events taken per C call


def _event_buf() -> Tuple[Any, c_uint32]:
    """An event array for kvp_poll_events / kvp_wait_events, and its count."""
    return (L.kvp_event_t * _EVENT_BATCH)(), c_uint32()


# ------------------------------------------------------------------ config
_STR_FIELDS = ("name", "listen_addr", "peer_id", "instance_id", "compat",
               "kv_events_endpoint", "kv_events_replay_endpoint")
_ENUMS = {
    "transport": {"ucx": L.KVP_TRANSPORT_UCX, "fake": L.KVP_TRANSPORT_FAKE},
    "thread_mode": {"own": L.KVP_THREAD_OWN, "caller": L.KVP_THREAD_CALLER},
}
_NOT_KWARGS = ("psk_len", "region", "region_len", "reserved0")
CONFIG_FIELDS = tuple(f for f, _ in L.kvp_config_t._fields_ if f not in _NOT_KWARGS)


def config_defaults() -> Dict[str, Any]:
    """kvp_config_init()'s defaults as a dict of the keyword arguments."""
    cfg = L.kvp_config_t()
    L.lib().kvp_config_init(ctypes.byref(cfg))
    out: Dict[str, Any] = {}
    for f in CONFIG_FIELDS:
        v = getattr(cfg, f)
        out[f] = v.decode() if isinstance(v, bytes) else (None if f == "psk" else v)
    return out


def _build_config(kw: Dict[str, Any]) -> Tuple[L.kvp_config_t, List[Any]]:
    """kvp_config_init() then the overrides; returns the struct and the Python
    objects its pointers borrow (keep them alive until kvp_node_create)."""
    cfg = L.kvp_config_t()
    L.lib().kvp_config_init(ctypes.byref(cfg))
    keep: List[Any] = []
    for k, v in kw.items():
        if k not in CONFIG_FIELDS:
            raise TypeError(f"unknown kvpeer config option {k!r}")
        if v is None and (k in _STR_FIELDS or k == "psk"):
            setattr(cfg, k, None)
        elif k in _STR_FIELDS:
            if not isinstance(v, str):
                raise TypeError(f"{k} must be a str, got {type(v).__name__}")
            b = v.encode()
            keep.append(b)
            setattr(cfg, k, b)
        elif k == "psk":
            if not isinstance(v, (bytes, bytearray)) or len(v) == 0:
                raise TypeError("psk must be non-empty bytes")
            buf = ctypes.create_string_buffer(bytes(v), len(v))
            keep.append(buf)
            cfg.psk = ctypes.addressof(buf)
            cfg.psk_len = len(v)
        elif k in _ENUMS:
            if isinstance(v, str):
                if v not in _ENUMS[k]:
                    raise Error(L.KVP_ERR_INVALID, f"{k} must be one of {sorted(_ENUMS[k])}")
                v = _ENUMS[k][v]
            setattr(cfg, k, _int_field(k, v, 31))
        else:
            bits = 8 * ctypes.sizeof(dict(L.kvp_config_t._fields_)[k])
            setattr(cfg, k, _int_field(k, v, bits))
    return cfg, keep


def _int_field(name: str, v: Any, bits: int) -> int:
    if isinstance(v, bool):
        v = int(v)
    if not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if not 0 <= v < 1 << bits:
        raise Error(L.KVP_ERR_INVALID, f"{name}={v} out of range")
    return v


# ------------------------------------------------------------------ node

def _keys_of(kbuf: Any, lens: Any, n: int) -> List[bytes]:
    """Keys in kvp_wanted_keys's layout: key i at i * KEY_MAX."""
    base = ctypes.addressof(kbuf)
    return [ctypes.string_at(base + i * L.KEY_MAX, min(lens[i], L.KEY_MAX)) for i in range(n)]

class Node:
    """One kvpeer node. Keyword arguments mirror kvp_config_t (defaults from
    kvp_config_init); e.g. ``Node(num_blocks=64, block_size=65536,
    hold_cap_ms=2000)``. ``transport`` is "ucx" (default) or an int;
    ``thread_mode`` "own" (default: the node's own progress thread) or
    "caller" (then call progress() whenever fileno() is readable).

    Thread safety: the methods may be called from several threads; events are
    delivered once, to whichever thread takes them.
    """

    def __init__(self, **config: Any) -> None:
        self._h: Optional[int] = None
        self.peer_id: str = ""
        self._lock = threading.RLock()
        self._waiting = 0  # threads inside kvp_wait_events (close() waits them out)
        self._idle = threading.Condition(self._lock)
        self._ops: Dict[int, _Op] = {}
        self._stash: Deque[Event] = collections.deque()
        self._take_buf = _event_buf()  # _take's, under _lock
        self._wait_bufs = threading.local()  # _wait_take's: one per waiting thread
        self._blocks: "weakref.WeakSet[Block]" = weakref.WeakSet()
        self._region: Optional[_Exported] = None  # issue 29: the caller's memory, exported
        region = config.pop("region", None)
        cfg, keep = _build_config(config)
        if region is not None:  # issue 29, external slots: a writable buffer or (addr, len)
            cfg.region, cfg.region_len = self._export_region(region)
        self._caller_mode = cfg.thread_mode == L.KVP_THREAD_CALLER
        self.block_size: int = cfg.block_size
        self.num_blocks: int = cfg.num_blocks
        handle = c_void_p()
        st = L.lib().kvp_node_create(ctypes.byref(cfg), ctypes.byref(handle))
        del keep  # borrowed only for the duration of kvp_node_create
        if st != L.KVP_OK:  # name the field or limit (kvp_last_error)
            self._release_region()
            why = L.lib().kvp_last_error()
            raise Error(st, "kvp_node_create: " + why.decode(errors="replace")
                        if why else "kvp_node_create")
        self._h = handle.value
        self._fd: int = L.lib().kvp_node_fd(self._h)
        self.peer_id = L.lib().kvp_node_peer_id(self._h).decode()

    # ---------------------------------------------------------- lifecycle
    @property
    def closed(self) -> bool:
        return self._h is None

    def _handle(self) -> int:
        h = self._h
        if h is None:
            raise Error(L.KVP_ERR_CLOSED, "node is closed")
        return h

    def close(self) -> None:
        """Release every Block, then drain and destroy the node (bounded by
        shutdown_drain_ms). Raises Error(KVP_ERR_BUSY) and leaves the node
        open while views derived from a Block are still alive. Idempotent."""
        with self._lock:
            if self._h is None:
                return
            busy = []
            for b in list(self._blocks):
                try:
                    self._release_block(b)
                except Error as e:
                    if e.status != L.KVP_ERR_BUSY:
                        raise
                    busy.append(b)
            if busy:
                raise Error(L.KVP_ERR_BUSY, f"{len(busy)} block view(s) still in use")
            h, self._h = self._h, None  # no new waiter from here on
            while self._waiting:  # each is back within one chunk (_WAIT_CHUNK_MS)
                self._idle.wait()
            L.lib().kvp_node_destroy(h)
            # destroyed: no event can arrive any more, the op buffers are free
            self._ops.clear()
            self._release_region()

    def _export_region(self, region: Any) -> Tuple[int, int]:
        """(address, length) of the node's region (issue 29): a writable
        C-contiguous buffer, exported (pinned) until close(); or an
        (address, length) pair of memory the caller keeps valid."""
        if isinstance(region, tuple):
            addr, n = (_int_field("region", region[0], 64), _int_field("region_len", region[1], 64))
            return addr, n
        if memoryview(region).readonly:
            raise TypeError("region must be a writable buffer")
        ex = _Exported(region)
        addr, n = ex.__enter__()
        self._region = ex
        return addr, n

    def _release_region(self) -> None:
        if self._region is not None:
            self._region.__exit__(None, None, None)
            self._region = None

    def __enter__(self) -> "Node":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # a live view: leaking the node beats unmapping it
            pass

    def __repr__(self) -> str:
        return f"<kvpeer.Node {self.peer_id} {'closed' if self.closed else 'open'}>"

    def fileno(self) -> int:
        """The node's event fd: readable when events are ready (and, in
        caller-driven mode, when progress() has work). For select/asyncio."""
        self._handle()
        return self._fd

    def progress(self, timeout: float = 0.0) -> None:
        """Caller-driven mode only: run one poll round, sleeping at most
        ``timeout`` seconds."""
        _check(L.lib().kvp_node_progress(self._handle(), _ms(timeout)), "kvp_node_progress")

    # ---------------------------------------------------------- peers
    def add_peer(self, addr: str) -> None:
        """Want a session with ``addr`` ("host:port"); redialled with backoff."""
        _check(L.lib().kvp_peer_add(self._handle(), _peer_bytes(addr)), "kvp_peer_add")

    def remove_peer(self, addr: str) -> None:
        """Close the session with ``addr`` gracefully and stop redialling."""
        _check(L.lib().kvp_peer_remove(self._handle(), _peer_bytes(addr)), "kvp_peer_remove")

    def forget_peer(self, addr: str) -> None:
        """Stop keeping ``addr`` across an idle close (kvp_peer_forget): an
        open session stays until idle, then the peer is forgotten."""
        _check(L.lib().kvp_peer_forget(self._handle(), _peer_bytes(addr)), "kvp_peer_forget")

    def wait_peer(self, addr: str, timeout: float = 10.0) -> PeerInfo:
        """add_peer(addr) and wait until its session is ready; events taken
        meanwhile stay queued for events(). Raises Error(KVP_ERR_TIMEOUT)."""
        self.add_peer(addr)
        deadline = time.monotonic() + timeout
        while True:
            for p in self.peers():
                if p.peer == addr and p.ready and not p.probation:
                    return p
            left = deadline - time.monotonic()
            if left <= 0:
                why = [f"{p.state}: {p.last_error}" if p.last_error else p.state
                       for p in self.peer_states() if p.peer == addr]
                raise Error(L.KVP_ERR_TIMEOUT, f"no session with {addr}" +
                            (f" ({why[0]})" if why else ""))
            self._pump(min(left, 0.05), stash=True)

    # ---------------------------------------------------------- local
    def put(self, key: bytes, data: Buffer, request_id: Optional[int] = None) -> None:
        """Copy ``data`` (<= block_size bytes; zero-padded) as the block of
        ``key``. ``request_id`` ties it to a source request (serves parked
        WAIT_FOR_SUPPLY demand of that request at once)."""
        k = _key_bytes(key)
        rid = 0 if request_id is None else _u64(request_id, "request_id")
        h = self._handle()
        with _Exported(data) as (addr, n):
            if not 1 <= n <= self.block_size:
                raise Error(L.KVP_ERR_INVALID, f"data must be 1..{self.block_size} bytes, got {n}")
            st = L.lib().kvp_put(h, k, len(k), addr, n, rid)
        _check(st, "kvp_put")

    def get(self, key: bytes) -> Block:
        """Pin the READY block of ``key`` and return it (see Block).
        Error(KVP_ERR_NOT_FOUND) / Error(KVP_ERR_PENDING) otherwise."""
        st, b = self.try_get(key)
        _check(st, "kvp_get")
        assert b is not None
        return b

    def try_get(self, key: bytes) -> Tuple[int, Optional[Block]]:
        """get() without the exception: (KVP_OK, the pinned block), or
        (KVP_ERR_NOT_FOUND / KVP_ERR_PENDING / ..., None). For callers that
        expect misses (a scheduler asking per key): an Error costs more than
        the lookup."""
        k = _key_bytes(key)
        with self._lock:
            cb = L.kvp_block_t()
            st = L.lib().kvp_get(self._handle(), k, len(k), ctypes.byref(cb))
            if st != L.KVP_OK:
                return st, None
            b = Block(self, k, cb)
            self._blocks.add(b)
            return st, b

    def copy_blocks(self, blocks: Sequence[Block], dsts: Sequence[Any]) -> None:
        """Copy ``blocks`` (pinned, from get()) into the writable buffers
        ``dsts``, at most each buffer's size, in one C call
        (kvp_blocks_copy: the GIL released once, not once per block). A
        released block: Error(KVP_ERR_STALE); a block of another node:
        Error(KVP_ERR_INVALID), nothing copied."""
        keep = [(c_char * memoryview(d).nbytes).from_buffer(d) for d in dsts]
        try:
            self._copy_call(blocks, [ctypes.addressof(a) for a in keep],
                            [len(a) for a in keep])()
        finally:
            keep.clear()

    def _copy_call(self, blocks: Sequence[Block], addrs: Sequence[int],
                   lens: Sequence[int]) -> Callable[[], None]:
        """copy_blocks into raw (address, length) buffers the caller keeps
        exported: the arguments built now, on this thread; the returned call
        makes the one C call (e.g. on a copy thread), blocks still pinned."""
        n = len(blocks)
        if len(addrs) != n or len(lens) != n:
            raise Error(L.KVP_ERR_INVALID, f"{n} blocks, {len(addrs)} buffers")
        if any(b.released for b in blocks):
            raise Error(L.KVP_ERR_STALE, "block already released")
        cbs = (L.kvp_block_t * n)(*[b._cb for b in blocks])
        ptrs = (c_void_p * n)(*addrs)
        ls = (c_uint64 * n)(*lens)
        return lambda: _check(L.lib().kvp_blocks_copy(self._handle(), cbs, n, ptrs, ls),
                              "kvp_blocks_copy")

    def contains(self, key: bytes) -> bool:
        """True if ``key`` is READY here (a get + release)."""
        st, b = self.try_get(key)
        if b is not None:
            b.release()
            return True
        if st in (L.KVP_ERR_NOT_FOUND, L.KVP_ERR_PENDING):
            return False
        raise Error(st, "kvp_get")

    def _release_block(self, b: Block) -> None:
        with self._lock:
            if b._node is None:
                raise Error(L.KVP_ERR_STALE, "block already released")
            if not b._drop_views():
                raise Error(L.KVP_ERR_BUSY,
                            "views derived from the block are still alive; drop them first")
            h = self._handle()
            st = L.lib().kvp_release(h, ctypes.byref(b._cb))
            b._finish_release()
            self._blocks.discard(b)
        _check(st, "kvp_release")

    # ---------------------------------------------------------- remote
    def lookup(self, peer: str, keys: Sequence[bytes], request_id: int) -> int:
        """Ask ``peer`` which of ``keys`` it holds (HITs are pinned there for
        this request). Returns the op id; the LOOKUP event carries
        ``results`` (True = HIT) per key. Error(KVP_ERR_UNREACHABLE) at once
        when there is no ready session to ``peer`` (it is dialled then)."""
        pb = _peer_bytes(peer)
        rid = _u64(request_id, "request_id")
        ks, kbuf, lens = _keys_arrays(keys)
        results = (c_uint8 * len(ks))()
        op = c_uint64()
        with self._lock:
            st = L.lib().kvp_lookup(self._handle(), pb, rid, kbuf, lens, len(ks), results,
                                    ctypes.byref(op))
            _check(st, "kvp_lookup")
            self._ops[op.value] = _Op(EventType.LOOKUP, peer, rid, ks, results=results)
        return op.value

    def lookup_prefix(self, peer: str, keys: Sequence[bytes], request_id: int) -> int:
        """Ask ``peer`` for the longest prefix of ``keys`` (one request's
        blocks, in order) it holds. Returns the op id; the LOOKUP event's
        ``n_ok`` is the prefix length and ``results`` is True for exactly the
        prefix. The prefix is pinned there for this request under the source's
        pin lease (``pin_lease_ms``): renew it with lease_renew(), a fetch or
        another lookup of the request, or it is released."""
        pb = _peer_bytes(peer)
        rid = _u64(request_id, "request_id")
        ks, kbuf, lens = _keys_arrays(keys)
        results = (c_uint8 * len(ks))()
        op = c_uint64()
        with self._lock:
            st = L.lib().kvp_lookup_prefix(self._handle(), pb, rid, kbuf, lens, len(ks),
                                           results, ctypes.byref(op))
            _check(st, "kvp_lookup_prefix")
            self._ops[op.value] = _Op(EventType.LOOKUP, peer, rid, ks, results=results)
        return op.value

    def lease_renew(self, peer: str, request_id: int) -> None:
        """Lease heartbeat: renew on ``peer`` the pins of every unfetched
        lookup of ``request_id`` (one small frame, no event)."""
        pb = _peer_bytes(peer)
        rid = _u64(request_id, "request_id")
        _check(L.lib().kvp_lease_renew(self._handle(), pb, rid), "kvp_lease_renew")

    def fetch(self, peer: str, keys: Sequence[bytes], request_id: int,
              wait_for_supply: bool = False, hint: bool = False) -> int:
        """Load ``keys`` from ``peer`` into this node's store (after a lookup
        of the same request, or with ``wait_for_supply``: the source parks the
        demand until the keys are put there). Returns the op id; exactly one
        LOAD event follows, with ``block_status`` per key. ``hint``: fetch
        without a lookup because a router's map says ``peer`` holds the keys;
        a stale hint fails at once with KVP_ERR_NOT_FOUND."""
        pb = _peer_bytes(peer)
        rid = _u64(request_id, "request_id")
        ks, kbuf, lens = _keys_arrays(keys)
        bst = (c_int32 * len(ks))(*([L.KVP_ERR_STATE] * len(ks)))
        flags = L.KVP_FETCH_FLAG_WAIT_FOR_SUPPLY if wait_for_supply else 0
        if hint:
            flags |= L.KVP_FETCH_FLAG_HINT
        op = c_uint64()
        with self._lock:
            st = L.lib().kvp_fetch(self._handle(), pb, rid, kbuf, lens, len(ks), flags, bst,
                                   ctypes.byref(op))
            _check(st, "kvp_fetch")
            self._ops[op.value] = _Op(EventType.LOAD, peer, rid, ks, block_status=bst)
        return op.value

    def cancel(self, op_id: int) -> None:
        """Abort a load; its LOAD event still comes (KVP_ERR_CANCELED unless
        it was already decided)."""
        _check(L.lib().kvp_cancel(self._handle(), _u64(op_id, "op_id")), "kvp_cancel")

    def finish_request(self, request_id: int) -> None:
        """The engine finished ``request_id`` locally: its loads fail, its
        supply and parked demand on this node are released."""
        rid = _u64(request_id, "request_id")
        _check(L.lib().kvp_finish_request(self._handle(), rid), "kvp_finish_request")

    def pending_ops(self) -> List[int]:
        """Op ids whose event has not been taken yet."""
        with self._lock:
            return sorted(self._ops)

    # ---------------------------------------------------------- events
    def _take(self) -> List[Event]:
        """Non-blocking: every ready event, converted (caller holds no lock)."""
        out: List[Event] = []
        with self._lock:
            h = self._handle()
            buf, n = self._take_buf  # used under the lock only
            while True:
                _check(L.lib().kvp_poll_events(h, buf, _EVENT_BATCH, ctypes.byref(n)), "kvp_poll_events")
                for i in range(n.value):
                    out.append(self._convert(buf[i]))
                if n.value < _EVENT_BATCH:
                    return out

    def _convert(self, ce: L.kvp_event_t) -> Event:
        try:
            et = EventType(ce.type)
        except ValueError:
            et = ce.type  # type: ignore[assignment]  # a newer library's event
        ev = Event(et, ce.status, ce.op_id, ce.request_id, ce.n_keys, ce.n_ok, bool(ce.fault),
                   ce.peer.decode(errors="replace"))
        ev.n_held = ce.n_held
        if et in (EventType.LOOKUP, EventType.LOAD):
            op = self._ops.pop(ce.op_id, None)  # the C side is done with its buffers
            if op is not None:
                ev.keys = op.keys
                if not ev.peer:
                    ev.peer = op.peer
                if op.results is not None:
                    # A LOOKUP refused at a source's budget (KVP_ERR_LIMIT,
                    # issue 27) still holds the hits it was granted (pinned
                    # for this request): keep them, or they wait for the lease.
                    granted = ev.ok or (et == EventType.LOOKUP and ev.status == L.KVP_ERR_LIMIT)
                    ev.results = [bool(r) for r in op.results] if granted else \
                        [False] * len(op.keys)
                if op.block_status is not None:
                    ev.block_status = list(op.block_status)
        return ev

    def _wait_take(self, timeout: Optional[float]) -> List[Event]:
        """Wait up to ``timeout`` seconds (None: no limit) in kvp_wait_events,
        which runs the node's rounds on this thread while the node thread
        sleeps (the answer wakes this thread directly), in chunks of
        _WAIT_CHUNK_MS so that close() never waits long for a waiter."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        bufs = getattr(self._wait_bufs, "bufs", None)
        if bufs is None:  # waiters run concurrently: a buffer per thread, kept
            bufs = self._wait_bufs.bufs = _event_buf()
        buf, n = bufs
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            ms = _WAIT_CHUNK_MS if left is None else \
                max(0, min(_WAIT_CHUNK_MS, math.ceil(left * 1000)))
            with self._lock:
                h = self._handle()
                self._waiting += 1
            try:
                st = L.lib().kvp_wait_events(h, buf, _EVENT_BATCH, ctypes.byref(n), ms)
            finally:
                with self._lock:
                    self._waiting -= 1
                    if not self._waiting:
                        self._idle.notify_all()
            _check(st, "kvp_wait_events")
            if n.value:
                with self._lock:
                    return [self._convert(buf[i]) for i in range(n.value)]
            if left is not None and left * 1000 <= ms:
                return []

    def _pump(self, timeout: Optional[float], stash: bool) -> List[Event]:
        """Wait up to ``timeout`` for events; return them (or stash them)."""
        evs = self._take()
        if not evs and self._caller_mode:
            self.progress(0.05 if timeout is None else max(0.0, timeout))
            evs = self._take()
        elif not evs and (timeout is None or timeout > 0):  # 0: _take was the whole answer
            evs = self._wait_take(timeout)
        if stash:
            with self._lock:
                self._stash.extend(evs)
        return evs

    def poll(self, timeout: Optional[float] = 0.0) -> List[Event]:
        """The events ready now; if none, wait up to ``timeout`` seconds
        (None = until one arrives) for the first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._stash:
                    out = list(self._stash)
                    self._stash.clear()
                    return out
            left = None if deadline is None else deadline - time.monotonic()
            evs = self._pump(None if left is None else max(0.0, min(left, 1.0)), stash=False)
            if evs:
                return evs
            if left is not None and left <= 0:
                return []

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Iterate over events as they arrive; stops once no event arrived for
        ``timeout`` seconds (None: never stops; 0: just the ready ones)."""
        while True:
            evs = self.poll(timeout)
            if not evs:
                return
            yield from evs

    def wait(self, op_id: int, timeout: Optional[float] = 30.0) -> Event:
        """Wait for the event of ``op_id`` and return it (other events stay
        queued for events()/poll()). Error(KVP_ERR_TIMEOUT) after ``timeout``
        seconds; Error(KVP_ERR_NOT_FOUND) for an op this Node does not know."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                for ev in self._stash:
                    if ev.op_id == op_id and ev.type in (EventType.LOOKUP, EventType.LOAD):
                        self._stash.remove(ev)
                        return ev
                if op_id not in self._ops:
                    raise Error(L.KVP_ERR_NOT_FOUND, f"op {op_id} is unknown or taken")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise Error(L.KVP_ERR_TIMEOUT, f"op {op_id} not done after {timeout} s")
            self._pump(0.5 if left is None else min(left, 0.5), stash=True)

    # ---------------------------------------------------------- inspection
    def stats(self) -> Dict[str, int]:
        """kvp_node_stats as a dict (slots by state, pins, lookups, ...)."""
        s = L.kvp_stats_t()
        _check(L.lib().kvp_node_stats(self._handle(), ctypes.byref(s)), "kvp_node_stats")
        return {f: int(getattr(s, f)) for f in L.STATS_FIELDS}

    def refusals(self) -> Dict[str, int]:
        """kvp_node_refusals as a dict: why sessions did not come up
        (dials, refused_incompatible, refused_auth, ...)."""
        r = L.kvp_refusal_stats_t()
        _check(L.lib().kvp_node_refusals(self._handle(), ctypes.byref(r)), "kvp_node_refusals")
        return {f: int(getattr(r, f)) for f in L.REFUSAL_FIELDS}

    def kv_events_endpoints(self) -> Tuple[Optional[str], Optional[str]]:
        """The bound KV-event endpoints (PUB, replay), wildcard ports
        resolved; None where the node publishes none. Subscribe with
        kvpeer.router.ClusterMap."""
        h = self._handle()
        out = []
        for replay in (0, 1):
            v = L.lib().kvp_node_kv_events_endpoint(h, replay)
            out.append(v.decode() if v else None)
        return out[0], out[1]

    def held(self, cap: int = 4096) -> List[HeldItem]:
        """Retained transfers and quarantined/suspect slots, with their ages."""
        buf = (L.kvp_held_item_t * cap)()
        n = c_uint32()
        _check(L.lib().kvp_node_held(self._handle(), buf, cap, ctypes.byref(n)), "kvp_node_held")
        return [HeldItem(_HELD_KINDS.get(it.kind, str(it.kind)), it.slot, it.id, it.age_ms,
                         it.peer.decode(errors="replace")) for it in buf[:n.value]]

    def peers(self, cap: int = 1024) -> List[PeerInfo]:
        """Per-peer session info, including the data path."""
        buf = (L.kvp_peer_info_t * cap)()
        n = c_uint32()
        _check(L.lib().kvp_node_peers(self._handle(), buf, cap, ctypes.byref(n)),
               "kvp_node_peers")
        return [PeerInfo(p.peer.decode(errors="replace"), p.instance.decode(errors="replace"),
                         p.data_path.decode(errors="replace"), bool(p.ready), bool(p.probation),
                         p.rtt_ns, p.loads_inflight, p.bytes_inflight) for p in buf[:n.value]]

    def peer_states(self, cap: int = 1024) -> List[PeerState]:
        """Every peer the node knows (wanted or with a session), with its
        state and, for one that cannot be reached, the last error."""
        buf = (L.kvp_peer_state_t * cap)()
        n = c_uint32()
        _check(L.lib().kvp_node_peer_states(self._handle(), buf, cap, ctypes.byref(n)),
               "kvp_node_peer_states")
        return [PeerState(p.peer.decode(errors="replace"), p.state.decode(errors="replace"),
                          p.last_error.decode(errors="replace"), bool(p.wanted), p.failures)
                for p in buf[:n.value]]

    # ---------------------------------------------------------- issue 29
    # External slots (external_slots=1: the region and its slots are the
    # caller's) and keys wanted (external_wanted=1). docs/API.md.
    def fetch_into(self, peer: str, keys: Sequence[bytes], slots: Sequence[int],
                   request_id: int, wait_for_supply: bool = False) -> int:
        """Load ``keys`` from ``peer`` into this node's region slots
        ``slots`` (the caller's chunks, lent until the LOAD event). Returns
        the op id; the LOAD event's ``block_status`` per key: KVP_OK (the
        verified block is in the slot), KVP_ERR_BUSY (still held: the slot
        is the caller's again only at the SLOTS_RELEASED event of this op),
        other errors (the slot is the caller's again now)."""
        pb = _peer_bytes(peer)
        rid = _u64(request_id, "request_id")
        ks, kbuf, lens = _keys_arrays(keys)
        if len(slots) != len(ks):
            raise Error(L.KVP_ERR_INVALID, f"{len(ks)} keys but {len(slots)} slots")
        sl = (c_uint32 * len(ks))(*[_int_field("slot", int(x), 32) for x in slots])
        bst = (c_int32 * len(ks))(*([L.KVP_ERR_STATE] * len(ks)))
        flags = L.KVP_FETCH_FLAG_WAIT_FOR_SUPPLY if wait_for_supply else 0
        op = c_uint64()
        with self._lock:
            st = L.lib().kvp_fetch_into(self._handle(), pb, rid, kbuf, lens, len(ks), sl, flags,
                                        bst, ctypes.byref(op))
            _check(st, "kvp_fetch_into")
            self._ops[op.value] = _Op(EventType.LOAD, peer, rid, ks, block_status=bst)
        return op.value

    def publish(self, key: bytes, slot: int, checksum: Optional[bytes] = None,
                once: bool = False, once_for: int = 0) -> None:
        """Serve the block of ``key`` from region slot ``slot`` (written,
        and not written again while published). ``checksum``: the slot's
        slot_checksum() taken since it was last written (the node then
        hashes nothing; a stale one fails the consumers' verify of it).
        ``once``: the first transfer from it that completes unpublishes it
        (kvp_publish_once: the SLOT_FREE event with op_id = slot follows);
        ``once_for`` (a request id, 0: any): only a transfer for that
        request does, the others are served from it and leave it."""
        sums = None if checksum is None else [checksum]
        _check(self.publish_many([_key_bytes(key)], [slot], sums, once, once_for)[0],
               "kvp_publish")

    def publish_many(self, keys: Sequence[bytes], slots: Sequence[int],
                     checksums: Optional[Sequence[bytes]] = None,
                     once: bool = False, once_for: int = 0) -> List[int]:
        """publish() of each key from its slot, in one call to the node (one
        wake-up of its thread, not one per key); ``checksums``: each slot's
        slot_checksum(), or None (each slot hashed by the node). Each key's
        status: KVP_OK, or what publish() would have raised (KVP_ERR_EXISTS,
        KVP_ERR_BUSY, ...). A bad key or slot anywhere: Error, nothing
        published."""
        ks, kbuf, lens, sl = self._publish_arrays(keys, slots, checksums)
        sums = None
        if checksums is not None:
            if not all(isinstance(c, bytes) and len(c) == L.CHECKSUM_LEN for c in checksums):
                raise ValueError(f"checksums must be {L.CHECKSUM_LEN} bytes from slot_checksum()")
            sums = (c_uint8 * (L.CHECKSUM_LEN * len(ks))).from_buffer_copy(b"".join(checksums))
        st = (c_int32 * len(ks))()
        _check(L.lib().kvp_publish_many(self._handle(), kbuf, lens, sl, len(ks), sums,
                                        L.KVP_PUBLISH_ONCE if once else 0,
                                        _int_field("once_for", once_for, 64), st),
               "kvp_publish_many")
        return list(st)

    def hash_publish_many(self, keys: Sequence[bytes], slots: Sequence[int], once: bool = False,
                          once_for: int = 0) -> Tuple[List[int], List[bytes]]:
        """slot_checksums() and publish_many() with them in one call: the
        slots are hashed on this thread (the GIL released once: the keys
        are served before it is taken back) and published. Each key's
        status, and each slot's checksum. A bad key or slot anywhere:
        Error, nothing hashed or published."""
        ks, kbuf, lens, sl = self._publish_arrays(keys, slots, None)
        sums = (c_uint8 * (L.CHECKSUM_LEN * len(ks)))()
        st = (c_int32 * len(ks))()
        _check(L.lib().kvp_hash_publish_many(self._handle(), kbuf, lens, sl, len(ks), sums,
                                             L.KVP_PUBLISH_ONCE if once else 0,
                                             _int_field("once_for", once_for, 64), st),
               "kvp_hash_publish_many")
        raw = bytes(sums)
        return list(st), [raw[i:i + L.CHECKSUM_LEN] for i in range(0, len(raw), L.CHECKSUM_LEN)]

    @staticmethod
    def _publish_arrays(keys: Sequence[bytes], slots: Sequence[int],
                        checksums: Optional[Sequence[bytes]]) -> Tuple[Any, Any, Any, Any]:
        ks, kbuf, lens = _keys_arrays(keys)
        if len(slots) != len(ks) or (checksums is not None and len(checksums) != len(ks)):
            raise Error(L.KVP_ERR_INVALID, f"{len(ks)} keys, {len(slots)} slots, "
                        f"{'no' if checksums is None else len(checksums)} checksums")
        return ks, kbuf, lens, (c_uint32 * len(ks))(*[_int_field("slot", int(x), 32)
                                                       for x in slots])

    def slot_checksum(self, slot: int) -> bytes:
        """The checksum publish() would compute of region slot ``slot``,
        computed on this thread without the node's lock (the GIL is
        released): hash a block when it is written, publish it later."""
        sum_ = (c_uint8 * L.CHECKSUM_LEN)()
        _check(L.lib().kvp_slot_checksum(self._handle(), _int_field("slot", slot, 32), sum_),
               "kvp_slot_checksum")
        return bytes(sum_)

    def slot_checksums(self, slots: Sequence[int]) -> List[bytes]:
        """slot_checksum() of each slot in one call (the GIL is released
        once, not once per slot: taken back while another thread runs
        Python, each return may wait out the switch interval, 5 ms). A bad
        slot anywhere: Error, nothing hashed."""
        n = len(slots)
        sl = (c_uint32 * n)(*[_int_field("slot", int(x), 32) for x in slots])
        out = (c_uint8 * (L.CHECKSUM_LEN * n))()
        _check(L.lib().kvp_slot_checksums(self._handle(), sl, n, out), "kvp_slot_checksums")
        raw = bytes(out)
        return [raw[i:i + L.CHECKSUM_LEN] for i in range(0, len(raw), L.CHECKSUM_LEN)]

    def unpublish(self, key: bytes) -> Tuple[bool, int]:
        """Stop serving ``key``: (True, slot) when the slot is the caller's
        now; (False, slot) when a transfer or lookup still pins it (the
        SLOT_FREE event with op_id = slot follows). Error(KVP_ERR_NOT_FOUND)
        when not published."""
        k = _key_bytes(key)
        slot = c_uint32()
        st = L.lib().kvp_unpublish(self._handle(), k, len(k), ctypes.byref(slot))
        if st == L.KVP_ERR_BUSY:
            return False, slot.value
        _check(st, "kvp_unpublish")
        return True, slot.value

    def slots_held(self, first: int = 0, count: Optional[int] = None) -> bytes:
        """Per slot from ``first``: 0 = the caller's, 1 = lent to a load,
        2 = published."""
        n = self.num_blocks - first if count is None else count
        buf = (c_uint8 * max(n, 1))()
        _check(L.lib().kvp_slots_held(self._handle(), _int_field("first", first, 32),
                                      _int_field("count", n, 32), buf), "kvp_slots_held")
        return bytes(buf[:n])

    def wanted_keys(self, op_id: int, cap: int = L.LIST_MAX) -> Optional[List[bytes]]:
        """The keys a WANTED event's op still wants (peer bytes: untrusted),
        or None when the op is answered already (done or its deadline).
        ``cap``: at most this many; pass the event's ``n_keys`` (the op
        never wants more than it raised): the buffer is cap x KEY_MAX bytes,
        4 MiB at the default, which cost ~5 ms per op (issue 29)."""
        cap = max(1, min(int(cap), L.LIST_MAX))
        kbuf = (c_uint8 * (cap * L.KEY_MAX))()
        lens = (c_uint32 * cap)()
        n = c_uint32()
        st = L.lib().kvp_wanted_keys(self._handle(), _u64(op_id, "op_id"), kbuf, lens, cap,
                                     ctypes.byref(n))
        if st == L.KVP_ERR_NOT_FOUND:
            return None
        _check(st, "kvp_wanted_keys")
        return _keys_of(kbuf, lens, n.value)

    def parked_keys(self, cap: int = 64) -> List[bytes]:
        """The keys parked FETCHes wait for (a consumer's wait-for-supply;
        peer bytes: untrusted), at most ``cap``: publish those held."""
        cap = max(1, min(int(cap), L.LIST_MAX))
        kbuf = (c_uint8 * (cap * L.KEY_MAX))()
        lens = (c_uint32 * cap)()
        n = c_uint32()
        _check(L.lib().kvp_parked_keys(self._handle(), kbuf, lens, cap, ctypes.byref(n)),
               "kvp_parked_keys")
        return _keys_of(kbuf, lens, n.value)

    def wanted_done(self, op_id: int) -> bool:
        """Answer a WANTED op now with what is published: True; False when
        it was answered already (every key published, or its deadline)."""
        st = L.lib().kvp_wanted_done(self._handle(), _u64(op_id, "op_id"))
        if st == L.KVP_ERR_NOT_FOUND:
            return False
        _check(st, "kvp_wanted_done")
        return True


def _ms(timeout: float) -> int:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError("timeout must be a number of seconds")
    return max(0, min(int(timeout * 1000), 2**31 - 1))
