"""The paired question bootstrap: reproducible, replayable by hand, paired, shrinking with n."""

import numpy as np
import pytest

from mopd.eval import bootstrap
from mopd.eval.bootstrap import dataset_draws, paired_intervals, resample_indices
from mopd.eval.metrics import macro_mean, question_metrics


def _data(rng, sizes, systems=3, k=4, p=(0.3, 0.5, 0.7)):
    di = np.concatenate([np.full(n, d) for d, n in enumerate(sizes)])
    correct = np.stack([rng.random((len(di), k)) < p[s] for s in range(systems)])  # [S, Q, K]
    return correct, di


def _values(correct):
    m = question_metrics(correct)
    return np.stack([m["avg"], m["pass"], m["all"]], 1)  # [S, 3, Q]


def test_replays_by_hand_from_the_published_indices():
    rng = np.random.default_rng(1)
    correct, di = _data(rng, [5, 3, 7], systems=2)
    v = _values(correct)
    draws = 30
    out = dataset_draws(v.reshape(6, -1), di, 3, draws=draws, seed=7)  # [B, D, F]
    idx = resample_indices([5, 3, 7], draws, seed=7)
    rows = [np.flatnonzero(di == d) for d in range(3)]
    for b in range(draws):
        for d in range(3):
            picked = rows[d][idx[d][b]]  # whole questions: all attempts of every system come along
            for s in range(2):
                by_hand = correct[s][picked]  # [n_d, K]
                assert out[b, d, s * 3 + 0] == pytest.approx(by_hand.mean())
                assert out[b, d, s * 3 + 1] == pytest.approx(by_hand.any(1).mean())
                assert out[b, d, s * 3 + 2] == pytest.approx(by_hand.all(1).mean())


def test_reproducible_for_a_seed_and_independent_of_chunking(monkeypatch):
    correct, di = _data(np.random.default_rng(2), [40, 25])
    v = _values(correct)
    a = dataset_draws(v.reshape(9, -1), di, 2, draws=300, seed=11)
    b = dataset_draws(v.reshape(9, -1), di, 2, draws=300, seed=11)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, dataset_draws(v.reshape(9, -1), di, 2, draws=300, seed=12))
    monkeypatch.setattr(bootstrap, "_CHUNK_CELLS", 97)  # a few draws per chunk
    np.testing.assert_array_equal(a, dataset_draws(v.reshape(9, -1), di, 2, draws=300, seed=11))


def test_intervals_contain_the_point_estimate_and_shrink_with_questions():
    widths = []
    for n in (20, 200, 2000):
        correct, di = _data(np.random.default_rng(3), [n, n // 2, n])
        v = _values(correct)
        iv = paired_intervals(v, di, 3, reference=2, draws=1000, seed=5)
        point = macro_mean(v, di, 3)  # [S, M]
        assert np.all(iv.macro_lo <= point + 1e-12) and np.all(point <= iv.macro_hi + 1e-12)
        diff = point[2:3] - point
        assert np.all(iv.diff_macro_lo <= diff + 1e-12) and np.all(diff <= iv.diff_macro_hi + 1e-12)
        widths.append((iv.macro_hi - iv.macro_lo)[:, 0].mean())
    assert widths[0] > widths[1] > widths[2]
    # sqrt(n) scaling, roughly: 10x the questions, about a third of the width.
    assert 2 < widths[0] / widths[1] < 5


def test_attempts_of_a_question_stay_together():
    # Every question has exactly one correct attempt out of four, at a random position. If attempts
    # were resampled on their own, pass@4 and 4/4 would vary across draws; kept together they cannot.
    rng = np.random.default_rng(4)
    q = 50
    correct = np.zeros((1, q, 4), bool)
    correct[0, np.arange(q), rng.integers(0, 4, q)] = True
    di = np.zeros(q, int)
    iv = paired_intervals(_values(correct), di, 1, reference=0, draws=500, seed=1)
    np.testing.assert_allclose(iv.macro_lo[0], [0.25, 1.0, 0.0])
    np.testing.assert_allclose(iv.macro_hi[0], [0.25, 1.0, 0.0])


def test_systems_are_resampled_together():
    # B equals A on every question: a paired difference is exactly 0 in every draw. C = A shifted by
    # exactly one correct attempt on question 0 only: every draw's difference is (count of q0) / (4 n).
    rng = np.random.default_rng(6)
    a = rng.random((30, 4)) < 0.5
    a[0] = [False, False, False, False]
    c = a.copy()
    c[0, 0] = True
    correct = np.stack([a, a.copy(), c])
    di = np.zeros(30, int)
    v = _values(correct)
    iv = paired_intervals(v, di, 1, reference=0, draws=2000, seed=3)
    np.testing.assert_array_equal(iv.diff_macro_lo[1], 0)
    np.testing.assert_array_equal(iv.diff_macro_hi[1], 0)
    per_draw = dataset_draws(v.reshape(9, -1), di, 1, draws=2000, seed=3)[:, 0]
    diff = per_draw[:, 0] - per_draw[:, 6]  # avg@4 of A minus avg@4 of C
    counts = (resample_indices([30], 2000, seed=3)[0] == 0).sum(1)
    np.testing.assert_allclose(diff, -counts / (4 * 30))
    assert iv.diff_macro_hi[2, 0] <= 0


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match=r"\[F, Q\]"):
        dataset_draws(np.zeros((2, 5)), np.zeros(4, int), 1, draws=3, seed=0)
