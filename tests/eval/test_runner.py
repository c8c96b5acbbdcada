"""`mopd eval run`'s resumable runner, with a fake rollout in place of the engine."""

import json

import pytest

from mopd.config import Config, resolve
from mopd.core.qa import QAExample
from mopd.core.records import read_records
from mopd.eval.alignment import EvalError
from mopd.eval.runner import EvalPlan, read_finished, run_evaluation
from mopd.rollout.run_state import WorkflowSettings
from tests.helpers.eval_records import make_record, right


class FakeRollout:
    """run_workflows-compatible: records every call; can fail on the n-th call (a killed run)."""

    def __init__(self, fail_on_call=None):
        self.calls = []
        self.fail_on_call = fail_on_call

    def __call__(
        self, engine, retriever, tokenizer, questions, settings, *, attempts, method="", progress=True
    ):
        workflow = settings.workflow
        self.calls.append(
            {
                "ids": [q.id for q in questions],
                "workflow": workflow,
                "attempts": attempts,
                "candidates": settings.answer_candidates,
                "temperature": settings.temperature,
                "top_p": settings.top_p,
                "seed": settings.seed,
                "max_steps": settings.max_steps,
                "topk": settings.topk,
            }
        )
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise KeyboardInterrupt
        return [
            make_record(q.id, q.dataset, a, right(), workflow=workflow)
            for q in questions
            for a in range(attempts)
        ]


def _questions(n):
    return [
        QAExample(id=f"q{i}", dataset="nq" if i % 2 else "hq", question=f"Q{i}?", answers=["Paris"])
        for i in range(n)
    ]


def _plan(out, workflow="cmas", attempts=4, cfg=None, **kw):
    return EvalPlan(out, WorkflowSettings.for_evaluation(cfg or Config(), workflow), attempts=attempts, **kw)


def test_eval_settings_follow_the_protocol():
    r = WorkflowSettings.for_evaluation(Config(), "hmas")
    assert (r.workflow, r.answer_candidates, r.temperature, r.top_p) == ("hmas", 1, 0.6, 0.95)
    assert (r.max_input_tokens, r.max_output_tokens, r.max_steps) == (8192, 512, 12)
    assert WorkflowSettings.for_evaluation(resolve("mopd"), "hmas").max_steps == 12
    assert WorkflowSettings.for_evaluation(Config(), "cmas").max_steps == 5
    # The config's own workflow keeps the config's limit; a preset's seed is the evaluation's seed.
    cfg = resolve("tiny_mopd", ["rollout.seed=7"])
    assert WorkflowSettings.for_evaluation(cfg).max_steps == cfg.rollout.max_steps == 8
    assert WorkflowSettings.for_evaluation(cfg).seed == 7
    with pytest.raises(ValueError, match="xmas"):
        WorkflowSettings.for_evaluation(cfg, "xmas")


def test_runs_every_question_in_chunks_and_writes_records(tmp_path):
    fake = FakeRollout()
    path = run_evaluation(
        None,
        None,
        None,
        _questions(5),
        _plan(tmp_path, "cmas", 4, method="m", chunk_questions=2),
        run_fn=fake,
    )
    assert [c["ids"] for c in fake.calls] == [["q0", "q1"], ["q2", "q3"], ["q4"]]
    assert all(c["temperature"] == 0.6 and c["top_p"] == 0.95 and c["candidates"] == 1 for c in fake.calls)
    assert {c["seed"] for c in fake.calls} == {0} and {c["topk"] for c in fake.calls} == {3}
    recs = read_records(path)
    assert len(recs) == 20 and {r.method for r in recs} == {"m"}
    assert json.loads((tmp_path / "run.json").read_text())["finished_questions"] == 5


