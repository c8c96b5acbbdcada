import random

import numpy as np
import pytest

from mopd.eval.alignment import EvalError, align_runs
from tests.helpers.eval_records import WRONG, make_record, right


def _run(qids, attempts=4, dataset="nq"):
    return [make_record(q, dataset, a, right() if a % 2 else WRONG) for q in qids for a in range(attempts)]


def test_grid_is_independent_of_record_order():
    a = _run(["q2", "q10", "q1"]) + _run(["h1"], dataset="hq")
    b = list(a)
    random.Random(0).shuffle(b)
    ra, rb = align_runs({"A": a}), align_runs({"A": b})
    assert ra.questions == rb.questions == [("hq", "h1"), ("nq", "q1"), ("nq", "q10"), ("nq", "q2")]
    np.testing.assert_array_equal(ra.dataset_index, [0, 1, 1, 1])
    assert [r.attempt for r in rb.records[0][:4]] == [0, 1, 2, 3]
    assert ra.grid(lambda r: r.attempt).shape == (1, 4, 4)


def test_missing_question_names_system_and_question():
    with pytest.raises(EvalError, match=r"system 'B' has no record of question nq/q3 \(system 'A' has it\)"):
        align_runs({"A": _run(["q1", "q3"]), "B": _run(["q1"])})


def test_missing_attempt_and_duplicates_are_errors():
    with pytest.raises(EvalError, match=r"'B' lacks attempt\(s\) \[3\] of question nq/q1"):
        align_runs({"A": _run(["q1"]), "B": _run(["q1"], attempts=3)})
    with pytest.raises(EvalError, match="two records of question nq/q1 attempt 0"):
        align_runs({"A": _run(["q1"]) + _run(["q1"], attempts=1)})
    with pytest.raises(EvalError, match="no records"):
        align_runs({"A": []})


def test_intersection_keeps_shared_questions_and_reports_drops():
    a = _run(["q1", "q2", "q3"])
    b = _run(["q1", "q2"]) + [make_record("q3", "nq", 0, WRONG)]  # q3 incomplete in B
    runs = align_runs({"A": a, "B": b}, intersect=True)
    assert runs.questions == [("nq", "q1"), ("nq", "q2")]
    assert runs.attempts == [0, 1, 2, 3]
    assert runs.dropped == {"A": 4, "B": 1}
