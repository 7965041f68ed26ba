"""A request's lookup cost against the number of peers, with and without a
router hint (issue 28, build item 3). Not a timed test: prints a table.

Engine B is vLLM's TieringOffloadingManager with the kvpeer tier (built as
vLLM builds it, python/tests/vllm_engine.py) and N static peers; N kvpeer
nodes with tiny stores run in this process (their own progress threads), one
of them, the source, holding every block. Each request asks for --keys
blocks the way vLLM's scheduler does: every step manager.lookup() on each
key, then on_schedule_end(), until no key answers RETRY (the source's HIT
makes vLLM start the promotion: HIT_PENDING). Without a hint the tier asks
every peer; with one (llm-d's ``remote_kv_source`` naming the source, as
vLLM's p2p tier takes it) it asks the source only.

Per request (median over --requests):
  LOOKUPs   LOOKUP frames B sent (each answered by one LOOKUP_RESP)
  wire B    control bytes of those frames and their answers, from the wire
            format (src/wire/wire.h: 8-byte header, two 16-byte epochs,
            LOOKUP u64+u64+u32 + n x (u8 len + key); LOOKUP_RESP
            u64+u64+u32 + n x u8)
  tcp B     TCP payload bytes B's sockets to the peers sent + received
            from the first lookup to the answer (kernel's tcp_info, `ss -ti`:
            bytes_acked + bytes_received; a heartbeat every --heartbeat-ms
            may fall in the window)
  sched ms  time B's scheduler thread spent in manager.lookup() and
            on_schedule_end() for the request (what delays other requests)
  wall ms   first lookup until no key answers RETRY

    lookup_cost.py [--peers 1,4,16,64] [--keys 16] [--requests 20] [--json OUT]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))
os.environ.setdefault("UCX_NET_DEVICES", "lo")

from vllm.v1.kv_offload.base import LookupResult  # noqa: E402

import kvpeer  # noqa: E402
from vllm_engine import CHUNK, Engine  # noqa: E402

COMPAT = "bench-lookup-cost"
HDR, EPOCHS = 8, 32


def key_of(n: int, r: int, i: int, hinted: bool) -> bytes:
    """A vLLM OffloadKey (32-byte hash + group), distinct per run."""
    return hashlib.sha256(b"lc-%d-%d-%d-%d" % (n, r, i, hinted)).digest() + bytes(4)


def wire_bytes(keys: List[bytes]) -> int:
    look = HDR + EPOCHS + 8 + 8 + 4 + sum(1 + len(k) for k in keys)
    resp = HDR + EPOCHS + 8 + 8 + 4 + len(keys)
    return look + resp


def tcp_bytes(ports: set) -> int:
    """Payload bytes sent + received by this machine's TCP sockets whose
    remote port is one of ``ports`` (B's connections to its peers)."""
    out = subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True,
                         text=True, timeout=10).stdout
    total, cur = 0, None
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            f = line.split()
            peer = f[3] if len(f) > 3 else ""
            cur = int(peer.rsplit(":", 1)[1]) if ":" in peer else None
            continue
        if cur in ports:
            for m in re.finditer(r"\bbytes_(?:acked|received):(\d+)", line):
                total += int(m.group(1))
    return total


def one_request(b: Engine, keys: List[bytes], params: Any, ports: set) -> Dict[str, float]:
    c = b.ctx(params)
    tcp0 = tcp_bytes(ports)
    sched = 0.0
    t0 = time.perf_counter()
    deadline = time.monotonic() + 20
    while True:
        t = time.perf_counter()
        with b.manager.lock:
            res = [b.manager.lookup(k, c) for k in keys]
        sched += time.perf_counter() - t
        if LookupResult.RETRY not in res or time.monotonic() > deadline:
            break
        t = time.perf_counter()
        b.step()
        sched += time.perf_counter() - t
        time.sleep(0.0002)
    wall = time.perf_counter() - t0
    time.sleep(0.002)  # the last LOOKUP_RESP's ACK
    tcp = tcp_bytes(ports) - tcp0  # before the promotion's FETCH is sent
    ok = all(r in (LookupResult.HIT_PENDING, LookupResult.HIT) for r in res)
    b.step()  # the promotion is submitted; let it finish outside the measure
    b.wait_idle(20)
    b.finish(c)
    return {"sched_ms": sched * 1e3, "wall_ms": wall * 1e3, "tcp": tcp, "ok": ok}


