"""An effect over several seeds: its pooled value with a two-level bootstrap (seeds, then
questions), over all questions (dataset-macro) or one question type at a time. A recipe's
multi-seed summary (which claims, which fields) is the recipe's.

A seed is a whole new world, pi_0 and training run, so seeds vary far more than questions within a
seed; an interval that resampled questions alone would ignore that. Each draw picks S seeds with
replacement, and for each pick resamples that seed's questions within each dataset (the paired
question bootstrap of :mod:`mopd.eval.bootstrap`, a fresh resample for every pick, also when a
seed is picked twice); the draw's value is the mean over the S picks of the picked seed's macro
avg@K difference. The point estimate is the mean over seeds of each seed's macro difference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mopd.eval.bootstrap import dataset_draws, percentile_interval


def macro_difference(diffs: np.ndarray, dataset_index: np.ndarray, n_datasets: int) -> float:
    """Dataset-macro mean of per-question differences (datasets weighted equally)."""
    return float(np.mean([diffs[dataset_index == d].mean() for d in range(n_datasets)]))


def pooled_difference(per_seed: Sequence[tuple[np.ndarray, np.ndarray, int]], draws: int, seed: int
                      ) -> tuple[float, float, float]:
    """(point, lo, hi) of the mean over seeds of the macro difference; ``per_seed`` holds, per seed,
    the per-question differences [Q], their dataset index [Q] and the number of datasets."""
    s = len(per_seed)
    if s == 0:
        raise ValueError("no seeds to pool")
    point = float(np.mean([macro_difference(v, di, nd) for v, di, nd in per_seed]))
    streams = np.random.SeedSequence(seed).spawn(s + 1)
    # [s, draws, s]: seed j's macro difference under an independent question resample for every
    # (draw, pick) cell, so a seed picked twice in one draw gets two resamples
    macro = np.empty((s, draws, s))
    for j, (v, di, nd) in enumerate(per_seed):
        sub = int(streams[j].generate_state(1)[0])
        per_d = dataset_draws(np.asarray(v, float)[None, :], np.asarray(di), nd, draws=draws * s, seed=sub)
        macro[j] = per_d[:, :, 0].mean(1).reshape(draws, s)
    picks = np.random.default_rng(streams[s]).integers(0, s, size=(draws, s))
    pooled = macro[picks, np.arange(draws)[:, None], np.arange(s)[None, :]].mean(1)
    lo, hi = percentile_interval(pooled)
    return point, float(lo), float(hi)


def interval_verdict(lo: float, hi: float) -> str:
    """above / below when the whole 95% interval is on one side of 0, else indistinguishable."""
    return "above" if lo > 0 else "below" if hi < 0 else "indistinguishable"


def question_differences(questions: Sequence[dict]) -> tuple[np.ndarray, np.ndarray, int]:
    """A claim's per-question differences (trained - base), their dataset index and dataset count."""
    datasets = sorted({q["dataset"] for q in questions})
    di = np.array([datasets.index(q["dataset"]) for q in questions])
    return np.array([q["trained"] - q["base"] for q in questions], float), di, len(datasets)


def pooled_by_dataset(per_seed_questions: Sequence[Sequence[dict]], draws: int, seed: int) -> dict:
    """{dataset: {diff, ci, verdict, seeds}}: the same two-level bootstrap as the macro difference,
    on one question type at a time, over the seeds whose claim has questions of that type (where
    a macro difference is nil, this says which question types pull which way)."""
    datasets = sorted({q["dataset"] for qs in per_seed_questions for q in qs})
    out = {}
    for d in datasets:
        rows = [question_differences([q for q in qs if q["dataset"] == d]) for qs in per_seed_questions
                if any(q["dataset"] == d for q in qs)]
        point, lo, hi = pooled_difference(rows, draws=draws, seed=seed)
        out[d] = {"diff": point, "ci": [lo, hi], "verdict": interval_verdict(lo, hi), "seeds": len(rows)}
    return out
