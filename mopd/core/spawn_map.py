"""Run one function over several argument tuples in spawned processes, results in input order.

Spawned (not forked) workers start from a clean interpreter: no torch thread pool or OpenMP state
is inherited, and the pinned CPU environment (:mod:`mopd.core.reproducible`) reaches them through
``os.environ``. A worker's exception is raised here, in the caller. Workers end when the process
that started them ends (:mod:`mopd.core.parent_death`): no orphan finishes a job for a caller
that is gone.

Ctrl-C (or a SIGTERM the caller turned into ``KeyboardInterrupt``) is the caller's to handle:
:func:`spawn_map`'s workers ignore SIGINT (a Ctrl-C to the terminal's process group reaches them
too, and each would print a traceback), and the caller, interrupted, ends them at once instead of
waiting for their jobs (which a worker that missed or swallowed the signal would run to the end:
the caller sat idle for minutes after "interrupted").
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, List, Sequence

from mopd.core.parent_death import die_with_parent

STOP_WAIT_S = 5.0
"""How long ended workers get to exit after SIGTERM before SIGKILL."""


def worker_pool(workers: int, ignore_ctrl_c: bool = False) -> ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes that end when this process ends, even by ``kill -9``
    (:mod:`mopd.core.parent_death`). Submit to it from the thread that made it. ``ignore_ctrl_c``:
    its workers ignore SIGINT (the caller stops them: :func:`stop_workers`)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_quiet_worker if ignore_ctrl_c else die_with_parent,
                               initargs=(os.getpid(),))


def spawn_map(fn: Callable, jobs: Sequence[tuple], workers: int) -> List:
    """``[fn(*args) for args in jobs]``, ``workers`` spawned processes at a time (``fn`` must be a
    module-level function, its arguments picklable); the workers end with this process, and at
    once when the caller is interrupted."""
    pool = worker_pool(workers, ignore_ctrl_c=True)
    try:
        with _ctrl_c_held():   # the workers are spawned meanwhile: they start with it held, then ignore it
            futures = [pool.submit(fn, *args) for args in jobs]
        return [f.result() for f in futures]
    except KeyboardInterrupt:
        stop_workers(pool)
        raise
    finally:
        pool.shutdown(wait=True)


def stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel the jobs not started and end ``pool``'s workers now (SIGTERM, then SIGKILL after
    :data:`STOP_WAIT_S`), so that nothing waits for the jobs they were running."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        with contextlib.suppress(Exception):
            p.terminate()
    for p in processes:
        with contextlib.suppress(Exception):
            p.join(STOP_WAIT_S)
            if p.is_alive():
                p.kill()
                p.join(STOP_WAIT_S)


def _quiet_worker(parent_pid: int) -> None:
    """A :func:`spawn_map` worker's start: it ends with its parent and leaves Ctrl-C to it."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})   # held by the parent while it spawned us


@contextlib.contextmanager
def _ctrl_c_held():
    """SIGINT blocked in this thread meanwhile (a worker spawned now inherits the block until it
    ignores SIGINT, so a Ctrl-C while it starts prints no traceback there); one that arrived is
    delivered here when the block ends."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
