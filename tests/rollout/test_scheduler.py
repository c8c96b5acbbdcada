"""The scheduler: one engine batch and one retriever batch per step, caps, slots."""

import pytest

from mopd.rollout.run_state import WorkflowSettings
from mopd.rollout.scheduler import new_run, run_steps, run_workflows
from mopd.rollout.scripted_engine import ScriptedEngine
from tests.helpers.prompts import role_of, turn_of
from tests.helpers.retrievers import FakeRetriever
from tests.helpers.workflows import questions, run_scripted


def two_searches(prompt, params):
    if role_of(prompt) == "searcher":
        return "<search>q</search>" if turn_of(prompt) <= 2 else "<report>r</report>"
    return "<answer>a</answer>"


def test_all_calls_of_a_step_go_in_one_batch(tokenizer):
    _recs, engine, retriever = run_scripted(tokenizer, two_searches, n_questions=5, attempts=2, candidates=3)
    # S1, S2 search, S3 reports, A4: four steps, one generate() and at most one search() each
    assert [len(b) for b in engine.batches] == [10, 10, 10, 10]
    assert [len(b) for b in retriever.batches] == [10, 10]
    assert all(b[0].params.n == 3 for b in engine.batches[3:])


def test_batch_cap_counts_sampled_sequences(tokenizer):
    recs, engine, _ = run_scripted(tokenizer, two_searches, n_questions=5, attempts=1, candidates=3,
                                   max_batch_calls=4)
    sizes = [sum(r.params.n for r in b) for b in engine.batches]
    assert max(sizes) <= 4
    assert len(engine.batches) == 3 * 2 + 5  # 5 Searcher requests in 2 batches per step, 5 Answerer batches
    assert all(r.final_answer == "a" for r in recs)


def test_finished_runs_free_their_slots(tokenizer):
    # run 0 ends fast (its Searcher reports at once); the others search twice
    def respond(prompt, params):
        if role_of(prompt) == "searcher" and "band 0" in prompt:
            return "<report>r</report>"
        return two_searches(prompt, params)

    engine, retriever = ScriptedEngine(tokenizer, respond), FakeRetriever()
    settings = WorkflowSettings(max_steps=5)
    runs = [new_run("cmas", q, 0, tokenizer, settings) for q in questions(3)]
    run_steps(engine, retriever, runs, topk=2, max_active_runs=2)
    # step 1: runs 0,1; step 2: run 0 answers, run 1 searches; step 3: run 1 and the newly admitted run 2
    assert [len(b) for b in engine.batches][:3] == [2, 2, 2]
    assert all(r.done for r in runs)
    assert [r.ctx.record.steps for r in runs] == [2, 4, 4]
    assert all(len(p) == 2 for e in runs[1].ctx.record.events_of("search") for p in [e.passages])


def test_a_bad_retriever_fails_loudly(tokenizer):
    class Short(FakeRetriever):
        def search(self, queries, k):
            return super().search(queries, k)[:-1]

    engine = ScriptedEngine(tokenizer, two_searches)
    with pytest.raises(RuntimeError, match="retriever returned"):
        run_workflows(engine, Short(), tokenizer, questions(2), WorkflowSettings(), attempts=1, progress=False)


def test_unknown_workflow_and_too_few_steps(tokenizer):
    with pytest.raises(ValueError, match="unknown workflow"):
        new_run("xmas", questions(1)[0], 0, tokenizer, WorkflowSettings())
    with pytest.raises(ValueError, match="max_steps"):
        new_run("cmas", questions(1)[0], 0, tokenizer, WorkflowSettings(max_steps=1))


def test_seeds_depend_on_the_call_not_the_batch(tokenizer):
    seen = {}

    def respond(prompt, params):
        seen.setdefault(params.seed, 0)
        seen[params.seed] += 1
        return two_searches(prompt, params)

    run_scripted(tokenizer, respond, n_questions=3, attempts=2)
    first = dict(seen)
    seen.clear()
    run_scripted(tokenizer, respond, n_questions=3, attempts=2, max_batch_calls=1)
    assert seen == first and all(v == 1 for v in first.values())  # every turn has its own seed


def test_scripted_completions_look_sampled(tokenizer):
    from mopd.core.generation import SamplingParams
    from mopd.rollout.scripted_engine import completion_from_text

    eos = tokenizer.eos_token_id
    stop = completion_from_text(tokenizer, "<search>q</search>", SamplingParams(stop=("</search>",)))
    assert stop.token_ids[-1] != eos and stop.finish_reason == "stop" and stop.text == "<search>q</search>"
    ended = completion_from_text(tokenizer, "<subtask>a</subtask>", SamplingParams(stop=("</select>",)))
    assert ended.token_ids[-1] == eos and ended.text == "<subtask>a</subtask>"
    cut = completion_from_text(tokenizer, "word " * 20, SamplingParams(max_new_tokens=5))
    assert len(cut.token_ids) == 5 and cut.finish_reason == "length" and cut.logprobs == [0.0] * 5
