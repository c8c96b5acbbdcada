"""Accuracy metrics, flexible extraction counts and failure taxonomy on a hand-made record set.

Every expected number below is worked out by hand from the table of attempts in ``_system_a``.
"""

import numpy as np
import pytest

from mopd.eval.alignment import align_runs
from mopd.eval.metrics import (
    dataset_means,
    macro_mean,
    n_correct_counts,
    outcomes,
    question_metrics,
    score_record,
)
from mopd.eval.summary import summarize
from tests.helpers.eval_records import WRONG, make_record, right


def _system_a():
    """nq: q1 4/4, q2 1/4, q3 0/4 (two rescuable, one empty, one missing); hq: h1 2/4.

    attempt:      0                1                        2                  3
    nq/q1   right            right                    right              right
    nq/q2   right            WRONG                    WRONG              WRONG
    nq/q3   "Paris"(flex)    "<ANSWER>paris</ANSWER>" ""  (empty)        no candidate
    hq/h1   right            right                    "Answer: London"   WRONG
    """
    table = {
        ("nq", "q1"): [right(), right(), right(), right()],
        ("nq", "q2"): [right(), WRONG, WRONG, WRONG],
        ("nq", "q3"): ["Paris", "<ANSWER>paris</ANSWER>", "", None],
        ("hq", "h1"): [right(), right(), "Answer: London", WRONG],
    }
    return [make_record(q, d, a, c) for (d, q), cands in table.items() for a, c in enumerate(cands)]


def _system_perfect():
    return [make_record(q, d, a, right()) for d, q in [("nq", "q1"), ("nq", "q2"), ("nq", "q3"), ("hq", "h1")]
            for a in range(4)]


def test_score_record_uses_the_last_candidate():
    assert score_record(make_record("q", "d", 0, None, candidates=[right(), WRONG])) == (False, False, 0)
    assert score_record(make_record("q", "d", 0, None, candidates=[WRONG, right()])) == (True, True, 0)
    assert score_record(make_record("q", "d", 0, None)) == (False, False, 1)
    assert score_record(make_record("q", "d", 0, "  ")) == (False, False, 2)
    assert score_record(make_record("q", "d", 0, "the Paris.")) == (False, True, 3)
    assert score_record(make_record("q", "d", 0, "x", answers=["Lyon", "x"])) == (False, True, 3)


def test_question_metrics_and_macro_by_hand():
    runs = align_runs({"A": _system_a()})
    assert runs.datasets == ["hq", "nq"]
    assert runs.questions == [("hq", "h1"), ("nq", "q1"), ("nq", "q2"), ("nq", "q3")]
    out = outcomes(runs)
    np.testing.assert_array_equal(out.strict[0].sum(-1), [2, 4, 1, 0])
    np.testing.assert_array_equal(out.flex[0].sum(-1), [2, 4, 1, 2])
    m = question_metrics(out.strict)
    di, d = runs.dataset_index, len(runs.datasets)
    # avg: nq (1 + 1/4 + 0)/3, hq 2/4; macro the plain mean of the two.
    np.testing.assert_allclose(dataset_means(m["avg"], di, d), [[0.5, 1.25 / 3]])
    np.testing.assert_allclose(macro_mean(m["avg"], di, d), [(0.5 + 1.25 / 3) / 2])
    np.testing.assert_allclose(macro_mean(m["pass"], di, d), [(1 + 2 / 3) / 2])
    np.testing.assert_allclose(macro_mean(m["all"], di, d), [(0 + 1 / 3) / 2])
    # questions with 0..4 right attempts: hq's one has 2; nq's three have 4, 1 and 0
    np.testing.assert_array_equal(n_correct_counts(out.strict, di, d)[0], [[0, 0, 1, 0, 0], [1, 1, 0, 0, 1]])


def test_macro_weights_datasets_equally_not_questions():
    # 1 question right in a 1-question dataset, 0 of 9 in the other: macro 0.5, pooled 0.1.
    recs = [make_record("a", "small", 0, right())] + [make_record(f"b{i}", "big", 0, WRONG) for i in range(9)]
    s = summarize({"S": recs}, draws=50)
    assert s["accuracy"]["strict"]["S"]["macro"]["avg@1"]["value"] == pytest.approx(0.5)


