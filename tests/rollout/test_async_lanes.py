"""The Searchers of one H-MAS wave advance independently under the asynchronous scheduler (each its
own lane, mopd.rollout.lanes), while their records stay the lock-step scheduler's."""

import asyncio
import dataclasses
import re
import threading
from concurrent.futures import Future

import pytest

from mopd.rollout.async_engine import BatchingFront
from mopd.rollout.async_scheduler import RunCounter, drive_runs, run_workflows_async
from mopd.rollout.lanes import Lane, merge_events
from mopd.rollout.run_state import RunContext, WorkflowSettings
from mopd.rollout.scheduler import new_run, run_workflows
from mopd.rollout.scripted_engine import ScriptedEngine
from tests.helpers.prompts import field, role_of, turn_of
from tests.helpers.retrievers import FakeRetriever

from .test_async_scheduler import SlowRetriever, comparable
from .test_hmas import policy

SETTINGS = WorkflowSettings(workflow="hmas", max_steps=12, max_rounds=3, answer_candidates=2, seed=5)


def band(prompt):
    return int(re.search(r"band (\d+)", prompt).group(1))


def wave_policy(searches, leader):
    """Searcher of subtask X searches ``searches[X]`` times (query 'X<turn> ...'), then reports;
    ``leader[band]``: the Leader's outputs of that question's run, turn by turn."""

    def respond(prompt, params):
        if role_of(prompt) == "searcher":
            sub, turn = field(prompt, "Question"), turn_of(prompt)
            if turn <= searches[sub[0]]:
                return f"<search>{sub}{turn}</search>"
            return f"<report>R({sub})</report>"
        return policy(leader[band(prompt)], answer=[f"<answer>x{j}</answer>" for j in range(params.n)])(
            prompt, params)

    return respond


def lockstep_records(tokenizer, respond, n_questions, settings=SETTINGS):
    from tests.helpers.workflows import questions

    return run_workflows(ScriptedEngine(tokenizer, respond), FakeRetriever(), tokenizer, questions(n_questions),
                         settings, attempts=1, method="m", progress=False)


class LoggedFront:
    """An engine front that logs every submission (role, subject, turn) before passing it on."""

    def __init__(self, front, engine, on_submit=None):
        self.front, self.engine, self.on_submit = front, engine, on_submit
        self.log = []

    def submit(self, request):
        prompt = self.engine.decode(request.prompt_ids)
        role = role_of(prompt)
        subject = field(prompt, "Question") if role == "searcher" else band(prompt)
        self.log.append((role, subject, turn_of(prompt)))
        if self.on_submit is not None:
            self.on_submit(self.log)
        return self.front.submit(request)


class GatedRetrieval:
    """Answers at once, except the queries of subtask A: those wait for ``release`` (set by the test
    when what it expects to run meanwhile has been submitted, or after 5 s at worst)."""

    def __init__(self):
        self.fake = FakeRetriever()
        self.held = []
        self.lock = threading.Lock()
        self.released = False

    def submit(self, query):
        fut = Future()
        with self.lock:
            if query.startswith("A") and not self.released:
                self.held.append((query, fut))
                return fut
        fut.set_result(self.fake.search([query], 3)[0])
        return fut

    def release(self):
        with self.lock:
            self.released, held, self.held = True, self.held, []
        for query, fut in held:
            fut.set_result(self.fake.search([query], 3)[0])


