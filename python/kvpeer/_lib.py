"""ctypes declarations of include/kvpeer.h and the loader of libkvpeer.so.

Every struct mirrors the C header field by field (ctypes applies the same
natural alignment as the C compiler); tests/test_layout.py checks sizes and
offsets against the real header when a C compiler is present.

Library search order (first hit wins):
  1. $KVPEER_LIB                      full path of libkvpeer.so
  2. $KVPEER_BUILD_DIR/libkvpeer.so   a CMake build directory
  3. the build tree next to this package (../../build/<dir>/libkvpeer.so),
     preferring build/release, then build/debug, then any other build dir
     (newest first); a sanitizer build (ASan/TSan, e.g. build/debug after
     `make test`) is skipped unless its runtime is already loaded into this
     process (LD_PRELOAD), since dlopen'ing it into a plain python3 aborts
  4. ctypes.util.find_library("kvpeer") (an installed library)
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_int,
    c_int32,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Iterator, List, Optional

# ------------------------------------------------------------------ statuses
KVP_OK = 0
KVP_ERR_LIMIT = -9
STATUS_NAMES = {
    0: "KVP_OK",
    -1: "KVP_ERR_INVALID",
    -2: "KVP_ERR_NOMEM",
    -3: "KVP_ERR_NOSPACE",
    -4: "KVP_ERR_EXISTS",
    -5: "KVP_ERR_PENDING",
    -6: "KVP_ERR_NOT_FOUND",
    -7: "KVP_ERR_STALE",
    -8: "KVP_ERR_STATE",
    -9: "KVP_ERR_LIMIT",
    -10: "KVP_ERR_PROTO",
    -11: "KVP_ERR_IO",
    -12: "KVP_ERR_TIMEOUT",
    -13: "KVP_ERR_CLOSED",
    -14: "KVP_ERR_INCOMPATIBLE",
    -15: "KVP_ERR_AUTH",
    -16: "KVP_ERR_TRANSPORT",
    -17: "KVP_ERR_UNSUPPORTED",
    -18: "KVP_ERR_CANCELED",
    -19: "KVP_ERR_CHECKSUM",
    -20: "KVP_ERR_BUSY",
    -21: "KVP_ERR_UNREACHABLE",
    -22: "KVP_ERR_TRUNCATED",
}
# Module-level constants KVP_ERR_INVALID = -1, ... generated from the table.
globals().update({name: code for code, name in STATUS_NAMES.items()})

KVP_TRANSPORT_UCX = 0
KVP_TRANSPORT_FAKE = 1
KVP_THREAD_OWN = 0
KVP_THREAD_CALLER = 1
KVP_FETCH_FLAG_WAIT_FOR_SUPPLY = 1
KVP_PUBLISH_ONCE = 1  # kvp_publish_many flags
KVP_FETCH_FLAG_HINT = 2

KVP_EV_LOOKUP = 1
KVP_EV_LOAD = 2
KVP_EV_PEER_UP = 3
KVP_EV_PEER_DOWN = 4
KVP_EV_OVERFLOW = 5
KVP_EV_SLOTS_RELEASED = 6  # issue 29: external slots
KVP_EV_SLOT_FREE = 7
KVP_EV_WANTED = 8          # issue 29 step 2: keys wanted

CHECKSUM_LEN = 16  # kvpeer.h KVP_CHECKSUM_LEN
KEY_MAX = 64         # SPEC §1: keys are 1..64 bytes
PEER_MAX = 255       # SPEC §4: strings <= 255 bytes
LIST_MAX = 65536     # SPEC §4: every list <= 65 536 items


# ------------------------------------------------------------------ structs
class kvp_config_t(Structure):
    """Mirror of kvp_config_t. c_char_p fields borrow Python bytes: keep them
    referenced until kvp_node_create returns (the node copies what it keeps)."""

    _fields_ = [
        ("name", c_char_p),
        ("listen_addr", c_char_p),
        ("peer_id", c_char_p),
        ("instance_id", c_char_p),
        ("num_blocks", c_uint32),
        ("block_size", c_uint32),
        ("compat", c_char_p),
        ("hash_seed", c_uint64),
        ("psk", c_void_p),
        ("psk_len", c_uint32),
        ("transport", c_int32),
        ("thread_mode", c_int32),
        ("region", c_void_p),
        ("region_len", c_uint64),
        ("verify_checksums", c_uint8),
        ("huge_pages", c_uint8),
        ("reserved0", c_uint16),
        ("heartbeat_ms", c_uint32),
        ("dead_after_ms", c_uint32),
        ("handshake_timeout_ms", c_uint32),
        ("lookup_pending_ms", c_uint32),
        ("supply_pin_ms", c_uint32),
        ("load_timeout_ms", c_uint32),
        ("abort_resend_ms", c_uint32),
        ("abort_ack_timeout_ms", c_uint32),
        ("parked_demand_ms", c_uint32),
        ("hold_cap_ms", c_uint32),
        ("suspect_period_ms", c_uint64),
        ("idle_session_ms", c_uint32),
        ("shutdown_drain_ms", c_uint32),
        ("max_sessions", c_uint32),
        ("max_pins", c_uint32),
        ("max_retained", c_uint32),
        ("max_quarantined", c_uint32),
        ("max_inflight_bytes_per_peer", c_uint64),
        ("backoff_min_ms", c_uint32),
        ("backoff_max_ms", c_uint32),
        ("pin_lease_ms", c_uint32),
        ("wait_spin_us", c_uint32),
        ("kv_events_endpoint", c_char_p),
        ("kv_events_replay_endpoint", c_char_p),
        ("kv_events_hwm", c_uint32),
        ("kv_events_replay_batches", c_uint32),
        # per-peer budgets (issue 27)
        ("max_supply_pins_per_peer", c_uint32),
        ("max_supply_pins", c_uint32),
        ("max_lookup_rounds_per_peer", c_uint32),
        ("max_lease_ms", c_uint32),
        ("max_lookup_bytes_per_peer", c_uint64),
        ("max_quarantined_per_peer", c_uint32),
        ("max_wanted_peers", c_uint32),
        # issue 27: the control plane's gate
        ("insecure", c_uint8),
        ("reserved1", c_uint8 * 3),
        ("max_preauth", c_uint32),
        ("max_preauth_per_addr", c_uint32),
        ("preauth_timeout_ms", c_uint32),
        ("data_port", c_uint32),  # issue 27: kvpeer's own tcp data stream
        # issue 27: the LOOKUP key rate (0 = no limit)
        ("max_lookup_keys_per_sec", c_uint32),
        # issue 29: external slots (the region and its slots are the embedding's)
        ("external_slots", c_uint32),
        # issue 29 step 2: keys wanted (KVP_EV_WANTED; needs external_slots)
        ("external_wanted", c_uint32),
        ("max_wanted_ops_per_peer", c_uint32),
    ]


class kvp_block_t(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("len", c_uint64),
        ("slot", c_uint32),
        ("gen", c_uint32),
    ]


class kvp_event_t(Structure):
    _fields_ = [
        ("type", c_int32),
        ("status", c_int32),
        ("op_id", c_uint64),
        ("request_id", c_uint64),
        ("n_keys", c_uint32),
        ("n_ok", c_uint32),
        ("fault", c_uint32),
        ("n_held", c_uint32),  # issue 29: LOAD of kvp_fetch_into, slots still held
        ("peer", c_char * 256),
    ]


STATS_FIELDS = (
    "slots_free slots_filling slots_ready slots_quarantined slots_suspect "
    "pins lookups_hit lookups_miss lookups_pending "
    "fetches_ok fetches_failed fetches_aborted "
    "blocks_in bytes_in blocks_out bytes_out "
    "transfer_latency_ns_sum transfers_done "
    "sessions_ready sessions_handshaking "
    "retained_transfers quarantined_slots force_releases "
    "checksum_mismatches stale_frames protocol_errors peers_down "
    "probations evictions loads_inflight "
    "sessions_refused pins_refused fetches_queued fetches_refused_inflight "
    "fetches_refused_quarantine fetches_refused_retained "
    "leases_renewed leases_expired lease_pins_expired fetch_hints_stale "
    "kv_event_batches kv_event_batches_dropped kv_events kv_event_replays "
    "am_refuse_releases late_bytes_dropped am_bytes_landed "
    "released_terminal released_fetch_done released_abort_ack released_fence "
    "released_am_refuse released_hold_cap released_not_sent "
    "waits_led "
    "supply_pins supply_pins_refused lookups_refused_limit rounds_refused lookup_bytes "
    "leases_capped lookups_limited peers_add_refused insecure "
    "lookup_keys_refused data_streams_open data_streams_refused "
    "released_process_exit "  # issue 27
    "bytes_copied_in bytes_copied_out "  # issue 29
    "wanted_ops wanted_keys wanted_keys_missed wanted_expired wanted_refused "  # 29 step 2
    "cma_bytes_written cma_writes_failed "  # issue 29 item 4
    "loads_landing_awaited loads_verified_later loads_verify_queued"
).split()


class kvp_stats_t(Structure):
    _fields_ = [(f, c_uint64) for f in STATS_FIELDS]


class kvp_held_item_t(Structure):
    _fields_ = [
        ("kind", c_int32),
        ("slot", c_uint32),
        ("id", c_uint64),
        ("age_ms", c_uint64),
        ("peer", c_char * 256),
    ]


class kvp_peer_info_t(Structure):
    _fields_ = [
        ("peer", c_char * 256),
        ("instance", c_char * 256),
        ("data_path", c_char * 32),
        ("ready", c_uint32),
        ("probation", c_uint32),
        ("rtt_ns", c_uint64),
        ("loads_inflight", c_uint64),
        ("bytes_inflight", c_uint64),
    ]


class kvp_peer_state_t(Structure):
    _fields_ = [
        ("peer", c_char * 256),
        ("state", c_char * 16),
        ("last_error", c_char * 128),
        ("wanted", c_uint32),
        ("failures", c_uint32),
    ]


REFUSAL_FIELDS = ("dials dial_failures handshakes_timed_out refused_incompatible "
                  "refused_auth refused_duplicate refused_limit peers_dead "
                  "refused_preauth refused_identity accept_fd_exhausted").split()


class kvp_refusal_stats_t(Structure):
    _fields_ = [(f, c_uint64) for f in REFUSAL_FIELDS]


# void (*kvp_log_fn)(int32_t level, const char *component, const char *line, void *arg)
LOG_FN = CFUNCTYPE(None, c_int32, c_char_p, c_char_p, c_void_p)


# ------------------------------------------------------------------ loading
def _package_build_candidates(build: Optional[Path] = None) -> Iterator[Path]:
    """libkvpeer.so files in <repo>/build/*/ when this package runs from the
    source tree (python/kvpeer/_lib.py -> <repo>/build)."""
    if build is None:
        build = Path(__file__).resolve().parent.parent.parent / "build"
    if not build.is_dir():
        return
    for pref in ("release", "debug"):
        p = build / pref / "libkvpeer.so"
        if p.exists():
            yield p
    others = [p for p in build.glob("*/libkvpeer.so")
              if p.parent.name not in ("release", "debug")]
    others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    yield from others


