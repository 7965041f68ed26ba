"""kvpeer.vllm_setup: what the vLLM tier derives from vLLM's own config and
environment, the way vLLM's own tiers derive it (issue 28, safe defaults):

* fingerprint(spec): the default ``compat`` string. vLLM's block hashes do
  not include the model, so two engines of different models (same chunk
  size) would otherwise exchange KV. It hashes the same fields vLLM's p2p
  tier fingerprints (``FileMapper.from_offloading_spec(...).get_run_config()``:
  model, dtype, tp/pp/pcp/dcp, tokens per hash, blocks per chunk, KV groups,
  layout) plus the prefix-cache hash seed the p2p tier checks at handshake.
* addresses(...): the bind address and the advertised peer id, with the p2p
  tier's ``host`` / ``port`` keys, ``VLLM_P2P_SIDE_CHANNEL_HOST`` /
  ``VLLM_P2P_SIDE_CHANNEL_PORT`` and its data-parallel port offset. A
  wildcard (0.0.0.0, ::) is never advertised: no peer can dial it.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Mapping, Optional, Tuple

ENV_HOST = "VLLM_P2P_SIDE_CHANNEL_HOST"
ENV_PORT = "VLLM_P2P_SIDE_CHANNEL_PORT"
_WILDCARDS = ("", "0.0.0.0", "::", "0:0:0:0:0:0:0:0")
FINGERPRINT_PREFIX = "vllm-kv1:"


def hash_seed() -> str:
    """The seed vLLM derives its block hashes from (NONE_HASH), as the p2p
    tier reads it. The tier is built before the engine runs init_none_hash,
    so until then PYTHONHASHSEED (which wins there when set) is read
    directly; check_hash_seed() compares it with the resolved one later."""
    from vllm.v1.core.kv_cache_utils import get_none_hash_seed
    env = os.environ.get("PYTHONHASHSEED")
    return env if env is not None else get_none_hash_seed()


def check_hash_seed(seed: str) -> Optional[str]:
    """None if vLLM's resolved seed is ``seed``; else why not (a random
    per-process seed: non-cryptographic hash without PYTHONHASHSEED)."""
    from vllm.v1.core.kv_cache_utils import get_none_hash_seed
    now = get_none_hash_seed()
    if now == seed:
        return None
    return ("vLLM's prefix-cache hash seed is not the one this tier was fingerprinted "
            "with (a random per-process seed: a non-cryptographic hash such as xxhash "
            "without PYTHONHASHSEED); no other engine computes these block hashes. Set "
            "PYTHONHASHSEED to one value on every engine, or use sha256")


def spec_fields(offloading_spec: Any) -> dict:
    """The fields vLLM's p2p tier fingerprints, from vLLM's own function."""
    from vllm.v1.kv_offload.file_mapper import FileMapper
    return FileMapper.from_offloading_spec(
        root_dir="", offloading_spec=offloading_spec,
        blocks_per_file=offloading_spec.blocks_per_chunk,
        parallel_agnostic=True).get_run_config()


def fingerprint(offloading_spec: Any, seed: str) -> str:
    """The default compat string: a hash of spec_fields() and the hash seed."""
    fields = dict(spec_fields(offloading_spec), hash_seed=seed)
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return FINGERPRINT_PREFIX + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _split(addr: str, key: str) -> Tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"kvpeer: {key}={addr!r} must be 'host:port'")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _port(v: Any, key: str) -> int:
    try:
        p = int(v)
    except (TypeError, ValueError):
        p = -1
    if isinstance(v, bool) or not 0 <= p <= 65535:
        raise ValueError(f"kvpeer: {key} must be a port number 0..65535, got {v!r}")
    return p


def _is_wildcard(host: str) -> bool:
    return host.strip("[]") in _WILDCARDS


def _host_address() -> str:
    """This host's address as vLLM finds it (VLLM_HOST_IP, else the address
    of the interface with the default route); 0.0.0.0 when there is none."""
    from vllm.utils.network_utils import get_ip
    return get_ip()


def addresses(listen: Optional[str], host: Optional[str], port: Any, dp_index: int,
              env: Mapping[str, str] = os.environ) -> Tuple[str, Optional[str]]:
    """(bind address, advertised peer id or None = the bound address).

    bind:  ``listen`` if given, else ``host`` / $VLLM_P2P_SIDE_CHANNEL_HOST
           (else 127.0.0.1) with ``port`` / $VLLM_P2P_SIDE_CHANNEL_PORT
           (else 0, ephemeral); a fixed port is offset by ``dp_index``
           (one port per data-parallel rank, as the p2p tier).
    advertised host: ``host``, else $VLLM_P2P_SIDE_CHANNEL_HOST, else the
           bind host, else (wildcard bind) this host's address. A wildcard
           is refused with a message naming where it came from."""
    env_host = env.get(ENV_HOST) or None
    if host is not None and not (isinstance(host, str) and host):
        raise ValueError(f"kvpeer: host must be a host name or address, got {host!r}")
    if listen is not None:
        if not isinstance(listen, str):
            raise ValueError(f"kvpeer: listen must be 'host:port', got {listen!r}")
        if port is not None:
            raise ValueError("kvpeer: give the port in listen or in port, not both")
        bind_host, bind_port = _split(listen, "listen")
        bind_key = "listen"
    else:
        bind_host = host or env_host or "127.0.0.1"
        bind_key = "host" if host else ENV_HOST if env_host else "listen"
        if port is not None:
            bind_port = _port(port, "port")
        elif env.get(ENV_PORT):
            bind_port = _port(env[ENV_PORT], ENV_PORT)
        else:
            bind_port = 0
    if bind_port != 0:
        bind_port += int(dp_index)
        if bind_port > 65535:
            raise ValueError(f"kvpeer: port {bind_port - dp_index} + data_parallel_index "
                             f"{dp_index} is over 65535")
    if host:
        adv_host, src = host, "the tier key 'host'"
    elif env_host:
        adv_host, src = env_host, ENV_HOST
    elif not _is_wildcard(bind_host):
        adv_host, src = bind_host, f"the tier key '{bind_key}'"
    else:
        adv_host, src = _host_address(), "this host's address (VLLM_HOST_IP or the default route)"
    if _is_wildcard(adv_host):
        raise ValueError(
            f"kvpeer: the advertised peer id would be {join(adv_host.strip('[]'), bind_port)} "
            f"(from {src}): no peer can dial a wildcard address; set the tier key 'host' "
            f"(or {ENV_HOST}) to this host's routable address")
    adv_host = adv_host.strip("[]")
    if adv_host == bind_host:
        return join(bind_host, bind_port), None
    if bind_port == 0:
        raise ValueError(f"kvpeer: advertising {adv_host} (from {src}) for a listener on "
                         f"{bind_host} needs a fixed port (the tier key 'port' or listen's)")
    return join(bind_host, bind_port), join(adv_host, bind_port)
