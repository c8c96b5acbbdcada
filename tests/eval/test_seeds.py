"""The multi-seed summary: claims held per seed, and the two-level (seeds, then questions) bootstrap
of the pooled effect."""

import numpy as np
import pytest

from mopd.eval.seeds import macro_difference, pooled_difference, summarize_seeds


def _seed(diffs_by_dataset):
    v = np.concatenate([np.asarray(d, float) for d in diffs_by_dataset])
    di = np.concatenate([np.full(len(d), j) for j, d in enumerate(diffs_by_dataset)])
    return v, di, len(diffs_by_dataset)


def test_macro_difference_weights_datasets_equally():
    v, di, nd = _seed([[1.0, 1.0, 1.0, 1.0], [0.0]])
    assert macro_difference(v, di, nd) == pytest.approx(0.5)


def test_constant_differences_give_a_point_interval():
    rows = [_seed([[0.25] * 5, [0.25] * 3]) for _ in range(3)]
    point, lo, hi = pooled_difference(rows, draws=300, seed=1)
    assert point == pytest.approx(0.25) and lo == pytest.approx(0.25) and hi == pytest.approx(0.25)


def test_seed_spread_widens_the_interval_beyond_question_noise():
    """Seeds with constant (question-free) effects 0, 0.1, 0.2, 0.3: every spread comes from the
    seeds; the interval lies inside [0, 0.3], contains the mean, and is far from a point."""
    rows = [_seed([[e] * 6, [e] * 6]) for e in (0.0, 0.1, 0.2, 0.3)]
    point, lo, hi = pooled_difference(rows, draws=2000, seed=3)
    assert point == pytest.approx(0.15)
    assert 0.0 <= lo < point < hi <= 0.3 and hi - lo > 0.1
    # one seed alone: question noise only
    rng = np.random.default_rng(0)
    one = [_seed([rng.normal(0.1, 0.2, 40), rng.normal(0.1, 0.2, 40)])]
    p1, lo1, hi1 = pooled_difference(one, draws=2000, seed=3)
    assert p1 == pytest.approx(macro_difference(*one[0]))
    assert lo1 < p1 < hi1


def test_pooled_bootstrap_is_seeded_and_a_repeated_seed_gets_fresh_question_draws():
    rng = np.random.default_rng(5)
    rows = [_seed([rng.normal(0.05, 0.3, 17), rng.normal(0.0, 0.3, 11)]) for _ in range(3)]
    assert pooled_difference(rows, 500, 7) == pooled_difference(rows, 500, 7)
    assert pooled_difference(rows, 500, 7) != pooled_difference(rows, 500, 8)
    # with one seed, every draw picks it S=1 times; with that seed listed twice, a draw averages two
    # independent question resamples, so the interval is narrower (by about sqrt 2)
    single = pooled_difference(rows[:1], 3000, 2)
    double = pooled_difference([rows[0], rows[0]], 3000, 2)
    assert single[0] == pytest.approx(double[0])
    assert (double[2] - double[1]) < 0.85 * (single[2] - single[1])


def _claims(d1, d2, holds1, holds2, n=8):
    def claim(trained, base, d, holds):
        qs = [{"dataset": "a" if i % 2 else "b", "id": f"q{i}", "base": 0.25, "trained": 0.25 + d} for i in range(n)]
        return {"trained": trained, "base": base, "metric": "avg@4", "diff": d, "ci": [d - 0.01, d + 0.01],
                "holds": holds, "questions": qs}
    return [claim("C-MAS + RL", "C-MAS base", d1, holds1), claim("MultiAgent-OPD", "H-MAS base", d2, holds2)]


def test_summarize_seeds_counts_held_claims_and_pools():
    per_seed = {3: {"claims": _claims(0.1, 0.05, True, False), "timings": {"total": 600.0},
                    "pi0_check": {"em": 0.2, "valid": 1.0, "weak": False, "verdict": "x"}},
                4: {"claims": _claims(0.2, 0.15, True, True)}}
    s = summarize_seeds(per_seed, draws=200, seed=0)
    assert s["seeds"] == ["3", "4"]
    c1, c2 = s["claims"]
    assert (c1["held"], c2["held"], c1["seeds"]) == (2, 1, 2)
    assert c1["diff"] == pytest.approx(0.15) and c2["diff"] == pytest.approx(0.10)
    assert c1["ci"][0] == pytest.approx(0.1) and c1["ci"][1] == pytest.approx(0.2) and c1["holds"]
    assert "questions" not in s["per_seed"]["3"]["claims"][0]
    assert s["per_seed"]["3"]["pi0_check"] == {"em": 0.2, "valid": 1.0, "weak": False}
    assert "pi0_check" not in s["per_seed"]["4"]


