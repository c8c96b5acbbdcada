"""Every number of an evaluation, computed from records: the content of ``metrics.json``.

``summarize`` aligns the systems' records, scores every workflow once, stacks all per-question
statistics of all systems into one array and bootstraps it once (so every interval and every
difference uses the same paired draws), then adds costs and format diagnostics. Values are
fractions (0-1) and unrounded; the report rounds them for people.

Differences are ``reference - system`` (positive: the reference is ahead), as the paper reports
its method against each baseline; the Table 7 bound is ``a_ref - (a_B + f_B)``.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence

import numpy as np

from mopd.core.records import WorkflowRecord
from mopd.eval.activity import activity
from mopd.eval.alignment import AlignedRuns, EvalError, align_runs
from mopd.eval.bootstrap import DEFAULT_DRAWS, DEFAULT_SEED, PERCENTILES, paired_intervals
from mopd.eval.costs import (
    COST_FIELDS,
    cost_averages,
    cost_grid,
    pooled_stats,
    relative_change,
    task_assignments_apply,
)
from mopd.eval.diagnostics import failure_counts, failure_fractions, repaired_values, rescued_counts
from mopd.eval.metrics import (
    FAILURE_TYPES,
    METRIC_KINDS,
    dataset_means,
    macro_mean,
    metric_names,
    n_correct_counts,
    outcomes,
    question_metrics,
)

SCORINGS = ("strict", "flexible")
# Order of the statistics stacked for the bootstrap: 3 metrics x 2 scorings, then the
# "all failures repaired" avg@K (a_B + f_B) and the Table 7 bound against the reference.
_STATS = [(s, m) for s in SCORINGS for m in METRIC_KINDS] + [("repaired", "avg"), ("bound", "avg")]


def _stat(value: float, lo: float, hi: float) -> dict:
    return {"value": float(value), "ci": [float(lo), float(hi)]}


def summarize(records_by_system: Mapping[str, Sequence[WorkflowRecord]], reference: Optional[str] = None,
              draws: int = DEFAULT_DRAWS, seed: int = DEFAULT_SEED, intersect: bool = False) -> dict:
    """The full evaluation of several systems; ``reference`` defaults to the first system."""
    runs = align_runs(records_by_system, intersect=intersect)
    ref_name = reference if reference is not None else runs.systems[0]
    if ref_name not in runs.systems:
        raise EvalError(f"reference system {ref_name!r} is not among {runs.systems}")
    ref = runs.systems.index(ref_name)
    out = outcomes(runs)
    k = runs.k
    n_d = len(runs.datasets)
    di = runs.dataset_index
    names = metric_names(k)

    per_q = {}
    for scoring, correct in (("strict", out.strict), ("flexible", out.flex)):
        for kind, v in question_metrics(correct).items():
            per_q[(scoring, kind)] = v
    per_q[("repaired", "avg")] = repaired_values(out.strict, out.failure)
    per_q[("bound", "avg")] = per_q[("strict", "avg")][ref][None, :] - per_q[("repaired", "avg")]
    values = np.stack([per_q[key] for key in _STATS], 1)  # [S, M, Q]
    point_d = dataset_means(values, di, n_d)  # [S, M, D]
    point_m = point_d.mean(-1)  # [S, M]
    iv = paired_intervals(values, di, n_d, ref, draws=draws, seed=seed)

    result = {
        "protocol": {
            "attempts": k,
            "attempt_ids": runs.attempts,
            "bootstrap_draws": draws,
            "bootstrap_seed": seed,
            "interval_percentiles": list(PERCENTILES),
            "resampling": "questions with replacement within each dataset; a question keeps its "
                          "attempts and all systems (paired); datasets weighted equally",
            "difference": "reference - system",
            "reference": ref_name,
            "intersect": intersect,
            "dropped_records": runs.dropped,
        },
        "systems": runs.systems,
        "metric_names": names,
        "datasets": {d: {"questions": int(n)} for d, n in zip(runs.datasets, runs.questions_per_dataset())},
        "records": {s: len(records_by_system[s]) for s in runs.systems},
        "accuracy": {},
    }
    for scoring in SCORINGS:
        result["accuracy"][scoring] = {}
        correct = out.strict if scoring == "strict" else out.flex
        counts = n_correct_counts(correct, di, n_d)  # [S, D, K+1]
        for si, sname in enumerate(runs.systems):
            macro, per_dataset = {}, {d: {} for d in runs.datasets}
            for kind in METRIC_KINDS:
                mi = _STATS.index((scoring, kind))
                entry = _stat(point_m[si, mi], iv.macro_lo[si, mi], iv.macro_hi[si, mi])
                entry.update(_diff(si, ref, point_m[ref, mi] - point_m[si, mi],
                                   iv.diff_macro_lo[si, mi], iv.diff_macro_hi[si, mi]))
                macro[names[kind]] = entry
                for di_, d in enumerate(runs.datasets):
                    e = _stat(point_d[si, mi, di_], iv.dataset_lo[si, mi, di_], iv.dataset_hi[si, mi, di_])
                    e.update(_diff(si, ref, point_d[ref, mi, di_] - point_d[si, mi, di_],
                                   iv.diff_dataset_lo[si, mi, di_], iv.diff_dataset_hi[si, mi, di_]))
                    per_dataset[d][names[kind]] = e
            c = counts[si]
            frac = c / c.sum(-1, keepdims=True)
            result["accuracy"][scoring][sname] = {
                "macro": macro,
                "per_dataset": per_dataset,
                "n_correct": {
                    "macro": frac.mean(0).tolist(),
                    "per_dataset": {d: frac[j].tolist() for j, d in enumerate(runs.datasets)},
                    "counts": {d: c[j].astype(int).tolist() for j, d in enumerate(runs.datasets)},
                },
            }
    result["costs"] = _costs(runs, ref)
    result["activity"] = activity(runs)
    result["format"] = _format(runs, out, point_m, iv, ref, names)
    return result


def _diff(si: int, ref: int, value: float, lo: float, hi: float) -> dict:
    if si == ref:
        return {"diff_vs_reference": None, "diff_ci": None}
    return {"diff_vs_reference": float(value), "diff_ci": [float(lo), float(hi)]}


def _costs(runs: AlignedRuns, ref: int) -> Dict[str, dict]:
    grid = cost_grid(runs)  # [S, Q, K, F]
    durations = runs.grid(lambda r: r.duration_s)  # [S, Q, K]
    per_d, macro = cost_averages(grid, runs.dataset_index, len(runs.datasets))
    out = {}
    for si, sname in enumerate(runs.systems):
        applies = task_assignments_apply(runs.records[si])
        entry = {
            "macro": {f: float(macro[si, j]) for j, f in enumerate(COST_FIELDS)},
            "per_dataset": {d: {f: float(per_d[si, di, j]) for j, f in enumerate(COST_FIELDS)}
                            for di, d in enumerate(runs.datasets)},
            "task_assignments_applicable": applies,
            "relative_change_of_reference": None if si == ref else {
                f: relative_change(macro[ref, j], macro[si, j]) for j, f in enumerate(COST_FIELDS)},
            "pooled": pooled_stats(np.concatenate([grid[si], durations[si][..., None]], -1)),
        }
        out[sname] = entry
    return out


def _format(runs: AlignedRuns, out, point_m, iv, ref: int, names) -> Dict[str, dict]:
    n_d = len(runs.datasets)
    di = runs.dataset_index
    rescued = rescued_counts(out.strict, out.flex, di, n_d)  # [S, D]
    fcounts = failure_counts(out.failure, di, n_d)  # [S, D, T]
    pooled, macro = failure_fractions(out.failure, di, n_d)
    any_pooled = (out.failure > 0).mean((1, 2))
    any_macro = macro_mean((out.failure > 0).mean(-1), di, n_d)
    has_candidate = macro_mean((out.failure != 1).mean(-1), di, n_d)
    res = {}
    rep_i, bound_i, strict_avg = _STATS.index(("repaired", "avg")), _STATS.index(("bound", "avg")), \
        _STATS.index(("strict", "avg"))
    for si, sname in enumerate(runs.systems):
        change = {}
        for kind in METRIC_KINDS:
            change[names[kind]] = float(point_m[si, _STATS.index(("flexible", kind))]
                                        - point_m[si, _STATS.index(("strict", kind))])
        failures = {t: {"count": int(fcounts[si, :, j].sum()), "pooled_frac": float(pooled[si, j]),
                        "macro_frac": float(macro[si, j]),
                        "per_dataset": {d: int(fcounts[si, dj, j]) for dj, d in enumerate(runs.datasets)}}
                    for j, t in enumerate(FAILURE_TYPES)}
        failures["any"] = {"count": int(fcounts[si].sum()), "pooled_frac": float(any_pooled[si]),
                           "macro_frac": float(any_macro[si])}
        bound = None
        if si != ref:
            bound = {
                "reference_score": float(point_m[ref, strict_avg]),
                "a": float(point_m[si, strict_avg]),
                "f": float(point_m[si, rep_i] - point_m[si, strict_avg]),
                "a_plus_f": float(point_m[si, rep_i]),
                "value": float(point_m[si, bound_i]),
                "ci": [float(iv.macro_lo[si, bound_i]), float(iv.macro_hi[si, bound_i])],
            }
        res[sname] = {
            "rescued": {"total": int(rescued[si].sum()),
                        "per_dataset": {d: int(rescued[si, j]) for j, d in enumerate(runs.datasets)}},
            "flexible_change_macro": change,
            "completion_macro": float(has_candidate[si]),
            "valid_tag_macro": float(1.0 - any_macro[si]),
            "failures": failures,
            "upper_bound": bound,
        }
    return res
