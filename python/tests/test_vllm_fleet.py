"""kvpeer.vllm in a fleet, the safe defaults (issue 28): engines of different
models never exchange a block; the peer id is a routable address (host /
VLLM_P2P_SIDE_CHANNEL_*, a wildcard refused, one port per data-parallel
rank); one PSK file serves kvpeerd and the tier; peers a request names are
dialled on demand, bounded; the README's multi-host JSON works between two
network namespaces. Through vLLM's own TieringOffloadingManager, as
test_vllm.py. Runs in the python_vllm ctest (project venv); skips, saying
so, without vllm.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

pytest.importorskip("vllm.v1.kv_offload.tiering.spec",
                    reason="vllm is not installed in this python (scripts/install-py.sh "
                           "makes .venv; the python_vllm ctest runs this file with it)")

from conftest import scaled  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402

import kvpeer  # noqa: E402
from kvpeer import vllm_setup as setup  # noqa: E402
from kvpeer.vllm import offloading_config, request_id_of  # noqa: E402
from test_vllm import (BOTH_MODES, engines, free_port, procs, tier_cfg,  # noqa: E402,F401 (fixtures)
                       write_psk)
from vllm_engine import CHUNK, Engine, block_bytes, make_key, spy_lookups  # noqa: E402

HERE = Path(__file__).resolve().parent


def digest(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def psk_file(tmp_path) -> str:
    return write_psk(tmp_path / "psk")


def spec_of(**kw: Any):
    cfg = offloading_config("fp-test", CHUNK, 4, [], **kw)
    return OffloadingSpecFactory.create_spec(cfg)


# ------------------------------------------------------------------ fingerprint
def test_fingerprint_follows_vllms_own_fields():
    """The default compat changes with every field vLLM's p2p tier
    fingerprints (model, dtype, tp) and with the hash seed; the same spec
    gives the same string on every engine."""
    base = setup.fingerprint(spec_of(), "seed")
    assert base == setup.fingerprint(spec_of(), "seed")
    assert base.startswith(setup.FINGERPRINT_PREFIX) and len(base) < 64
    others = [setup.fingerprint(spec_of(model_name="other/model"), "seed"),
              setup.fingerprint(spec_of(dtype="bfloat16"), "seed"),
              setup.fingerprint(spec_of(tp_size=2), "seed"),
              setup.fingerprint(spec_of(), "another-seed")]
    assert len({base, *others}) == 5, others
    # vLLM's own function is the source of the fields.
    f = setup.spec_fields(spec_of(model_name="m1"))
    assert f["model_name"] == "m1" and f["dtype"] == "float16" and "kv_cache_groups" in f


def test_other_model_exchanges_nothing(procs, engines, psk_file):
    """Engine A (model-a) stores; engine B configured for model-b (same 64
    KiB chunks, same PSK) gets MISS and loads nothing: the sessions are
    refused as incompatible. Engine C of model-a shares A's blocks."""
    a = procs(tier_cfg(psk_file=psk_file), {"model_name": "model-a"})
    keys = [make_key(700 + i) for i in range(4)]
    assert a.store(keys, seed=11) == [True] * 4
    b = engines(tier_cfg(peers=[a.peer_id], psk_file=psk_file), model_name="model-b")
    c = b.ctx()
    res = b.lookup_all(keys, c, timeout=scaled(10))
    if LookupResult.HIT in res:  # what the fault looks like: B would load A's KV
        loaded = b.read([k for k, r in zip(keys, res) if r is LookupResult.HIT], c)
        pytest.fail(f"model-b answered {res} and loaded {len(loaded)} blocks of model-a")
    assert res == [LookupResult.MISS] * 4
    b.finish(c)
    node = b.tier._tier.node
    assert node.stats()["blocks_in"] == 0
    if b.tier._zc:  # the default: no chunk of B's vLLM lent to a load either
        assert not any(node.slots_held())
    else:
        assert not any(node.contains(k) for k in keys)
    assert node.refusals()["refused_incompatible"] >= 1, node.refusals()
    assert b.tier.compat != a.compat
    same = engines(tier_cfg(peers=[a.peer_id], psk_file=psk_file), model_name="model-a")
    assert same.tier.compat == a.compat
    c = same.ctx()
    assert same.lookup_all(keys, c, timeout=scaled(10)) == [LookupResult.HIT] * 4
    assert same.read(keys, c) == [block_bytes(k, 11) for k in keys]
    same.finish(c)


