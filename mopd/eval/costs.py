"""Recorded workload per workflow (Appendix A, "Costs").

Counts of one workflow record:

- search_actions: non-empty queries inside a complete ``<search>`` tag (``WorkflowRecord.search_actions``);
- searches_with_passages: those that returned at least one passage;
- returned_passages: passages returned over all searches;
- input_tokens / output_tokens: summed over calls and turns (repeated history counts again; EOS included);
- reports: Searcher reports; task_assignments: Leader subtasks (C-MAS has no Leader, so the field
  does not apply there: 0 in JSON with ``task_assignments_applicable: false``, "n/a" in tables).

Averages follow the paper: the K attempts of a question, then the questions of a dataset, then
the datasets with equal weight. Relative changes are computed from these unrounded averages.
Pooled statistics (over all workflows of a system, no weighting) are kept separately.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from mopd.core.records import WorkflowRecord
from mopd.eval.alignment import AlignedRuns
from mopd.eval.metrics import dataset_means

COST_FIELDS = ("search_actions", "searches_with_passages", "returned_passages", "input_tokens",
               "output_tokens", "reports", "task_assignments")
POOLED_FIELDS = COST_FIELDS + ("duration_s",)


def record_costs(r: WorkflowRecord) -> Tuple[float, ...]:
    """The COST_FIELDS of one workflow, in order (one pass over its events; the same counts as
    ``WorkflowRecord.search_actions`` / ``returned_passages``)."""
    actions = with_passages = passages = reports = subtasks = 0
    for e in r.events:
        if e.kind == "search":
            n = len(e.passages)
            passages += n
            if e.text.strip():
                actions += 1
                with_passages += n > 0
        elif e.kind == "report":
            reports += 1
        elif e.kind == "subtask":
            subtasks += 1
    tokens_in = sum(c.input_tokens for c in r.calls)
    tokens_out = sum(c.output_tokens for c in r.calls)
    return (float(actions), float(with_passages), float(passages), float(tokens_in), float(tokens_out),
            float(reports), float(subtasks))


def task_assignments_apply(records: List[WorkflowRecord]) -> bool:
    """Leader task assignments exist only in hierarchical (H-MAS) workflows."""
    return any(r.workflow == "hmas" for r in records)


def cost_grid(runs: AlignedRuns) -> np.ndarray:
    """[S, Q, K, F] counts of every workflow (F = len(COST_FIELDS))."""
    return runs.grid(record_costs, dtype=float)


def cost_averages(grid: np.ndarray, dataset_index: np.ndarray, n_datasets: int
                  ) -> Tuple[np.ndarray, np.ndarray]:
    """Attempts -> questions -> datasets: per dataset [S, D, F] and macro [S, F]."""
    per_question = grid.mean(2)  # [S, Q, F]
    per_dataset = dataset_means(np.moveaxis(per_question, -1, 1), dataset_index, n_datasets)  # [S, F, D]
    per_dataset = np.moveaxis(per_dataset, 1, -1)  # [S, D, F]
    return per_dataset, per_dataset.mean(1)


def relative_change(value: float, base: float) -> Optional[float]:
    """(value - base) / base from unrounded values; None when the base is 0."""
    return None if base == 0 else (value - base) / base


def pooled_stats(rows: np.ndarray) -> Dict[str, Dict[str, float]]:
    """Descriptive statistics over all workflows of one system, without any weighting.

    rows: [N, len(POOLED_FIELDS)], one row per workflow (its COST_FIELDS, then its duration).
    """
    rows = np.asarray(rows, dtype=float).reshape(-1, len(POOLED_FIELDS))
    out = {}
    for j, name in enumerate(POOLED_FIELDS):
        col = rows[:, j]
        empty = len(col) == 0
        out[name] = {
            "workflows": len(col),
            "total": float(col.sum()),
            "mean": 0.0 if empty else float(col.mean()),
            "std": 0.0 if empty else float(col.std()),
            "median": 0.0 if empty else float(np.median(col)),
            "max": 0.0 if empty else float(col.max()),
        }
    return out
