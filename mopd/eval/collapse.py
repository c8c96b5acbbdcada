"""Search-collapse diagnostics over a series of checkpoints (the paper's Table 8).

For the records of each checkpoint (e.g. a fixed development set evaluated every 100 steps), the
fractions are POOLED over workflows (no dataset weighting), as the paper reports them:

- no_search_frac: workflows with no recorded search action (a non-empty query in a complete
  ``<search>`` tag, whether or not retrieval returned passages);
- em: strict exact match of the final candidate;
- final_answer_frac: workflows whose final candidate has a valid ``<answer>`` tag;
- searches_per_workflow: mean search actions;
- reports_frac: workflows with at least one Searcher report;
- subtasks_and_reports_frac: workflows with at least one Leader subtask and one report (H-MAS).

A collapse shows as no_search_frac rising to 1 while final_answer_frac stays high.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from mopd.core.records import WorkflowRecord
from mopd.core.scoring import extract_answer
from mopd.eval.metrics import score_record

COLLAPSE_COLUMNS = ("no_search_frac", "em", "final_answer_frac", "searches_per_workflow",
                    "reports_frac", "subtasks_and_reports_frac")


def collapse_row(records: List[WorkflowRecord]) -> Dict[str, float]:
    """The collapse statistics of one checkpoint's records (pooled over workflows)."""
    if not records:
        raise ValueError("a checkpoint with no records")
    searches = np.asarray([r.search_actions for r in records], dtype=float)
    reports = np.asarray([len(r.events_of("report")) > 0 for r in records])
    subtasks = np.asarray([len(r.events_of("subtask")) > 0 for r in records])
    final = np.asarray([bool(r.candidates) and extract_answer(r.candidates[-1]) is not None for r in records])
    em = np.asarray([score_record(r)[0] for r in records], dtype=float)
    return {
        "workflows": len(records),
        "no_search_frac": float((searches == 0).mean()),
        "em": float(em.mean()),
        "final_answer_frac": float(final.mean()),
        "searches_per_workflow": float(searches.mean()),
        "reports_frac": float(reports.mean()),
        "subtasks_and_reports_frac": float((reports & subtasks).mean()),
    }


def collapse_table(records_by_step: Dict[int, List[WorkflowRecord]]) -> List[Dict[str, float]]:
    """One row per checkpoint step, in step order: ``{"step": s, "workflows": n, <COLLAPSE_COLUMNS>}``."""
    return [{"step": int(step), **collapse_row(records_by_step[step])} for step in sorted(records_by_step)]
