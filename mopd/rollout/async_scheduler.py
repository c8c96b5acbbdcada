"""Asynchronous turn-level scheduling: every workflow run advances as soon as its own turns and
searches are done, while the engine batches whatever turns are pending across all runs.

Each run is a coroutine around the run's own state machine (``begin_step`` / ``searches`` /
``end_step``, the same one the lock-step :mod:`mopd.rollout.scheduler` drives):

    turns = run.begin_step()        # e.g. a Leader turn, a wave's Searcher turns, Answerer candidates
    await every turn's completions  # submitted to the engine front at once
    deliver them in turn order
    await every search's passages   # submitted to the retrieval front at once
    deliver them in order; run.end_step()

Runs never wait for each other: a run whose Searcher reported starts its Answerer while another
run's Searcher is still decoding, and retrieval overlaps generation. Nor do the Searchers of one
H-MAS wave: a run that exposes ``lanes()`` (:mod:`mopd.rollout.lanes`) has each lane driven by
its own coroutine, which submits the Searcher's next turn as soon as its own search returns; the
run goes on (``join_lanes()``, then the Leader's step) when every lane has ended. Steps are
logical rounds, not a barrier: each lane keeps its own step, and the events are put in round
order, so the records are the lock-step scheduler's: same prompts, segments, events and steps.
Sampling is seeded per request from (seed, question, attempt, call, turn)
(:meth:`RunContext.params`), and the HF and scripted engines sample a request the same way in any
batch; only ``duration_s`` differs.

A search that raises or times out ends its run with a ``limit`` event whose text starts with
``retrieval:`` (the record scores as a run without an answer) and counts in
``RolloutStats.failed_runs``; the other runs go on. An engine error, or a retriever that is gone
(``RetrieverUnavailable``), fails the whole rollout.
Cancelling (Ctrl-C, or cancelling the caller) cancels every run, fails pending requests, lets the
engine batch in progress finish and joins the worker threads before the exception propagates.

Entry points, with ``run_workflows``'s signature: :func:`run_workflows_async`, and
:func:`run_rollout`, the trainer's and evaluation's default, which uses it where it is the faster
scheduler (:func:`prefers_async`) and the lock-step one elsewhere, with the same statistics.
"""

from __future__ import annotations

import asyncio
import time
from typing import List, Optional

from tqdm.auto import tqdm

from mopd.core.records import WorkflowRecord
from mopd.retriever.client import RetrieverUnavailable
from mopd.rollout.async_engine import engine_front
from mopd.rollout.async_retrieval import RetrievalFront
from mopd.rollout.engine import capabilities_of
from mopd.rollout.rollout_stats import BusyMeter, MeteredEngine, MeteredRetriever, RolloutStats
from mopd.rollout.run_state import WorkflowSettings
from mopd.rollout.scheduler import new_runs, run_workflows

RETRIEVAL_EVENT = "retrieval"
"""Text prefix of the ``limit`` event that ends a run whose search failed."""

FATAL_RETRIEVAL_ERRORS = (RetrieverUnavailable,)
"""The retriever itself is gone (the HTTP client gave up after its retries): the rollout fails, as
the lock-step one does, rather than ending every run with an event (the trainer then stops with a
checkpoint instead of training on runs without passages)."""


class RolloutRecords(list):
    """The records, in question order with attempts in order, and ``stats`` (a RolloutStats)."""

    stats: Optional[RolloutStats] = None


async def _await_all(futures):
    waits = [asyncio.wrap_future(f) for f in futures]
    try:
        return await asyncio.gather(*waits)
    finally:
        for w in waits:
            w.cancel()  # a no-op on finished ones; drops the rest from the fronts' queues


class RunCounter:
    """Runs admitted, not done, and not waiting on the engine (read by the engine front's thread;
    an int read is atomic)."""

    def __init__(self):
        self.away = 0

    def __call__(self) -> int:
        return self.away


