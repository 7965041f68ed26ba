"""Issue 18 (operators and bad input) from Python: the library that gets
loaded, settings that name their field, a quiet default log level."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvpeer
from kvpeer import _lib as L

HERE = Path(__file__).resolve().parent
PKG = str(HERE.parent)


def _plain_env() -> dict:
    """The environment of a plain python3: no sanitizer runtime preloaded."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "KVPEER_LIB", "KVPEER_BUILD_DIR")}
    env["PYTHONPATH"] = PKG
    return env


def test_sanitizer_build_skipped_for_a_plain_one(tmp_path):
    """Only `make test` ran (build/debug is ASan) and another plain build
    exists: the plain one is chosen, not the one that would abort python.
    Mutation: drop the _usable() check in find_library's candidate loop."""
    build = tmp_path / "build"
    (build / "debug").mkdir(parents=True)
    (build / "plain").mkdir()
    (build / "debug" / "libkvpeer.so").write_bytes(b"\x7fELF....libasan.so.8\0....")
    (build / "plain" / "libkvpeer.so").write_bytes(b"\x7fELF....libc.so.6\0....")
    cands = [p for p in L._package_build_candidates(build)]
    assert cands[0].parent.name == "debug"  # debug is preferred by name...
    usable = [p for p in cands if L._usable(p) is None]
    if L._runtime_loaded("libasan"):
        pytest.skip("libasan is preloaded into this test process")
    assert [p.parent.name for p in usable] == ["plain"]  # ...but skipped: ASan
    assert "sanitizer build" in L._usable(cands[0])
    assert "make release" in L._usable(cands[0])


def test_sanitized_library_gives_a_clear_error_not_an_abort():
    """KVPEER_LIB at an ASan library in a plain python3: an OSError naming
    the cause and the fix, never the ASan abort (exit by SIGABRT).
    Mutation: remove the _usable() check in lib()."""
    lib = os.environ.get("KVPEER_LIB") or L.lib_path() or L.find_library()
    if L.sanitizer_runtime(lib) is None:
        pytest.skip("this build's library is not sanitized")
    env = _plain_env()
    env["KVPEER_LIB"] = lib
    code = ("import kvpeer\n"
            "try:\n    kvpeer.Node(num_blocks=4, block_size=65536)\n"
            "except OSError as e:\n    print('OSERROR', e)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "OSERROR" in r.stdout and "sanitizer build" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("cfg,field", [
    (dict(block_size=1000), "block_size"),
    (dict(num_blocks=4, block_size=65536, heartbeat_ms=900, dead_after_ms=900), "dead_after_ms"),
    (dict(num_blocks=4, block_size=65536, psk=b"ab"), "psk"),
    (dict(num_blocks=1 << 31, block_size=1 << 30), "MemAvailable"),
])
def test_bad_settings_name_the_field(cfg, field):
    """Mutation: raise Error(st, 'kvp_node_create') without kvp_last_error."""
    with pytest.raises(kvpeer.Error) as ei:
        kvpeer.Node(**cfg)
    assert ei.value.status == L.KVP_ERR_INVALID
    assert field in str(ei.value), str(ei.value)


def test_unreachable_peer_listed_with_its_error():
    """A wanted peer nobody listens on is listed as failed with the reason;
    a string that is no address is refused at once.
    Mutation: do_peer_states listing sessions only (as kvp_node_peers)."""
    with kvpeer.Node(num_blocks=4, block_size=65536, backoff_min_ms=20,
                     backoff_max_ms=100) as n:
        with pytest.raises(kvpeer.Error) as ei:
            n.add_peer("notanaddress")
        assert ei.value.status == L.KVP_ERR_INVALID
        n.add_peer("127.0.0.1:1")
        import time
        end = time.monotonic() + 10
        st = []
        while time.monotonic() < end:
            st = [p for p in n.peer_states() if p.peer == "127.0.0.1:1"]
            if st and st[0].failures > 0:
                break
            time.sleep(0.02)
        assert st and st[0].wanted and st[0].state in ("failed", "dialing", "wanted"), st
        assert "refused" in st[0].last_error, st
        assert all(p.peer != "notanaddress" for p in n.peer_states())
        # doors2: forget_peer stops keeping an added peer across an idle
        # close (the want stays); a second forget finds nothing to forget
        n.forget_peer("127.0.0.1:1")
        with pytest.raises(kvpeer.Error) as ei:
            n.forget_peer("127.0.0.1:1")
        assert ei.value.status == L.KVP_ERR_NOT_FOUND
        assert any(p.peer == "127.0.0.1:1" and p.wanted for p in n.peer_states())


