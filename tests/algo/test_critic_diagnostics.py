import pytest

from mopd.algo.critic import parse_verdict, render_judge_prompt
from mopd.algo.diagnostics import batch_diagnostics
from mopd.core.records import Event
from tests.helpers.records import call, record, search


@pytest.mark.parametrize("text,v", [
    ("<verdict>yes</verdict>", 1), ("<verdict> No. </verdict>", 0), ("<VERDICT>TRUE</VERDICT>", 1),
    ("<verdict>no</verdict> then <verdict>yes</verdict>", 1), ("yes", None), ("<verdict>maybe</verdict>", None),
    ("", None), (None, None), ("<verdict>yes", None),
])
def test_parse_verdict(text, v):
    assert parse_verdict(text) == v


def test_judge_prompt_fills_all_slots():
    p = render_judge_prompt("Q?", "sub?", "the report")
    assert "Q?" in p and "sub?" in p and "the report" in p and "<verdict>" in p


def test_batch_diagnostics_by_hand():
    r1 = record(candidates=["<answer>a</answer>", "x"], calls=[call("s0", "searcher", ["x"], invalid=True),
                                                               call("a0", "answerer", ["x"])],
                events=[search(0, "s0"), search(1, "s0"), Event("report", 2, "s0", "r"), Event("subtask", 0, "l0", "t")])
    r2 = record(attempt=1, candidates=[], calls=[call("s0", "searcher", ["x"])], events=[search(0, "s0", q=" ")])
    d = batch_diagnostics([r1, r2], rewards=[{"s0": 1.0, "a0": 0.0}, {"s0": 0.5}])
    assert d["no_search_frac"] == 0.5 and d["search_per_workflow"] == 1.0
    assert d["reports_per_workflow"] == 0.5 and d["subtasks_per_workflow"] == 0.5
    assert d["valid_answer_frac"] == 0.5 and d["invalid_call_frac"] == pytest.approx(1 / 3)
    assert d["answered_frac"] == 0.5
    assert d["reward/searcher"] == 0.75 and d["reward/answerer"] == 0.0
    assert batch_diagnostics([]) == {}
