"""kvpeer: Python binding of the kvpeer peer-to-peer KV-cache tier.

    import kvpeer
    with kvpeer.Node(num_blocks=64, block_size=65536) as node:
        node.put(b"key", b"data")
        with node.get(b"key") as block:
            assert block.view[:4] == b"data"

Everything goes through libkvpeer.so's public C API (kvpeer.h) via ctypes; see
``kvpeer._lib`` for how the library is found (KVPEER_LIB, KVPEER_BUILD_DIR,
the build tree, the system).
"""
from ._lib import STATUS_NAMES, find_library, lib_path
from .node import (
    CONFIG_FIELDS,
    Block,
    Error,
    Event,
    EventType,
    HeldItem,
    Node,
    PeerInfo,
    config_defaults,
    status_str,
)
from . import tier  # noqa: E402  (kvpeer.tier: the engine tier adapter)

# The status codes as module constants: kvpeer.KVP_ERR_NOT_FOUND, ...
globals().update({name: code for code, name in STATUS_NAMES.items()})

__version__ = "0.1.0"

__all__ = [
    "Block", "CONFIG_FIELDS", "Error", "Event", "EventType", "HeldItem", "Node", "PeerInfo",
    "STATUS_NAMES", "config_defaults", "find_library", "lib_path", "status_str", "tier",
] + list(STATUS_NAMES.values())
