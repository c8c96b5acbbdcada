"""What each role did per workflow, by question type: does the Leader split a question, do the
Searchers search?

Per workflow record:

- leader_subtasks: Leader subtasks that were run (``subtask`` events; a subtask beyond
  ``rollout.max_searchers_per_wave`` is a ``dropped_subtask`` and not counted, as in the costs);
- leader_waves: Leader outputs that dispatched at least one subtask (its subtask events share the
  Leader's call and the step of that output);
- multi_subtask: 1 when the Leader delegated two or more subtasks in the whole workflow;
- multi_subtask_one_wave: 1 when one Leader output delegated two or more (parallel Searchers);
- searches: search actions (``WorkflowRecord.search_actions``);
- no_search: 1 when the workflow has no search action.

Averages follow the costs (:func:`mopd.eval.costs.cost_averages`): the attempts of a question, then
the questions of a dataset, then the datasets with equal weight (macro); the fractions are then
fractions of workflows. A cascade (C-MAS) has no Leader: its Leader fields are None ("n/a").
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, Tuple

from mopd.core.records import WorkflowRecord
from mopd.eval.alignment import AlignedRuns
from mopd.eval.costs import cost_averages, task_assignments_apply

ACTIVITY_FIELDS = ("leader_subtasks", "leader_waves", "multi_subtask", "multi_subtask_one_wave", "searches",
                   "no_search")
LEADER_FIELDS = ("leader_subtasks", "leader_waves", "multi_subtask", "multi_subtask_one_wave")
"""The fields that need a Leader (None for a cascade)."""


def record_activity(r: WorkflowRecord) -> Tuple[float, ...]:
    """The ACTIVITY_FIELDS of one workflow, in order."""
    per_output = Counter((e.call_id, e.step) for e in r.events if e.kind == "subtask")
    subtasks = sum(per_output.values())
    searches = r.search_actions
    return (float(subtasks), float(len(per_output)), float(subtasks >= 2),
            float(max(per_output.values(), default=0) >= 2), float(searches), float(searches == 0))


def activity(runs: AlignedRuns) -> Dict[str, dict]:
    """Per system: ``leader_applicable``, ``macro`` and ``per_dataset`` {field: value or None}."""
    grid = runs.grid(record_activity, dtype=float)  # [S, Q, K, F]
    per_d, macro = cost_averages(grid, runs.dataset_index, len(runs.datasets))

    def fields(values, applies):
        return {f: (float(values[j]) if applies or f not in LEADER_FIELDS else None)
                for j, f in enumerate(ACTIVITY_FIELDS)}

    out = {}
    for si, system in enumerate(runs.systems):
        applies = task_assignments_apply(runs.records[si])
        out[system] = {"leader_applicable": applies, "macro": fields(macro[si], applies),
                       "per_dataset": {d: fields(per_d[si, di], applies) for di, d in enumerate(runs.datasets)}}
    return out