def test_unshareable_hash_seed_answers_miss(engines, psk_file, monkeypatch, caplog):
    """vLLM resolves its hash seed after the tier is built; a seed other
    than the one fingerprinted (xxhash without PYTHONHASHSEED: random per
    process) makes every lookup MISS, logged, instead of asking peers."""
    import vllm.v1.core.kv_cache_utils as kcu
    a = engines(tier_cfg(psk_file=psk_file))
    keys = [make_key(720 + i) for i in range(2)]
    assert a.store(keys, seed=14, timeout=scaled(10)) == [True] * 2
    b = engines(tier_cfg(peers=[a.peer_id], psk_file=psk_file))
    b.tier._tier.node.wait_peer(a.peer_id, scaled(10))
    monkeypatch.setattr(kcu, "_NONE_HASH_SEED", os.urandom(32).hex())
    c = b.ctx()
    assert b.lookup_all(keys, c, timeout=scaled(5)) == [LookupResult.MISS] * 2
    assert "PYTHONHASHSEED" in caplog.text
    b.finish(c)
    monkeypatch.undo()
    d = a.ctx()  # A was fingerprinted with the seed in use: its lookups go on
    assert a.lookup_all(keys, d, timeout=scaled(5)) == [LookupResult.HIT] * 2
    a.finish(d)


def test_compat_override_is_used(engines):
    e = engines(tier_cfg(compat="my-fleet-v1"))
    assert e.tier.compat == "my-fleet-v1"
    with pytest.raises(ValueError, match="compat"):
        Engine(tier_cfg(compat=""))


# ------------------------------------------------------------------ addresses
def test_addresses_rules():
    env: Dict[str, str] = {}
    assert setup.addresses(None, None, None, 0, env) == ("127.0.0.1:0", None)
    assert setup.addresses(None, "10.1.2.3", 7000, 2, env) == ("10.1.2.3:7002", None)
    assert setup.addresses("0.0.0.0:7000", "10.1.2.3", None, 1, env) == \
        ("0.0.0.0:7001", "10.1.2.3:7001")
    env = {setup.ENV_HOST: "10.9.9.9", setup.ENV_PORT: "5710"}
    assert setup.addresses(None, None, None, 0, env) == ("10.9.9.9:5710", None)
    assert setup.addresses("0.0.0.0:7000", None, None, 0, env) == \
        ("0.0.0.0:7000", "10.9.9.9:7000")
    assert setup.addresses(None, "::1", 7000, 0, {}) == ("[::1]:7000", None)
    for listen, host, env, key in (("0.0.0.0:7000", "0.0.0.0", {}, "'host'"),
                                   ("[::]:7000", "::", {}, "'host'"),
                                   ("127.0.0.1:7000", None, {setup.ENV_HOST: "0.0.0.0"},
                                    setup.ENV_HOST)):
        with pytest.raises(ValueError, match=re.escape(key)):
            setup.addresses(listen, host, None, 0, env)
    with pytest.raises(ValueError, match="fixed port"):
        setup.addresses("0.0.0.0:0", "10.1.2.3", None, 0, {})
    with pytest.raises(ValueError, match="not both"):
        setup.addresses("127.0.0.1:1", None, 7000, 0, {})


def test_wildcard_listen_advertises_a_routable_id(engines, monkeypatch, psk_file):
    """listen 0.0.0.0 (the old README): the peer id is the host's address
    (vLLM's get_ip: VLLM_HOST_IP here), never 0.0.0.0; with no address to
    be found the tier refuses to start, naming the key."""
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.1")
    e, port = _on_free_port(lambda p: engines(tier_cfg(listen=f"0.0.0.0:{p}", psk_file=psk_file)))
    assert e.peer_id == f"127.0.0.1:{port}"
    monkeypatch.setenv("VLLM_HOST_IP", "0.0.0.0")
    with pytest.raises(ValueError, match="'host'"):
        Engine(tier_cfg(listen=f"0.0.0.0:{port}", psk_file=psk_file))
    monkeypatch.delenv("VLLM_HOST_IP")
    monkeypatch.setenv(setup.ENV_HOST, "127.0.0.1")
    f, port2 = _on_free_port(lambda p: engines(tier_cfg(listen=f"0.0.0.0:{p}", psk_file=psk_file)))
    assert f.peer_id == f"127.0.0.1:{port2}"
    with pytest.raises(ValueError, match="psk_file"):  # beyond loopback: a key or insecure
        Engine(tier_cfg(listen=f"0.0.0.0:{free_port()}"))


