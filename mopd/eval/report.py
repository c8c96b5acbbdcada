"""The evaluation report: ``metrics.json`` (every number), ``report.md`` (tables laid out like the
paper's) and PNG plots, from the records of one or more runs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from mopd.core.atomic import atomic_write_json
from mopd.eval import plots, tables
from mopd.eval.bootstrap import DEFAULT_DRAWS, DEFAULT_SEED
from mopd.eval.collapse import collapse_table
from mopd.eval.differences import largest_differences
from mopd.eval.loading import load_runs, read_eval_records, records_file
from mopd.eval.plots import read_training_log
from mopd.eval.summary import summarize

__all__ = ["load_runs", "render_markdown", "report_runs", "write_report"]


def write_report(summary: dict, out_dir: str | os.PathLike, *, collapse_rows: Optional[List[dict]] = None,
                 validation_logs: Sequence[str | os.PathLike] = (), validation_labels: Optional[Sequence[str]] = None,
                 make_plots: bool = True, title: str = "Evaluation report", top_sections: str = "") -> Path:
    """Write metrics.json, report.md and the plots into ``out_dir``; returns the report's path.
    ``top_sections``: markdown placed after the introduction, before the main results."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures: Dict[str, str] = {}
    if make_plots:
        figures["per_dataset"] = plots.per_dataset_plot(summary, out / "per_dataset.png").name
        figures["cost_accuracy"] = plots.cost_accuracy_plot(summary, out / "cost_accuracy.png").name
        if validation_logs:
            figures["validation"] = plots.validation_curve_plot(validation_logs, out / "validation.png",
                                                                labels=validation_labels).name
    full = dict(summary)
    if collapse_rows is not None:
        full["collapse"] = collapse_rows
    if validation_logs:
        full["validation"] = validation_rows(validation_logs, validation_labels)
    full["figures"] = figures
    _write_json(out / "metrics.json", full)
    path = out / "report.md"
    path.write_text(render_markdown(full, title, top_sections), encoding="utf-8")
    return path


def validation_rows(logs: Sequence[str | os.PathLike], labels: Optional[Sequence[str]] = None
                    ) -> Dict[str, List[dict]]:
    """{label: [{"step", and each of tables.VALIDATION_COLUMNS the row has}]} of the validation
    rows (those with ``val/em``) of each training log, in step order; a non-finite value (logged
    as a string) is left out."""
    out: Dict[str, List[dict]] = {}
    for i, p in enumerate(logs):
        label = labels[i] if labels else (Path(p).parent.name or Path(p).stem)
        rows = []
        for r in read_training_log(p):
            if "val/em" not in r:
                continue
            row = {"step": int(r["step"])}
            row.update({k: float(r[k]) for k in tables.VALIDATION_COLUMNS
                        if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)})
            rows.append(row)
        out[label] = sorted(rows, key=lambda r: r["step"])
    return out


