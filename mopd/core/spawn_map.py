"""Run one function over several argument tuples in spawned processes, results in input order.

Spawned (not forked) workers start from a clean interpreter: no torch thread pool or OpenMP state
is inherited, and the pinned CPU environment (:mod:`mopd.core.reproducible`) reaches them through
``os.environ``. A worker's exception is raised here, in the caller.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, List, Sequence


def spawn_map(fn: Callable, jobs: Sequence[tuple], workers: int) -> List:
    """``[fn(*args) for args in jobs]``, ``workers`` spawned processes at a time (``fn`` must be a
    module-level function, its arguments picklable)."""
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(fn, *args) for args in jobs]
        return [f.result() for f in futures]
