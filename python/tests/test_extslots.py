"""Issue 29, external slots, through the ctypes mirror (kvpeer._lib) only:
two nodes on 127.0.0.1 whose regions are this process's memory; the source
publishes a chunk it wrote, the consumer fetches it into a chunk it names,
byte-exact, with no copy counted; the new event field and calls line up
with the header (test_layout checks the layouts)."""
from __future__ import annotations

import ctypes
import gc
import mmap
import time

from kvpeer import _lib as L

NB, BS = 8, 64 * 1024


def _node(lib, region):
    cfg = L.kvp_config_t()
    lib.kvp_config_init(ctypes.byref(cfg))
    cfg.num_blocks, cfg.block_size = NB, BS
    cfg.listen_addr = b"127.0.0.1:0"
    cfg.external_slots = 1
    buf = (ctypes.c_uint8 * (NB * BS)).from_buffer(region)
    cfg.region = ctypes.cast(buf, ctypes.c_void_p)
    cfg.region_len = NB * BS
    node = ctypes.c_void_p()
    assert lib.kvp_node_create(ctypes.byref(cfg), ctypes.byref(node)) == 0
    return node, buf


def _wait(lib, node, etype, op_id, timeout=10.0):
    ev = L.kvp_event_t()
    got = ctypes.c_uint32()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if lib.kvp_wait_events(node, ctypes.byref(ev), 1, ctypes.byref(got), 50) == 0 and \
                got.value == 1 and ev.type == etype and ev.op_id == op_id:
            return ev
    raise AssertionError(f"no event {etype} for op {op_id}")


def test_fetch_into_published_chunk():
    lib = L.lib()
    rs, rd = mmap.mmap(-1, NB * BS), mmap.mmap(-1, NB * BS)
    src, sbuf = _node(lib, rs)
    dst, dbuf = _node(lib, rd)
    try:
        key = b"chunk-0042"
        rs[3 * BS:4 * BS] = bytes((i * 7) & 0xFF for i in range(BS))
        assert lib.kvp_publish(src, key, len(key), 3) == 0
        assert lib.kvp_publish(src, key, len(key), 4) == -4  # KVP_ERR_EXISTS
        peer = lib.kvp_node_peer_id(src)
        assert lib.kvp_peer_add(dst, peer) == 0
        assert lib.kvp_peer_wait(dst, peer, 10000) == 0
        keys = (ctypes.c_uint8 * len(key)).from_buffer_copy(key)
        lens = (ctypes.c_uint32 * 1)(len(key))
        slots = (ctypes.c_uint32 * 1)(6)
        status = (ctypes.c_int32 * 1)(99)
        op = ctypes.c_uint64()
        assert lib.kvp_fetch_into(dst, peer, 1, keys, lens, 1, slots, 1, status,
                                  ctypes.byref(op)) == 0  # WAIT_FOR_SUPPLY: no lookup first
        held = (ctypes.c_uint8 * NB)()
        assert lib.kvp_slots_held(dst, 0, NB, held) == 0
        ev = _wait(lib, dst, 2, op.value)  # KVP_EV_LOAD
        assert (ev.status, ev.n_ok, ev.n_held, status[0]) == (0, 1, 0, 0)
        assert rd[6 * BS:7 * BS] == rs[3 * BS:4 * BS]
        assert lib.kvp_slots_held(dst, 0, NB, held) == 0 and list(held) == [0] * NB
        st = L.kvp_stats_t()
        assert lib.kvp_node_stats(dst, ctypes.byref(st)) == 0
        assert (st.bytes_in, st.bytes_copied_in, st.bytes_copied_out) == (BS, 0, 0)
        slot = ctypes.c_uint32()
        assert lib.kvp_unpublish(src, key, len(key), ctypes.byref(slot)) == 0 and slot.value == 3
        lib.kvp_finish_request(dst, 1)
    finally:
        lib.kvp_node_destroy(dst)
        lib.kvp_node_destroy(src)
        del sbuf, dbuf  # the exported buffers, before the mappings close
        gc.collect()  # ctypes.cast keeps one in a cycle
        rs.close()
        rd.close()