async def drive_run(run, engine, retrieval, counter: Optional[RunCounter] = None) -> bool:
    """Advance one run to its end; False when a search failed and ended it."""
    counter = counter or RunCounter()
    counter.away += 1
    try:
        return await _drive(run, engine, retrieval, counter)
    finally:
        counter.away -= 1


class _SearchFailed(Exception):
    """A lane's search raised or timed out (not fatally): its run ends."""

    def __init__(self, lane, error: BaseException):
        super().__init__(str(error))
        self.lane, self.error = lane, error


def _end_on_search_error(run, error: BaseException) -> None:
    """End ``run`` with a ``limit`` event saying why its search failed."""
    if isinstance(error, FATAL_RETRIEVAL_ERRORS):
        raise error
    reason = f"timed out ({error})" if isinstance(error, TimeoutError) else f"{type(error).__name__}: {error}"
    run.ctx.event("limit", text=f"{RETRIEVAL_EVENT}: {reason}")
    run.ctx.finish()
    run.done = True


async def _drive_lane(lane, engine, retrieval, counter: RunCounter) -> None:
    """One Searcher of a wave, turn after turn, each submitted when its own previous search is in."""
    try:
        while not lane.done:
            turn = lane.begin()
            if turn is None:
                return
            future = engine.submit(turn.request)
            counter.away -= 1
            try:
                (completions,) = await _await_all([future])
            finally:
                counter.away += 1
            turn.deliver(completions)
            need = lane.search()
            if need is not None:
                try:
                    (passages,) = await _await_all([retrieval.submit(need.query)])
                except Exception as e:
                    if isinstance(e, FATAL_RETRIEVAL_ERRORS):
                        raise
                    raise _SearchFailed(lane, e) from e
                need.deliver(passages)
            lane.end_turn()
    finally:
        counter.away -= 1


async def _drive_lanes(lanes, engine, retrieval, counter: RunCounter) -> _SearchFailed | None:
    """Every lane on its own coroutine until all have ended; the first failed search, if any
    (the other lanes are then cancelled). Any other error cancels them and propagates."""
    counter.away += len(lanes) - 1  # each lane counts as a run for the engine front
    tasks = [asyncio.ensure_future(_drive_lane(lane, engine, retrieval, counter)) for lane in lanes]
    try:
        await asyncio.gather(*tasks)
    except _SearchFailed as failed:
        return failed
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        counter.away += 1
    return None


async def _drive(run, engine, retrieval, counter: RunCounter) -> bool:
    while not run.done:
        lanes = run.lanes() if hasattr(run, "lanes") else []
        if lanes:
            failed = await _drive_lanes(lanes, engine, retrieval, counter)
            run.join_lanes()
            if failed is not None:
                run.ctx.step = failed.lane.step
                _end_on_search_error(run, failed.error)
                return False
            continue
        turns = run.begin_step()
        futures = [engine.submit(t.request) for t in turns]
        counter.away -= 1
        try:
            outputs = await _await_all(futures)
        finally:
            counter.away += 1
        for turn, completions in zip(turns, outputs, strict=True):
            turn.deliver(completions)
        needs = run.searches()
        if needs:
            try:
                results = await _await_all([retrieval.submit(n.query) for n in needs])
            except Exception as e:
                if isinstance(e, FATAL_RETRIEVAL_ERRORS):
                    raise
                _end_on_search_error(run, e)
                return False
            for need, passages in zip(needs, results, strict=True):
                need.deliver(passages)
        run.end_step()
    return True


async def drive_runs(runs, engine, retrieval, *, max_active_runs: Optional[int] = None, progress=None,
                     counter: Optional[RunCounter] = None) -> int:
    """Drive every run concurrently (at most ``max_active_runs`` at once); the number that failed.
    ``counter``: kept up to date with the runs not waiting on the engine (for the engine front)."""
    gate = asyncio.Semaphore(max_active_runs or max(1, len(runs)))
    counter = counter or RunCounter()
    failed = 0

    async def one(run):
        nonlocal failed
        async with gate:
            ok = await drive_run(run, engine, retrieval, counter)
        failed += not ok
        if progress is not None:
            progress.update(1)

    tasks = [asyncio.ensure_future(one(run)) for run in runs]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION) if tasks else (set(), set())
        for task in tasks:  # the first error (in run order) fails the rollout
            if task in done and not task.cancelled() and task.exception() is not None:
                raise task.exception()
    finally:  # an error, or the caller's cancellation: no run outlives the rollout
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return failed


