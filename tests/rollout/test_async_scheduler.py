"""The asynchronous scheduler against the lock-step reference (scripted engine), failures, cancelling."""

import _thread
import asyncio
import dataclasses
import re
import signal
import threading
import time

import pytest

from mopd.rollout.async_engine import BatchingFront
from mopd.rollout.async_retrieval import RetrievalFront
from mopd.rollout.async_scheduler import drive_runs, run_workflows_async
from mopd.rollout.run_state import WorkflowSettings
from mopd.rollout.scheduler import new_run, run_workflows
from mopd.rollout.scripted_engine import ScriptedEngine
from tests.helpers.prompts import role_of, turn_of
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.workflows import questions


def band(prompt):
    """The band a prompt is about (questions are 'Where was band i formed?', subtasks 'band i part k')."""
    return int(re.search(r"band (\d+)", prompt).group(1))


def uneven(prompt, params):
    """Runs of uneven length: band i's Searchers search i % 4 times (H-MAS: plus the subtask's
    number), the Leader delegates i % 3 + 1 subtasks once, then selects; some outputs are invalid."""
    role, turn, i = role_of(prompt), turn_of(prompt), band(prompt)
    if role == "searcher":
        part = re.search(r"part (\d+)", prompt)
        extra = int(part.group(1)) if part else 0
        if turn == 2 and i % 5 == 3:
            return "no tags here"
        if turn <= i % 4 + extra:
            return f"<search>q{i}.{turn}.{extra}</search>"
        return f"<report>band {i} found after {turn} turns</report>"
    if role == "leader":
        if turn == 1:
            return "".join(f"<subtask>band {i} part {k}</subtask>" for k in range(i % 3 + 1))
        return "<select>1</select>"
    return [f"<answer>Town{i}.{j}</answer>" for j in range(params.n)]


def settings_for(workflow, candidates=2):
    return WorkflowSettings(workflow=workflow, max_steps=5 if workflow == "cmas" else 12, max_rounds=3,
                            answer_candidates=candidates, seed=3)


def comparable(records):
    out = []
    for r in records:
        d = r.to_dict()
        d.pop("duration_s")
        out.append(d)
    return out


def lockstep(workflow, tokenizer, respond, n_questions, attempts, candidates=2):
    engine = ScriptedEngine(tokenizer, respond)
    return run_workflows(engine, FakeRetriever(), tokenizer, questions(n_questions),
                         settings_for(workflow, candidates), attempts=attempts, method="m", progress=False)


@pytest.mark.parametrize("workflow", ["cmas", "hmas"])
def test_async_records_equal_lockstep_records(tokenizer, workflow):
    ref = lockstep(workflow, tokenizer, uneven, 9, 2)
    engine = ScriptedEngine(tokenizer, uneven)
    got = run_workflows_async(engine, FakeRetriever(), tokenizer, questions(9), settings_for(workflow),
                              attempts=2, method="m", progress=False)
    assert comparable(got) == comparable(ref)
    assert len({r.steps for r in got}) > 1  # the runs really had different lengths
    stats = got.stats
    assert stats.failed_runs == 0 and stats.engine_calls == len(engine.batches)
    total = sum(c.output_tokens for r in got for c in r.calls)
    assert sum(stats.tokens.values()) == total and stats.tokens["answerer"] > 0
    assert stats.retrieval_queries == sum(r.search_actions for r in got) > 0
    assert 0 < stats.busy_fraction <= 1


def test_runs_do_not_wait_for_each_others_searches(tokenizer):
    """Band 3's search is held until band 0's Answerer has run (at most 10 s): the asynchronous
    scheduler runs band 0 on while that search is out; lock-step would hold band 0 until every
    search of step 1 returned, and the search would be released only by the timeout. No wall-clock
    assumption: on a loaded machine the order is the same."""
    log = []
    band0_answered = threading.Event()

    def respond(prompt, params):
        key = (band(prompt), role_of(prompt), turn_of(prompt))
        log.append(key)
        if key == (0, "answerer", 1):
            band0_answered.set()
        return uneven(prompt, params)

    class HeldForBand0(FakeRetriever):
        def search(self, queries, k):
            if any(q.startswith("q3.1.") for q in queries):
                band0_answered.wait(10)
            out = super().search(queries, k)
            log.append(("searched", tuple(queries)))
            return out

    recs = run_workflows_async(ScriptedEngine(tokenizer, respond), HeldForBand0(), tokenizer, questions(4),
                               settings_for("cmas"), attempts=1, method="m", progress=False)
    # Band 0 never searches: its Answerer ran while band 3's search was still out.
    slow_search = next(i for i, e in enumerate(log) if e[0] == "searched" and any(q.startswith("q3.1.") for q in e[1]))
    assert log.index((0, "answerer", 1)) < slow_search
    assert comparable(recs) == comparable(lockstep("cmas", tokenizer, uneven, 4, 1))


class SlowRetriever(FakeRetriever):
    def __init__(self, delay_for):
        super().__init__()
        self.delay_for = delay_for

    def search(self, queries, k):
        time.sleep(max(self.delay_for(q) for q in queries))
        return super().search(queries, k)


