"""kvpeer.vllm_params: a request's ``kv_transfer_params`` as the kvpeer tier
uses them -- kvpeer's own keys and, so that a router or P/D proxy that
drives vLLM's p2p tier drives kvpeer unchanged (issue 28 item 6), exactly
the ones vLLM's p2p tier takes (vllm/v1/kv_offload/tiering/p2p/manager.py,
``_parse_source`` / ``_parse_dest``):

  remote_kv_source {remote_host, remote_port, kv_request_id}
      symmetric P2P (e.g. llm-d's router): this request's blocks are on that
      engine: one LOOKUP to it only (no other peer is asked).
  remote_prefiller {remote_host, remote_port, kv_request_id}
      P/D, on the decoder: the prefiller will store them: it is the supplier
      (fetch before supply) and the only peer asked.
  remote_decoder {kv_request_id}
      P/D, on the prefiller: its stores carry the request id the decoder
      fetches with (zero copy: and are served from the moment they are
      stored, not from the next tier-poll round).
  kvpeer_supplier "host:port", kvpeer_peers ["host:port", ...]
      kvpeer's own keys; they win over the p2p keys when both are given.

Both engines of a P/D pair derive kvpeer's request id from
``kv_request_id`` (else from vLLM's request id). A malformed value is logged
(escaped) and ignored, never raised into the scheduler.
"""
from __future__ import annotations

import hashlib
import logging
from typing import Any, Dict, List, Optional, Tuple

from .tier import Request
from .vllm_setup import join

log = logging.getLogger("kvpeer.vllm")

SUPPLIER = "kvpeer_supplier"
PEERS = "kvpeer_peers"


def request_id_of(req_id: str) -> int:
    """kvpeer's 64-bit request id for a vLLM (or kv_request_id) id: a hash,
    so the prefill and decode engines of one request derive the same id."""
    h = int.from_bytes(hashlib.blake2b(req_id.encode(), digest_size=8).digest(), "little")
    return h or 1  # 0 means "no request" to kvpeer


def _role(req_id: str, params: Dict[str, Any], name: str,
          need_addr: bool) -> Optional[Tuple[Optional[str], str]]:
    """(peer "host:port" or None, kv_request_id) of one p2p sub-dict."""
    role = params.get(name)
    if role is None:
        return None
    host = role.get("remote_host") if isinstance(role, dict) else None
    port = role.get("remote_port") if isinstance(role, dict) else None
    kv_id = role.get("kv_request_id") if isinstance(role, dict) else None
    ok_addr = isinstance(host, str) and host and isinstance(port, (int, str)) \
        and not isinstance(port, bool) and str(port).isdigit()
    if not (isinstance(kv_id, str) and kv_id) or (need_addr and not ok_addr):
        log.error("request %r: kv_transfer_params[%r] = %r lacks %s: ignored", req_id, name,
                  role, "remote_host, remote_port and kv_request_id" if need_addr
                  else "kv_request_id")
        return None
    return (join(host, int(port)) if need_addr else None), kv_id


def parse(req_id: str, params: Optional[Dict[str, Any]]) -> Request:
    params = params if isinstance(params, dict) else {}
    kv_id: Optional[str] = None
    supplier: Optional[str] = None
    peers: Optional[List[str]] = None
    pd = _role(req_id, params, "remote_prefiller", True)
    src = _role(req_id, params, "remote_kv_source", True) if pd is None else None
    dest = _role(req_id, params, "remote_decoder", False)
    if pd is not None:
        supplier, kv_id = pd
        peers = [supplier]
    elif src is not None:
        peers, kv_id = [src[0]], src[1]
    if dest is not None:
        kv_id = dest[1]
    own_sup = params.get(SUPPLIER)
    own_peers = params.get(PEERS)
    if own_sup is not None:
        if isinstance(own_sup, str) and own_sup:
            supplier = own_sup
        else:
            log.error("request %r: kv_transfer_params[%r] must be a 'host:port' string, "
                      "got %r: ignored", req_id, SUPPLIER, own_sup)
    if own_peers is not None:
        if isinstance(own_peers, (list, tuple)) and all(isinstance(p, str) and p
                                                        for p in own_peers):
            peers = list(own_peers)
        else:
            log.error("request %r: kv_transfer_params[%r] must be a list of 'host:port' "
                      "strings, got %r: ignored", req_id, PEERS, own_peers)
    if supplier is not None and peers is not None and supplier not in peers:
        peers = peers + [supplier]
    return Request(request_id_of(kv_id if kv_id is not None else req_id),
                   peers=peers, supplier=supplier, decoder=dest is not None)
