"""The vLLM tier's peers_dns key (issue 28 item 2) through vLLM's own
manager (vllm_engine.Engine), as test_vllm.py; kvpeer.dns_peers itself is
tested in test_dns_peers.py (no vLLM needed)."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm.v1.kv_offload.tiering.spec",
                    reason="vllm is not installed in this python (scripts/install-py.sh "
                           "makes .venv; the python_vllm ctest runs this file with it)")

from conftest import scaled  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult  # noqa: E402

from test_vllm import engines, free_port, procs, tier_cfg  # noqa: E402,F401 (fixtures)
from vllm_engine import block_bytes, make_key  # noqa: E402


def test_vllm_peers_dns_localhost(procs, engines):
    """The tier's peers_dns key (issue 28 item 2) through vLLM's manager: B
    names no peer, only ``localhost:P``; the system resolver (on the tier's
    resolver thread) gives A's address, A is dialled on demand, and B's vLLM
    loads A's blocks byte-exact. A bad peers_dns is refused naming the key."""
    port = free_port()
    a = procs(tier_cfg(listen=f"127.0.0.1:{port}"))
    keys = [make_key(4400 + i) for i in range(4)]
    assert a.store(keys, seed=5) == [True] * 4
    b = engines(tier_cfg(peers_dns=f"localhost:{port}", peers_dns_interval_s=1.0))
    assert b.tier._tier._dns.wait_resolved(scaled(10))
    c = b.ctx()
    res = b.lookup_all(keys, c, timeout=scaled(15))
    assert res == [LookupResult.HIT] * 4, res
    assert b.read(keys, c) == [block_bytes(k, 5) for k in keys]
    b.finish(c)
    with pytest.raises(ValueError, match="peers_dns"):
        engines(tier_cfg(peers_dns="localhost"))