def render_markdown(summary: dict, title: str = "Evaluation report", top_sections: str = "") -> str:
    p = summary["protocol"]
    k, ref = p["attempts"], p["reference"]
    names = summary["metric_names"]
    ds = ", ".join(f"{d} ({v['questions']})" for d, v in summary["datasets"].items())
    figs = summary.get("figures", {})
    parts = [
        f"# {title}",
        "",
        (f"Systems: {', '.join(summary['systems'])}; reference: **{ref}**. Datasets (questions): {ds}. "
         f"{k} attempts per question. Scores are normalised exact match of the last `<answer>` tag of the "
         "final Answerer output (strict) unless marked flexible; all values in %, datasets weighted equally "
         f"(macro). Intervals: 2.5th-97.5th percentiles of {p['bootstrap_draws']:,} paired question-bootstrap "
         f"draws (seed {p['bootstrap_seed']}); differences are {ref} minus the system."),
    ]
    if p.get("dropped_records"):
        parts.append(f"\nRestricted to the questions all systems share; records left out: {p['dropped_records']}.")
    if top_sections:
        parts += ["", top_sections.rstrip()]
    parts += ["", "## Main results (strict EM, macro)", "", tables.main_table(summary)]
    if len(summary["systems"]) > 1:
        parts += ["", f"### Paired differences against {ref}", "", tables.difference_table(summary)]
    parts += ["", "### Strict and flexible EM", "", tables.side_by_side_table(summary),
              "", f"### Distribution of n_i (correct attempts out of {k}, macro)", "", tables.n_correct_table(summary),
              "", "## Per-dataset results (strict EM)", ""]
    for kind in ("avg", "pass", "all"):
        parts += [f"**{names[kind]}**", "", tables.per_dataset_table(summary, names[kind]), ""]
    parts += [f"**{names['avg']} with 95% intervals**", "",
              tables.per_dataset_table(summary, names["avg"], intervals=True), ""]
    if "per_dataset" in figs:
        parts += [f"![{names['avg']} per dataset]({figs['per_dataset']})", ""]
    if summary.get("differences", {}).get("datasets"):
        parts += [tables.difference_links(summary), ""]
    parts += ["## Cost (per workflow; attempts, then questions, then datasets averaged)", "",
              tables.cost_table(summary), "",
              ("Task assignments are Leader subtasks; a cascade (C-MAS) has no Leader, shown as n/a "
               "(0 in metrics.json with `task_assignments_applicable: false`). Token counts include repeated "
               "history across turns."), ""]
    if len(summary["systems"]) > 1:
        parts += [tables.relative_cost_table(summary), ""]
    if "activity" in summary:
        parts += ["## Role activity by question type (per workflow)", "",
                  ("Leader subtasks are those run (a subtask beyond the per-wave cap is dropped, not counted); "
                   "a wave is one Leader output with subtasks. Averaged over attempts, then questions, then "
                   "question types (macro). A cascade (C-MAS) has no Leader: n/a."), "",
                  tables.activity_tables(summary), ""]
    parts += ["Pooled over all workflows (no weighting):", "", tables.pooled_cost_table(summary), ""]
    if "cost_accuracy" in figs:
        parts += [f"![accuracy against cost]({figs['cost_accuracy']})", ""]
    parts += ["## Format diagnostics", "", "### Flexible extraction (main scoring unchanged)", "",
              tables.flexible_table(summary), "", "### Failure taxonomy of the final candidate",
              "", "count (pooled % / macro %)", "", tables.failure_table(summary), ""]
    if len(summary["systems"]) > 1:
        parts += [f"### Upper bound from format repair (against {ref})", "",
                  (f"If every format failure of system B were correct, its {names['avg']} would be a_B + f_B; "
                   "a positive bound means the reference stays ahead even then (an assumed repair, "
                   "not a measured one)."), "", tables.bound_table(summary), ""]
    if summary.get("collapse"):
        parts += ["## Search collapse over checkpoints (pooled over workflows)", "",
                  tables.collapse_markdown(summary["collapse"]), ""]
    has_rows = any(summary.get("validation", {}).values())
    if has_rows or "validation" in figs:
        parts += ["## Validation over training (dev split)", ""]
        if has_rows:
            parts += [("Every validation of each training run, from its metrics.jsonl (step 0 is the starting "
                       "model). A Searcher that collapses into not searching shows as the no-search fraction "
                       "rising towards 100%."), "", tables.validation_tables(summary["validation"]), ""]
        if "validation" in figs:
            parts += [f"![validation curves]({figs['validation']})", ""]
    return "\n".join(parts).rstrip() + "\n"


def _write_json(path: Path, obj) -> None:
    atomic_write_json(path, obj, allow_nan=False)


@dataclass(frozen=True)
class ReportOptions:
    """What ``mopd eval report`` compares and what it draws."""

    names: Optional[Sequence[str]] = None
    """Display name of each run (default: the run directories' names)."""
    reference: Optional[str] = None
    """The system every other is compared with (paired bootstrap of the difference)."""
    draws: int = DEFAULT_DRAWS
    """Question-bootstrap draws."""
    seed: int = DEFAULT_SEED
    """Seed of the bootstrap."""
    intersect: bool = False
    """Compare on the questions every run has, instead of refusing runs that differ."""
    collapse_runs: Optional[Mapping[int, str | os.PathLike]] = None
    """Evaluations of checkpoints by training step, for the search-collapse table."""
    validation_logs: Sequence[str | os.PathLike] = ()
    """metrics.jsonl files whose validation curves are plotted."""
    validation_labels: Optional[Sequence[str]] = None
    """Legend labels of those curves."""
    make_plots: bool = True
    """Write the PNG plots beside the report."""
    title: str = "Evaluation report"
    """The report's heading."""
    top_sections: str = ""
    """Markdown placed after the report's introduction, before the main results (a recipe's own section)."""
    linked: Optional[str] = None
    """The system whose largest per-question differences from the reference the report links into
    the viewer's page (default: the first other system)."""


def report_runs(run_paths: Sequence[str | os.PathLike], out_dir: str | os.PathLike,
                options: ReportOptions = ReportOptions()) -> Path:
    """Everything ``mopd eval report`` does: read the runs, summarise, write the report."""
    o = options
    names, reference, draws, seed, intersect, collapse_runs = (o.names, o.reference, o.draws, o.seed, o.intersect,
                                                               o.collapse_runs)
    validation_logs, validation_labels, make_plots, title = (o.validation_logs, o.validation_labels, o.make_plots,
                                                             o.title)
    runs = load_runs(run_paths, names)
    summary = summarize(runs, reference=reference, draws=draws, seed=seed, intersect=intersect)
    if len(summary["systems"]) > 1:   # linked to the viewer's page of the two (mopd view A B)
        a = summary["protocol"]["reference"]
        b = o.linked if o.linked in summary["systems"] and o.linked != a else \
            next(n for n in summary["systems"] if n != a)
        summary["differences"] = {"a": a, "b": b, "datasets": largest_differences(runs[a], runs[b])}
    rows = None
    if collapse_runs:
        rows = collapse_table({int(step): read_eval_records(records_file(p)) for step, p in collapse_runs.items()})
    return write_report(summary, out_dir, collapse_rows=rows, validation_logs=validation_logs,
                        validation_labels=validation_labels, make_plots=make_plots, title=title,
                        top_sections=o.top_sections)
