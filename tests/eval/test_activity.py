"""Role activity by question type, from hand-built records whose counts are known."""

import pytest

from mopd.core.records import AgentCall, Event, WorkflowRecord
from mopd.eval.activity import ACTIVITY_FIELDS, record_activity
from mopd.eval.report import write_report
from mopd.eval.summary import summarize


def _record(qid, dataset, attempt, waves=(), searches=0, dropped=0, workflow="hmas"):
    """A workflow whose Leader dispatched ``waves`` (subtasks per Leader output, one output per
    step) and whose Searchers made ``searches`` search actions."""
    events, step = [], 1
    for n in waves:
        events += [Event("subtask", step, call_id="l0", text=f"sub {step}.{i}") for i in range(n)]
        step += 1
        events += [Event("search", step, call_id=f"s{step}.0", text="q") for _ in range(searches if step == 2 else 0)]
        step += 1
    if not waves:
        events += [Event("search", 1, call_id="s0", text="q") for _ in range(searches)]
    events += [Event("search", 1, call_id="s0", text="  ")]          # a blank query: no search action
    events += [Event("dropped_subtask", 1, call_id="l0", text="x") for _ in range(dropped)]
    calls = [AgentCall("l0", "leader")] if workflow == "hmas" else [AgentCall("s0", "searcher")]
    return WorkflowRecord(question_id=qid, dataset=dataset, question="q?", answers=["a"], attempt=attempt,
                          workflow=workflow, calls=calls, events=events, candidates=["<answer>a</answer>"])


def test_one_record_counts():
    r = _record("q", "d", 0, waves=(1, 2), searches=3, dropped=4)
    assert dict(zip(ACTIVITY_FIELDS, record_activity(r))) == {
        "leader_subtasks": 3.0, "leader_waves": 2.0, "multi_subtask": 1.0, "multi_subtask_one_wave": 1.0,
        "searches": 3.0, "no_search": 0.0}
    # two single-subtask waves: two subtasks in all, never two at once
    r = _record("q", "d", 0, waves=(1, 1), searches=0)
    assert record_activity(r) == (2.0, 2.0, 1.0, 0.0, 0.0, 1.0)
    # subtasks of the same step from two different calls are not one output
    r = _record("q", "d", 0, waves=(1,))
    r.events.append(Event("subtask", 1, call_id="l1", text="other"))
    assert record_activity(r)[:4] == (2.0, 2.0, 1.0, 0.0)


def test_activity_per_dataset_and_macro_and_na_for_a_cascade(tmp_path):
    # H-MAS: dataset "cmp" has 3 questions, "hop" 1; 2 attempts each
    h = [
        _record("c1", "cmp", 0, waves=(2,), searches=2), _record("c1", "cmp", 1, waves=(1, 1), searches=1),
        _record("c2", "cmp", 0, waves=(3,), searches=0), _record("c2", "cmp", 1, waves=(1,), searches=5),
        _record("c3", "cmp", 0, waves=(), searches=0), _record("c3", "cmp", 1, waves=(2, 1), searches=1),
        _record("h1", "hop", 0, waves=(1,), searches=1), _record("h1", "hop", 1, waves=(1,), searches=2),
    ]
    c = [_record(r.question_id, r.dataset, r.attempt, searches=(i % 3), workflow="cmas") for i, r in enumerate(h)]
    s = summarize({"H": h, "C": c}, draws=20)
    a = s["activity"]["H"]
    cmp_, hop = a["per_dataset"]["cmp"], a["per_dataset"]["hop"]
    # per workflow of cmp: subtasks 2,2,3,1,0,3 -> 11/6; waves 1,2,1,1,0,2 -> 7/6
    assert cmp_["leader_subtasks"] == pytest.approx(11 / 6) and cmp_["leader_waves"] == pytest.approx(7 / 6)
    # >= 2 in all: yes, yes, yes, no, no, yes -> 4/6; in one output: yes, no, yes, no, no, yes -> 3/6
    assert cmp_["multi_subtask"] == pytest.approx(4 / 6) and cmp_["multi_subtask_one_wave"] == pytest.approx(3 / 6)
    assert cmp_["searches"] == pytest.approx(9 / 6) and cmp_["no_search"] == pytest.approx(2 / 6)
    assert hop == {"leader_subtasks": 1.0, "leader_waves": 1.0, "multi_subtask": 0.0,
                   "multi_subtask_one_wave": 0.0, "searches": 1.5, "no_search": 0.0}
    # macro: the two question types weigh the same, whatever their sizes
    assert a["macro"]["multi_subtask"] == pytest.approx((4 / 6 + 0) / 2)
    assert a["macro"]["searches"] == pytest.approx((9 / 6 + 1.5) / 2)
    assert a["leader_applicable"] is True
    cm = s["activity"]["C"]
    assert cm["leader_applicable"] is False
    assert all(cm["macro"][f] is None for f in ("leader_subtasks", "leader_waves", "multi_subtask",
                                                 "multi_subtask_one_wave"))
    # searches 0,1,2,0,1,2 on cmp; 0,1 on hop
    assert cm["per_dataset"]["cmp"]["searches"] == pytest.approx(1.0)
    assert cm["per_dataset"]["cmp"]["no_search"] == pytest.approx(2 / 6)
    assert cm["per_dataset"]["hop"]["no_search"] == pytest.approx(0.5)
    md = write_report(s, tmp_path / "rep", make_plots=False).read_text()
    part = md.split("## Role activity by question type", 1)[1]
    assert "| H | 66.7 | 0.0 | 33.3 |" in part     # 2+ subtasks: cmp, hop, macro
    assert "| H | 50.0 | 0.0 | 25.0 |" in part     # 2+ in one output
    assert "| C | n/a | n/a | n/a |" in part
    assert "| H | 1.83 | 1.00 | 1.42 |" in part    # subtasks per workflow
    assert "| C | 1.00 | 0.50 | 0.75 |" in part    # searches per workflow


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.helpers.tiny_model import init_tiny_model

    return AutoTokenizer.from_pretrained(init_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def test_activity_of_records_the_h_mas_state_machine_writes(tokenizer):
    """Records of a real (scripted-engine) H-MAS run: a wave of two subtasks, then one of one, with
    a per-wave cap of 2 (a third subtask of the first output is dropped); B searches twice."""
    from tests.helpers.prompts import field, role_of, turn_of
    from tests.helpers.workflows import run_scripted

    leader = ["<subtask>A</subtask><subtask>B</subtask><subtask>Z</subtask>", "<subtask>C</subtask>",
              "<select>1,2,3</select>"]

    def respond(prompt, params):
        role, t = role_of(prompt), turn_of(prompt)
        if role == "leader":
            return leader[min(t, 3) - 1]
        if role == "searcher":
            sub = field(prompt, "Question")
            return f"<search>{sub}{t}</search>" if t <= (2 if sub == "B" else 1) else "<report>r</report>"
        return "<answer>a</answer>"

    (rec,), *_ = run_scripted(tokenizer, respond, workflow="hmas", max_searchers_per_wave=2)
    assert [e.kind for e in rec.events].count("dropped_subtask") == 1
    assert dict(zip(ACTIVITY_FIELDS, record_activity(rec))) == {
        "leader_subtasks": 3.0, "leader_waves": 2.0, "multi_subtask": 1.0, "multi_subtask_one_wave": 1.0,
        "searches": 4.0, "no_search": 0.0}
