"""The local API of kvpeer.Node: put/get, zero-copy views and their
lifetime, events fd, config, and bad input (clear exceptions, no crash)."""
from __future__ import annotations

import asyncio
import ctypes
import gc
import selectors
import time

import pytest

import kvpeer
from kvpeer import _lib as L

BS = 65536


def test_put_get_zero_copy_view(node_factory):
    n = node_factory()
    data = bytes(range(256)) * 16
    n.put(b"k", data)
    with n.get(b"k") as b:
        v = b.view
        assert v.readonly and v.format == "B" and len(v) == BS == len(b)
        assert v[: len(data)] == data and not any(v[len(data):])  # zero-padded
        assert n.stats()["pins"] == 1
        # zero copy: the view's address is the pinned slot's data pointer
        assert ctypes.addressof(v.obj) == b._cb.data
        with pytest.raises(TypeError):
            v[0] = 1  # read-only
    assert b.released and n.stats()["pins"] == 0


def test_put_accepts_buffers_without_copy_needs(node_factory):
    n = node_factory()
    n.put(b"a", bytearray(b"A" * 100))
    n.put(bytearray(b"b"), memoryview(b"B" * BS))
    with n.get(b"a") as a:
        n.put(b"c", a.view)  # a read-only view of another slot
    assert n.get(b"c").tobytes()[:100] == b"A" * 100
    with pytest.raises(kvpeer.Error) as ei:
        n.put(b"a", b"again")
    assert ei.value.status == kvpeer.KVP_ERR_EXISTS


def test_view_after_release_raises(node_factory):
    n = node_factory()
    n.put(b"k", b"data")
    b = n.get(b"k")
    v = b.view
    b.release()
    with pytest.raises(ValueError):
        v[0]
    with pytest.raises(ValueError):
        bytes(v)
    with pytest.raises(kvpeer.Error) as ei:
        b.view
    assert ei.value.status == kvpeer.KVP_ERR_STALE
    with pytest.raises(kvpeer.Error):
        b.release()
    with pytest.raises(kvpeer.Error):
        b.tobytes()
    assert n.stats()["pins"] == 0


def test_derived_view_keeps_the_pin(node_factory):
    n = node_factory()
    n.put(b"k", b"0123456789")
    b = n.get(b"k")
    part = b.view[2:6]
    with pytest.raises(kvpeer.Error) as ei:
        b.release()
    assert ei.value.status == kvpeer.KVP_ERR_BUSY
    assert n.stats()["pins"] == 1 and part == b"2345"  # still safe to read
    with pytest.raises(kvpeer.Error) as ei:
        n.close()  # refuses to unmap under a live view
    assert ei.value.status == kvpeer.KVP_ERR_BUSY and not n.closed
    del part
    b.release()
    assert n.stats()["pins"] == 0


def test_exported_view_keeps_the_pin(node_factory):
    n = node_factory()
    n.put(b"k", b"abc")
    b = n.get(b"k")
    holder = memoryview(b.view)  # a second view on the same buffer
    with pytest.raises(kvpeer.Error):
        b.release()
    holder.release()
    b.release()
    assert n.stats()["pins"] == 0


def test_dropped_block_unpins(node_factory):
    n = node_factory()
    n.put(b"k", b"abc")
    v = n.get(b"k").view  # the Block lives as long as its view
    assert n.stats()["pins"] == 1 and v[:3] == b"abc"
    del v
    gc.collect()
    assert n.stats()["pins"] == 0
    n.get(b"k")  # dropped at once
    gc.collect()
    assert n.stats()["pins"] == 0


