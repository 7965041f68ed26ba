"""kvpeer.psk: a pre-shared key file, read by the C library's kvp_psk_load()
(issue 27): the one format kvpeerd, the C embedders and the Python/vLLM tier
read, so a file that works for the daemon works for the tier. Hex digits as
``openssl rand -hex 32 > psk`` writes them (whitespace around them ignored),
16..64 bytes of key, in a regular file only its owner can read (chmod 600).
"""
from __future__ import annotations

import ctypes
from ctypes import c_uint8, c_uint32

from . import _lib as L
from .node import Error

PSK_MAX = 64  # bytes of key (kvp_psk_load's bound)


def load(path: str) -> bytes:
    """The key held in ``path``; Error(KVP_ERR_INVALID / KVP_ERR_IO) whose
    text names the file, the cause and the fix (kvp_last_error)."""
    if not isinstance(path, str) or not path:
        raise Error(L.KVP_ERR_INVALID, f"psk_file must be a path, got {path!r}")
    buf = (c_uint8 * PSK_MAX)()
    n = c_uint32()
    st = L.lib().kvp_psk_load(path.encode(), buf, PSK_MAX, ctypes.byref(n))
    if st != L.KVP_OK:
        why = L.lib().kvp_last_error()
        raise Error(st, why.decode(errors="replace") if why else f"psk_file {path}")
    key = bytes(buf[:n.value])
    ctypes.memset(buf, 0, PSK_MAX)
    return key
