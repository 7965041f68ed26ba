"""kvpeer.vllm_sums: the zero-copy tier's checksums of vLLM's chunks.

A serve publishes a chunk with the checksum taken at its store job (the
node hashes nothing on the LOOKUP's path then). Hashing costs ~0.1 s of a
core per GB (xxh3 at ~10 GB/s here, memory-bound), which on the scheduler
thread would be a step's time per GB vLLM offloads; so a cascade's chunks
are hashed on one thread of this class's own (ctypes drops the GIL for the
C call) while vLLM pins them for that store job, and the job is reported
done when they are hashed (``take``, on a vLLM thread). The prefill half of
P/D hashes on the calling thread instead (``hash_now``): its chunks are
published at that store job and its decoder's FETCH waits for them.

vLLM cascades what it writes into a chunk, so a rewritten chunk is hashed
again at its new store job; one rewritten without a store job would be
served with a stale checksum, which every consumer that verifies (the
default) refuses: that block fails, nothing wrong is committed.
"""
from __future__ import annotations

import collections
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Deque, Dict, Hashable, List, Optional, Sequence, Tuple

log = logging.getLogger("kvpeer.vllm")

_Hashed = Tuple[Hashable, Sequence[bytes], Sequence[int], Optional[List[bytes]]]


class ChunkSums:
    """key -> (chunk, checksum), one entry per chunk (so at most the number
    of vLLM's chunks); ``checksum(chunk)`` is the node's slot_checksum."""

    def __init__(self, checksum: Callable[[int], bytes]) -> None:
        self._checksum = checksum
        self._sums: Dict[bytes, Tuple[int, bytes]] = {}
        self._sum_key: Dict[int, bytes] = {}
        self.served = [0, 0]  # chunks served with their store job's checksum / hashed then
        self.pending = 0      # store jobs handed to the thread, not yet taken back
        self._done: Deque[_Hashed] = collections.deque()  # the thread appends, take() pops
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvpeer-sums")

    def remember(self, key: bytes, chunk: int, checksum: bytes) -> None:
        old = self._sum_key.pop(chunk, None)
        if old is not None:
            self._sums.pop(old, None)
        prev = self._sums.pop(key, None)
        if prev is not None:
            self._sum_key.pop(prev[0], None)
        self._sums[key] = (chunk, checksum)
        self._sum_key[chunk] = key

    def stored(self, key: bytes, chunk: int) -> Optional[bytes]:
        """The checksum taken at the store job of ``key`` in ``chunk``, or
        None (the caller hashes it now)."""
        got = self._sums.get(key)
        hit = got is not None and got[0] == chunk
        self.served[0 if hit else 1] += 1
        return got[1] if hit else None

    def hash_now(self, keys: Sequence[bytes], chunks: Sequence[int]) -> None:
        for k, c in zip(keys, chunks):
            self.remember(k, c, self._checksum(c))

    def hash_later(self, job_id: Hashable, keys: Sequence[bytes], chunks: Sequence[int]) -> None:
        """Hash on the thread; ``take`` names ``job_id`` when done. vLLM must
        keep the chunks pinned (and unwritten) until then: its store job."""
        self.pending += 1
        self._pool.submit(self._run, job_id, keys, chunks)

    def _run(self, job_id: Hashable, keys: Sequence[bytes], chunks: Sequence[int]) -> None:
        sums: Optional[List[bytes]] = None
        try:
            sums = [self._checksum(c) for c in chunks]
        except Exception:  # the node closed under it: a serve hashes them then
            log.exception("kvpeer: hashing store job %s failed", job_id)
        self._done.append((job_id, keys, chunks, sums))

    def take(self) -> List[Any]:
        """The store jobs hashed since the last call (their checksums now
        remembered), on a thread vLLM calls the tier from."""
        out: List[Any] = []
        while self._done:
            job_id, keys, chunks, sums = self._done.popleft()
            self.pending -= 1
            for k, c, s in zip(keys, chunks, sums or ()):
                self.remember(k, c, s)
            out.append(job_id)
        return out

    def close(self) -> None:
        """Wait for the running hash (bounded: one store job's chunks) and
        stop the thread; the jobs not taken are dropped (vLLM shuts down)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
