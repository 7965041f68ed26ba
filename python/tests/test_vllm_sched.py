"""Must-show line 1, second half (issue 28), through vLLM's real Scheduler:
two engines of one model, each in its own network namespace with its own
address, configured with the README's multi-host --kv-transfer-config as
written (but for the addresses, the key file and small sizes), share KV:
engine B computes only the prompt tokens past A's blocks, loads A's blocks
byte-exact, and computes the whole prompt of a request A never ran; an
engine of another model in B's namespace computes everything (fingerprint).

vllm_sched.py is the engine: vLLM's Scheduler -> OffloadingConnector ->
TieringOffloadingManager -> kvpeer tier; only the GPU worker is emulated.
vLLM's model inspection imports einops, which the project venv lacks: the
fixture pip-installs it into build/vllm-sched-extra (skips, saying so, when
the package index cannot be reached). Runs in the python_vllm ctest.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

pytest.importorskip("vllm.v1.kv_offload.tiering.spec",
                    reason="vllm is not installed in this python (scripts/install-py.sh "
                           "makes .venv; the python_vllm ctest runs this file with it)")

from conftest import scaled  # noqa: E402
from kvpeer import vllm_setup as setup  # noqa: E402
from test_vllm import Child, _reap, write_psk  # noqa: E402
from test_vllm_fleet import NS_IP, two_hosts  # noqa: E402,F401 (the fixture)
from vllm_sched import BLOCK_TOKENS, tiny_model  # noqa: E402

HERE = Path(__file__).resolve().parent
EXTRA = HERE.parent.parent / "build" / "vllm-sched-extra"
EINOPS = "einops==0.8.2"


@pytest.fixture(scope="module")
def extra_path() -> str:
    """A directory with einops for the engines' PYTHONPATH (cached)."""
    if not (EXTRA / "einops").is_dir():
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                            "--disable-pip-version-check", "--target", str(EXTRA), EINOPS],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.skip(f"pip could not install {EINOPS} (offline?): "
                        f"{r.stderr.strip().splitlines()[-1:]}")
    return str(EXTRA)


class SchedChild(Child):
    """An engine (vllm_sched.py) in its own process."""

    def __init__(self, model: str, ktc: Dict[str, Any], prefix: List[str],
                 env: Dict[str, str]) -> None:
        self.p = subprocess.Popen([*prefix, sys.executable, str(HERE / "vllm_sched.py"), model,
                                   json.dumps(ktc)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, **env})
        hello = self._read(scaled(120))
        self.peer_id, self.compat = hello["peer_id"], hello["compat"]

    def run(self, prompt: List[int], req_id: str,
            params: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        self.start_run(prompt, req_id, params)
        return self.result()

    def start_run(self, prompt: List[int], req_id: str,
                  params: Optional[Dict[str, Any]] = None) -> None:
        self.p.stdin.write(json.dumps({"op": "run", "prompt": prompt, "req_id": req_id,
                                       "params": params, "timeout": scaled(30)}) + "\n")
        self.p.stdin.flush()

    def result(self) -> Dict[str, Any]:
        return self._read(scaled(60))

    def stats(self) -> Dict[str, int]:
        self.p.stdin.write(json.dumps({"op": "stats"}) + "\n")
        self.p.stdin.flush()
        return self._read(scaled(10))


def sched_env(extra_path: str) -> Dict[str, str]:
    return {"PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(
        [extra_path] + [p for p in [os.environ.get("PYTHONPATH")] if p])}


@pytest.fixture
def engines():
    made: List[Child] = []
    yield made
    _reap(made)


def readme_config(psk_file: str) -> Dict[str, Any]:
    """The README's --kv-transfer-config: 10.0.0.x -> the namespaces'
    addresses, the key file, a small CPU tier and kvpeer store."""
    import re
    text = (HERE.parent / "README.md").read_text()
    raw = re.search(r"--kv-transfer-config '(\{.*?\})'", text, re.S).group(1)
    raw = raw.replace("10.0.0.1", NS_IP["a"]).replace("10.0.0.2", NS_IP["b"])
    cfg = json.loads(raw)
    extra = cfg["kv_connector_extra_config"]
    extra["cpu_bytes_to_use"] = 64 * 32768
    (tier,) = extra["secondary_tiers"]
    assert tier.get("psk_file") and tier.get("port"), tier
    tier.update(psk_file=psk_file, num_blocks=64)
    return cfg


