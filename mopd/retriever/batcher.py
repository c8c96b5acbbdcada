"""Micro-batching of concurrent search requests, with large requests cut into slices.

Requests wait in an ordered list. The worker takes what is waiting (after at most ``max_wait_s``
for more to arrive, when little is waiting), runs ONE search over their queries with k = the
largest topk asked, and hands each request its own rows cut to its own topk. While a batch
computes, new requests pile up and form the next batch, so under load the wait costs nothing and 64
concurrent clients cost about one batched call instead of 64 serial ones.

Fairness, only where it is needed: a request is *big* when its queries left need more than one
*slice* (``slice_work``), *small* otherwise. While a small request is waiting next to a big one (or
was in the batch just run: its client is likely back within a round trip), a batch takes one slice
per waiting request, in order, within ``max_batch_work`` and ``max_batch_queries``, and a request
with queries left goes to the back of the list: a one-query request waits for at most the batch
being computed plus its own, and a 1,024-query request shares the worker round by round. Otherwise
-- a big request alone, big requests only, or small ones only -- a batch takes whole requests in
order, within ``max_batch_queries`` and ``max_whole_work`` (``max_batch_work`` by default):
slicing would only cost the encoder its batch size, with nobody to be fair to. A request above
``max_whole_work`` (say 1,024 queries) still runs in pieces of that size even alone, because
batches cannot be interrupted: a small request that arrives meanwhile waits for one piece, not for
all of it. That piece is what the first small clients to arrive wait for, so it is held to one
batch's work (about 70 search-length queries, ~0.2 s on a 2-core CPU): at 4 x ``max_batch_work``
(~290 queries, 0.7 s) the 32 clients of bench_retriever_latency.py that arrive while a large
request runs alone all waited for one such piece, 3.0-3.7x their p99 alone (bench/RESULTS.md). (A request whose padding would more than double a batch
past ``max_batch_work`` -- long queries next to short ones -- leads the next batch instead.)

The batching window adapts to the concurrency seen: after the first request arrives, the worker
waits (up to ``max_wait_s`` after that arrival) only while fewer requests wait than the last batch
held, so a lone client is never made to wait, and 64 concurrent clients are gathered as before.
Next to a big request the window is ``return_wait_s`` after the last batch ended instead: the
small clients that batch answered are on their way back, and a slice of the big request started
without them is one they would queue behind. Without it, 32 clients next to a 1,024-query request
met such big-only slices between their rounds (p50 225 ms against 131 ms with a 50 ms wait; the
wait is bounded, and a big request whose last batch served nobody small never waits).

Work is counted as an encoder pays for it: a batch is padded to its longest query, so its work is
(number of queries) x (longest query's characters + ``QUERY_OVERHEAD``). A slice holds at most
``slice_work`` of it, and a slice of long queries does not join a batch of short ones when the
padding would take it over ``max_batch_work`` (it runs next, on its own).

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


QUERY_OVERHEAD = 16
"""Work of a query beyond its characters (tokenizer call, special tokens, one index row)."""


def query_work(q: str) -> int:
    return len(q) + QUERY_OVERHEAD


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future
    arrived: float
    small: bool = False                 # the whole request fits one slice
    done: int = 0                       # queries searched so far
    ids: list = field(default_factory=list)
    scores: list = field(default_factory=list)

    @property
    def left(self) -> int:
        return len(self.queries) - self.done

    def next_slice(self, slice_work: int) -> tuple[int, int]:
        """``(end, widest)`` of the next slice: at least one query, then as many as keep
        (count x widest query work) within ``slice_work``."""
        end, widest = self.done + 1, query_work(self.queries[self.done])
        while end < len(self.queries):
            w = max(widest, query_work(self.queries[end]))
            if (end + 1 - self.done) * w > slice_work:
                break
            end, widest = end + 1, w
        return end, widest


@dataclass
class BatchStats:
    requests: int = 0
    queries: int = 0
    batches: int = 0
    largest_batch: int = 0
    errors: int = 0
    sliced_requests: int = 0
    waits: int = 0                      # times the worker waited for more requests to arrive
    fair_batches: int = 0               # batches formed slice by slice (a small request next to a big one)
    batch_sizes: list[int] = field(default_factory=list, repr=False)


class MicroBatcher:
    def __init__(self, search: SearchFn, max_wait_s: float = 0.002, max_batch_queries: int = 512,
                 enabled: bool = True, slice_work: int = 1024, max_batch_work: int = 4096,
                 max_whole_work: int | None = None, return_wait_s: float = 0.05):
        max_whole_work = max_batch_work if max_whole_work is None else max_whole_work
        if (slice_work < 1 or max_batch_work < slice_work or max_whole_work < max_batch_work
                or max_batch_queries < 1 or return_wait_s < 0):
            raise ValueError("need 1 <= slice_work <= max_batch_work <= max_whole_work, max_batch_queries >= 1 "
                             "and return_wait_s >= 0")
        self.search, self.max_wait_s, self.max_batch_queries = search, max_wait_s, max_batch_queries
        self.slice_work, self.max_batch_work, self.max_whole_work = slice_work, max_batch_work, max_whole_work
        self.return_wait_s = return_wait_s
        self.enabled = enabled
        self.stats = BatchStats()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieve")
        self._waiting: list[_Pending] = []
        self._last_requests = 1             # requests in the last batch: the concurrency to wait for
        self._last_had_small = False        # the last batch served a small request
        self._last_end = 0.0                # loop time the last batch's search ended
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
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
        """ids [len(queries), k'] and scores of one request, once all its slices have run."""
        self.stats.requests += 1
        self.stats.queries += len(queries)
        loop = asyncio.get_running_loop()
        if not self.enabled:
            self._count_batch(len(queries))
            return await loop.run_in_executor(self._executor, self.search, queries, k)
        fut = loop.create_future()
        p = _Pending(list(queries), k, fut, loop.time())
        p.small = not self._is_big(p)
        self._waiting.append(p)
        self._wakeup.set()
        return await fut

    def _count_batch(self, n: int) -> None:
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, n)
        if len(self.stats.batch_sizes) < 10000:
            self.stats.batch_sizes.append(n)

    async def _gather(self) -> None:
        """Wait for a request, then, while fewer requests wait than the last batch held (and less
        than a full batch of queries), for others until ``max_wait_s`` after the first's arrival.

        Next to a big request, the small clients the last batch answered are on their way back: a
        batch started now would be a slice of the big one alone, which they would then wait for.
        So the wait extends to ``return_wait_s`` after the last batch ended (a big request alone is
        never held up: it applies only when the last batch served a small request)."""
        while not self._waiting:
            self._wakeup.clear()
            await self._wakeup.wait()
        loop = asyncio.get_running_loop()
        deadline = self._waiting[0].arrived + self.max_wait_s
        if self._last_had_small and self._big_waiting():
            deadline = max(deadline, self._last_end + self.return_wait_s)
        waited = False
        while (len(self._waiting) < self._last_requests
               and self._queued_queries() < self.max_batch_queries):
            left = deadline - loop.time()
            if left <= 0:
                break
            waited = True
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), left)
            except TimeoutError:
                break
        self.stats.waits += waited

    def _queued_queries(self) -> int:
        """Queries the next batch would hold if it formed now: in fair mode a big request counts
        its next slice, else (and a small request always) everything it has left. Runs at every
        arrival while the batch gathers, so small requests cost an attribute read."""
        fair = self.fair_mode()
        return sum(p.next_slice(self.slice_work)[0] - p.done if fair and not p.small else p.left
                   for p in self._waiting)

    def _is_big(self, p: _Pending) -> bool:
        return p.next_slice(self.slice_work)[0] < len(p.queries)

    def _big_waiting(self) -> bool:
        """A waiting request has more than one slice left. (A request small on arrival stays small,
        being served whole, so only the others are measured; a big one's last slice is small.)"""
        return any(not p.small and self._is_big(p) for p in self._waiting)

    def fair_mode(self) -> bool:
        """Slice by slice when a big request waits and a small one waits too (or was just served)."""
        return (self._big_waiting()
                and (self._last_had_small or any(p.small for p in self._waiting)))

    def _take(self) -> list[tuple[_Pending, int, int]]:
        """The next batch's parts ``(request, start, end)``: one slice per waiting request in fair
        mode (``fair_mode``), else whole requests in order."""
        self._waiting = [p for p in self._waiting if not p.future.done()]  # clients that went away
        if not self._waiting:
            return []
        if not self.fair_mode():
            parts, n, widest, work = [], 0, 0, 0
            for p in self._waiting:
                end, _ = p.next_slice(self.max_whole_work)     # the whole request, unless above the cap
                rest = [query_work(q) for q in p.queries[p.done:end]]
                m, w, t = n + len(rest), max(widest, *rest), work + sum(rest)
                # a request that does not fit, or whose padding would more than double a batch past
                # max_batch_work (long queries next to short ones), leads the next batch instead
                if parts and (m > self.max_batch_queries or m * w > self.max_whole_work
                              or (m * w > self.max_batch_work and m * w > 2 * t)):
                    continue
                parts.append((p, p.done, end))
                n, widest, work = m, w, t
            return parts
        self.stats.fair_batches += 1
        parts, widest, n = [], 0, 0
        for p in self._waiting:
            end, w = p.next_slice(self.slice_work)
            m, w = n + end - p.done, max(widest, w)
            if parts and (m * w > self.max_batch_work or m > self.max_batch_queries):
                continue     # a later, narrower slice may still fit; this one leads the next batch
            parts.append((p, p.done, end))
            widest, n = w, m
        return parts

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._gather()
            parts = self._take()
            if not parts:
                continue
            queries = [q for p, s, e in parts for q in p.queries[s:e]]
            k = max(p.k for p, _, _ in parts)
            self._last_requests = len(parts)
            self._last_had_small = any(p.small for p, _, _ in parts)
            self._count_batch(len(queries))
            try:
                ids, scores = await loop.run_in_executor(self._executor, self.search, queries, k)
                self._last_end = loop.time()
            except Exception as e:  # noqa: BLE001 (any index failure goes to the requests; the worker goes on)
                self.stats.errors += 1
                for p, _, _ in parts:
                    if not p.future.done():
                        p.future.set_exception(e)
                self._waiting = [p for p in self._waiting if not p.future.done()]
                continue
            row, served = 0, set()
            for p, s, e in parts:
                n = e - s
                p.ids.append(ids[row:row + n, :p.k])
                p.scores.append(scores[row:row + n, :p.k])
                p.done = e
                row += n
                served.add(id(p))
                if p.done == len(p.queries):
                    if len(p.ids) > 1:
                        self.stats.sliced_requests += 1
                    if not p.future.done():
                        p.future.set_result((np.concatenate(p.ids), np.concatenate(p.scores)))
            # Requests with queries left go behind the ones this batch did not reach.
            rest = [p for p in self._waiting if id(p) not in served]
            again = [p for p, _, _ in parts if p.done < len(p.queries)]
            self._waiting = rest + again