def test_copy_blocks_in_one_call(node_factory):
    """Node.copy_blocks: pinned blocks into writable buffers (each at most
    its buffer's size) in one C call; another node's block is refused with
    nothing copied; a released block is STALE; counts must match."""
    n, m = node_factory(), node_factory()
    n.put(b"a", b"A" * 100)
    n.put(b"b", b"B" * 100)
    m.put(b"c", b"C" * 100)
    ba, bb, bc = n.get(b"a"), n.get(b"b"), m.get(b"c")
    d0, d1 = bytearray(8), bytearray(4)
    with pytest.raises(kvpeer.Error) as ei:
        n.copy_blocks([ba, bc], [d0, d1])  # bc is m's
    assert ei.value.status == kvpeer.KVP_ERR_INVALID and d0 == bytearray(8)
    with pytest.raises(kvpeer.Error):
        n.copy_blocks([ba], [d0, d1])
    n.copy_blocks([ba, bb], [d0, d1])
    assert d0 == b"A" * 8 and d1 == b"B" * 4
    bb.release()
    with pytest.raises(kvpeer.Error) as ei:
        n.copy_blocks([bb], [d1])
    assert ei.value.status == kvpeer.KVP_ERR_STALE
    ba.release()
    bc.release()
    assert n.stats()["pins"] == 0 and m.stats()["pins"] == 0


def test_get_missing_is_not_found(node_factory):
    n = node_factory()
    with pytest.raises(kvpeer.Error) as ei:
        n.get(b"nope")
    e = ei.value
    assert e.status == kvpeer.KVP_ERR_NOT_FOUND == -6
    assert e.status_name == "KVP_ERR_NOT_FOUND" and e.status_str in str(e) and e.status_str
    assert not n.contains(b"nope")


@pytest.mark.parametrize("key", [b"", b"x" * 65, bytearray(), memoryview(b"y" * 100)])
def test_bad_key_length(node_factory, key):
    n = node_factory()
    for call in (lambda: n.put(key, b"d"), lambda: n.get(key),
                 lambda: n.lookup("127.0.0.1:9", [key], 1),
                 lambda: n.fetch("127.0.0.1:9", [key], 1)):
        with pytest.raises(kvpeer.Error) as ei:
            call()
        assert ei.value.status == kvpeer.KVP_ERR_INVALID
    n.put(b"x" * 64, b"d")  # 64 is fine
    assert n.contains(b"x" * 64)


def test_bad_types(node_factory):
    n = node_factory()
    bad = [
        lambda: n.put("str-key", b"d"),
        lambda: n.put(b"k", "str-data"),
        lambda: n.put(b"k", 12),
        lambda: n.put(b"k", None),
        lambda: n.put(b"k", memoryview(b"abcdef")[::2]),  # not contiguous
        lambda: n.put(b"k", b"d", request_id="7"),
        lambda: n.get(42),
        lambda: n.lookup(b"127.0.0.1:9", [b"k"], 1),
        lambda: n.lookup("127.0.0.1:9", b"k", 1),  # a key, not a list of keys
        lambda: n.lookup("127.0.0.1:9", [b"k"], None),
        lambda: n.fetch("127.0.0.1:9", [b"k", 3], 1),
        lambda: n.cancel("1"),
        lambda: n.finish_request(1.5),
        lambda: n.events(timeout="soon").__next__(),
        lambda: kvpeer.Node(num_blocks="many"),
        lambda: kvpeer.Node(no_such_option=1),
        lambda: kvpeer.Node(name=b"bytes-name"),
    ]
    for call in bad:
        with pytest.raises(TypeError):
            call()
    with pytest.raises(kvpeer.Error) as ei:
        n.put(b"k", b"x" * (BS + 1))
    assert ei.value.status == kvpeer.KVP_ERR_INVALID
    with pytest.raises(kvpeer.Error):
        n.put(b"k", b"")
    with pytest.raises(kvpeer.Error):
        n.finish_request(-1)
    with pytest.raises(kvpeer.Error):
        n.lookup("127.0.0.1:9", [], 1)
    with pytest.raises(kvpeer.Error):
        n.lookup("", [b"k"], 1)
    with pytest.raises(kvpeer.Error) as ei:
        n.wait(12345, 0.1)
    assert ei.value.status == kvpeer.KVP_ERR_NOT_FOUND
    with pytest.raises(kvpeer.Error):
        n.cancel(999)  # no such load
    with pytest.raises(kvpeer.Error):
        n.progress(0)  # own-thread mode
    assert n.stats()["pins"] == 0  # nothing changed


