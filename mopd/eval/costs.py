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

from mopd.eval.alignment import AlignedRuns
from mopd.eval.metrics import dataset_means
from mopd.rollout.records import WorkflowRecord

COST_FIELDS = ("search_actions", "searches_with_passages", "returned_passages", "input_tokens",
               "output_tokens", "reports", "task_assignments")
POOLED_FIELDS = COST_FIELDS + ("duration_s",)


def record_costs(r: WorkflowRecord) -> Tuple[float, ...]:
    """The COST_FIELDS of one workflow, in order."""
    searches = [e for e in r.events if e.kind == "search" and e.text.strip()]
    return (
        float(r.search_actions),
        float(sum(1 for e in searches if len(e.passages) > 0)),
        float(r.returned_passages),
        float(r.input_tokens),
        float(r.output_tokens),
        float(len(r.events_of("report"))),
        float(len(r.events_of("subtask"))),
    )


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


def pooled_stats(records: List[WorkflowRecord]) -> Dict[str, Dict[str, float]]:
    """Descriptive statistics over all workflows of one system, without any weighting."""
    rows = np.asarray([record_costs(r) + (r.duration_s,) for r in records], dtype=float)
    out = {}
    for j, name in enumerate(POOLED_FIELDS):
        col = rows[:, j] if len(rows) else np.zeros(0)
        out[name] = {
            "workflows": int(len(col)),
            "total": float(col.sum()),
            "mean": float(col.mean()) if len(col) else 0.0,
            "std": float(col.std()) if len(col) else 0.0,
            "median": float(np.median(col)) if len(col) else 0.0,
            "max": float(col.max()) if len(col) else 0.0,
        }
    return out
