"""Cost averages (attempts -> questions -> datasets), relative changes and pooled statistics by hand."""

import pytest

from mopd.eval.costs import record_costs, relative_change
from mopd.eval.summary import summarize
from tests.helpers.eval_records import make_record, right


def test_record_costs_counts_each_field():
    r = make_record("q", "d", 0, right(), workflow="hmas", searches=2, empty_searches=1, blank_queries=2,
                    passages_per_search=3, reports=2, subtasks=3, input_tokens=100, output_tokens=7)
    # 3 search actions (blank queries are not actions), 2 of them returned passages (3 each).
    assert record_costs(r) == (3.0, 2.0, 6.0, 100.0, 7.0, 2.0, 3.0)


def _costly(workflow, searches):
    """searches[(dataset, qid)] = search actions of attempts 0..3; tokens = 100 x searches."""
    return [make_record(q, d, a, right(), workflow=workflow, searches=n, input_tokens=100 * n,
                        output_tokens=10, subtasks=1 if workflow == "hmas" else 0, duration_s=1.5)
            for (d, q), per_attempt in searches.items() for a, n in enumerate(per_attempt)]


def test_cost_averages_attempts_then_questions_then_datasets():
    h = _costly("hmas", {("nq", "q1"): [1, 2, 3, 2], ("nq", "q2"): [0, 0, 0, 4], ("hq", "h1"): [5, 5, 5, 5]})
    c = _costly("cmas", {("nq", "q1"): [1, 1, 1, 1], ("nq", "q2"): [1, 1, 1, 1], ("hq", "h1"): [2, 2, 2, 2]})
    s = summarize({"H": h, "C": c}, reference="H", draws=20)
    hc = s["costs"]["H"]
    # per question: q1 2, q2 1, h1 5; nq = 1.5, hq = 5; macro 3.25 (pooled mean would be 32/12).
    assert hc["per_dataset"]["nq"]["search_actions"] == pytest.approx(1.5)
    assert hc["macro"]["search_actions"] == pytest.approx(3.25)
    assert hc["macro"]["returned_passages"] == pytest.approx(3 * 3.25)
    assert hc["macro"]["input_tokens"] == pytest.approx(325)
    assert hc["macro"]["searches_with_passages"] == pytest.approx(3.25)
    assert hc["macro"]["task_assignments"] == pytest.approx(1.0)
    assert hc["task_assignments_applicable"] is True
    assert hc["pooled"]["search_actions"]["mean"] == pytest.approx(32 / 12)
    assert hc["pooled"]["search_actions"]["total"] == 32
    assert hc["pooled"]["search_actions"]["max"] == 5
    assert hc["pooled"]["duration_s"]["total"] == pytest.approx(18.0)
    cc = s["costs"]["C"]
    assert cc["macro"]["search_actions"] == pytest.approx(1.5)  # nq 1, hq 2
    assert cc["task_assignments_applicable"] is False and cc["macro"]["task_assignments"] == 0
    # relative change of the reference H against C, from unrounded values: (3.25 - 1.5) / 1.5.
    assert cc["relative_change_of_reference"]["search_actions"] == pytest.approx(1.75 / 1.5)
    assert cc["relative_change_of_reference"]["task_assignments"] is None  # C has 0
    assert hc["relative_change_of_reference"] is None


def test_relative_change():
    assert relative_change(697, 885) == pytest.approx(-188 / 885)
    assert relative_change(1, 0) is None


def test_record_costs_agree_with_the_record_properties():
    import random

    rng = random.Random(3)
    for _ in range(50):
        r = make_record("q", "d", 0, right(), searches=rng.randint(0, 3), empty_searches=rng.randint(0, 2),
                        blank_queries=rng.randint(0, 2), passages_per_search=rng.randint(0, 3),
                        reports=rng.randint(0, 2), subtasks=rng.randint(0, 2), input_tokens=rng.randint(0, 99))
        c = record_costs(r)
        assert (c[0], c[2], c[3], c[4]) == (r.search_actions, r.returned_passages, r.input_tokens, r.output_tokens)
        assert c[1] == sum(1 for e in r.events_of("search") if e.text.strip() and e.passages)
        assert (c[5], c[6]) == (len(r.events_of("report")), len(r.events_of("subtask")))
