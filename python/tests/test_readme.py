"""The README's examples work as written."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import kvpeer
from conftest import FAST

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_blocks() -> list:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_ten_line_example_runs_as_written():
    text = README.read_text()
    block = re.search(r"<!-- example:start -->\n```python\n(.*?)```\n<!-- example:end -->",
                      text, re.S).group(1)
    assert len(block.strip().splitlines()) <= 10
    env = {**os.environ, "PYTHONPATH": str(Path(kvpeer.__file__).parent.parent),
           "UCX_NET_DEVICES": os.environ.get("UCX_NET_DEVICES", "lo")}
    r = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == "[True] True b'hello kvpeer'\n"


def test_connector_example(peer_factory):
    """The engine plug-in sketch, driven like an engine would."""
    code = readme_blocks()[1]
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)
    src = peer_factory()
    keys = [b"h0", b"h1"]
    src.call("put", b"h0", b"zero", 0)
    src.call("put", b"h1", b"one", 0)
    conn = ns["KVPeerConnector"]([src.peer_id], **FAST)
    try:
        conn.tier.node.wait_peer(src.peer_id, 10)
        req = SimpleNamespace(id=5)
        deadline = time.monotonic() + 10
        while conn.num_hits(req, keys) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        bufs = [bytearray(4), bytearray(4)]
        conn.start_load(req, keys, bufs)
        done = []
        while not done and time.monotonic() < deadline:
            done = conn.step_done()
            time.sleep(0.01)
        assert done == [(5, True)] and bufs == [bytearray(b"zero"), bytearray(b"one\0")]
        conn.save(req, [b"h2"], [b"two"])
        assert conn.step_done() == [(("store", 5), True)]
        conn.request_finished(req)
    finally:
        conn.close()
