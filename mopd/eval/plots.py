"""PNG plots of an evaluation (matplotlib, Agg backend: no display needed).

- per-dataset bars of a metric with their 95% bootstrap intervals, one bar per system;
- cost against accuracy: macro avg@K (with interval) against search actions and input tokens;
- validation curves from training logs (``metrics.jsonl`` lines with ``step`` and ``val/...`` keys).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

VALIDATION_KEYS = ("val/em", "rollout/search_per_workflow", "rollout/no_search_frac")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def per_dataset_plot(summary: dict, out_png: str | os.PathLike, metric: Optional[str] = None,
                     scoring: str = "strict") -> Path:
    """Grouped bars: datasets (and Macro) on x, one bar per system, 95% intervals as error bars."""
    plt = _pyplot()
    metric = metric or summary["metric_names"]["avg"]
    datasets = list(summary["datasets"])
    groups = datasets + ["Macro"]
    systems = summary["systems"]
    width = 0.8 / len(systems)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) + 2), 4))
    x = np.arange(len(groups))
    for i, s in enumerate(systems):
        acc = summary["accuracy"][scoring][s]
        entries = [acc["per_dataset"][d][metric] for d in datasets] + [acc["macro"][metric]]
        vals = np.array([100 * e["value"] for e in entries])
        lo = np.array([100 * e["ci"][0] for e in entries])
        hi = np.array([100 * e["ci"][1] for e in entries])
        ax.bar(x + (i - (len(systems) - 1) / 2) * width, vals, width, label=s,
               yerr=np.stack([vals - lo, hi - vals]), capsize=2)
    ax.set_xticks(x)
    ax.set_xticklabels(groups, rotation=20)
    ax.set_ylabel(f"{metric} {scoring} EM (%)")
    ax.set_title(f"{metric} per dataset, 95% question-bootstrap intervals")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(4, len(systems)))
    return _save(fig, out_png)


def cost_accuracy_plot(summary: dict, out_png: str | os.PathLike) -> Path:
    """Macro avg@K (with interval) against macro search actions and input tokens per workflow."""
    plt = _pyplot()
    metric = summary["metric_names"]["avg"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, field, label in ((axes[0], "search_actions", "search actions per workflow"),
                             (axes[1], "input_tokens", "input tokens per workflow")):
        for s in summary["systems"]:
            e = summary["accuracy"]["strict"][s]["macro"][metric]
            x = summary["costs"][s]["macro"][field]
            y = 100 * e["value"]
            ax.errorbar([x], [y], yerr=[[y - 100 * e["ci"][0]], [100 * e["ci"][1] - y]], fmt="o", capsize=3)
            ax.annotate(s, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
        ax.set_xlabel(f"{label} (macro)")
        ax.set_ylabel(f"{metric} (%)")
        ax.grid(alpha=0.3)
    fig.suptitle("Accuracy against recorded workload")
    return _save(fig, out_png)


def read_training_log(path: str | os.PathLike) -> List[dict]:
    """The JSON-object lines of a trainer's ``metrics.jsonl``; a truncated last line is skipped."""
    rows = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                continue  # a run killed mid-write
            raise ValueError(f"{path}:{i + 1}: not valid JSON") from None
        if isinstance(d, dict) and "step" in d:
            rows.append(d)
    return rows


def validation_curve_plot(metrics_jsonl_paths: Sequence[str | os.PathLike], out_png: str | os.PathLike,
                          labels: Optional[Sequence[str]] = None,
                          keys: Sequence[str] = VALIDATION_KEYS) -> Path:
    """One panel per key present in any log (val/em, searches per workflow, no-search fraction),
    one line per training run, against the training step; a validation panel also draws each run's
    step-0 value (its starting model) as a dashed line, the level training has to rise above."""
    plt = _pyplot()
    logs: Dict[str, List[dict]] = {}
    for i, p in enumerate(metrics_jsonl_paths):
        label = labels[i] if labels else (Path(p).parent.name or Path(p).stem)
        logs[label] = read_training_log(p)
    present = [k for k in keys if any(k in row for rows in logs.values() for row in rows)]
    if not present:
        raise ValueError(f"none of {list(keys)} appears in {[str(p) for p in metrics_jsonl_paths]}")
    fig, axes = plt.subplots(1, len(present), figsize=(4.5 * len(present), 3.6), squeeze=False)
    for ax, key in zip(axes[0], present):
        for label, rows in logs.items():
            pts = sorted((r["step"], r[key]) for r in rows if key in r and r[key] is not None)
            if pts:
                line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=label)
                if key.startswith("val/") and pts[0][0] == 0:   # the starting model (a base system)
                    ax.axhline(pts[0][1], color=line.get_color(), linestyle="--", linewidth=0.8, alpha=0.6)
        ax.set_xlabel("training step")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return _save(fig, out_png)


def _save(fig, out_png) -> Path:
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)
    return out