def run_workflows_async(engine, retriever, tokenizer, questions, settings: WorkflowSettings, *, attempts: int,
                        method: str = "", progress: bool = True) -> List[WorkflowRecord]:
    """Run ``attempts`` workflows of ``settings.workflow`` on every question, asynchronously; a
    :class:`RolloutRecords` list (records question by question, attempts in order) whose ``stats``
    says how the time went. Same arguments as :func:`mopd.rollout.scheduler.run_workflows`; the
    settings' ``retrieval_workers`` and ``retrieval_timeout_s`` shape the retrieval front.
    """
    settings = settings.with_engine(engine)  # the transcripts stop where the engine does
    runs = new_runs(questions, attempts, tokenizer, settings, method)
    engine.reset_prefix_cache()  # cached prefixes may predate the weights
    bar = None
    if progress:
        bar = tqdm(total=len(runs), desc=f"rollout {settings.workflow}", unit="run", leave=False)
    counter = RunCounter()
    front = engine_front(engine, max_batch_calls=settings.max_batch_calls, others=counter)
    searches = RetrievalFront(retriever, settings.topk, workers=settings.retrieval_workers,
                              timeout_s=settings.retrieval_timeout_s or None, fatal=FATAL_RETRIEVAL_ERRORS)
    start = time.perf_counter()
    try:
        failed = asyncio.run(drive_runs(runs, front, searches, max_active_runs=settings.max_active_runs or None, progress=bar,
                                        counter=counter))
    finally:
        wall = time.perf_counter() - start
        front.close()
        searches.close()
        if bar is not None:
            bar.close()
        engine.reset_prefix_cache()
    records = RolloutRecords(r.ctx.record for r in runs)
    records.stats = RolloutStats.collect(wall, front.meter, searches.meter, records, failed)
    return records


def prefers_async(engine) -> bool:
    """Whether the asynchronous scheduler is the faster one for ``engine`` (bench/RESULTS.md,
    "Asynchronous rollout"): yes for vLLM, whose engine steps run outside the Python interpreter
    lock and batch continuously (simulated at the paper's scale: 1.46-1.50x lock-step tokens/s);
    no for the HF engine, whose Python decode loop shares that lock with the event loop (measured
    on the CPU with the 0.7M-parameter model: 0.57x; not measured on a GPU) and for other synchronous engines. The
    engine says so in its ``capabilities``."""
    return capabilities_of(engine).prefers_async


def run_rollout(engine, retriever, tokenizer, questions, settings: WorkflowSettings, *, attempts: int,
                method: str = "", progress: bool = True) -> List[WorkflowRecord]:
    """:func:`run_workflows_async` where ``settings.scheduler`` says async, or says auto and
    :func:`prefers_async`; else the lock-step scheduler with its engine and retriever metered;
    either way the records (identical in both) carry ``stats``."""
    if settings.scheduler == "async" or (settings.scheduler == "auto" and prefers_async(engine)):
        return run_workflows_async(engine, retriever, tokenizer, questions, settings, attempts=attempts,
                                   method=method, progress=progress)

    engine_meter, retrieval_meter = BusyMeter(), BusyMeter()
    start = time.perf_counter()
    records = RolloutRecords(run_workflows(MeteredEngine(engine, engine_meter),
                                           MeteredRetriever(retriever, retrieval_meter), tokenizer, questions,
                                           settings, attempts=attempts, method=method, progress=progress))
    records.stats = RolloutStats.collect(time.perf_counter() - start, engine_meter, retrieval_meter, records)
    return records
