"""kvpeer.vllm_sums: the zero-copy tier's checksums of vLLM's chunks.

A serve publishes a chunk with the checksum taken at its store job (the
node hashes nothing on the LOOKUP's path then). Hashing costs ~0.1 s of a
core per GB (xxh3 at ~10 GB/s here, memory-bound), which on the scheduler
thread would be a step's time per GB vLLM offloads; so a cascade's chunks
are hashed on one thread of this class's own (ctypes drops the GIL for the
C call) while vLLM pins them for that store job, and the job is reported
done when they are hashed (``take``, on a vLLM thread). The prefill half of
P/D is hashed on a second thread of its own (``publish_later``), so it never
queues behind a burst of cascades: its decoder's FETCH waits for those
chunks, which are hashed and published from that thread in one C call.

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
    of vLLM's chunks); ``checksum(chunks)`` is the node's slot_checksums: a
    job's chunks in one C call, so this thread takes the GIL back once per
    job, not per chunk (each return waits up to the switch interval, 5 ms,
    while the scheduler runs Python: 16 chunks took 91 ms, not 2 ms)."""

    def __init__(self, checksum: Callable[[Sequence[int]], List[bytes]]) -> None:
        self._checksum = checksum
        self._sums: Dict[bytes, Tuple[int, bytes]] = {}
        self._sum_key: Dict[int, bytes] = {}
        self.served = [0, 0]  # chunks served with their store job's checksum / hashed then
        self.pending = 0      # store jobs handed to the thread, not yet taken back
        self._done: Deque[_Hashed] = collections.deque()  # the thread appends, take() pops
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvpeer-sums")
        # the prefill half of P/D: a decoder waits for these (publish_later)
        self._urgent = ThreadPoolExecutor(1, thread_name_prefix="kvpeer-sums-prefill")

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

    def hash_later(self, job_id: Hashable, keys: Sequence[bytes], chunks: Sequence[int]) -> None:
        """Hash on the thread; ``take`` names ``job_id`` when done. vLLM must
        keep the chunks pinned (and unwritten) until then: its store job."""
        self.pending += 1
        self._pool.submit(self._run, job_id, keys, chunks)

    def publish_later(self, keys: Sequence[bytes], chunks: Sequence[int],
                      publish: Callable[[], Optional[List[bytes]]]) -> None:
        """Call ``publish()`` on the prefill thread: it hashes and publishes
        the chunks in one C call and returns their checksums (None: not
        published, the node closing), remembered at the next ``take``.
        Every chunk of the job is hashed, prefix hits vLLM cascades again
        included: a store job cannot tell a chunk vLLM kept from one it
        wrote again with the same key (after an eviction; KV bytes of the
        same tokens need not be bit-identical), and a stale checksum would
        fail that block at the decoder. vLLM must keep the chunks pinned
        until ``publish`` returned: the prefill store job."""
        self._urgent.submit(self._run_publish, keys, chunks, publish)

    def _run(self, job_id: Hashable, keys: Sequence[bytes], chunks: Sequence[int]) -> None:
        sums: Optional[List[bytes]] = None
        try:
            sums = self._checksum(chunks)
        except Exception:  # the node closed under it: a serve hashes them then
            log.exception("kvpeer: hashing store job %s failed", job_id)
        finally:
            self._done.append((job_id, keys, chunks, sums))

    def _run_publish(self, keys: Sequence[bytes], chunks: Sequence[int],
                     publish: Callable[[], Optional[List[bytes]]]) -> None:
        sums: Optional[List[bytes]] = None
        try:
            sums = publish()
        except Exception:  # logged: an executor would drop it silently
            log.exception("kvpeer: publishing a prefill store job failed")
        finally:
            self._done.append((None, keys, chunks, sums))

    def take(self) -> List[Any]:
        """The cascade store jobs hashed since the last call (the checksums
        of those and of the prefill jobs now remembered), on a thread vLLM
        calls the tier from."""
        out: List[Any] = []
        while self._done:
            job_id, keys, chunks, sums = self._done.popleft()
            for k, c, s in zip(keys, chunks, sums or ()):
                self.remember(k, c, s)
            if job_id is not None:
                self.pending -= 1
                out.append(job_id)
        return out

    def close(self) -> None:
        """Wait for the running hashes (bounded: one store job's chunks each)
        and stop the threads; the jobs not taken are dropped (vLLM shuts down)."""
        self._urgent.shutdown(wait=True, cancel_futures=True)
        self._pool.shutdown(wait=True, cancel_futures=True)
