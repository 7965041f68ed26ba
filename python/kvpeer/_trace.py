"""Timestamps through one request, for measuring where the vLLM tier's time
goes (issue 29): with $KVPEER_TRACE=/some/prefix each process appends
"<CLOCK_MONOTONIC s> <thread> <tag> <args>" lines to /some/prefix.<pid>
(one clock for every process of the host, so the files merge by sorting).
Off (one attribute test per call) unless the variable is set when kvpeer is
imported. python/bench/vllm_tiers.py --trace reads them back (per-phase
medians). Only op ids, counts and statuses are written, never a key."""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional, TextIO

_prefix = os.environ.get("KVPEER_TRACE")
_out: Optional[TextIO] = open(f"{_prefix}.{os.getpid()}", "a", buffering=1) if _prefix else None


def t(tag: str, *args: Any) -> None:
    """One line: now, this thread's name, ``tag``, ``args``."""
    if _out is not None:
        _out.write(f"{time.monotonic():.6f} {threading.current_thread().name[:16].replace(' ', '_')} "
                   f"{tag} {' '.join(map(str, args))}\n")
