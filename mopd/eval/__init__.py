"""Evaluation: scoring, K-attempt metrics, paired bootstrap intervals, costs, diagnostics, reports.

The public names below are imported on first use, so ``import mopd.core.scoring`` (used by the
rollout and the method) stays light and free of import cycles.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "summarize": "mopd.eval.summary",
    "write_report": "mopd.eval.report",
    "report_runs": "mopd.eval.report",
    "ReportOptions": "mopd.eval.report",
    "render_markdown": "mopd.eval.report",
    "load_runs": "mopd.eval.loading",
    "read_eval_records": "mopd.eval.loading",
    "align_runs": "mopd.eval.alignment",
    "EvalError": "mopd.eval.alignment",
    "collapse_table": "mopd.eval.collapse",
    "validation_curve_plot": "mopd.eval.plots",
    "paired_intervals": "mopd.eval.bootstrap",
    "evaluate": "mopd.eval.runner",
    "run_evaluation": "mopd.eval.runner",
}

__all__ = ["EvalError", "ReportOptions", "align_runs", "collapse_table", "evaluate", "load_runs", "paired_intervals",
           "read_eval_records", "render_markdown", "report_runs", "run_evaluation", "summarize",
           "validation_curve_plot", "write_report"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'mopd.eval' has no attribute {name!r}")
