"""Run one function over several argument tuples in spawned processes, results in input order.

Spawned (not forked) workers start from a clean interpreter: no torch thread pool or OpenMP state
is inherited, and the pinned CPU environment (:mod:`mopd.core.reproducible`) reaches them through
``os.environ``. A worker's exception is raised here, in the caller. Workers end when the process
that started them ends (:mod:`mopd.core.parent_death`): no orphan finishes a job for a caller
that is gone.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, List, Sequence

from mopd.core.parent_death import die_with_parent


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes that end when this process ends, even by ``kill -9``
    (:mod:`mopd.core.parent_death`). Submit to it from the thread that made it."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=die_with_parent, initargs=(os.getpid(),))


def spawn_map(fn: Callable, jobs: Sequence[tuple], workers: int) -> List:
    """``[fn(*args) for args in jobs]``, ``workers`` spawned processes at a time (``fn`` must be a
    module-level function, its arguments picklable); the workers end with this process."""
    with worker_pool(workers) as pool:
        futures = [pool.submit(fn, *args) for args in jobs]
        return [f.result() for f in futures]