def _on_free_port(start: Any) -> Any:
    """(start(port), port) on a port free just before: another process can
    take a port between free_port() and the bind (python_vllm failed here
    once with EADDRINUSE beside a concurrent test run), so retry."""
    for attempt in range(5):
        port = free_port()
        try:
            return start(port), port
        except Exception as e:  # kvpeer.Error from the tier's node
            if "Address already in use" not in str(e) or attempt == 4:
                raise


def _free_pair() -> int:
    """A port P with P and P + 1 free now (rank 1 binds P + 1: an ephemeral
    port another process held there failed this test once under load)."""
    for _ in range(100):
        port = free_port()
        if port + 2 > 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


def test_dp_ranks_bind_port_plus_index(engines):
    """DP rank i binds port + i (as vLLM's p2p tier); a second tier on a
    taken port fails with an error that names the address."""
    port = _free_pair()
    r0 = engines(tier_cfg(host="127.0.0.1", port=port), dp_index=0)
    r1 = engines(tier_cfg(host="127.0.0.1", port=port), dp_index=1)
    assert (r0.peer_id, r1.peer_id) == (f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}")
    with pytest.raises(kvpeer.Error, match=re.escape(f"127.0.0.1:{port + 1}")):
        Engine(tier_cfg(host="127.0.0.1", port=port), dp_index=1)


# ------------------------------------------------------------------ PSK
def _kvpeerd() -> str:
    path = os.environ.get("KVPEERD") or str(Path(os.environ.get("KVPEER_LIB", "x")).parent /
                                            "tools" / "kvpeerd")
    if not os.access(path, os.X_OK):
        pytest.skip(f"no kvpeerd at {path} (the python_vllm ctest sets KVPEERD)")
    return path


def _daemon(port: int, psk: str) -> subprocess.Popen:
    return subprocess.Popen([_kvpeerd(), "--listen", f"127.0.0.1:{port}", "--num_blocks", "16",
                             "--block_size", str(CHUNK), "--compat", "psk-test",
                             "--psk_file", psk],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _stop(d: subprocess.Popen) -> str:
    if d.poll() is None:
        d.send_signal(signal.SIGTERM)
    try:
        _, err = d.communicate(timeout=scaled(20))
    except subprocess.TimeoutExpired:
        d.kill()
        _, err = d.communicate()
    return err


def test_one_psk_file_for_kvpeerd_and_tier(tmp_path, engines):
    """The same psk_file (`openssl rand -hex 32` with spaces and a newline
    around it) in kvpeerd's config and the tier's: the tier's session with
    the daemon comes up; a tier with another key is refused (auth). A file
    group/others can read is refused by both, with the same fix named."""
    good = tmp_path / "psk"
    good.write_text("  " + os.urandom(32).hex() + " \n")
    good.chmod(0o600)
    port = free_port()
    d = _daemon(port, str(good))
    try:
        peer = f"127.0.0.1:{port}"
        e = engines(tier_cfg(peers=[peer], psk_file=str(good), compat="psk-test"))
        e.tier._tier.node.wait_peer(peer, scaled(15))
        f = engines(tier_cfg(peers=[peer], psk_file=write_psk(tmp_path / "other"),
                             compat="psk-test"))
        with pytest.raises(kvpeer.Error):
            f.tier._tier.node.wait_peer(peer, scaled(3))
        assert f.tier._tier.node.refusals()["refused_auth"] >= 1, f.tier._tier.node.refusals()
    finally:
        _stop(d)
    good.chmod(0o640)
    with pytest.raises(ValueError, match="chmod 600"):
        Engine(tier_cfg(psk_file=str(good)))
    d = _daemon(free_port(), str(good))
    try:
        d.wait(scaled(20))
    finally:
        err = _stop(d)
    assert d.returncode != 0 and "chmod 600" in err, (d.returncode, err)


# ------------------------------------------------------------------ dial on demand
def test_peers_named_by_request_are_dialled(procs, engines, psk_file):
    """B has no static peers; a request naming A in kvpeer_peers dials A
    (RETRY meanwhile) and loads A's blocks. With max_hinted_peers=1 a
    second, different name is answered MISS at once and not dialled."""
    a = procs(tier_cfg(psk_file=psk_file))
    keys = [make_key(800 + i) for i in range(4)]
    assert a.store(keys, seed=12) == [True] * 4
    b = engines(tier_cfg(psk_file=psk_file, max_hinted_peers=1))
    c = b.ctx({"kvpeer_peers": [a.peer_id]})
    assert b.lookup_all(keys, c, timeout=scaled(10)) == [LookupResult.HIT] * 4
    assert b.read(keys, c) == [block_bytes(k, 12) for k in keys]
    b.finish(c)
    other = f"127.0.0.1:{free_port()}"
    d = b.ctx({"kvpeer_peers": [other]})
    with b.manager.lock:
        assert b.manager.lookup(make_key(899), d) is LookupResult.MISS
    assert other not in {s.peer for s in b.tier._tier.node.peer_states()}
    assert b.tier._tier._dialer.refused == 1
    b.finish(d)


def test_dial_of_a_dead_named_peer_is_bounded(engines):
    """A named peer nobody listens on: RETRY while dialling, MISS once the
    dial failed, within the dial bound."""
    b = engines(tier_cfg())
    dead = f"127.0.0.1:{free_port()}"
    c = b.ctx({"kvpeer_peers": [dead]})
    t0 = time.monotonic()
    assert b.lookup_all([make_key(900)], c, timeout=scaled(10)) == [LookupResult.MISS]
    assert time.monotonic() - t0 < scaled(3)
    b.finish(c)
    assert not b.tier.has_pending_work()


# ------------------------------------------------------------------ multi-host
NS_IP = {"a": "10.213.9.1", "b": "10.213.9.2"}


def _sh(*args: str, ns: str = "") -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair, one address each.
    Removed on every exit path (and stale ones of a killed run first)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI: the two-host test needs root and iproute2")
        pytest.skip("needs root and iproute2 for network namespaces")
    for line in _sh("ip", "netns", "list").stdout.splitlines():
        m = re.match(r"^kvpv(\d+)[ab]\b", line)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            _sh("ip", "netns", "del", line.split()[0])
    ns = {n: f"kvpv{os.getpid()}{n}" for n in ("a", "b")}
    try:
        for n in ns.values():
            r = _sh("ip", "netns", "add", n)
            assert r.returncode == 0, r.stderr
        steps = [("ip", "link", "add", "kvpa", "netns", ns["a"], "type", "veth", "peer",
                  "name", "kvpb", "netns", ns["b"])]
        for n in ("a", "b"):
            steps += [("ip", "netns", "exec", ns[n], "ip", "addr", "add", NS_IP[n] + "/24",
                       "dev", "kvp" + n),
                      ("ip", "netns", "exec", ns[n], "ip", "link", "set", "kvp" + n, "up"),
                      ("ip", "netns", "exec", ns[n], "ip", "link", "set", "lo", "up")]
        for s in steps:
            r = _sh(*s)
            assert r.returncode == 0, (s, r.stderr)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
                "LOWER_UP" in _sh("ip", "link", "show", "kvp" + n, ns=ns[n]).stdout
                for n in ("a", "b")):
            time.sleep(0.05)
        yield ns
    finally:
        for n in ns.values():
            _sh("ip", "netns", "del", n)


