"""Retrieval that overlaps generation: searches are submitted one query at a time, from any run, and
worker threads send whatever is pending to the retriever as one batched ``search`` call.

While a batch is being searched, new queries pile up and make the next batch, so under load the
retriever sees large batches (one encoder pass, one index call) and a run never waits for an
engine step to get its passages. ``workers`` threads search concurrently: 1 for an in-process
index (it serialises its calls anyway), more for an HTTP server (a connection each; the server
micro-batches across them again).

A batch that raises, times out (``timeout_s``), or returns the wrong number of result lists is
searched again one query at a time, so only the queries that fail alone fail (a server that is
down fails them all); the scheduler records the failure on the runs concerned (see
:mod:`mopd.rollout.async_scheduler`).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import List, Optional, Tuple

from mopd.rollout.rollout_stats import BusyMeter
from mopd.rollout.work_queue import WorkQueue


class RetrievalFront(WorkQueue):
    """``timeout_s``: a search call that has not answered by then fails with ``TimeoutError`` (the
    call itself is left to finish on its own daemon thread). ``fatal``: error types that say the
    retriever itself is gone (e.g. ``RetrieverUnavailable`` after the client's retries): they fail
    the whole batch at once, without the query-by-query retry."""

    def __init__(self, retriever, k: int, *, workers: int = 1, timeout_s: Optional[float] = None,
                 max_batch_queries: int = 512, fatal: tuple = (), name: str = "mopd-retrieval"):
        if workers < 1 or max_batch_queries < 1 or k < 1:
            raise ValueError("workers, max_batch_queries and k must be >= 1")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0")
        self.retriever, self.k, self.max_batch_queries = retriever, k, max_batch_queries
        self.timeout_s, self.name, self.fatal = timeout_s, name, tuple(fatal)
        self.meter = BusyMeter()
        WorkQueue.__init__(self, "search")
        self.start_workers(name, workers)

    def submit(self, query: str) -> Future:
        """A future of the query's passages (best first)."""
        return WorkQueue.submit(self, query)

    def _take(self) -> Optional[List[Tuple[str, Future, float]]]:
        with self._cv:
            while True:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return None
                batch = self.take_fitting(self.max_batch_queries, size=lambda query: 1)
                if batch:
                    return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            call = self._start([q for q, _, _ in batch])
            if self._finish(batch, call) or len(batch) == 1 or isinstance(call.error, self.fatal):
                continue
            # One bad or hung query must not fail the runs it was batched with: search each alone
            # (concurrently, so a hung one costs the others one more timeout at most).
            for s in range(0, len(batch), SOLO_CHUNK):
                part = batch[s:s + SOLO_CHUNK]
                calls = [self._start([q]) for q, _, _ in part]
                for item, c in zip(part, calls):
                    self._finish([item], c, raise_to_waiter=True)

    def _start(self, queries: List[str]) -> "_Call":
        c = _Call(queries, time.perf_counter())
        if self.timeout_s is None:
            c.run(self._search)
        else:
            threading.Thread(target=c.run, args=(self._search,), name=f"{self.name}-call",
                             daemon=True).start()
        return c

    def _finish(self, batch, call: "_Call", raise_to_waiter: bool = False) -> bool:
        """Deliver a call's results; on failure fail the waiters when ``raise_to_waiter`` or the
        batch is a single query, and return False."""
        left = None
        if self.timeout_s is not None:
            left = max(0.0, call.started + self.timeout_s - time.perf_counter())
        if not call.done.wait(left):
            error: BaseException = TimeoutError(f"no answer within {self.timeout_s:g} s")
        elif call.error is not None:
            error = call.error
        else:
            end = call.ended
            self.meter.work(end - call.started, len(batch))
            for (_, fut, submitted), passages in zip(batch, call.results):
                self.meter.wait(end - submitted)
                fut.set_result(passages)
            return True
        if raise_to_waiter or len(batch) == 1 or isinstance(error, self.fatal):
            for _, fut, _ in batch:
                fut.set_exception(error)
        return False

    def _search(self, queries: List[str]) -> list:
        results = self.retriever.search(queries, self.k)
        if len(results) != len(queries):
            raise RuntimeError(f"retriever returned {len(results)} results for {len(queries)} queries")
        return results



SOLO_CHUNK = 32
"""Queries of a failed batch searched alone at a time (each its own call)."""


class _Call:
    """One search call and its outcome."""

    def __init__(self, queries: List[str], started: float):
        self.queries, self.started = queries, started
        self.done = threading.Event()
        self.results: list = []
        self.error: Optional[BaseException] = None
        self.ended = started

    def run(self, search) -> None:
        try:
            self.results = search(self.queries)
        except BaseException as e:
            self.error = e
        finally:
            self.ended = time.perf_counter()
            self.done.set()