def test_killed_run_resumes_with_unfinished_questions(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run_evaluation(
            None,
            None,
            None,
            _questions(5),
            _plan(tmp_path, "cmas", 4, chunk_questions=2),
            run_fn=FakeRollout(fail_on_call=2),
        )
    assert len(read_records(tmp_path / "records.jsonl")) == 8  # the first chunk was saved
    # A kill in the middle of writing: a half line at the end, and q1 missing two attempts.
    f = tmp_path / "records.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    f.write_text("".join(lines[:6]) + lines[6][:40])
    fake = FakeRollout()
    path = run_evaluation(
        None, None, None, _questions(5), _plan(tmp_path, "cmas", 4, chunk_questions=2), run_fn=fake
    )
    assert [c["ids"] for c in fake.calls] == [["q1", "q2"], ["q3", "q4"]]
    recs = read_records(path)
    assert sorted((r.question_id, r.attempt) for r in recs) == [
        (f"q{i}", a) for i in range(5) for a in range(4)
    ]
    # Nothing left: a third start runs nothing.
    fake3 = FakeRollout()
    run_evaluation(None, None, None, _questions(5), _plan(tmp_path, "cmas", 4), run_fn=fake3)
    assert fake3.calls == []


def test_read_finished_rejects_a_broken_line_in_the_middle(tmp_path):
    f = tmp_path / "records.jsonl"
    good = json.dumps(make_record("q", "d", 0, right()).to_dict())
    f.write_text(good + "\n{broken\n" + good + "\n")
    with pytest.raises(ValueError, match="records.jsonl:2"):
        read_finished(f, 1)


def test_resume_with_other_settings_is_refused(tmp_path):
    run_evaluation(None, None, None, _questions(2), _plan(tmp_path, "cmas", 4), run_fn=FakeRollout())
    with pytest.raises(EvalError, match="other settings"):
        run_evaluation(None, None, None, _questions(2), _plan(tmp_path, "hmas", 4), run_fn=FakeRollout())
    with pytest.raises(EvalError, match="other settings"):
        run_evaluation(None, None, None, _questions(2), _plan(tmp_path, "cmas", 2), run_fn=FakeRollout())


def test_a_rollout_that_loses_attempts_is_an_error(tmp_path):
    def lossy(*a, questions=None, **k):
        return [make_record("q0", "hq", 0, right())]

    with pytest.raises(EvalError, match="attempts \\[0\\] for question hq/q0"):
        run_evaluation(
            None, None, None, _questions(1), _plan(tmp_path, "cmas", 4), run_fn=lambda *a, **k: lossy()
        )
    with pytest.raises(EvalError, match="appears twice"):
        run_evaluation(
            None, None, None, _questions(2) * 2, _plan(tmp_path / "b", "cmas", 4), run_fn=FakeRollout()
        )


def test_evaluate_in_process_with_an_engine(tmp_path):
    import mopd.eval

    class Engine:
        tokenizer = "tok"

        def generate(self, requests):
            raise AssertionError("the fake rollout does not generate")

    seen = {}

    def rollout(engine, retriever, tokenizer, questions, settings, **kw):
        seen.update(engine=engine, tokenizer=tokenizer, retriever=retriever)
        return FakeRollout()(engine, retriever, tokenizer, questions, settings, **kw)

    eng = Engine()
    path = mopd.eval.evaluate(
        eng, None, "ret", _questions(3), _plan(tmp_path, "hmas", 2), Config(), run_fn=rollout
    )
    assert seen == {"engine": eng, "tokenizer": "tok", "retriever": "ret"}
    s = mopd.eval.summarize({"m": mopd.eval.load_runs([path.parent])[path.parent.name]}, draws=20)
    assert s["accuracy"]["strict"]["m"]["macro"]["avg@2"]["value"] == 1.0


def test_token_ids_are_dropped_unless_kept(tmp_path):
    from mopd.core.records import Segment

    def with_segments(*a, **k):
        recs = FakeRollout()(*a, **k)
        for r in recs:
            r.calls[0].segments = [Segment([1, 2], "env", "prompt"), Segment([3], "model", "out", [-0.5])]
        return recs

    for keep, ids in ((False, [[], []]), (True, [[1, 2], [3]])):
        path = run_evaluation(
            None,
            None,
            None,
            _questions(1),
            _plan(tmp_path / str(keep), "cmas", 1, keep_token_ids=keep),
            run_fn=with_segments,
        )
        segs = read_records(path)[0].calls[0].segments
        assert [s.token_ids for s in segs] == ids and [s.text for s in segs] == ["prompt", "out"]
