"""Format diagnostics of the final Answerer output (Appendix A, Tables 6 and 7).

- Flexible extraction (Table 6): the answers the flexible extractor rescues (flexible-correct but
  strict-incorrect workflows, counted per dataset; the "rescued count" is their total) and the
  macro change of each metric when flexible EM replaces strict EM. The main scoring rule is unchanged.
- Failure taxonomy: no Answerer candidate, an empty final candidate, a non-empty output without a
  valid answer tag; counts, pooled fractions (over all workflows) and macro fractions.
- Upper bound (Table 7): a format failure scores 0, so if every failure of system B became correct
  its avg@K would be a_B + f_B (f_B: macro failure rate). The bound is a_ref - (a_B + f_B); it is the
  macro mean of the per-question value ``mean_k(ref correct) - mean_k(B correct or B failed)``, so
  its interval comes from the same paired draws as every other statistic.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from mopd.eval.metrics import FAILURE_TYPES, dataset_means


def rescued_counts(strict: np.ndarray, flex: np.ndarray, dataset_index: np.ndarray,
                   n_datasets: int) -> np.ndarray:
    """Workflows that flexible extraction turns correct, per system and dataset: int [S, D]."""
    rescued = (np.asarray(flex, bool) & ~np.asarray(strict, bool)).sum(-1)  # [S, Q]
    member = (dataset_index[:, None] == np.arange(n_datasets)).astype(np.int64)
    return rescued @ member


def failure_counts(failure: np.ndarray, dataset_index: np.ndarray, n_datasets: int) -> np.ndarray:
    """Workflows of each failure type per system and dataset: int [S, D, len(FAILURE_TYPES)]."""
    f = np.asarray(failure)
    per_q = np.stack([(f == code + 1).sum(-1) for code in range(len(FAILURE_TYPES))], -1)  # [S, Q, T]
    member = (dataset_index[:, None] == np.arange(n_datasets)).astype(np.int64)
    return np.einsum("sqt,qd->sdt", per_q, member)


def failure_fractions(failure: np.ndarray, dataset_index: np.ndarray, n_datasets: int
                      ) -> Tuple[np.ndarray, np.ndarray]:
    """Fractions of workflows of each failure type: pooled [S, T] and dataset-macro [S, T]."""
    f = np.asarray(failure)
    per_type = np.stack([(f == code + 1).mean(-1) for code in range(len(FAILURE_TYPES))], 1)  # [S, T, Q]
    pooled = per_type.mean(-1)
    macro = dataset_means(per_type, dataset_index, n_datasets).mean(-1)
    return pooled, macro


def repaired_values(strict: np.ndarray, failure: np.ndarray) -> np.ndarray:
    """Per-question avg@K if every format failure were correct: mean_k(correct or failed), [S, Q]."""
    return (np.asarray(strict, bool) | (np.asarray(failure) > 0)).mean(-1)
