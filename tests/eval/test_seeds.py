"""The two-level (seeds, then questions) bootstrap of an effect pooled over seeds (a recipe's
multi-seed summary uses it: tests/recipes/tiny_world/test_seed_summary.py)."""

import numpy as np
import pytest

from mopd.eval.seeds import macro_difference, pooled_by_dataset, pooled_difference


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

    by = pooled_by_dataset([questions(0.2, 0.2), questions(0.3, 0.1, extra=True)], draws=300, seed=0)
    assert set(by) == {"chain", "pair", "yes_no"}
    assert by["chain"]["diff"] == pytest.approx(0.25, abs=0.01) and by["chain"]["verdict"] == "above"
    assert by["pair"]["diff"] == pytest.approx(-0.15, abs=0.01) and by["pair"]["verdict"] == "below"
    assert by["chain"]["ci"][0] < by["chain"]["diff"] < by["chain"]["ci"][1]
    assert (by["yes_no"]["seeds"], by["chain"]["seeds"]) == (1, 2)
    assert by["yes_no"]["diff"] == 0.0 and by["yes_no"]["verdict"] == "indistinguishable"