_SANITIZER_RUNTIMES = ((b"libasan.so", "libasan"), (b"libtsan.so", "libtsan"))


def sanitizer_runtime(path: "os.PathLike[str] | str") -> Optional[str]:
    """'libasan' / 'libtsan' if the library at ``path`` needs that sanitizer
    runtime (its name appears among the ELF's needed libraries), else None."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    for needle, name in _SANITIZER_RUNTIMES:
        if needle in data:
            return name
    return None


def _runtime_loaded(name: str) -> bool:
    """Is the sanitizer runtime ``name`` mapped into this process?"""
    try:
        with open("/proc/self/maps") as f:
            return any(name + ".so" in line for line in f)
    except OSError:
        return False


def _usable(path: "os.PathLike[str] | str") -> Optional[str]:
    """None if the library can be loaded here; else why not."""
    rt = sanitizer_runtime(path)
    if rt is None or _runtime_loaded(rt):
        return None
    return (f"{path} is a sanitizer build (needs {rt}, which is not loaded in this "
            f"process; loading it would abort python). Build a plain library "
            f"(`make release`), point KVPEER_LIB at one, or preload the runtime: "
            f"LD_PRELOAD=$(cc -print-file-name={rt}.so)")


def find_library() -> str:
    """The path (or soname) of libkvpeer.so following the documented order;
    raises OSError naming what was tried when nothing is found."""
    tried: List[str] = []
    env = os.environ.get("KVPEER_LIB")
    if env:
        if os.path.exists(env):
            return env
        tried.append(env)
    bdir = os.environ.get("KVPEER_BUILD_DIR")
    if bdir:
        p = os.path.join(bdir, "libkvpeer.so")
        if os.path.exists(p):
            return p
        tried.append(p)
    skipped: List[str] = []
    for p in _package_build_candidates():
        why = _usable(p)
        if why is None:
            return str(p)
        skipped.append(why)
    tried.append("<repo>/build/*/libkvpeer.so")
    found = ctypes.util.find_library("kvpeer")
    if found:
        return found
    tried.append('ctypes.util.find_library("kvpeer")')
    if skipped:
        raise OSError("no loadable libkvpeer.so: " + "; ".join(skipped))
    raise OSError("libkvpeer.so not found; tried: " + ", ".join(tried) +
                  " (set KVPEER_LIB to its full path)")


def _declare(lib: ctypes.CDLL) -> None:
    """Argument and result types of every kvpeer.h function."""
    node_p = c_void_p
    st = c_int32
    u8p = POINTER(c_uint8)
    u32p = POINTER(c_uint32)
    protos = {
        "kvp_status_str": (c_char_p, [c_int32]),
        "kvp_set_log_level": (None, [c_int32]),
        "kvp_config_init": (None, [POINTER(kvp_config_t)]),
        "kvp_node_create": (st, [POINTER(kvp_config_t), POINTER(c_void_p)]),
        "kvp_node_destroy": (None, [node_p]),
        "kvp_node_peer_id": (c_char_p, [node_p]),
        "kvp_node_fd": (c_int, [node_p]),
        "kvp_node_progress": (st, [node_p, c_int32]),
        "kvp_peer_add": (st, [node_p, c_char_p]),
        "kvp_peer_remove": (st, [node_p, c_char_p]),
        "kvp_peer_forget": (st, [node_p, c_char_p]),
        "kvp_put": (st, [node_p, c_void_p, c_uint32, c_void_p, c_uint64, c_uint64]),
        "kvp_get": (st, [node_p, c_void_p, c_uint32, POINTER(kvp_block_t)]),
        "kvp_release": (st, [node_p, POINTER(kvp_block_t)]),
        "kvp_blocks_copy": (st, [node_p, POINTER(kvp_block_t), c_uint32, POINTER(c_void_p),
                                 POINTER(c_uint64)]),
        "kvp_lookup": (st, [node_p, c_char_p, c_uint64, u8p, u32p, c_uint32, u8p,
                            POINTER(c_uint64)]),
        "kvp_lookup_prefix": (st, [node_p, c_char_p, c_uint64, u8p, u32p, c_uint32, u8p,
                                   POINTER(c_uint64)]),
        "kvp_lease_renew": (st, [node_p, c_char_p, c_uint64]),
        "kvp_node_kv_events_endpoint": (ctypes.c_char_p, [node_p, ctypes.c_int32]),
        "kvp_fetch": (st, [node_p, c_char_p, c_uint64, u8p, u32p, c_uint32, c_uint32,
                           POINTER(c_int32), POINTER(c_uint64)]),
        "kvp_cancel": (st, [node_p, c_uint64]),
        "kvp_finish_request": (st, [node_p, c_uint64]),
        "kvp_poll_events": (st, [node_p, POINTER(kvp_event_t), c_uint32, u32p]),
        "kvp_wait_events": (st, [node_p, POINTER(kvp_event_t), c_uint32, u32p, c_int32]),
        "kvp_node_stats": (st, [node_p, POINTER(kvp_stats_t)]),
        "kvp_node_stall_ms": (c_uint64, [node_p]),
        "kvp_node_held": (st, [node_p, POINTER(kvp_held_item_t), c_uint32, u32p]),
        "kvp_node_peers": (st, [node_p, POINTER(kvp_peer_info_t), c_uint32, u32p]),
        "kvp_last_error": (c_char_p, []),
        "kvp_version": (c_char_p, []),
        "kvp_get_log_level": (c_int32, []),
        "kvp_set_log_callback": (None, [LOG_FN, c_void_p]),
        # issue 27: peer-chosen text made safe for a log line or a page
        "kvp_escape": (ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p,
                                         ctypes.c_size_t, c_uint32]),
        "kvp_peer_wait": (st, [node_p, c_char_p, c_int32]),
        "kvp_node_reconfigure": (st, [node_p, POINTER(kvp_config_t)]),
        "kvp_node_peer_states": (st, [node_p, POINTER(kvp_peer_state_t), c_uint32, u32p]),
        "kvp_node_refusals": (st, [node_p, POINTER(kvp_refusal_stats_t)]),
        "kvp_psk_load": (st, [c_char_p, u8p, c_uint32, u32p]),  # issue 27
        # issue 29: external slots
        "kvp_fetch_into": (st, [node_p, c_char_p, c_uint64, u8p, u32p, c_uint32, u32p,
                                c_uint32, POINTER(c_int32), POINTER(c_uint64)]),
        "kvp_publish": (st, [node_p, c_void_p, c_uint32, c_uint32]),
        "kvp_unpublish": (st, [node_p, c_void_p, c_uint32, u32p]),
        "kvp_slots_held": (st, [node_p, c_uint32, c_uint32, u8p]),
        "kvp_slot_checksum": (st, [node_p, c_uint32, u8p]),
        "kvp_slot_checksums": (st, [node_p, u32p, c_uint32, u8p]),
        "kvp_publish_checksum": (st, [node_p, c_void_p, c_uint32, c_uint32, u8p]),
        "kvp_publish_once": (st, [node_p, c_void_p, c_uint32, c_uint32, u8p, c_uint64]),
        "kvp_publish_many": (st, [node_p, u8p, u32p, u32p, c_uint32, u8p, c_uint32,
                                  c_uint64, POINTER(c_int32)]),
        "kvp_hash_publish_many": (st, [node_p, u8p, u32p, u32p, c_uint32, u8p, c_uint32,
                                       c_uint64, POINTER(c_int32)]),
        # issue 29 step 2: keys wanted
        "kvp_wanted_keys": (st, [node_p, c_uint64, u8p, u32p, c_uint32, u32p]),
        "kvp_wanted_done": (st, [node_p, c_uint64]),
        "kvp_parked_keys": (st, [node_p, u8p, u32p, c_uint32, u32p]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


_LIB: Optional[ctypes.CDLL] = None
_LIB_PATH: Optional[str] = None


def lib() -> ctypes.CDLL:
    """The loaded, declared library (loaded once, on first use)."""
    global _LIB, _LIB_PATH
    if _LIB is None:
        path = find_library()
        why = _usable(path) if os.path.isabs(path) else None
        if why is not None:  # an explicit KVPEER_LIB / KVPEER_BUILD_DIR choice
            raise OSError("cannot load " + why)
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            raise OSError(f"cannot load {path}: {e} (a sanitizer build needs its "
                          "runtime in LD_PRELOAD; build a plain one for Python)") from e
        _declare(handle)
        _LIB, _LIB_PATH = handle, path
    return _LIB


def lib_path() -> Optional[str]:
    """Where the library was loaded from (None before the first use)."""
    return _LIB_PATH
