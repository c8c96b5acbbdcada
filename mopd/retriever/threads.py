"""Torch threads by batch size, for the server's searches: a batch of a few queries runs on one thread.

Encoding one short query is a few hundred tiny matrix products ([~10 tokens, 384] x [384, 1536]
for MiniLM); split over OpenMP threads, each product pays a fork/join whose cost is of the order of
the product itself, and on a busy machine a join waits for a descheduled thread. Measured on the
2-core box (bench/RESULTS.md, "Against Search-R1's retrieval server"): one query took 13 ms of CPU
on one thread and 18 ms on two, and its wall time was no shorter on two. Large batches still use
every thread (64 queries: 275 ms on two threads against 364 ms on one).

Torch's thread count is process-wide, so this is for a process whose searches are its only torch
work (``mopd retriever serve``: the batcher's one worker thread); each call restores the count it
found, so nothing outlives the call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

SMALL_BATCH_QUERIES = 8
"""Batches of at most this many queries run on ``SMALL_BATCH_THREADS`` torch threads."""
SMALL_BATCH_THREADS = 1


class ThreadsBySize:
    """``search(queries, k)`` with torch limited to ``threads`` threads for batches of at most
    ``small`` queries; larger batches run with the process's thread count."""

    def __init__(self, search: Callable[[Sequence[str], int], tuple[np.ndarray, np.ndarray]],
                 small: int = SMALL_BATCH_QUERIES, threads: int = SMALL_BATCH_THREADS):
        if small < 0 or threads < 1:
            raise ValueError("need small >= 0 and threads >= 1")
        self.search, self.small, self.threads = search, small, threads
        self.limited = 0        # calls run with the thread limit (what tests check)

    def __call__(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        if len(queries) > self.small:
            return self.search(queries, k)
        import torch

        before = torch.get_num_threads()
        if before <= self.threads:
            return self.search(queries, k)
        torch.set_num_threads(self.threads)
        self.limited += 1
        try:
            return self.search(queries, k)
        finally:
            torch.set_num_threads(before)