def test_bad_config_from_c(node_factory):
    for kw in (dict(block_size=1000), dict(num_blocks=0), dict(transport="carrier-pigeon"),
               dict(heartbeat_ms=5000, dead_after_ms=1000), dict(transport=7),
               dict(hold_cap_ms=0), dict(peer_id="")):
        with pytest.raises(kvpeer.Error) as ei:
            node_factory(**kw)
        assert ei.value.status < 0
    with pytest.raises(kvpeer.Error):
        node_factory(num_blocks=-1)


BAD_ADDR_SNIPPET = """
import kvpeer
try:
    kvpeer.Node(num_blocks=8, block_size=65536, listen_addr="not-an-address")
except kvpeer.Error as e:
    print("status", e.status)
"""


def test_bad_listen_addr_is_a_clean_error():
    """In a child process: a failing kvp_node_create must return an error,
    not abort (it once aborted in ctl/loop.c heap_remove: hold timer stopped before init)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", BAD_ADDR_SNIPPET], capture_output=True, text=True,
                       timeout=30, env={**__import__("os").environ,
                                        "PYTHONPATH": str(__import__("pathlib").Path(
                                            kvpeer.__file__).parent.parent)})
    assert r.returncode == 0, "libkvpeer aborted on a bad listen_addr: " + r.stderr.strip()[-200:]
    assert "status -" in r.stdout


def test_port_in_use_names_the_cause():
    """A listen port already taken: the error names the key, the address and
    the system's reason (EADDRINUSE), not only "i/o error"."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        addr = "127.0.0.1:%d" % s.getsockname()[1]
        with pytest.raises(kvpeer.Error) as ei:
            kvpeer.Node(num_blocks=8, block_size=BS, listen_addr=addr)
    msg = str(ei.value)
    assert ei.value.status == kvpeer.KVP_ERR_IO
    assert "listen_addr " + addr in msg and "Address already in use" in msg, msg


def test_use_after_close():
    n = kvpeer.Node(num_blocks=8, block_size=BS)
    n.put(b"k", b"d")
    b = n.get(b"k")
    v = b.view
    n.close()
    assert n.closed and b.released  # close released the block
    with pytest.raises(ValueError):
        v[0]
    n.close()  # idempotent
    for call in (lambda: n.put(b"k", b"d"), lambda: n.get(b"k"), lambda: n.stats(),
                 lambda: n.lookup("127.0.0.1:9", [b"k"], 1), lambda: n.fileno(),
                 lambda: n.finish_request(1), lambda: n.peers(), lambda: n.held(),
                 lambda: n.add_peer("127.0.0.1:9"), lambda: list(n.events(0))):
        with pytest.raises(kvpeer.Error) as ei:
            call()
        assert ei.value.status == kvpeer.KVP_ERR_CLOSED
    with kvpeer.Node(num_blocks=8, block_size=BS) as m:
        pass
    assert m.closed


def test_config_defaults_mirror_c():
    d = kvpeer.config_defaults()
    assert d["num_blocks"] == 1024 and d["block_size"] == 256 * 1024
    assert d["listen_addr"] == "127.0.0.1:0" and d["hold_cap_ms"] == 120000
    assert set(d) == set(kvpeer.CONFIG_FIELDS)


def test_caller_driven_mode(node_factory):
    a = node_factory(thread_mode="caller")
    b = node_factory()
    b.put(b"k", b"caller")
    a.add_peer(b.peer_id)
    ev = next(e for e in a.events(timeout=10) if e.type == kvpeer.EventType.PEER_UP)
    assert ev.peer == b.peer_id
    lk = a.wait(a.lookup(b.peer_id, [b"k"], 3), 10)
    assert lk.results == [True]
    ld = a.wait(a.fetch(b.peer_id, [b"k"], 3), 10).raise_for_status()
    assert a.get(b"k").tobytes()[:6] == b"caller" and ld.n_ok == 1


