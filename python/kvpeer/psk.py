"""kvpeer.psk: a pre-shared key file read the way kvpeerd reads it.

One file format for kvpeerd, the C config helpers and the Python/vLLM tier
(issue 27/28): the C library's kvp_psk_load() reads it, so a file that works
for the daemon works for the tier. A library built before kvp_psk_load
existed is read by _load_py(), the same rules as kvpeerd's tools/options.c:
hex digits (what ``openssl rand -hex 32 > psk`` writes; a trailing newline
allowed) are decoded, anything else is the raw bytes.
"""
from __future__ import annotations

import ctypes
import os
import stat
from ctypes import c_uint8, c_uint32

from . import _lib as L
from .node import Error

PSK_MAX = 256  # bytes of key (kvpeerd's KVPD_PSK_MAX)
PSK_MIN = 16   # shorter keys are refused (brute-forceable)


def load(path: str) -> bytes:
    """The key held in ``path``. Error(KVP_ERR_INVALID / KVP_ERR_IO) naming
    the file and the cause when it is missing, empty, too short or too long."""
    if not isinstance(path, str) or not path:
        raise Error(L.KVP_ERR_INVALID, f"psk_file must be a path, got {path!r}")
    fn = getattr(L.lib(), "kvp_psk_load", None)
    if fn is None:
        return _load_py(path)
    buf = (c_uint8 * PSK_MAX)()
    n = c_uint32()
    st = fn(path.encode(), buf, PSK_MAX, ctypes.byref(n))
    if st != L.KVP_OK:
        why = L.lib().kvp_last_error()
        raise Error(st, f"psk_file {path}: " + (why.decode(errors="replace") if why else
                                                  L.STATUS_NAMES.get(st, str(st))))
    return bytes(buf[:n.value])


def _load_py(path: str) -> bytes:
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise Error(L.KVP_ERR_INVALID, f"psk_file {path}: not a regular file")
        with open(path, "rb") as f:
            raw = f.read(2 * PSK_MAX + 3)
    except OSError as e:
        raise Error(L.KVP_ERR_IO, f"psk_file {path}: {e.strerror}") from None
    text = raw.rstrip(b"\r\n ")
    key = None
    if text and len(text) % 2 == 0 and len(text) // 2 <= PSK_MAX \
            and all(c in b"0123456789abcdefABCDEF" for c in text):
        key = bytes.fromhex(text.decode("ascii"))
    if key is None:
        if not raw or len(raw) > PSK_MAX:
            raise Error(L.KVP_ERR_INVALID, f"psk_file {path}: must hold 1..{PSK_MAX} raw "
                        f"bytes or up to {2 * PSK_MAX} hex digits")
        key = raw
    if len(key) < PSK_MIN:
        raise Error(L.KVP_ERR_INVALID, f"psk_file {path}: {len(key)} bytes of key is too "
                    f"short (at least {PSK_MIN} bytes, e.g. `openssl rand -hex 32`)")
    return key