def test_summary_strict_flexible_format_and_bound_by_hand():
    s = summarize({"A": _system_a(), "P": _system_perfect()}, reference="P", draws=200)
    strict, flex = s["accuracy"]["strict"]["A"]["macro"], s["accuracy"]["flexible"]["A"]["macro"]
    assert strict["avg@4"]["value"] == pytest.approx((0.5 + 1.25 / 3) / 2)
    assert strict["pass@4"]["value"] == pytest.approx((1 + 2 / 3) / 2)
    assert strict["4/4"]["value"] == pytest.approx(1 / 6)
    # flexible: nq/q3 gains 2 attempts -> nq avg (1 + .25 + .5)/3, every nq question passes.
    assert flex["avg@4"]["value"] == pytest.approx((0.5 + 1.75 / 3) / 2)
    assert flex["pass@4"]["value"] == pytest.approx(1.0)
    assert flex["4/4"]["value"] == pytest.approx(1 / 6)
    # Differences are reference - system; the reference scores 1 everywhere.
    assert strict["avg@4"]["diff_vs_reference"] == pytest.approx(1 - (0.5 + 1.25 / 3) / 2)
    assert s["accuracy"]["strict"]["P"]["macro"]["avg@4"]["diff_vs_reference"] is None
    assert s["accuracy"]["strict"]["A"]["n_correct"]["counts"] == {"hq": [0, 0, 1, 0, 0], "nq": [1, 1, 0, 0, 1]}

    fmt = s["format"]["A"]
    assert fmt["rescued"] == {"total": 2, "per_dataset": {"hq": 0, "nq": 2}}
    assert fmt["flexible_change_macro"]["avg@4"] == pytest.approx(0.5 / 3 / 2)
    assert fmt["flexible_change_macro"]["pass@4"] == pytest.approx(1 - (1 + 2 / 3) / 2)
    f = fmt["failures"]
    assert (f["no_candidate"]["count"], f["empty_candidate"]["count"], f["no_valid_tag"]["count"]) == (1, 1, 3)
    assert f["no_valid_tag"]["per_dataset"] == {"hq": 1, "nq": 2}
    assert f["no_candidate"]["pooled_frac"] == pytest.approx(1 / 16)
    assert f["no_valid_tag"]["pooled_frac"] == pytest.approx(3 / 16)
    # macro: nq has 12 workflows, hq 4.
    assert f["no_candidate"]["macro_frac"] == pytest.approx((1 / 12 + 0) / 2)
    assert f["no_valid_tag"]["macro_frac"] == pytest.approx((2 / 12 + 1 / 4) / 2)
    assert f["any"]["macro_frac"] == pytest.approx((4 / 12 + 1 / 4) / 2)
    assert fmt["completion_macro"] == pytest.approx((11 / 12 + 1) / 2)
    # Table 7: a_A + f_A = 0.75 (nq: 1, .25, 1; hq: .75); the bound against P is 1 - 0.75.
    b = fmt["upper_bound"]
    assert b["a"] == pytest.approx((0.5 + 1.25 / 3) / 2)
    assert b["f"] == pytest.approx(7 / 24)
    assert b["a_plus_f"] == pytest.approx(0.75)
    assert b["value"] == pytest.approx(0.25)
    assert b["ci"][0] <= 0.25 <= b["ci"][1]
    assert s["format"]["P"]["upper_bound"] is None
    assert s["format"]["P"]["rescued"]["total"] == 0


def test_validation_counts_add_up_across_ranks():
    from mopd.eval.metrics import validation_counts, validation_metrics

    rank0 = [make_record("q0", "nq", 0, right(), searches=2), make_record("q1", "nq", 0, WRONG, blank_queries=1)]
    rank1 = [make_record("q2", "hq", 0, right(), searches=1), make_record("q3", "hq", 0, None, empty_searches=1),
             make_record("q4", "hq", 0, "<answer>Paris</answer> <answer>Rome</answer>")]
    a, b = validation_counts(rank0), validation_counts(rank1)
    assert a == [1.0, 2.0, 2.0, 1.0] and b == [1.0, 3.0, 2.0, 1.0]   # a blank query is no search action
    m = validation_metrics([x + y for x, y in zip(a, b)])
    assert m == {"val/em": 2 / 5, "val/search_per_workflow": 4 / 5, "val/no_search_frac": 2 / 5}
    assert validation_metrics(validation_counts([])) == {"val/em": 0.0, "val/search_per_workflow": 0.0,
                                                          "val/no_search_frac": 0.0}