class FailingRetriever(FakeRetriever):
    """Raises for queries of band 2; hangs (until released) on queries of band 5."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def search(self, queries, k):
        if any(q.startswith("q2.") for q in queries):
            raise ConnectionError("server said no")
        if any(q.startswith("q5.") for q in queries):
            self.release.wait(10)
        return super().search(queries, k)


@pytest.mark.parametrize("workflow", ["cmas", "hmas"])
def test_failed_or_hung_retrieval_ends_only_its_run(tokenizer, workflow):
    ref = lockstep(workflow, tokenizer, uneven, 7, 1)
    retriever = FailingRetriever()
    try:
        got = run_workflows_async(ScriptedEngine(tokenizer, uneven), retriever, tokenizer, questions(7),
                                  dataclasses.replace(settings_for(workflow), retrieval_timeout_s=0.6,
                                                      retrieval_workers=2), attempts=1, method="m", progress=False)
    finally:
        retriever.release.set()
    assert got.stats.failed_runs == 2
    for i, (r, want) in enumerate(zip(got, ref)):
        limits = [e.text for e in r.events_of("limit")]
        if i == 2:
            assert limits[-1] == "retrieval: ConnectionError: server said no" and r.final_answer is None
        elif i == 5:
            assert limits[-1] == "retrieval: timed out (no answer within 0.6 s)" and r.final_answer is None
        else:  # searched in the same batches as the failing queries, yet untouched
            assert comparable([r]) == comparable([want])
    for t in threading.enumerate():
        if t.name.startswith("mopd-retrieval"):
            t.join(5)
    assert not [t for t in threading.enumerate() if t.name.startswith("mopd-")]


def mopd_threads():
    return [t for t in threading.enumerate() if t.name.startswith("mopd-")]


def test_ctrl_c_leaves_no_running_thread(tokenizer):
    calls = []

    def respond(prompt, params):
        calls.append(1)
        if len(calls) == 12:
            _thread.interrupt_main()  # what Ctrl-C does: SIGINT to the main thread
            time.sleep(0.2)
        return uneven(prompt, params)

    # Ctrl-C's handler, whatever the process or an earlier test left installed: interrupt_main()
    # does nothing when SIGINT is ignored, and asyncio.run turns it into a cancellation only when
    # the handler is Python's default
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_workflows_async(ScriptedEngine(tokenizer, respond), SlowRetriever(lambda q: 0.01), tokenizer,
                                questions(20), settings_for("hmas"), attempts=2, progress=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(calls) < 200 and not mopd_threads()


def test_cancelling_the_rollout_task_cancels_every_run(tokenizer):
    settings = settings_for("cmas")
    runs = [new_run("cmas", q, 0, tokenizer, settings) for q in questions(8)]
    engine = BatchingFront(ScriptedEngine(tokenizer, uneven))
    searches = RetrievalFront(SlowRetriever(lambda q: 0.05), 3)

    async def main():
        task = asyncio.create_task(drive_runs(runs, engine, searches))
        await asyncio.sleep(0.08)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    try:
        left = asyncio.run(main())
    finally:
        engine.close()
        searches.close()
    assert left == [] and not mopd_threads()
    assert not all(r.done for r in runs)  # it really was cut short
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit(None)


def test_engine_errors_fail_the_rollout(tokenizer):
    def respond(prompt, params):
        if role_of(prompt) == "answerer":
            raise ValueError("engine broke")
        return uneven(prompt, params)

    with pytest.raises(ValueError, match="engine broke"):
        run_workflows_async(ScriptedEngine(tokenizer, respond), FakeRetriever(), tokenizer, questions(3),
                            settings_for("cmas"), attempts=1, progress=False)
    assert not mopd_threads()


def test_an_unreachable_retriever_fails_the_rollout(tokenizer):
    from mopd.retriever import RetrieverUnavailable

    class Gone(FakeRetriever):
        def search(self, queries, k):
            self.batches.append(list(queries))
            raise RetrieverUnavailable("http://127.0.0.1:9 unavailable after 6 attempts")

    gone = Gone()
    with pytest.raises(RetrieverUnavailable):
        run_workflows_async(ScriptedEngine(tokenizer, uneven), gone, tokenizer, questions(6),
                            dataclasses.replace(settings_for("cmas"), retrieval_workers=2), attempts=1,
                            progress=False)
    assert all(len(b) >= 1 for b in gone.batches) and len(gone.batches) <= 2  # no query-by-query retry
    assert not mopd_threads()


def test_run_rollout_picks_the_scheduler_by_engine_and_always_reports_stats(tokenizer):
    from mopd.rollout.async_scheduler import prefers_async, run_rollout

    from .test_async_fronts import FakeVLLMEngine

    engine, retriever = ScriptedEngine(tokenizer, uneven), FakeRetriever()
    assert not prefers_async(engine) and prefers_async(FakeVLLMEngine())
    got = run_rollout(engine, retriever, tokenizer, questions(5), settings_for("hmas"), attempts=2,
                      method="m", progress=False)
    assert comparable(got) == comparable(lockstep("hmas", tokenizer, uneven, 5, 2))
    stats = got.stats
    assert stats.engine_calls == len(engine.batches) and stats.retrieval_batches == len(retriever.batches)
    assert stats.retrieval_queries == sum(r.search_actions for r in got) > 0
    assert stats.mean_batch_rows > 1 and 0 < stats.busy_fraction <= 1
    fake = FakeVLLMEngine()  # continuous batching: the asynchronous scheduler, stepping the fake engine
    short = dataclasses.replace(settings_for("cmas"), max_output_tokens=8)
    got = run_rollout(fake, FakeRetriever(), tokenizer, questions(2), short, attempts=1, progress=False)
    assert len(got) == 2 and got.stats.engine_calls == len(fake.llm.llm_engine.steps) > 0