def test_ten_line_example_is_quiet():
    """The README's 10-line example prints its result and nothing on stderr
    at the default level (a library is quiet). Mutation: default level INFO
    in log.c (it printed 17 INFO lines)."""
    import re
    readme = (HERE.parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    env = _plain_env()
    for k in ("KVPEER_LIB", "LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "KVPEER_LOG_LEVEL"):
        if k in os.environ:
            env[k] = os.environ[k]
    env.pop("KVPEER_LOG_LEVEL", None)
    env["UCX_NET_DEVICES"] = os.environ.get("UCX_NET_DEVICES", "lo")
    r = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == "[True] True b'hello kvpeer'\n"
    assert r.stderr == "", r.stderr


def test_numeric_log_level_from_the_environment():
    """kvpeer.h documents KVPEER_LOG_LEVEL as a number. Mutation: the name-only
    parser of log_init_from_env."""
    env = {k: v for k, v in os.environ.items()}
    env["PYTHONPATH"] = PKG
    for val, want in (("3", 3), ("0", 0), ("debug", 3), ("warn", 1)):
        env["KVPEER_LOG_LEVEL"] = val
        r = subprocess.run([sys.executable, "-c",
                            "from kvpeer import _lib as L; print(L.lib().kvp_get_log_level())"],
                           capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(want), (val, r.stdout, r.stderr)


def test_wait_peer_timeout_says_why():
    """wait_peer on a peer nobody listens on times out naming the reason.
    Mutation: the bare 'no session with ADDR' message."""
    with kvpeer.Node(num_blocks=4, block_size=65536, backoff_min_ms=20,
                     backoff_max_ms=100) as n:
        with pytest.raises(kvpeer.Error) as ei:
            n.wait_peer("127.0.0.1:1", timeout=1.0)
        assert ei.value.status == L.KVP_ERR_TIMEOUT
        assert "refused" in str(ei.value), str(ei.value)


def test_lookup_at_a_budget_keeps_its_granted_hits():
    """Issue 27: a source answers a LOOKUP past one peer's supply-pin share
    with the limit flag (KVP_ERR_LIMIT) and the hits it did grant, pinned for
    the request. The event keeps them (they are fetchable), instead of
    reading as all-miss and leaving the pins to the lease.
    Mutation: results all False whenever the event is not ok."""
    cfg = dict(num_blocks=16, block_size=65536)
    with kvpeer.Node(max_supply_pins_per_peer=2, **cfg) as src, kvpeer.Node(**cfg) as dst:
        keys = [b"budget-%d" % i for i in range(4)]
        for k in keys:
            src.put(k, k * 8)
        dst.wait_peer(src.peer_id)
        ev = dst.wait(dst.lookup(src.peer_id, keys, request_id=7))
        assert ev.status == L.KVP_ERR_LIMIT, L.STATUS_NAMES.get(ev.status)
        assert sum(ev.results) == 2, ev.results
        granted = [k for k, hit in zip(keys, ev.results) if hit]
        load = dst.wait(dst.fetch(src.peer_id, granted, request_id=7))
        assert load.ok, L.STATUS_NAMES.get(load.status)
        with dst.get(granted[0]) as b:
            assert bytes(b.view[:len(granted[0]) * 8]) == granted[0] * 8
        dst.finish_request(7)


def test_lookup_key_rate_refusal_keeps_the_keys_granted_first():
    """Issue 27, the LOOKUP key rate: a source with max_lookup_keys_per_sec
    = 100 (a bucket one second deep) looks up only the first 100 keys of a
    LOOKUP of 150 and answers the rest MISS with the limit flag: the event
    says KVP_ERR_LIMIT and keeps the hits among the keys granted (they are
    fetchable); the source counts the keys it refused (about 50: the bucket
    refills meanwhile).
    Mutation: no limit flag for the keys past the rate (server_lookup.c
    r->limited) -> the event is ok."""
    cfg = dict(num_blocks=16, block_size=65536)
    with kvpeer.Node(max_lookup_keys_per_sec=100, **cfg) as src, kvpeer.Node(**cfg) as dst:
        keys = [b"rate-%d" % i for i in range(150)]
        for k in keys[:4]:
            src.put(k, k * 8)
        dst.wait_peer(src.peer_id)
        ev = dst.wait(dst.lookup(src.peer_id, keys, request_id=9))
        assert ev.status == L.KVP_ERR_LIMIT, L.STATUS_NAMES.get(ev.status)
        assert ev.results[:4] == [True] * 4 and sum(ev.results) == 4, ev.results
        refused = src.stats()["lookup_keys_refused"]
        assert 0 < refused <= 50, refused
        load = dst.wait(dst.fetch(src.peer_id, keys[:4], request_id=9))
        assert load.ok, L.STATUS_NAMES.get(load.status)
        dst.finish_request(9)