def test_two_engines_share_kv_through_the_scheduler(two_hosts, engines, extra_path,  # noqa: F811
                                                    tmp_path):
    model = str(tiny_model(tmp_path / "model-a"))
    cfg = readme_config(write_psk(tmp_path / "psk"))
    env = {"UCX_NET_DEVICES": "all", **sched_env(extra_path)}

    def start(ns: str, model_dir: str, ktc: Dict[str, Any]) -> SchedChild:
        e = SchedChild(model_dir, ktc, ["ip", "netns", "exec", two_hosts[ns]],
                       {**env, setup.ENV_HOST: NS_IP[ns]})
        engines.append(e)
        return e

    a = start("a", model, cfg)
    b = start("b", model, cfg)
    assert (a.peer_id, b.peer_id) == (f"{NS_IP['a']}:7000", f"{NS_IP['b']}:7000")
    assert a.compat == b.compat
    prompt = [100 + i for i in range(199)]  # 12 full blocks + 7 tokens
    full = len(prompt) // BLOCK_TOKENS
    got_a = a.run(prompt, "req-a")
    assert got_a["finished"] and got_a["computed"] == len(prompt), got_a
    assert got_a["stored_blocks"] == full, got_a
    other = [5000 + i for i in range(199)]  # a prompt A never ran: B computes it all
    alone = b.run(other, "req-b0")
    assert alone["finished"] and alone["computed"] == len(other), alone
    assert alone["loaded_blocks"] == 0, alone
    shared = b.run(prompt, "req-b1")
    assert shared["finished"], shared
    assert shared["loaded_blocks"] == full and shared["bad_blocks"] == 0, shared
    assert shared["computed"] == len(prompt) - full * BLOCK_TOKENS, shared  # 7 of 199
    # Another model (same chunk size) in B's namespace: nothing exchanged.
    cfg_d = json.loads(json.dumps(cfg))
    cfg_d["kv_connector_extra_config"]["secondary_tiers"][0]["port"] = 7001
    d = start("b", str(tiny_model(tmp_path / "model-b")), cfg_d)
    assert d.compat != a.compat
    got_d = d.run(prompt, "req-d")
    assert got_d["finished"] and got_d["computed"] == len(prompt), got_d
    assert got_d["loaded_blocks"] == 0, got_d
    print(f"\nscheduler-level, two namespaces: A computed {got_a['computed']}/{len(prompt)}, "
          f"B computed {shared['computed']}/{len(prompt)} with A's {full} blocks "
          f"({alone['computed']}/{len(other)} for a prompt A never ran), other model "
          f"{got_d['computed']}/{len(prompt)}")


def loopback_config(peers: List[str], **tier: Any) -> Dict[str, Any]:
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 64 * 32768,
                "secondary_tiers": [{"type": "KVPeerSecondaryTier", "module_path": "kvpeer.vllm",
                                     "peers": peers, "num_blocks": 64, **tier}]}}


def test_router_hint_and_pd_through_the_scheduler(engines, extra_path, tmp_path):
    """Must-show line 2 under vLLM's Scheduler, driven by exactly the
    kv_transfer_params vLLM's p2p tier takes. Router hint: B's static peers
    are X and A; the request names A in remote_kv_source: B computes 7 of
    199 tokens, and X is never asked (its node answered no LOOKUP). P/D: the
    decoder D's request names the prefiller P in remote_prefiller before P
    has run it; D waits (fetch before supply); P runs the prompt with
    remote_decoder and the same kv_request_id; D then computes 7 of 199."""
    model = str(tiny_model(tmp_path / "model"))
    env = sched_env(extra_path)

    def start(ktc: Dict[str, Any]) -> SchedChild:
        e = SchedChild(model, ktc, [], env)
        engines.append(e)
        return e

    prompt = [300 + i for i in range(199)]
    full = len(prompt) // BLOCK_TOKENS
    a = start(loopback_config([]))
    x = start(loopback_config([]))
    b = start(loopback_config([x.peer_id, a.peer_id]))
    assert a.run(prompt, "r-a")["computed"] == len(prompt)
    host, port = a.peer_id.rsplit(":", 1)
    got = b.run(prompt, "r-b", {"remote_kv_source": {
        "remote_host": host, "remote_port": int(port), "kv_request_id": "router-1"}})
    assert got["finished"] and got["loaded_blocks"] == full and got["bad_blocks"] == 0, got
    assert got["computed"] == len(prompt) - full * BLOCK_TOKENS, got
    xs, as_ = x.stats(), a.stats()
    assert xs["lookups_hit"] + xs["lookups_miss"] == 0, xs  # X was not asked
    assert as_["lookups_hit"] >= full, as_

    # P/D: the decoder asks before the prefiller has the blocks.
    pd_prompt = [700 + i for i in range(199)]
    p = start(loopback_config([]))
    d = start(loopback_config([], node_options={"parked_demand_ms": 30000}))
    host, port = p.peer_id.rsplit(":", 1)
    d.start_run(pd_prompt, "decode-side", {"remote_prefiller": {
        "remote_host": host, "remote_port": int(port), "kv_request_id": "pd-1"}})
    got_p = p.run(pd_prompt, "prefill-side", {"remote_decoder": {"kv_request_id": "pd-1"}})
    assert got_p["computed"] == len(pd_prompt) and got_p["stored_blocks"] == full, got_p
    got_d = d.result()
    assert got_d["finished"] and got_d["loaded_blocks"] == full, got_d
    assert got_d["bad_blocks"] == 0, got_d
    assert got_d["computed"] == len(pd_prompt) - full * BLOCK_TOKENS, got_d
    print(f"\nscheduler-level: router hint B computed {got['computed']}/{len(prompt)} "
          f"(X asked {xs['lookups_hit'] + xs['lookups_miss']} times); P/D decoder computed "
          f"{got_d['computed']}/{len(pd_prompt)}")