def test_a_searcher_does_not_wait_for_the_slow_searches_of_its_wave(tokenizer):
    """Run 0's wave: A searches 3 times with slow retrieval, B reports at once, C searches 3 times
    with fast retrieval. Run 1 delegates one subtask (D, reports at once). A's first search is held
    until C's last turn and run 1's Answerer have been submitted: with per-Searcher lanes they are
    (rounds would hold C's second turn behind A's search)."""
    from tests.helpers.workflows import questions

    respond = wave_policy({"A": 3, "B": 0, "C": 3, "D": 0},
                          {0: ["<subtask>A</subtask><subtask>B</subtask><subtask>C</subtask>", "<select>1,3</select>"],
                           1: ["<subtask>D</subtask>", "<select>1</select>"]})
    engine = ScriptedEngine(tokenizer, respond)
    searches = GatedRetrieval()

    def release_when_ready(log):
        if ("searcher", "C", 4) in log and ("answerer", 1, 1) in log:
            searches.release()

    front = LoggedFront(BatchingFront(engine), engine, release_when_ready)
    runs = [new_run("hmas", q, 0, tokenizer, SETTINGS, "m") for q in questions(2)]
    timer = threading.Timer(5.0, searches.release)  # a scheduler that waits on A fails, not hangs
    timer.start()
    counter = RunCounter()
    try:
        assert asyncio.run(drive_runs(runs, front, searches, counter=counter)) == 0
    finally:
        timer.cancel()
        front.front.close()
    assert counter.away == 0
    log = front.log
    a2 = log.index(("searcher", "A", 2))
    assert all(log.index(("searcher", "C", t)) < a2 for t in (2, 3, 4))  # C's turns 2-4 went first
    assert log.index(("answerer", 1, 1)) < a2  # and the other run finished meanwhile
    assert log.index(("searcher", "B", 1)) < log.index(("searcher", "C", 2))
    assert log.index(("leader", 0, 2)) > log.index(("searcher", "A", 4))  # the Leader waits for its wave
    records = [r.ctx.record for r in runs]
    assert comparable(records) == comparable(lockstep_records(tokenizer, respond, 2))
    rec = records[0]
    # logical steps, not execution order: L1, wave 2-5 (A's 4 turns), L6, A7
    assert rec.steps == 7 and [c.step for c in rec.calls] == [1, 2, 2, 2, 7, 7]
    assert [(e.step, e.call_id) for e in rec.events_of("search")] == [
        (2, "s0.0"), (2, "s0.2"), (3, "s0.0"), (3, "s0.2"), (4, "s0.0"), (4, "s0.2")]
    assert [(e.step, e.call_id) for e in rec.events_of("report")] == [(2, "s0.1"), (5, "s0.0"), (5, "s0.2")]


class FailingA(GatedRetrieval):
    """Subtask A's searches fail; the others are answered at once."""

    def submit(self, query):
        if query.startswith("A"):
            fut = Future()
            fut.set_exception(ConnectionError("no index"))
            return fut
        return super().submit(query)


