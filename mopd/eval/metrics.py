"""Accuracy metrics over K attempts per question, per dataset and dataset-macro (Appendix A).

Let c[i, k] be 1 when attempt k answers question i correctly and n_i = sum_k c[i, k]. Per question:

- avg@K  = n_i / K          (expected accuracy of one attempt)
- pass@K = 1{n_i >= 1}      (some attempt is right)
- K/K    = 1{n_i == K}      (every attempt is right)

A dataset's score is the mean over its questions; the macro score is the plain mean of the dataset
scores (each dataset weighs the same, whatever its size). Every metric is therefore a macro mean of
a per-question value, which is what lets the bootstrap treat them all alike.

Correctness is scored from each workflow's LAST Answerer candidate: strict = EM of the text in its
last ``<answer>`` tag, flexible = EM of ``flexible_extract`` (never less than strict, since its first
rule is the strict answer). No candidate scores 0 under both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from mopd.core.records import WorkflowRecord
from mopd.core.scoring import classify_failure, exact_match, extract_answer, flexible_extract
from mopd.eval.alignment import AlignedRuns

FAILURE_TYPES = ("no_candidate", "empty_candidate", "no_valid_tag")
"""Format failures of the final candidate, coded 1, 2, 3 in ``Outcomes.failure`` (0: valid tag)."""

METRIC_KINDS = ("avg", "pass", "all")


def metric_names(k: int) -> Dict[str, str]:
    """Display names: {'avg': 'avg@4', 'pass': 'pass@4', 'all': '4/4'}."""
    return {"avg": f"avg@{k}", "pass": f"pass@{k}", "all": f"{k}/{k}"}


def score_record(r: WorkflowRecord) -> Tuple[bool, bool, int]:
    """(strict correct, flexible correct, failure code) of one workflow."""
    failure = classify_failure(r.candidates)
    code = 0 if failure is None else FAILURE_TYPES.index(failure) + 1
    if not r.candidates:
        return False, False, code
    last = r.candidates[-1]
    strict = exact_match(extract_answer(last), r.answers) == 1.0
    flex = exact_match(flexible_extract(last), r.answers) == 1.0
    return strict, flex, code


@dataclass
class Outcomes:
    """Per-workflow outcomes, each [S, Q, K]."""

    strict: np.ndarray
    flex: np.ndarray
    failure: np.ndarray
    """int8: 0 valid tag, else 1 + index into FAILURE_TYPES."""


def outcomes(runs: AlignedRuns) -> Outcomes:
    g = runs.grid(score_record, dtype=np.int64)
    return Outcomes(strict=g[..., 0].astype(bool), flex=g[..., 1].astype(bool),
                    failure=g[..., 2].astype(np.int8))


def question_metrics(correct: np.ndarray) -> Dict[str, np.ndarray]:
    """Per-question avg / pass / all from a boolean array [..., Q, K]; each value is [..., Q]."""
    c = np.asarray(correct, dtype=bool)
    return {"avg": c.mean(-1), "pass": c.any(-1).astype(float), "all": c.all(-1).astype(float)}


def dataset_weights(dataset_index: np.ndarray, n_datasets: int) -> np.ndarray:
    """[Q, D] matrix whose column d averages the questions of dataset d (1/n_d on its rows)."""
    q = len(dataset_index)
    counts = np.bincount(dataset_index, minlength=n_datasets).astype(float)
    if (counts == 0).any():
        raise ValueError("every dataset needs at least one question")
    w = np.zeros((q, n_datasets))
    w[np.arange(q), dataset_index] = 1.0 / counts[dataset_index]
    return w


def dataset_means(values: np.ndarray, dataset_index: np.ndarray, n_datasets: int) -> np.ndarray:
    """Mean of per-question values [..., Q] within each dataset: [..., D]."""
    return np.asarray(values, dtype=float) @ dataset_weights(dataset_index, n_datasets)


def macro_mean(values: np.ndarray, dataset_index: np.ndarray, n_datasets: int) -> np.ndarray:
    """Dataset-macro mean of per-question values [..., Q]: datasets weighted equally."""
    return dataset_means(values, dataset_index, n_datasets).mean(-1)


def n_correct_counts(correct: np.ndarray, dataset_index: np.ndarray, n_datasets: int) -> np.ndarray:
    """How many questions of each dataset have n_i = 0..K correct attempts: int [..., D, K+1]."""
    c = np.asarray(correct, dtype=bool)
    k = c.shape[-1]
    n = c.sum(-1)  # [..., Q]
    onehot = (n[..., None] == np.arange(k + 1)).astype(np.int64)  # [..., Q, K+1]
    member = (dataset_index[:, None] == np.arange(n_datasets)).astype(np.int64)  # [Q, D]
    return np.einsum("...qj,qd->...dj", onehot, member)


def validation_counts(records) -> List[float]:
    """[strict correct, workflows, search actions, workflows without a search] of a batch of
    records: sums, so that ranks can add theirs before :func:`validation_metrics` divides."""
    return [float(sum(score_record(r)[0] for r in records)), float(len(records)),
            float(sum(r.search_actions for r in records)), float(sum(1 for r in records if r.search_actions == 0))]


def validation_metrics(counts: Sequence[float]) -> Dict[str, float]:
    """``val/em``, ``val/search_per_workflow`` and ``val/no_search_frac`` from summed counts."""
    correct, n, searches, no_search = (float(c) for c in counts)
    n = max(n, 1.0)
    return {"val/em": correct / n, "val/search_per_workflow": searches / n, "val/no_search_frac": no_search / n}
