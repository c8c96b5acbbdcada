"""Batch diagnostics for training logs and evaluation: search activity, reports, format, rewards."""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, Optional, Sequence

from mopd.core.records import WorkflowRecord
from mopd.core.scoring import extract_answer


def batch_diagnostics(records: Sequence[WorkflowRecord],
                      rewards: Optional[Sequence[Dict[str, float]]] = None) -> Dict[str, float]:
    """Fractions and means over a batch of workflows (keys are metric names, values floats).

    - ``no_search_frac``: workflows with no search action (the paper's collapse signal);
    - ``search_per_workflow``, ``reports_per_workflow``, ``subtasks_per_workflow``;
    - ``dropped_subtasks_per_workflow``: subtasks beyond ``rollout.max_searchers_per_wave`` (never run);
    - ``valid_answer_frac``: Answerer candidates holding a complete <answer> tag;
    - ``invalid_call_frac``: agent calls with an invalid action;
    - ``reward/<role>``: mean reward of each role's calls, when rewards are given.
    """
    n = len(records)
    if n == 0:
        return {}
    cands = [c for r in records for c in r.candidates]
    calls = [c for r in records for c in r.calls]
    out = {
        "no_search_frac": sum(1 for r in records if r.search_actions == 0) / n,
        "search_per_workflow": sum(r.search_actions for r in records) / n,
        "reports_per_workflow": sum(len(r.events_of("report")) for r in records) / n,
        "subtasks_per_workflow": sum(len(r.events_of("subtask")) for r in records) / n,
        "dropped_subtasks_per_workflow": sum(len(r.events_of("dropped_subtask")) for r in records) / n,
        "valid_answer_frac": (sum(1 for c in cands if extract_answer(c) is not None) / len(cands)) if cands else 0.0,
        "invalid_call_frac": (sum(1 for c in calls if c.invalid) / len(calls)) if calls else 0.0,
        "answered_frac": sum(1 for r in records if r.candidates) / n,
    }
    if rewards is not None:
        sums, counts = defaultdict(float), defaultdict(int)
        for rec, rw in zip(records, rewards):
            for call in rec.calls:
                if call.call_id in rw:
                    sums[call.role] += rw[call.call_id]
                    counts[call.role] += 1
        for role in sums:
            out[f"reward/{role}"] = sums[role] / counts[role]
    return out
