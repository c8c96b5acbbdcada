"""Markdown tables laid out like the paper's, from a ``summarize`` result (fractions shown as %)."""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Sequence
from urllib.parse import quote

from mopd.eval.collapse import COLLAPSE_COLUMNS
from mopd.eval.costs import COST_FIELDS
from mopd.eval.metrics import FAILURE_TYPES, METRIC_KINDS

COST_HEADERS = {
    "search_actions": "Search actions",
    "searches_with_passages": "Searches w/ passages",
    "returned_passages": "Returned passages",
    "input_tokens": "Input tokens",
    "output_tokens": "Output tokens",
    "reports": "Reports",
    "task_assignments": "Task assignments",
}
FAILURE_HEADERS = {"no_candidate": "No candidate", "empty_candidate": "Empty final candidate",
                   "no_valid_tag": "No valid tag"}


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], first_left: bool = True) -> str:
    align = [":---" if (i == 0 and first_left) else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>()#|!~&])")


def markdown_text(text: str) -> str:
    """``text`` (a dataset name, a question id: from records) as literal Markdown text inside a table
    cell: its punctuation backslash-escaped, line breaks made spaces."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(text).splitlines()))


def question_link(dataset: str, qid: str) -> str:
    """A link to one question in the viewer's page beside the report: ``view.html#q=DATASET/ID``,
    each part percent-encoded (a ``%``, ``/``, ``#`` or space in an id would else break the link;
    the page decodes them)."""
    return f"[{markdown_text(qid)}](view.html#q={quote(str(dataset), safe='')}/{quote(str(qid), safe='')})"


def pct(x: Optional[float], digits: int = 2) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}"


def signed_pct(x: Optional[float], digits: int = 2) -> str:
    return "n/a" if x is None else f"{100 * x:+.{digits}f}"


def with_ci(entry: dict, signed: bool = False, key: str = "value", ci_key: str = "ci") -> str:
    f = signed_pct if signed else pct
    lo, hi = entry[ci_key]
    return f"{f(entry[key])} [{f(lo)}, {f(hi)}]"


def count(x: float, field: str = "") -> str:
    return f"{x:,.0f}" if field.endswith("tokens") else f"{x:,.2f}"


def _names(summary: dict) -> List[str]:
    return [summary["metric_names"][k] for k in METRIC_KINDS]


def main_table(summary: dict, scoring: str = "strict") -> str:
    """Macro avg@K, pass@K and K/K with 95% intervals, one row per system."""
    names = _names(summary)
    acc = summary["accuracy"][scoring]
    rows = [[s] + [with_ci(acc[s]["macro"][n]) for n in names] for s in summary["systems"]]
    return markdown_table(["System"] + names, rows)


def difference_table(summary: dict, scoring: str = "strict") -> str:
    """Paired differences reference - system with 95% intervals."""
    names = _names(summary)
    ref = summary["protocol"]["reference"]
    acc = summary["accuracy"][scoring]
    rows = [[f"{ref} - {s}"] + [with_ci(acc[s]["macro"][n], True, "diff_vs_reference", "diff_ci") for n in names]
            for s in summary["systems"] if s != ref]
    return markdown_table(["Difference"] + [f"Δ {n}" for n in names], rows)


def side_by_side_table(summary: dict) -> str:
    """Strict and flexible EM next to each other, macro."""
    names = _names(summary)
    header = ["System"] + [f"{n} {sc}" for n in names for sc in ("strict", "flex")]
    rows = [[s] + [pct(summary["accuracy"][sc][s]["macro"][n]["value"]) for n in names
                   for sc in ("strict", "flexible")] for s in summary["systems"]]
    return markdown_table(header, rows)


def n_correct_table(summary: dict, scoring: str = "strict") -> str:
    """Macro distribution of n_i, the number of correct attempts per question."""
    k = summary["protocol"]["attempts"]
    rows = [[s] + [pct(x) for x in summary["accuracy"][scoring][s]["n_correct"]["macro"]]
            for s in summary["systems"]]
    return markdown_table(["System"] + [f"n={j}" for j in range(k + 1)], rows)


def per_dataset_table(summary: dict, metric: str, scoring: str = "strict", intervals: bool = False) -> str:
    """One metric per dataset and macro, one row per system."""
    datasets = list(summary["datasets"])
    acc = summary["accuracy"][scoring]
    cell = with_ci if intervals else (lambda e: pct(e["value"]))
    rows = [[s] + [cell(acc[s]["per_dataset"][d][metric]) for d in datasets] + [cell(acc[s]["macro"][metric])]
            for s in summary["systems"]]
    header = ["System"] + [f"{d} (n={summary['datasets'][d]['questions']})" for d in datasets] + ["Macro"]
    return markdown_table(header, rows)


def difference_links(summary: dict) -> str:
    """Each dataset's questions where the two systems of ``summary["differences"]`` differ most,
    linked into the viewer's page of them (``view.html`` beside the report)."""
    diff = summary["differences"]
    a, b, k = diff["a"], diff["b"], summary["protocol"]["attempts"]
    rows = [[markdown_text(d), ", ".join(f"{question_link(d, r['id'])} ({signed_pct(r['a'] - r['b'], 0)})"
                                         for r in found)]
            for d, found in diff["datasets"].items()]
    intro = (f"**Questions where {a} and {b} differ most** (strict avg@{k}, {a} minus {b}); the links open "
             f"`view.html` beside this report, written by `mopd view RUN_A RUN_B --names {a} {b} --out "
             "<this directory>/view.html` (RUN_A, RUN_B: the two evaluations' directories):")
    return intro + "\n\n" + markdown_table(["Dataset", "Questions"], rows)


def cost_table(summary: dict) -> str:
    """Macro per-workflow costs; task assignments 'n/a' where the workflow has no Leader."""
    rows = []
    for s in summary["systems"]:
        c = summary["costs"][s]
        rows.append([s] + [("n/a" if f == "task_assignments" and not c["task_assignments_applicable"]
                            else count(c["macro"][f], f)) for f in COST_FIELDS])
    return markdown_table(["System"] + [COST_HEADERS[f] for f in COST_FIELDS], rows)


def relative_cost_table(summary: dict) -> str:
    """Change of the reference's macro costs relative to each other system, from unrounded values."""
    ref = summary["protocol"]["reference"]
    rows = []
    for s in summary["systems"]:
        rel = summary["costs"][s]["relative_change_of_reference"]
        if rel is None:
            continue
        applies = summary["costs"][s]["task_assignments_applicable"] and \
            summary["costs"][ref]["task_assignments_applicable"]
        rows.append([f"{ref} vs {s}"] + [
            "n/a" if (rel[f] is None or (f == "task_assignments" and not applies)) else f"{100 * rel[f]:+.1f}%"
            for f in COST_FIELDS])
    return markdown_table(["Relative change"] + [COST_HEADERS[f] for f in COST_FIELDS], rows)


def pooled_cost_table(summary: dict) -> str:
    """Pooled (unweighted) mean and median per workflow, plus total duration."""
    fields = ("search_actions", "input_tokens", "output_tokens", "duration_s")
    rows = []
    for s in summary["systems"]:
        p = summary["costs"][s]["pooled"]
        rows.append([s, str(p["search_actions"]["workflows"])] +
                    [f"{p[f]['mean']:,.2f} / {p[f]['median']:,.0f}" for f in fields[:3]] +
                    [f"{p['duration_s']['total']:,.1f}"])
    return markdown_table(["System", "Workflows", "Search actions (mean / median)", "Input tokens (mean / median)",
                           "Output tokens (mean / median)", "Total duration (s)"], rows)


def flexible_table(summary: dict) -> str:
    """Table 6: answers rescued by flexible extraction per dataset and the macro change."""
    datasets = list(summary["datasets"])
    avg = summary["metric_names"]["avg"]
    rows = []
    for s in summary["systems"]:
        f = summary["format"][s]
        strict = summary["accuracy"]["strict"][s]["macro"][avg]["value"]
        flex = summary["accuracy"]["flexible"][s]["macro"][avg]["value"]
        rows.append([s] + [str(f["rescued"]["per_dataset"][d]) for d in datasets] +
                    [str(f["rescued"]["total"]), pct(f["valid_tag_macro"]), pct(strict), pct(flex),
                     signed_pct(f["flexible_change_macro"][avg])])
    header = (["System"] + [f"Rescued {d}" for d in datasets] +
              ["Rescued total", "Valid tag", f"{avg} strict", f"{avg} flex", "Macro change (pp)"])
    return markdown_table(header, rows)


def failure_table(summary: dict) -> str:
    """Failure taxonomy of the final candidate: count (pooled % / macro %)."""
    rows = []
    for s in summary["systems"]:
        fl = summary["format"][s]["failures"]
        rows.append([s] + [f"{fl[t]['count']:,} ({pct(fl[t]['pooled_frac'])} / {pct(fl[t]['macro_frac'])})"
                           for t in FAILURE_TYPES + ("any",)])
    return markdown_table(["System"] + [FAILURE_HEADERS[t] for t in FAILURE_TYPES] + ["Any"], rows)


def bound_table(summary: dict) -> str:
    """Table 7: a_ref - (a_B + f_B), with paired 95% intervals."""
    ref = summary["protocol"]["reference"]
    rows = []
    for s in summary["systems"]:
        b = summary["format"][s]["upper_bound"]
        if b is None:
            continue
        rows.append([s, pct(b["a"]), pct(b["f"]), pct(b["a_plus_f"]), pct(b["reference_score"]),
                     with_ci(b, signed=True)])
    return markdown_table(["System B", "a_B", "f_B", "a_B + f_B", f"a_ref ({ref})", "a_ref - (a_B + f_B)"], rows)


def collapse_markdown(rows: List[Dict[str, float]]) -> str:
    """Table 8: per checkpoint, pooled fractions of workflows."""
    header = ["Step", "Workflows", "No search", "EM", "Final answer", "Searches / workflow", "With report",
              "With subtasks + reports"]
    out = []
    for r in rows:
        vals = [pct(r[c], 1) if c != "searches_per_workflow" else f"{r[c]:.2f}" for c in COLLAPSE_COLUMNS]
        out.append([str(r["step"]), f"{r['workflows']:,}"] + vals)
    return markdown_table(header, out)


ACTIVITY_HEADERS = {
    "leader_subtasks": "Leader subtasks per workflow",
    "leader_waves": "Leader waves (outputs with subtasks) per workflow",
    "multi_subtask": "Workflows whose Leader delegated 2+ subtasks (%)",
    "multi_subtask_one_wave": "Workflows whose Leader delegated 2+ subtasks in one output (%)",
    "searches": "Search actions per workflow",
    "no_search": "Workflows with no search action (%)",
}
_ACTIVITY_FRACTIONS = ("multi_subtask", "multi_subtask_one_wave", "no_search")


def activity_tables(summary: dict) -> str:
    """Role activity by question type: one table per statistic, a row per system, a column per
    dataset and the macro; 'n/a' for the Leader's statistics of a system without a Leader."""
    datasets = list(summary["datasets"])
    parts = []
    for f, title in ACTIVITY_HEADERS.items():
        def cell(v):
            return "n/a" if v is None else (pct(v, 1) if f in _ACTIVITY_FRACTIONS else f"{v:.2f}")
        rows = []
        for s in summary["systems"]:
            a = summary["activity"][s]
            rows.append([s] + [cell(a["per_dataset"][d][f]) for d in datasets] + [cell(a["macro"][f])])
        parts += [f"**{title}**", "", markdown_table(["System"] + datasets + ["Macro"], rows), ""]
    return "\n".join(parts).rstrip()


VALIDATION_COLUMNS = {"val/em": "dev EM (%)", "val/no_search_frac": "dev workflows with no search (%)",
                      "val/search_per_workflow": "dev search actions per workflow"}


def validation_tables(validation: Dict[str, List[dict]]) -> str:
    """Per logged statistic, a row per validation step and a column per training run ('' where a
    run did not validate at that step); ``validation``: {label: [{"step", "val/em", ...}]}."""
    labels = list(validation)
    steps = sorted({r["step"] for rows in validation.values() for r in rows})
    by = {label: {r["step"]: r for r in rows} for label, rows in validation.items()}
    parts = []
    for key, title in VALIDATION_COLUMNS.items():
        if not any(key in r for rows in validation.values() for r in rows):
            continue

        def cell(label, step):
            v = by[label].get(step, {}).get(key)
            return "" if v is None else (f"{v:.2f}" if key == "val/search_per_workflow" else pct(v, 1))
        rows = [[str(step)] + [cell(label, step) for label in labels] for step in steps]
        parts += [f"**{title}**", "", markdown_table(["Step"] + labels, rows), ""]
    return "\n".join(parts).rstrip()
