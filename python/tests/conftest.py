"""Shared fixtures: the library location, UCX on loopback, peer processes.

Run:  KVPEER_LIB=/work/main/build/py/libkvpeer.so python3 -m pytest python/tests
(without KVPEER_LIB the package finds the library in the build tree).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the package from the source tree
sys.path.insert(0, str(HERE))         # peer_proc for spawned children
os.environ.setdefault("UCX_NET_DEVICES", "lo")
_py_build = HERE.parent.parent / "build" / "py" / "libkvpeer.so"
if "KVPEER_LIB" not in os.environ and "KVPEER_BUILD_DIR" not in os.environ and _py_build.exists():
    os.environ["KVPEER_LIB"] = str(_py_build)

import kvpeer  # noqa: E402
from peer_proc import Peer  # noqa: E402

# Real-clock bounds scale with the build (3 under ASan, like the C suite).
TIME_SCALE = float(os.environ.get("KVPEER_TEST_TIME_SCALE", "1") or 1)


def scaled(seconds: float) -> float:
    """A real-clock bound scaled for slow (sanitizer) builds."""
    return seconds * TIME_SCALE


# Small, fast settings for every node in the suite.
FAST = dict(num_blocks=64, block_size=65536, heartbeat_ms=200, dead_after_ms=1000,
            shutdown_drain_ms=500, backoff_min_ms=50, backoff_max_ms=500)


@pytest.fixture
def node_factory() -> Iterator[Callable[..., kvpeer.Node]]:
    """Nodes closed at the end of the test (even when it fails)."""
    made: List[kvpeer.Node] = []

    def make(**kw: Any) -> kvpeer.Node:
        n = kvpeer.Node(**{**FAST, **kw})
        made.append(n)
        return n

    yield make
    for n in made:
        try:
            n.close()
        except kvpeer.Error:
            pass


@pytest.fixture
def peer_factory() -> Iterator[Callable[..., Peer]]:
    """Nodes in child processes (spawned); killed and reaped at the end."""
    made: List[Peer] = []

    def make(**kw: Any) -> Peer:
        p = Peer({**FAST, **kw})
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()