def readme_tier() -> Dict[str, Any]:
    text = (HERE.parent / "README.md").read_text()
    cfg = json.loads(re.search(r"--kv-transfer-config '(\{.*?\})'", text, re.S).group(1))
    (tier,) = cfg["kv_connector_extra_config"]["secondary_tiers"]
    return tier


@BOTH_MODES
def test_readme_multi_host_json_between_two_hosts(two_hosts, procs, psk_file, zero_copy):
    """The README's JSON, as written but for the addresses (10.0.0.x ->
    the namespaces'), the key file and a small store: engine A in one
    namespace stores, engine B in the other loads A's bytes through vLLM's
    manager. Each engine's host comes from VLLM_P2P_SIDE_CHANNEL_HOST.
    Zero copy: the namespaces share /dev/shm (same-host proof) but not the
    abstract unix sockets, so A cannot prove B's pid for direct-cma: its
    proof stays pending and it writes by AM, which B waits to land (before
    the pending proof, every load failed: "direct-cma write refused")."""
    tier = readme_tier()
    text = json.dumps({k: v for k, v in tier.items() if k not in ("type", "module_path")})
    text = text.replace("10.0.0.1", NS_IP["a"]).replace("10.0.0.2", NS_IP["b"])
    cfg = json.loads(text)
    assert cfg.get("psk_file"), "the README JSON names a key file"
    cfg.update(psk_file=psk_file, num_blocks=64)
    cfg["kvpeer_zero_copy"] = zero_copy  # the README leaves it out: zero copy
    env = {"UCX_NET_DEVICES": "all"}
    a = procs(cfg, prefix=["ip", "netns", "exec", two_hosts["a"]],
              env={**env, setup.ENV_HOST: NS_IP["a"]})
    b = procs(cfg, prefix=["ip", "netns", "exec", two_hosts["b"]],
              env={**env, setup.ENV_HOST: NS_IP["b"]})
    assert a.peer_id.startswith(NS_IP["a"] + ":") and b.peer_id.startswith(NS_IP["b"] + ":")
    keys = [make_key(950 + i) for i in range(6)]
    assert a.store(keys, seed=13) == [True] * 6
    got = b.load(keys, timeout=15)
    assert got["results"] == ["HIT"] * 6, got
    assert got["digests"] == [digest(block_bytes(k, 13)) for k in keys]
    assert got["blocks_in"] == 6
    if zero_copy:  # A -> B is not direct-cma here (A cannot prove B's pid), and
        # B, never finding A's proof, waited for A's AM to land before committing
        assert a.peers().get(b.peer_id) in ("am-shm", "am-tcp"), a.peers()
        assert got["loads_landing_awaited"] >= 1, got


