"""Engine fronts: agent turns go to the engine one request at a time, from any run, and the engine
works on whatever is pending (continuous batching across workflows).

A front has ``submit(request) -> concurrent.futures.Future`` (the request's ``params.n``
completions) and ``close()``. One worker thread owns the engine, so the engine is never called
from two threads, and the event loop of :mod:`mopd.rollout.async_scheduler` keeps running the
other workflows (and their retrieval) while the engine computes.

- An engine's own step-level front, where its capabilities declare one:
  :class:`mopd.rollout.vllm_async_engine.VLLMStepFront`, for the vLLM engine: requests join
  vLLM's running batch between engine steps and leave it the step they finish;
  :class:`mopd.rollout.hf_continuous.HFStepFront`, for the HF engine: the same, on HFEngine's
  prefill, forward and sampling. A row samples the same tokens in any batch (per-row seeded
  streams, :mod:`mopd.rollout.sampling`), so batching does not change records.
- :class:`BatchingFront`, for other engines with a synchronous ``generate`` (scripted, fakes): each
  iteration takes every pending request, oldest first, up to ``max_batch_calls`` sampled
  sequences (after a bounded wait for runs that are about to submit), runs one ``generate`` over
  them and resolves their futures; what is submitted meanwhile makes the next batch.

:func:`engine_front` picks the front for an engine.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Callable, List, Optional, Protocol, Tuple

from mopd.core.generation import Completion, GenerationRequest
from mopd.rollout.engine import capabilities_of
from mopd.rollout.engine_worker import cuda_device_keeper, request_rows
from mopd.rollout.rollout_stats import BusyMeter
from mopd.rollout.work_queue import FrontClosed, WorkQueue  # noqa: F401 (FrontClosed: the fronts' error)


class EngineFront(Protocol):
    meter: BusyMeter

    def submit(self, request: GenerationRequest) -> "Future[List[Completion]]":
        ...

    def close(self) -> None:
        ...


GATHER_POLL_S = 0.002
"""How often a gathering front looks again at the runs it waits for."""
GATHER_SHARE = 0.25
"""Default wait for stragglers, as a share of the mean generate() call (see BatchingFront)."""
GATHER_FIRST_S = 0.05
"""Default wait before any call has been timed."""


class BatchingFront(WorkQueue):
    """Batching for a synchronous engine: every ``generate`` call takes all that is pending.

    A ``generate`` call runs until its longest sequence ends, so on such an engine small batches
    waste it (each call pays its own tail). ``others()`` says how many runs are neither done nor
    waiting on the engine (they are between turns, or searching); while some are, the front waits
    for their turns to join the batch, at most ``gather_s`` seconds (None: a quarter of the mean
    duration of the calls so far, starting at 50 ms: waiting costs at most a quarter of the call
    that a half-empty batch would waste). When every live run is waiting on the engine, or the
    time is up, the batch goes: a run is never held for a straggler's long turn.
    """

    def __init__(self, engine, *, max_batch_calls: int = 256, others: Callable[[], int] = lambda: 0,
                 gather_s: Optional[float] = None, name: str = "mopd-engine"):
        if max_batch_calls < 1:
            raise ValueError(f"max_batch_calls={max_batch_calls} must be >= 1")
        if gather_s is not None and gather_s < 0:
            raise ValueError(f"gather_s={gather_s} must be >= 0")
        self.engine = engine
        self.max_batch_calls = max_batch_calls
        self.others, self.gather_s = others, gather_s
        self.meter = BusyMeter()
        WorkQueue.__init__(self, "request")
        self.start_workers(name, on_worker=cuda_device_keeper())

    def _take(self) -> Optional[List[Tuple[GenerationRequest, Future, float]]]:
        """The next batch (oldest first, cut at max_batch_calls rows; one oversized request goes
        alone); None once closed."""
        with self._cv:
            while True:
                while not self._pending and not self._closed:
                    self._cv.wait()
                deadline = time.perf_counter() + self._gather_s()
                while not self._closed and self.others() > 0 and self.pending_size(request_rows) < self.max_batch_calls:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    self._cv.wait(min(left, GATHER_POLL_S))
                if self._closed:
                    return None
                batch = self.take_fitting(self.max_batch_calls, request_rows)
                if batch:
                    return batch

    def _gather_s(self) -> float:
        if self.gather_s is not None:
            return self.gather_s
        m = self.meter
        return GATHER_SHARE * m.busy_s / m.units if m.units else GATHER_FIRST_S

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            start = time.perf_counter()
            try:
                outputs = self.engine.generate([r for r, _, _ in batch])
                if len(outputs) != len(batch):
                    raise RuntimeError(f"the engine returned {len(outputs)} results for {len(batch)} "
                                       "requests")
            except BaseException as e:  # every waiter gets the error; the front goes on
                for _, fut, _ in batch:
                    fut.set_exception(e)
                continue
            end = time.perf_counter()
            self.meter.work(end - start, sum(r.params.n for r, _, _ in batch))
            for (_, fut, submitted), out in zip(batch, outputs):
                self.meter.wait(end - submitted)
                fut.set_result(out)


def engine_front(engine, *, max_batch_calls: int = 256, others: Callable[[], int] = lambda: 0) -> EngineFront:
    """The front for ``engine``: its own step-level front where it declares one
    (``capabilities.step_front``: vLLM's scheduler, or HFEngine's decode loop; sequences join
    between decode steps, so they never wait to gather), else the batching front over its
    ``generate`` (``others``: see BatchingFront)."""
    if capabilities_of(engine).step_front:
        return engine.step_front(max_rows=max_batch_calls)
    return BatchingFront(engine, max_batch_calls=max_batch_calls, others=others)
