"""Work handed from the rollout's event loop to a worker thread.

The asynchronous fronts (engine batching, vLLM steps, retrieval) all take work the same way: the
event loop calls :meth:`WorkQueue.submit` and awaits the returned future; the front's worker
thread takes items under the queue's condition variable; :meth:`WorkQueue.close_pending` marks
the queue closed, wakes every waiter and fails what never started. :meth:`WorkQueue.start_workers`
runs the front's ``_loop`` on its worker threads and :meth:`WorkQueue.close` ends them. What a
worker does with the items (batch by rows, step an engine, search) is the front's own.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Callable, Deque, List, Tuple


class FrontClosed(RuntimeError):
    """The rollout ended (an error elsewhere, or Ctrl-C) before this piece of work ran."""


class WorkQueue:
    """Pending ``(item, future, submitted_at)`` triples, oldest first, behind one condition."""

    def __init__(self, what: str):
        self._what = what
        """What an item is, for error messages ("request", "search")."""
        self._pending: Deque[Tuple[object, Future, float]] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._threads: List[threading.Thread] = []

    def start_workers(self, name: str, count: int = 1, on_worker: Callable[[], object] = lambda: None) -> None:
        """Run the front's ``_loop`` on ``count`` daemon threads (``name``, or ``name-i`` for several),
        each after ``on_worker()`` (e.g. binding the CUDA device the front was made on)."""
        def work() -> None:
            on_worker()
            self._loop()

        self._threads = [threading.Thread(target=work, name=name if count == 1 else f"{name}-{i}", daemon=True)
                         for i in range(count)]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        """Fail what is still pending, let the work in progress finish, and join the workers."""
        self.close_pending()
        for t in self._threads:
            t.join()

    def submit(self, item) -> Future:
        """Queue ``item``; the future gets the worker's result (or its exception)."""
        fut: Future = Future()
        with self._cv:
            if self._closed:
                raise FrontClosed(f"the front is closed: this {self._what} cannot run")
            self._pending.append((item, fut, time.perf_counter()))
            self._cv.notify()
        return fut

    def take_all(self) -> List[Tuple[object, Future, float]]:
        """Every pending triple, removed from the queue (call it holding ``self._cv``)."""
        items, self._pending = list(self._pending), deque()
        return items

    def pending_size(self, size: Callable[[object], int]) -> int:
        """The summed size of the pending items whose waiter still wants them (call it holding
        ``self._cv``): a cancelled item is dropped when taken, so it is no work to wait for."""
        return sum(size(item) for item, fut, _ in self._pending if not fut.cancelled())

    def take_fitting(self, cap: int, size: Callable[[object], int], used: int = 0) -> List[Tuple[object, Future, float]]:
        """The oldest pending triples whose sizes fit in ``cap`` beside ``used`` (call it holding
        ``self._cv``). An item larger than ``cap`` is taken alone when nothing is used yet, so it is
        never starved; an item whose waiter went away (a cancelled future) is dropped, not taken."""
        taken = []
        while self._pending:
            item = self._pending[0]
            if not item[1].cancelled() and used and used + size(item[0]) > cap:
                break
            self._pending.popleft()
            if item[1].set_running_or_notify_cancel():
                taken.append(item)
                used += size(item[0])
        return taken

    def close_pending(self) -> None:
        """Close the queue, wake every waiter, and fail the work that never started."""
        with self._cv:
            self._closed = True
            pending = self.take_all()
            self._cv.notify_all()
        for _, fut, _ in pending:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(FrontClosed(f"the rollout ended before this {self._what} ran"))