# ------------------------------------------------------------------ p2p hints
def test_router_hint_remote_kv_source(procs, engines, psk_file):
    """llm-d's hint for vLLM's p2p tier, unchanged: remote_kv_source names
    the engine that holds the prefix. B (static peers: A and one more) asks
    A only, one LOOKUP, and loads A's bytes."""
    a = procs(tier_cfg(psk_file=psk_file))
    other = procs(tier_cfg(psk_file=psk_file))
    keys = [make_key(1000 + i) for i in range(5)]
    assert a.store(keys, seed=15) == [True] * 5
    b = engines(tier_cfg(peers=[other.peer_id, a.peer_id], psk_file=psk_file))
    for p in (a.peer_id, other.peer_id):
        b.tier._tier.node.wait_peer(p, scaled(10))
    sent = spy_lookups(b)
    host, port = a.peer_id.rsplit(":", 1)
    c = b.ctx({"remote_kv_source": {"remote_host": host, "remote_port": int(port),
                                    "kv_request_id": "router-req-1"}})
    assert b.lookup_all(keys, c, timeout=scaled(10)) == [LookupResult.HIT] * 5
    assert sent == [(a.peer_id, 5)], sent
    assert b.read(keys, c) == [block_bytes(k, 15) for k in keys]
    b.finish(c)


def test_pd_remote_prefiller_remote_decoder(procs, engines, psk_file):
    """A P/D pair driven by the p2p tier's params: the decoder's request
    names remote_prefiller (host, port, kv_request_id) and is answered HIT
    before the prefiller has stored; the prefiller's request carries
    remote_decoder with the same kv_request_id (different vLLM request ids
    on the two engines); the decoder's load waits and gets the bytes."""
    a = procs(tier_cfg(psk_file=psk_file))
    b = engines(tier_cfg(psk_file=psk_file,
                         node_options={"heartbeat_ms": 200, "parked_demand_ms": 20000}))
    keys = [make_key(1100 + i) for i in range(3)]
    host, port = a.peer_id.rsplit(":", 1)
    c = b.ctx({"remote_prefiller": {"remote_host": host, "remote_port": port,
                                    "kv_request_id": "pd-kv-7"}}, req_id="decode-side-id")
    # Both sides derive kvpeer's request id from kv_request_id (the put does
    # not need it to serve the parked fetch: by key; the id ties pins/leases).
    assert b.tier._request(c).request_id == request_id_of("pd-kv-7")
    for k in keys:
        assert until_hit(b, k, c), k
    with b.manager.lock:
        assert [b.manager.lookup(k, c) for k in keys] == [LookupResult.HIT_PENDING] * 3
    b.step()  # the fetch (wait for supply) is on its way
    assert a.store(keys, seed=16, req_id="prefill-side-id",
                   params={"remote_decoder": {"kv_request_id": "pd-kv-7"}}) == [True] * 3
    assert b.lookup_all(keys, c, timeout=scaled(10)) == [LookupResult.HIT] * 3
    assert b.read(keys, c) == [block_bytes(k, 16) for k in keys]
    b.finish(c)


def until_hit(e: Engine, key: bytes, c: Any) -> bool:
    deadline = time.monotonic() + scaled(10)
    while time.monotonic() < deadline:
        if e.tier.lookup(key, c) is LookupResult.HIT:
            return True
        e.step()
        time.sleep(0.02)
    return False


def test_p2p_params_malformed_are_ignored(engines):
    e = engines(tier_cfg())
    c = e.ctx({"remote_kv_source": {"remote_host": "127.0.0.1\n", "kv_request_id": "x"},
               "remote_prefiller": "nonsense"})
    r = e.tier._request(c)
    assert r.peers is None and r.supplier is None
    e.finish(c)
