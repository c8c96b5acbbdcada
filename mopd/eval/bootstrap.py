"""Paired question bootstrap of dataset-macro metrics (Appendix A).

For each of B draws, the questions of every dataset are resampled with replacement (n_d out of n_d);
a sampled question keeps its K attempts and the values of ALL compared systems, so one set of
indices serves every system and every metric (the comparison is paired). Dataset means of the
resample are averaged with equal weight, and an interval is the 2.5th and 97.5th percentiles of
the B macro values (numpy's default linear interpolation). A difference between two systems is
bootstrapped the same way, from the per-draw difference of their macro values.

Vectorised plan: every metric is a macro mean of a per-question value (see ``metrics``), so all
statistics are stacked into one matrix V [F, Q]. For dataset d the draw indices [B, n_d] are
turned into multiplicities C [B, n_d] (how often each question was drawn, one ``bincount``), and
the resampled dataset means of all F statistics at once are ``C @ V_d.T / n_d``: one matrix
product per dataset, never a [B, n_d, F] gather. Draws are processed in chunks so that C stays
under ~32 MB whatever the dataset size; every dataset has its own random stream
(``SeedSequence(seed).spawn``) and numpy's bounded integers are drawn element by element, so the
chunking does not change the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from mopd.config import EvalConfig

DEFAULT_DRAWS = EvalConfig.bootstrap_draws
DEFAULT_SEED = EvalConfig.bootstrap_seed
PERCENTILES = (2.5, 97.5)
_CHUNK_CELLS = 4_000_000  # draws x questions per multiplicity chunk (~32 MB of float64)


def _dataset_rngs(n_datasets: int, seed: int) -> List[np.random.Generator]:
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n_datasets)]


def resample_indices(dataset_sizes: List[int], draws: int, seed: int) -> List[np.ndarray]:
    """The question indices of every draw, per dataset: arrays [draws, n_d] (local to the dataset).

    These are exactly the draws ``macro_draws`` uses (same seed, same streams); exposed so that
    tests and readers can replay a draw by hand.
    """
    return [rng.integers(0, n, size=(draws, n)) for rng, n in zip(_dataset_rngs(len(dataset_sizes), seed),
                                                                   dataset_sizes)]


def _multiplicities(idx: np.ndarray, n: int) -> np.ndarray:
    b = idx.shape[0]
    flat = (idx + (np.arange(b) * n)[:, None]).ravel()
    return np.bincount(flat, minlength=b * n).reshape(b, n).astype(float)


def dataset_draws(values: np.ndarray, dataset_index: np.ndarray, n_datasets: int,
                  draws: int = DEFAULT_DRAWS, seed: int = DEFAULT_SEED) -> np.ndarray:
    """Bootstrap dataset means of per-question statistics.

    values: [F, Q] (F statistics, e.g. systems x metrics flattened); dataset_index: [Q].
    Returns [draws, D, F]: for each draw, the mean of each statistic over the resampled questions
    of each dataset.
    """
    v = np.asarray(values, dtype=float)
    if v.ndim != 2 or v.shape[1] != len(dataset_index):
        raise ValueError(f"values must be [F, Q] with Q={len(dataset_index)}, got {v.shape}")
    out = np.empty((draws, n_datasets, v.shape[0]))
    rngs = _dataset_rngs(n_datasets, seed)
    for d in range(n_datasets):
        rows = np.flatnonzero(dataset_index == d)
        n = len(rows)
        if n == 0:
            raise ValueError(f"dataset {d} has no questions")
        vd = v[:, rows].T  # [n_d, F]
        chunk = max(1, _CHUNK_CELLS // n)
        for start in range(0, draws, chunk):
            stop = min(draws, start + chunk)
            idx = rngs[d].integers(0, n, size=(stop - start, n))
            out[start:stop, d] = _multiplicities(idx, n) @ vd / n
    return out


def percentile_interval(samples: np.ndarray, axis: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """2.5th and 97.5th percentiles along ``axis``."""
    lo, hi = np.percentile(samples, PERCENTILES, axis=axis)
    return lo, hi


@dataclass
class PairedIntervals:
    """Intervals of per-question statistics [S, M, Q] and of reference-minus-system differences."""

    macro_lo: np.ndarray
    """[S, M]"""
    macro_hi: np.ndarray
    dataset_lo: np.ndarray
    """[S, M, D]"""
    dataset_hi: np.ndarray
    diff_macro_lo: np.ndarray
    """[S, M]: interval of macro(reference) - macro(system); zeros on the reference's own row."""
    diff_macro_hi: np.ndarray
    diff_dataset_lo: np.ndarray
    """[S, M, D]"""
    diff_dataset_hi: np.ndarray


def paired_intervals(values: np.ndarray, dataset_index: np.ndarray, n_datasets: int,
                     reference: int, draws: int = DEFAULT_DRAWS, seed: int = DEFAULT_SEED
                     ) -> PairedIntervals:
    """Percentile intervals of every statistic and of its difference against system ``reference``.

    values: [S, M, Q], per-question values of M statistics for S systems (all resampled together).
    """
    v = np.asarray(values, dtype=float)
    s, m, q = v.shape
    per_d = dataset_draws(v.reshape(s * m, q), dataset_index, n_datasets, draws, seed)
    per_d = per_d.reshape(draws, n_datasets, s, m).transpose(0, 2, 3, 1)  # [B, S, M, D]
    macro = per_d.mean(-1)  # [B, S, M]
    diff_d = per_d[:, reference:reference + 1] - per_d
    diff_m = macro[:, reference:reference + 1] - macro
    m_lo, m_hi = percentile_interval(macro)
    d_lo, d_hi = percentile_interval(per_d)
    dm_lo, dm_hi = percentile_interval(diff_m)
    dd_lo, dd_hi = percentile_interval(diff_d)
    return PairedIntervals(m_lo, m_hi, d_lo, d_hi, dm_lo, dm_hi, dd_lo, dd_hi)
