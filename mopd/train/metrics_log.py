"""Run logging: metrics.jsonl always, TensorBoard and W&B when asked, events, and the run plots."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Dict, Optional

from mopd.train.run_dir import record_wandb_run, wandb_run


class MetricsLogger:
    """Appends one JSON line per step to ``<run>/metrics.jsonl`` and events to ``events.jsonl``.

    W&B (``wandb_project``): the W&B run's id is kept in ``<run>/run.json`` (``"wandb"``, which
    ``--resume`` keeps), and a logger of a run that has one continues that W&B run
    (``wandb.init(id=..., resume="allow")``) instead of opening a new one at every resume. W&B
    drops steps at or below the last it has, so the steps between the resumed checkpoint and a
    kill, logged again, keep their first values there (metrics.jsonl is cut back and rewritten).
    """

    def __init__(self, run_dir: str | os.PathLike, tensorboard: bool = False, wandb_project: str = "",
                 config: Optional[dict] = None, enabled: bool = True):
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self._tb = None
        self._wandb = None
        self.wandb_resumed = False
        """Whether this logger continues the W&B run that run.json records."""
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise RuntimeError("trainer.tensorboard=true needs tensorboard: pip install tensorboard") from None
            self._tb = SummaryWriter(str(self.run_dir / "tb"))
        if wandb_project:
            try:
                import wandb
            except ImportError:
                raise RuntimeError("trainer.wandb_project needs wandb: pip install wandb") from None

            known = wandb_run(self.run_dir)
            resume_id = known["id"] if known and known.get("project") == wandb_project else None
            more = {"id": resume_id, "resume": "allow"} if resume_id else {}
            self._wandb = wandb.init(project=wandb_project, dir=str(self.run_dir), config=config or {}, **more)
            self.wandb_resumed = resume_id is not None
            if resume_id is None:
                record_wandb_run(self.run_dir, self._wandb.id, wandb_project)

    def log(self, step: int, metrics: Dict[str, float]) -> None:
        if not self.enabled:
            return
        row = {"step": step, "time": time.time()}
        for k, v in metrics.items():
            v = float(v)
            row[k] = v if math.isfinite(v) else str(v)
        with (self.run_dir / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, float(v), step)
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)

    def event(self, step: int, kind: str, message: str, **data) -> None:
        if not self.enabled:
            return
        with (self.run_dir / "events.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, "time": time.time(), "kind": kind, "message": message, **data}) + "\n")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: str | os.PathLike) -> list:
    p = Path(path)
    if not p.is_file():
        return []
    rows = []
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash
    return rows


def plot_training(run_dir: str | os.PathLike, out_png: Optional[str] = None) -> Optional[Path]:
    """Validation EM, role rewards and search activity over steps, in one PNG beside the checkpoints."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    if not rows:
        return None
    panels = [("validation EM", ["val/em"]),
              ("mean reward per role", ["reward/leader", "reward/searcher", "reward/answerer"]),
              ("search activity", ["rollout/search_per_workflow", "rollout/no_search_frac"]),
              ("policy", ["loss/entropy_mean", "loss/clip_frac", "loss/searcher_opd_log_ratio"])]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2))
    for ax, (title, keys) in zip(axes, panels):
        for k in keys:
            pts = [(r["step"], r[k]) for r in rows if isinstance(r.get(k), (int, float))]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, ms=3, label=k.split("/")[-1])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    out = Path(out_png) if out_png else Path(run_dir) / "training.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
