"""Micro-batching of concurrent search requests into one encoder + index call.

Requests wait in an asyncio queue. The worker takes the first one, then keeps collecting for at
most ``max_wait_s`` (or until ``max_batch_queries`` queries are gathered), runs ONE search over all
their queries with k = the largest topk asked, and hands each request its own rows cut to its own
topk. While a batch computes, new requests pile up and form the next batch, so under load the
wait costs nothing and 64 concurrent clients cost about one batched call instead of 64 serial ones.

The search runs in a one-thread executor, so the event loop keeps accepting requests meanwhile and
the encoder / index are never called from two threads at once. With ``enabled=False`` every request
is its own call (the baseline the benchmark compares against).

Cutting a top-K list to its first k gives the top-k list for exact indexes (flat, torch, BM25);
for HNSW/IVF a larger K may search slightly more widely, which can only improve the answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

SearchFn = Callable[[Sequence[str], int], tuple[np.ndarray, np.ndarray]]


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future


@dataclass
class BatchStats:
    requests: int = 0
    queries: int = 0
    batches: int = 0
    largest_batch: int = 0
    errors: int = 0
    batch_sizes: list[int] = field(default_factory=list, repr=False)


class MicroBatcher:
    def __init__(self, search: SearchFn, max_wait_s: float = 0.002, max_batch_queries: int = 512,
                 enabled: bool = True):
        self.search, self.max_wait_s, self.max_batch_queries = search, max_wait_s, max_batch_queries
        self.enabled = enabled
        self.stats = BatchStats()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieve")
        self._queue: asyncio.Queue | None = None
        self._worker: asyncio.Task | None = None

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        if self.enabled:
            self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=True)

    async def submit(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """ids [len(queries), k'] and scores of one request, once its batch has run."""
        self.stats.requests += 1
        self.stats.queries += len(queries)
        loop = asyncio.get_running_loop()
        if not self.enabled:
            self._count_batch(len(queries))
            return await loop.run_in_executor(self._executor, self.search, queries, k)
        fut = loop.create_future()
        await self._queue.put(_Pending(queries, k, fut))
        return await fut

    def _count_batch(self, n: int) -> None:
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, n)
        if len(self.stats.batch_sizes) < 10000:
            self.stats.batch_sizes.append(n)

    async def _collect(self) -> list[_Pending]:
        loop = asyncio.get_running_loop()
        batch = [await self._queue.get()]
        n = len(batch[0].queries)
        deadline = loop.time() + self.max_wait_s
        while n < self.max_batch_queries:
            if not self._queue.empty():
                item = self._queue.get_nowait()
            else:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), left)
                except asyncio.TimeoutError:
                    break
            batch.append(item)
            n += len(item.queries)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            live = [p for p in batch if not p.future.done()]  # a client that went away is skipped
            if not live:
                continue
            queries = [q for p in live for q in p.queries]
            k = max(p.k for p in live)
            self._count_batch(len(queries))
            try:
                ids, scores = await loop.run_in_executor(self._executor, self.search, queries, k)
            except Exception as e:  # every waiting request gets the error; the worker goes on
                self.stats.errors += 1
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(e)
                continue
            row = 0
            for p in live:
                n = len(p.queries)
                if not p.future.done():
                    p.future.set_result((ids[row:row + n, :p.k], scores[row:row + n, :p.k]))
                row += n
