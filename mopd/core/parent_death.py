"""Worker processes that end when the process that started them ends.

A pipeline's workers (Stage II arms trained side by side, evaluations, pi_0's demonstrations) are
spawned processes. Killed with ``kill -9``, the parent cannot stop them; before this they went on
as orphans, finished their stages after their pipeline was gone and wrote what its rerun then
reused. :func:`die_with_parent` (a worker pool's initializer, :func:`mopd.core.spawn_map.worker_pool`)
arms Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``), checks the parent did not
die before it was armed, and on every system also watches the parent from a daemon thread (the
worker's parent id changes when it is re-parented) and ends the process at once when it goes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
WATCH_EVERY_S = 0.5


def _arm_parent_death_signal() -> bool:
    """Linux: SIGKILL this process when the thread that spawned it exits (its pool's thread, which
    lives as long as the pool). False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    while True:
        time.sleep(WATCH_EVERY_S)
        if os.getppid() != parent_pid:
            os._exit(1)


def die_with_parent(parent_pid: int) -> None:
    """In a worker: end this process when ``parent_pid`` (the process that started it) ends."""
    _arm_parent_death_signal()
    if os.getppid() != parent_pid:      # it died before the signal was armed
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), name="parent-watch", daemon=True).start()


def parent_death_signal(sig: int):
    """A ``preexec_fn`` for ``subprocess``: the child gets ``sig`` when the thread that starts it
    (which waits for it) ends, e.g. SIGTERM, so that ``torchrun`` can stop its own workers."""
    def arm() -> None:
        if sys.platform.startswith("linux"):
            try:
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
            except (OSError, AttributeError):
                pass
    return arm
