"""Where a kvpeer tier's request time goes, from kvpeer._trace files
(vllm_tiers.py --trace): engine B's requests run one after the other, so
each request's window [req_start, req_done] holds its own events of both
engines (A's serve of B's LOOKUP included; one host, one monotonic clock).

Phases of one request (ms, from the first event of each kind in the window):
  to-lookup   req_start   -> lookup_sent  B's step end sends the LOOKUP
  to-wanted   lookup_sent -> wanted_ev    A's node raised WANTED, A's tier took it
  serve       serve_start -> serve_done   A: ParentManager lookup + pin + publish + done
  to-hit      serve_done  -> lookup_ev    the answer reaches B's tier
  to-fetch    lookup_ev   -> fetch        B: HIT -> promotion -> submit_load -> fetch
  fetch       fetch       -> load_ev      the transfer (last LOAD event of the window)
  to-result   load_ev     -> job_result   LOAD event -> vLLM's JobResult
  to-done     job_result  -> req_done     B's scheduler sees every key HIT
A phase whose events are absent (staging serves without WANTED) is left out.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

PHASES: Sequence[Tuple[str, str, str]] = (
    ("to-lookup", "req_start", "lookup_sent"),
    ("to-wanted", "lookup_sent", "wanted_ev"),
    ("serve", "serve_start", "serve_done"),
    ("to-hit", "serve_done", "lookup_ev"),
    ("to-fetch", "lookup_ev", "fetch"),
    ("fetch", "fetch", "load_ev"),
    ("to-result", "load_ev", "job_result"),
    ("to-done", "job_result", "req_done"),
)
_LAST = {"load_ev", "job_result"}  # a request's load may come in parts: the last one


def read(prefix: str) -> List[Tuple[float, str, str]]:
    """(time, tag, first argument) of every trace line of the files
    ``prefix``.<pid>, in time order."""
    p = Path(prefix)
    out: List[Tuple[float, str, str]] = []
    for f in p.parent.glob(p.name + ".*"):
        for line in f.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                out.append((float(parts[0]), parts[2], parts[3] if len(parts) > 3 else ""))
    out.sort()
    return out


def phases(prefix: str) -> Dict[str, List[float]]:
    """Per phase, its duration in ms in each measured request (req_start's
    argument is the request's tag: the warm-up requests, "warm...", are left
    out)."""
    wins: List[List[Tuple[float, str]]] = []
    cur: List[Tuple[float, str]] = []
    open_ = False
    for t, tag, arg in read(prefix):
        if tag == "req_start":
            cur, open_ = [(t, tag)], not arg.startswith("warm")
        elif open_:
            cur.append((t, tag))
            if tag == "req_done":
                wins.append(cur)
                open_ = False
    out: Dict[str, List[float]] = {name: [] for name, _, _ in PHASES}
    for w in wins:
        first: Dict[str, float] = {}
        last: Dict[str, float] = {}
        for t, tag in w:
            first.setdefault(tag, t)
            last[tag] = t
        for name, a, b in PHASES:
            ta = last.get(a) if a in _LAST else first.get(a)
            tb = last.get(b) if b in _LAST else first.get(b)
            if ta is not None and tb is not None and tb >= ta:
                out[name].append((tb - ta) * 1e3)
    return {k: v for k, v in out.items() if v}