def test_a_failed_search_ends_its_run_and_cancels_the_other_lanes(tokenizer):
    from tests.helpers.workflows import questions

    respond = wave_policy({"A": 1, "C": 3, "D": 1},
                          {0: ["<subtask>C</subtask><subtask>A</subtask>", "<select>1</select>"],
                           1: ["<subtask>D</subtask>", "<select>1</select>"]})
    engine = ScriptedEngine(tokenizer, respond)
    front = LoggedFront(BatchingFront(engine), engine)
    runs = [new_run("hmas", q, 0, tokenizer, SETTINGS, "m") for q in questions(2)]
    counter = RunCounter()

    async def main():
        failed = await drive_runs(runs, front, FailingA(), counter=counter)
        return failed, [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    try:
        failed, left = asyncio.run(main())
    finally:
        front.front.close()
    assert failed == 1 and left == [] and counter.away == 0
    rec = runs[0].ctx.record
    last = rec.events[-1]
    assert (last.kind, last.step, last.text) == ("limit", 2, "retrieval: ConnectionError: no index")
    assert rec.steps == 2 and rec.final_answer is None  # C's lane was cancelled with its run
    assert comparable([r.ctx.record for r in runs[1:]]) == comparable(lockstep_records(tokenizer, respond, 2)[1:])


@pytest.mark.parametrize("slow", ["A", "C"])
def test_searchers_reaching_the_step_limit_at_different_times(tokenizer, slow):
    """A and C search every turn (one of them with slow retrieval), B searches once, D's long
    queries overflow its input limit after two searches: A and C are forced to report at step
    max_steps-2, D ends earlier, and the records are lock-step's."""
    from tests.helpers.workflows import questions

    def respond(prompt, params):
        if role_of(prompt) == "searcher":
            sub, turn = field(prompt, "Question"), turn_of(prompt)
            if sub == "B":
                return "<search>B1</search>" if turn == 1 else "<report>R(B)</report>"
            if sub == "D":
                return "<search>D" + " very long words" * 20 + f"{turn}</search>"
            return f"<search>{sub}{turn}</search>"
        return policy(["<subtask>A</subtask><subtask>B</subtask><subtask>C</subtask><subtask>D</subtask>",
                       "<select>2</select>"], answer="<answer>x</answer>")(prompt, params)

    settings = dataclasses.replace(SETTINGS, max_steps=7, max_input_tokens=1200, answer_candidates=1)
    ref = lockstep_records(tokenizer, respond, 3, settings)
    slow_retriever = SlowRetriever(lambda q: 0.05 if q.startswith(slow) else 0.0)
    got = run_workflows_async(ScriptedEngine(tokenizer, respond), slow_retriever, tokenizer, questions(3),
                              dataclasses.replace(settings, retrieval_workers=2), attempts=1, method="m",
                              progress=False)
    assert comparable(got) == comparable(ref)
    rec = got[0]
    limits = [(e.step, e.call_id, e.text) for e in rec.events_of("limit")]
    # wave steps 2-5: D searched at 2 and 3 and cannot be prompted at 4; A and C are forced at 5
    assert limits == [(4, "s0.3", "input"), (5, "s0.0", "step"), (5, "s0.2", "step"), (6, "l0", "step")]
    assert rec.steps == 7 and rec.calls_of("answerer")[0].step == 7


def test_the_leader_resumes_at_the_step_its_last_searcher_ended_without_a_turn(tokenizer):
    """When the wave's last Searcher to end is cut by the input limit (no turn at that step), the
    Leader acts at that very step, as in rounds."""
    from tests.helpers.workflows import questions

    def respond(prompt, params):
        if role_of(prompt) == "searcher":
            sub, turn = field(prompt, "Question"), turn_of(prompt)
            if sub == "D":
                return "<search>D" + " very long words" * 20 + f"{turn}</search>"
            return f"<report>R({sub})</report>"
        return policy(["<subtask>A</subtask><subtask>D</subtask>", "<select>1</select>"])(prompt, params)

    settings = dataclasses.replace(SETTINGS, max_input_tokens=1200, answer_candidates=1)
    ref = lockstep_records(tokenizer, respond, 2, settings)
    got = run_workflows_async(ScriptedEngine(tokenizer, respond), SlowRetriever(lambda q: 0.02), tokenizer,
                              questions(2), settings, attempts=1, method="m", progress=False)
    assert comparable(got) == comparable(ref)
    rec = got[0]
    assert [(e.step, e.call_id, e.text) for e in rec.events_of("limit")] == [(4, "s0.1", "input")]
    assert [e.step for e in rec.events_of("select")] == [4] and rec.steps == 5


def test_lanes_driven_out_of_order_merge_their_events_into_round_order(tokenizer):
    """Two lanes run their sub-steps in an arbitrary interleaving; the merged events are the ones
    rounds emit, in round order, each at its lane's step."""
    from mopd.core.records import WorkflowRecord
    from mopd.retriever import Passage
    from mopd.rollout.agents import Searcher
    from tests.helpers.workflows import questions

    q = questions(1)[0]
    settings = dataclasses.replace(SETTINGS, max_steps=6)
    ctx = RunContext(WorkflowRecord(question_id=q.id, dataset=q.dataset, question=q.question, answers=[]),
                     tokenizer, settings)
    ctx.event("subtask", "l0", "before")
    first = len(ctx.record.events)
    lanes = [Lane(ctx, Searcher(ctx, f"s0.{i}", q.question, f"T{i}"), i, step=2, force_at=4) for i in range(2)]
    outputs = {0: ["<search>a</search>", "<search>b</search>", "<report>x</report>"],
               1: ["no tags", "<report>y</report>"]}
    engine = ScriptedEngine(tokenizer, lambda p, params: "unused")
    from mopd.rollout.scripted_engine import completion_from_text

    def one_turn(lane):
        turn = lane.begin()
        text = outputs[lane.index][turn_of(engine.decode(turn.request.prompt_ids)) - 1]
        turn.deliver([completion_from_text(tokenizer, text, turn.request.params)])
        need = lane.search()
        if need is not None:
            need.deliver([Passage(id=need.query, title="t", text="p")])
        lane.end_turn()

    for i in (1, 1, 0, 0, 0):  # lane 1 runs both its turns before lane 0 starts
        one_turn(lanes[i])
    assert [lane.step for lane in lanes] == [5, 4] and all(lane.done for lane in lanes)
    merge_events(ctx, first, lanes)
    got = [(e.step, e.kind, e.call_id) for e in ctx.record.events]
    assert got == [(0, "subtask", "l0"), (2, "invalid", "s0.1"), (2, "search", "s0.0"),
                   (3, "report", "s0.1"), (3, "search", "s0.0"), (4, "limit", "s0.0"), (4, "report", "s0.0")]
    assert [c.step for c in ctx.record.calls] == [2, 2]
    ctx.event("select", "l0")  # an event from outside the lanes cannot be ordered
    with pytest.raises(RuntimeError, match="its lanes'"):
        merge_events(ctx, first, lanes)