def test_summarize_seeds_matches_claims_by_systems_and_pools_over_the_seeds_that_have_them():
    """Seed 1 lists the two claims in the other order and adds a third; seed 2 lacks the second.
    Each claim pools over the seeds that evaluated it, in ``order`` first, then as they appear."""
    a = _claims(0.1, 0.3, True, True)
    extra = dict(a[0], trained="MultiAgent-OPD", base="No Searcher supervision", kind="primary", holds=False,
                 questions=[dict(q, trained=q["base"] - 0.05) for q in a[0]["questions"]])
    per_seed = {0: {"claims": a}, 1: {"claims": [a[1], a[0], extra]}, 2: {"claims": [a[0]]}}
    s = summarize_seeds(per_seed, draws=200, seed=0,
                        order=[("MultiAgent-OPD", "No Searcher supervision"), ("C-MAS + RL", "C-MAS base")])
    assert [(c["trained"], c["base"], c["seeds"], c["held"]) for c in s["claims"]] == [
        ("MultiAgent-OPD", "No Searcher supervision", 1, 0), ("C-MAS + RL", "C-MAS base", 3, 3),
        ("MultiAgent-OPD", "H-MAS base", 2, 2)]
    primary, stage1, stage2 = s["claims"]
    assert primary["kind"] == "primary" and primary["diff"] == pytest.approx(-0.05)
    assert primary["verdict"] == "below" and not primary["holds"]
    assert stage1["diff"] == pytest.approx(0.1) and stage2["diff"] == pytest.approx(0.3)
    assert stage1["verdict"] == "above" and "kind" not in stage1       # none given: none invented here
    # per seed, the claims it has, in the summary's order
    assert [c["base"] for c in s["per_seed"]["1"]["claims"]] == ["No Searcher supervision", "C-MAS base", "H-MAS base"]
    assert [c["base"] for c in s["per_seed"]["2"]["claims"]] == ["C-MAS base"]


def test_summarize_seeds_refuses_a_claim_measured_two_ways_or_listed_twice():
    a = _claims(0.1, 0.1, True, True)
    b = [dict(c, metric="avg@8") for c in a]
    with pytest.raises(ValueError, match="avg@4.*avg@8"):
        summarize_seeds({0: {"claims": a}, 1: {"claims": b}}, draws=10, seed=0)
    with pytest.raises(ValueError, match="twice"):
        summarize_seeds({0: {"claims": a + a[:1]}}, draws=10, seed=0)


def test_per_question_type_pools_say_which_type_pulls_which_way():
    """A nil macro difference made of a gain on one type and a loss on another: the per-type pools
    find both (and a type only one seed has pools over that seed alone)."""
    rng = np.random.default_rng(7)

    def questions(gain, loss, extra=False):
        qs = [{"dataset": "chain", "id": f"c{i}", "base": 0.25, "trained": 0.25 + gain + rng.normal(0, 0.02)}
              for i in range(13)]
        qs += [{"dataset": "pair", "id": f"p{i}", "base": 0.75, "trained": 0.75 - loss + rng.normal(0, 0.02)}
               for i in range(11)]
        if extra:
            qs += [{"dataset": "yes_no", "id": f"y{i}", "base": 0.5, "trained": 0.5} for i in range(5)]
        return qs

    claim = lambda qs: {"trained": "MultiAgent-OPD", "base": "No Searcher supervision", "kind": "primary",  # noqa: E731
                        "metric": "avg@4", "diff": 0.0, "ci": [-0.1, 0.1], "holds": False, "questions": qs}
    per_seed = {1: {"claims": [claim(questions(0.2, 0.2))]}, 2: {"claims": [claim(questions(0.3, 0.1, extra=True))]}}
    (c,) = summarize_seeds(per_seed, draws=300, seed=0)["claims"]
    by = c["per_dataset"]
    assert set(by) == {"chain", "pair", "yes_no"}
    assert by["chain"]["diff"] == pytest.approx(0.25, abs=0.01) and by["chain"]["verdict"] == "above"
    assert by["pair"]["diff"] == pytest.approx(-0.15, abs=0.01) and by["pair"]["verdict"] == "below"
    assert by["chain"]["ci"][0] < by["chain"]["diff"] < by["chain"]["ci"][1]
    assert (by["yes_no"]["seeds"], by["chain"]["seeds"]) == (1, 2)
    assert by["yes_no"]["diff"] == 0.0 and by["yes_no"]["verdict"] == "indistinguishable"
