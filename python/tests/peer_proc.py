"""A kvpeer node in a child process, driven over a multiprocessing pipe.

The child is spawned (not forked: UCX and the node's thread do not survive a
fork), binds 127.0.0.1 with an ephemeral port and sends its peer id back
through the pipe. Commands are (name, *args) tuples; each gets one reply
("ok", value) or ("err", status, text).
"""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import random
from typing import Any, Dict


def block_bytes(key: bytes, n: int) -> bytes:
    """Deterministic pseudo-random content of ``key``'s block (n bytes)."""
    seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little")
    return random.Random(seed).randbytes(n)


def _child(conn: Any, config: Dict[str, Any]) -> None:
    import kvpeer

    node = kvpeer.Node(**config)
    conn.send(("ok", node.peer_id))
    while True:
        cmd, *args = conn.recv()
        try:
            if cmd == "exit":
                node.close()
                conn.send(("ok", None))
                return
            conn.send(("ok", _run(node, cmd, args)))
        except kvpeer.Error as e:
            conn.send(("err", e.status, str(e)))


def _run(node: Any, cmd: str, args: list) -> Any:
    if cmd == "put_pattern":  # keys, length: put block_bytes(key, length) for each
        keys, n, rid = args
        for k in keys:
            node.put(k, block_bytes(k, n), request_id=rid)
        return len(keys)
    if cmd == "put":
        key, data, rid = args
        node.put(key, data, request_id=rid)
        return None
    if cmd == "read":
        with node.get(args[0]) as b:
            return b.tobytes()
    if cmd == "wait_peer":
        return node.wait_peer(args[0], args[1]).data_path
    if cmd == "pull":  # lookup + fetch from a peer; returns the events' fields
        peer, keys, rid, timeout = args
        lk = node.wait(node.lookup(peer, keys, rid), timeout)
        hits = [k for k, h in zip(keys, lk.results or []) if h]
        ld = node.wait(node.fetch(peer, hits, rid), timeout) if hits else None
        node.finish_request(rid)
        return (lk.results, None if ld is None else (ld.status, ld.block_status))
    if cmd == "finish":
        node.finish_request(args[0])
        return None
    if cmd == "stats":
        return node.stats()
    raise ValueError(cmd)


class Peer:
    """Handle on a child-process node: ``peer_id``, ``call(cmd, *args)``,
    ``kill()`` (SIGKILL), ``stop()`` (graceful, then kill)."""

    def __init__(self, config: Dict[str, Any], timeout: float = 20.0) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_child, args=(child, config), daemon=True)
        self.proc.start()
        child.close()
        self.peer_id: str = self._reply(timeout)

    def _reply(self, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError("peer process did not answer")
        r = self.conn.recv()
        if r[0] == "err":
            import kvpeer
            raise kvpeer.Error(r[1], r[2])
        return r[1]

    def call(self, cmd: str, *args: Any, timeout: float = 30.0) -> Any:
        self.conn.send((cmd, *args))
        return self._reply(timeout)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(10)

    def stop(self) -> None:
        if self.proc.is_alive():
            try:
                self.call("exit", timeout=10)
            except (OSError, EOFError, TimeoutError):
                pass
            self.proc.join(10)
        if self.proc.is_alive():
            self.kill()
        self.conn.close()
