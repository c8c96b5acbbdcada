"""What one training step reports: loss statistics pooled over micro-batches, advantage statistics,
rollout diagnostics and throughput per phase. Pure bookkeeping; the trainer only hands it numbers.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Dict, Iterator, Sequence

import torch
from mopd_kernels import stats_to_floats

from mopd.algo.diagnostics import batch_diagnostics
from mopd.algo.rewards import team_em
from mopd.core.roles import role_names
from mopd.train.packing import padding_fraction


class PhaseTimer:
    """Wall seconds per named phase: ``with timer("rollout"): ...``."""

    def __init__(self):
        self.seconds: Dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0


class LossStats:
    """Running means of a step's loss statistics.

    Per-role kernel stats (``loss/<role>_<stat>``, and the same stat pooled over roles as
    ``loss/<stat>``) are weighted by the role's token count in each micro-batch; the loss and the
    gradient norm of each optimizer update are plain means over updates (a skipped update counts
    as 0, and in ``loss/skipped_updates``).
    """

    def __init__(self):
        self._sum: Dict[str, float] = {}
        self._weight: Dict[str, float] = {}
        self.skipped = 0

    def _add(self, key: str, value: float, weight: float = 1.0) -> None:
        self._sum[key] = self._sum.get(key, 0.0) + value * weight
        self._weight[key] = self._weight.get(key, 0.0) + weight

    def add_micro_batch(self, stats) -> None:
        """The kernel's per-role stats of one micro-batch (one host transfer)."""
        flat = stats_to_floats(stats, list(role_names()))
        for role in role_names():
            n = flat.get(f"{role}/tokens", 0.0)
            if n <= 0:
                continue
            for key, v in flat.items():
                r, name = key.split("/", 1)
                if r != role or name == "tokens" or not math.isfinite(v):
                    continue
                self._add(f"loss/{role}_{name}", v, n)
                self._add(f"loss/{name}", v, n)

    def add_update(self, loss: float, grad_norm: float, applied: bool) -> None:
        """One optimizer update (or one skipped for a non-finite loss or gradient)."""
        self.skipped += not applied
        self._add("loss/total", loss if applied else 0.0)
        self._add("loss/grad_norm", grad_norm if applied else 0.0)

    def means(self) -> Dict[str, float]:
        out = {k: self._sum[k] / self._weight[k] for k in self._sum if self._weight[k]}
        out["loss/skipped_updates"] = float(self.skipped)
        return out


def advantage_stats(batches: Sequence) -> Dict[str, float]:
    """Mean and mean absolute advantage of each role's trained tokens (outcome roles; OPD roles'
    advantages are formed inside the loss and read 0 here)."""
    out = {}
    for rid, role in enumerate(role_names()):
        vals = torch.cat([b.advantages[b.roles == rid] for b in batches]) if batches else torch.zeros(0)
        if vals.numel():
            out[f"adv/{role}_mean"] = float(vals.mean())
            out[f"adv/{role}_abs"] = float(vals.abs().mean())
    return out


def step_metrics(records: Sequence, rewards: Sequence, batches: Sequence, losses: LossStats,
                 timer: PhaseTimer, scoring_passes: int) -> Dict[str, float]:
    """The metrics line of one step. ``scoring_passes``: forwards per token in the scoring phase
    (recomputed pi_old, teacher, reference)."""
    t = timer.seconds
    n_tok = sum(b.num_tokens for b in batches)
    n_gen = sum(c.output_tokens for r in records for c in r.calls)
    m = {f"rollout/{k}": v for k, v in batch_diagnostics(records).items()}
    m.update({k: v for k, v in batch_diagnostics(records, rewards).items() if k.startswith("reward/")})
    m.update(advantage_stats(batches))
    m.update(losses.means())
    m.update({
        "rollout/em": sum(team_em(r) for r in records) / max(1, len(records)),
        "perf/rollout_s": t.get("rollout", 0.0), "perf/score_s": t.get("score", 0.0),
        "perf/train_s": t.get("train", 0.0),
        "perf/rollout_tokens_per_s": n_gen / max(t.get("rollout", 0.0), 1e-9),
        "perf/score_tokens_per_s": n_tok * scoring_passes / max(t.get("score", 0.0), 1e-9),
        "perf/train_tokens_per_s": n_tok / max(t.get("train", 0.0), 1e-9),
        "perf/padding_frac": padding_fraction(batches), "perf/micro_batches": len(batches),
    })
    if torch.cuda.is_available():
        m["perf/max_memory_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
    return m