def run(n: int, args: argparse.Namespace) -> List[Dict[str, Any]]:
    node_cfg = dict(listen_addr="127.0.0.1:0", block_size=CHUNK, compat=COMPAT,
                    heartbeat_ms=args.heartbeat_ms, dead_after_ms=4 * args.heartbeat_ms)
    src = kvpeer.Node(num_blocks=2 * args.keys * args.requests + 8, **node_cfg)
    others = [kvpeer.Node(num_blocks=4, **node_cfg) for _ in range(n - 1)]
    peers = [src] + others
    rows = []
    try:
        data = bytes(CHUNK)
        for hinted in (False, True):
            for r in range(args.requests):
                for i in range(args.keys):
                    src.put(key_of(n, r, i, hinted), data)
        b = Engine({"peers": [p.peer_id for p in peers], "compat": COMPAT,
                    "num_blocks": 2 * args.keys + 8,
                    "node_options": {"heartbeat_ms": args.heartbeat_ms,
                                     "dead_after_ms": 4 * args.heartbeat_ms}},
                   num_chunks=2 * args.keys + 8)
        try:
            for p in peers:
                b.tier._tier.node.wait_peer(p.peer_id, 30)
            sent: List[Any] = []
            orig = b.tier._tier.node.lookup

            def spy(peer, ks, rid):
                sent.append(list(ks))
                return orig(peer, ks, rid)

            b.tier._tier.node.lookup = spy  # type: ignore[method-assign]
            ports = {int(p.peer_id.rsplit(":", 1)[1]) for p in peers}
            host, port = src.peer_id.rsplit(":", 1)
            for hinted in (False, True):
                per: List[Dict[str, float]] = []
                for r in range(args.requests):
                    keys = [key_of(n, r, i, hinted) for i in range(args.keys)]
                    params = ({"remote_kv_source": {"remote_host": host, "remote_port": int(port),
                                                    "kv_request_id": f"lc-{n}-{r}"}}
                              if hinted else None)
                    sent.clear()
                    m = one_request(b, keys, params, ports)
                    m["frames"] = len(sent)
                    m["wire"] = sum(wire_bytes(ks) for ks in sent)
                    per.append(m)
                rows.append({
                    "peers": n, "hint": hinted, "requests": args.requests, "keys": args.keys,
                    "ok": all(m["ok"] for m in per),
                    "lookups": statistics.median(m["frames"] for m in per),
                    "wire_bytes": statistics.median(m["wire"] for m in per),
                    "tcp_bytes": statistics.median(m["tcp"] for m in per),
                    "sched_ms": statistics.median(m["sched_ms"] for m in per),
                    "wall_ms": statistics.median(m["wall_ms"] for m in per),
                    "wall_ms_p90": sorted(m["wall_ms"] for m in per)[int(0.9 * (len(per) - 1))],
                })
                print(_fmt(rows[-1]), flush=True)
        finally:
            b.close()
    finally:
        for p in peers:
            p.close()
    return rows


HEAD = (f"{'peers':>5} {'hint':>5} {'LOOKUPs':>8} {'wire B':>8} {'tcp B':>8} "
        f"{'sched ms':>9} {'wall ms':>8} {'p90 ms':>7} ok")


def _fmt(r: Dict[str, Any]) -> str:
    return (f"{r['peers']:>5} {('yes' if r['hint'] else 'no'):>5} {r['lookups']:>8.0f} "
            f"{r['wire_bytes']:>8.0f} {r['tcp_bytes']:>8.0f} {r['sched_ms']:>9.3f} "
            f"{r['wall_ms']:>8.3f} {r['wall_ms_p90']:>7.3f} {'yes' if r['ok'] else 'NO'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default="1,4,16,64")
    ap.add_argument("--keys", type=int, default=16)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--heartbeat-ms", type=int, default=2000)
    ap.add_argument("--json")
    args = ap.parse_args()
    print(f"lookup cost per request ({args.keys} keys, median of {args.requests}; "
          f"{os.cpu_count()} cores, loopback)")
    print(HEAD, flush=True)
    rows: List[Dict[str, Any]] = []
    for n in (int(x) for x in args.peers.split(",")):
        rows += run(n, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
