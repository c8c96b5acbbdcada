"""The trainer's token traces: each model token's values read back from the packed micro-batches,
the fixed sample, and the append-only file."""

import json

import pytest
import torch

from mopd.algo.advantages import role_specs
from mopd.config import resolve
from mopd.core.records import AgentCall, Segment
from mopd.train.step_batches import pack_records
from mopd.train.token_trace import append_traces, trace_lines, traced_records
from tests.helpers.records import record


def _call(cid, role, env, model, lps):
    return AgentCall(cid, role, segments=[Segment(env, "env", "e"), Segment(model, "model", "m", lps)])


def _step(records):
    step = pack_records(records, budget=9, device=torch.device("cpu"))   # odd budget: calls spread over batches
    for b in step.batches:
        # pi_old = sampling + 0.5, teacher = -(token id) / 100: each token's values are known
        b.old_logp, b.teacher_logp = b.sampling_logp + 0.5, -(b.targets.float() / 100)
    return step


def test_values_are_those_of_each_model_token_in_order():
    recs = [record("q1", calls=[_call("s0", "searcher", [1, 2], [31, 32, 33], [-0.1, -0.2, -0.3]),
                                _call("a0.0", "answerer", [4], [41], [-0.7])]),
            record("q2", calls=[_call("s0", "searcher", [5, 6, 7], [51, 52], [-1.5, -2.5])])]
    step = _step(recs)
    cfg = resolve("mopd")
    step.fill_advantages([{"a0.0": 0.25}, {}])
    lines = trace_lines(7, recs, step, role_specs(cfg.algo), rewards=[{"a0.0": 1.0}, {}],
                        advantages=[{"a0.0": 0.25}, {}], teacher_roles=["searcher"], count=5)
    assert [ln["record"]["question_id"] for ln in lines] == ["q1", "q2"] and lines[0]["step"] == 7
    s = lines[0]["calls"]["s0"]["tokens"]
    assert s["sampling"] == [-0.1, -0.2, -0.3]
    assert s["old"] == [0.4, 0.3, 0.2]
    assert s["teacher"] == [-0.31, -0.32, -0.33]
    # OPD on the Searcher: opd_coef (0.01 in the paper preset) x (teacher - old)
    coef = cfg.algo.role("searcher").opd_coef
    assert s["advantage"] == [round(coef * (t - o), 4) for t, o in zip(s["teacher"], s["old"])]
    a = lines[0]["calls"]["a0.0"]
    assert a["reward"] == 1.0 and a["advantage"] == 0.25
    assert a["tokens"]["advantage"] == [0.25] and "teacher" not in a["tokens"]
    assert lines[1]["calls"]["s0"]["tokens"]["sampling"] == [-1.5, -2.5]


def test_the_sample_is_the_first_workflow_of_each_group():
    recs = [record("q1", attempt=0), record("q1", attempt=1), record("q2"), record("q3")]
    assert traced_records(recs, 2) == [0, 2]
    assert traced_records(recs, 10) == [0, 2, 3]


def test_traces_are_appended_whole_lines(tmp_path):
    append_traces(tmp_path, [{"step": 1}])
    append_traces(tmp_path, [{"step": 2}, {"step": 3}])
    rows = [json.loads(x) for x in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]


@pytest.mark.slow
def test_a_traced_step_trains_exactly_as_an_untraced_one(tiny_model_dir, qa_file, tmp_path):
    from mopd.train.trainer import PolicyTrainer
    from tests.helpers.retrievers import FakeRetriever
    from tests.helpers.training import tiny_overrides

    runs = {}
    for every in (0, 1):
        cfg = resolve("mopd", tiny_overrides(tiny_model_dir, qa_file, tmp_path / f"run{every}", **{
            "teacher.path": tiny_model_dir, "trainer.trace_every": every, "trainer.trace_workflows": 2,
            "rollout.workflow": "cmas"}))   # a Searcher first in every workflow: OPD tokens to trace
        t = PolicyTrainer(cfg, retriever=FakeRetriever(), progress=False)
        m = t.fit(1)
        runs[every] = ({k: v.detach().clone() for k, v in t.model.state_dict().items()},
                       {k: v for k, v in m.items() if k.startswith(("loss/", "reward/", "adv"))})
        t.close()
    assert runs[0][1] and runs[0][1] == runs[1][1]
    assert all(torch.equal(runs[0][0][k], runs[1][0][k]) for k in runs[0][0])
    assert not (tmp_path / "run0" / "traces.jsonl").exists()
    lines = [json.loads(x) for x in (tmp_path / "run1" / "traces.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and {ln["step"] for ln in lines} == {1}
    searchers = [c for ln in lines for cid, c in ln["calls"].items() if cid.startswith("s")]
    assert searchers and all(len(c["tokens"]["teacher"]) == len(c["tokens"]["old"]) > 0 for c in searchers)


def test_trace_settings_are_checked():
    from mopd.config import ConfigError

    assert resolve("mopd").trainer.trace_every == 0 and resolve("tiny_mopd").trainer.trace_every == 5
    for bad in ("trainer.trace_every=-1", "trainer.trace_workflows=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            resolve("mopd", [bad])