def test_fileno_with_selectors_and_asyncio(node_factory):
    a = node_factory()
    b = node_factory()
    a.add_peer(b.peer_id)
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ)
    assert sel.select(10)  # PEER_UP arrives
    sel.close()
    assert any(e.type == kvpeer.EventType.PEER_UP for e in a.poll(0))

    async def main() -> kvpeer.Event:
        loop = asyncio.get_running_loop()
        got: asyncio.Future = loop.create_future()

        def ready() -> None:
            for e in a.poll(0):
                if e.type == kvpeer.EventType.LOOKUP and not got.done():
                    got.set_result(e)

        loop.add_reader(a.fileno(), ready)
        try:
            b.put(b"z", b"zz")
            a.lookup(b.peer_id, [b"z"], 9)
            return await asyncio.wait_for(got, 10)
        finally:
            loop.remove_reader(a.fileno())

    ev = asyncio.run(main())
    assert ev.results == [True] and ev.request_id == 9
    a.finish_request(9)


def test_held_and_peers_inspection(node_factory):
    a = node_factory()
    assert a.held() == [] and a.peers() == []
    assert a.peer_id.startswith("127.0.0.1:") and repr(a).startswith("<kvpeer.Node")


def test_status_str_covers_every_code():
    for code, name in L.STATUS_NAMES.items():
        assert kvpeer.status_str(code)
        assert getattr(kvpeer, name) == code


def test_threads_share_a_node(node_factory):
    """Puts, gets and releases from several threads while another waits for
    events: the lock and the GIL-free C calls hold together."""
    import threading
    n = node_factory(num_blocks=256)
    errors = []

    def worker(t: int) -> None:
        try:
            for i in range(40):
                k = b"t%d-%d" % (t, i)
                n.put(k, k * 8)
                with n.get(k) as b:
                    assert b.view[: len(k)] == k
        except Exception as e:  # surfaced below
            errors.append(e)

    def events() -> None:
        try:
            list(n.events(timeout=0.5))
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    threads.append(threading.Thread(target=events))
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == [] and n.stats()["pins"] == 0 and n.stats()["slots_ready"] == 160


def test_close_while_a_thread_waits(node_factory):
    """A thread waiting for events without a limit (kvp_wait_events, chunked)
    while another closes the node: the waiter gets Error(KVP_ERR_CLOSED),
    close() returns, nothing hangs or touches a freed node."""
    import threading
    n = node_factory()
    out = []

    def waiter() -> None:
        try:
            n.poll(None)
            out.append("returned")
        except kvpeer.Error as e:
            out.append(e.status)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)  # inside the wait
    t0 = time.monotonic()
    n.close()
    t.join(10)
    assert not t.is_alive() and out == [kvpeer.KVP_ERR_CLOSED]
    assert time.monotonic() - t0 < 5  # one wait chunk (50 ms), not the waiter's whole wait
    assert n.closed


def test_wait_runs_the_rounds(node_factory):
    """Node.wait() on lookups gets each lookup's answer; a wait with nothing
    ready runs in kvp_wait_events and leads while the node thread sleeps,
    counted in stats()["waits_led"] (an answer often beats the Python
    waiter into C, so the count is checked on waits that find nothing)."""
    a = node_factory()
    b = node_factory()
    b.put(b"k1", b"x" * 100)
    a.add_peer(b.peer_id)
    a.wait_peer(b.peer_id, 10)
    for req in range(1, 21):  # an answer may beat the waiter into C: several rounds
        op = a.lookup(b.peer_id, [b"k1", b"k2"], req)
        ev = a.wait(op, 10)
        assert ev.ok and ev.results == [True, False]
        a.finish_request(req)
    for _ in range(40):  # the node thread may be busy for a round: try again
        a.poll(0.02)
        if a.stats()["waits_led"] > 0:
            break
    assert a.stats()["waits_led"] > 0
