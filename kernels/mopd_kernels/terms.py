"""Per-token loss terms of the role-aware PPO/OPD loss, and the per-role stats (pure torch, [n] vectors).

For a trained token t of role r (its spec's columns gathered from the role table):

    A_t   = advantages[t]                                  outcome role
          = opd_coef * (teacher_logp[t] - old_logp[t])     OPD role
    ratio = exp(logp_t - old_logp[t])
    pg_t  = max(-A ratio, -A clip(ratio, 1 - clip_low, 1 + clip_high))
            and, with dual clip c and A < 0, min(pg_t, -A c)
    kl_t  = k1: logp - ref | k2: (logp - ref)^2 / 2 | k3: exp(ref - logp) - (ref - logp) - 1
    loss_t = pg_coef pg_t - entropy_coef H_t + kl_coef kl_t

The loss depends on the logits only through logp_t and H_t, so its gradient is two scalars per
token: ``g_logp = d loss_t / d logp_t`` and ``g_H = d loss_t / d H_t = -entropy_coef``, with
    d pg / d logp = -A ratio  when the unclipped branch is taken (pg1 >= pg2) and the dual clip is not,
                    0         otherwise (the clipped branch and the dual-clip cap are constant in logp);
    d k1 / d logp = 1,  d k2 / d logp = logp - ref,  d k3 / d logp = 1 - exp(ref - logp).
A coefficient of 0 switches its term off exactly (no 0 * inf = NaN from an extreme log-prob).

The torch row pass uses ``g_logp``/``g_H`` to form the logits gradient; every backend uses
``loss_t`` and the per-token stats from here, after its kernels have produced logp_t and H_t.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from mopd_kernels.inputs import LossInputs
from mopd_kernels.roles import COL_ENT_COEF, COL_IS_OPD, COL_KL_COEF, COL_KL_TYPE, COL_OPD_COEF, COL_PG_COEF
from mopd_kernels.settings import PolicyLossSettings

STAT_NAMES = ("tokens", "advantage_mean", "clip_frac", "approx_kl", "entropy_mean", "opd_log_ratio",
              "pg_loss", "kl")
"""Per-role stats: token count; mean A_t; fraction of tokens where the clipped branch is larger
(pg2 > pg1, verl's pg_clipfrac); mean old_logp - logp; mean H_t; mean teacher_logp - old_logp (0
without teacher_logp); mean pg_t; mean kl_t (0 without ref_logp)."""


def _coef_times(coef: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.where(coef != 0, coef * x, torch.zeros_like(x))


def token_terms(logp: torch.Tensor, entropy: torch.Tensor, inputs: LossInputs,
                settings: PolicyLossSettings) -> Dict[str, torch.Tensor]:
    """Loss, gradient scalars and stat inputs of trained tokens, fp32 [n] each.

    ``logp``, ``entropy`` and every tensor of ``inputs`` are [n], over trained tokens only
    (``inputs.roles >= 0``); ``inputs``' values are fp32.
    """
    old_logp, advantages, teacher_logp, ref_logp = (inputs.old_logp, inputs.advantages, inputs.teacher_logp,
                                                    inputs.ref_logp)
    clip_low, clip_high, dual_clip = settings.clip_low, settings.clip_high, settings.dual_clip
    spec = settings.role_table(logp.device)[inputs.roles.long()]
    A = advantages
    if teacher_logp is not None:
        A = torch.where(spec[:, COL_IS_OPD] != 0, spec[:, COL_OPD_COEF] * (teacher_logp - old_logp), A)
    ratio = torch.exp(logp - old_logp)
    pg1 = -A * ratio
    pg2 = -A * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(pg1, pg2)
    dpg = torch.where(pg1 >= pg2, pg1, torch.zeros_like(pg1))
    if dual_clip is not None:
        cap = -A * dual_clip
        capped = (A < 0) & (pg > cap)
        pg = torch.where(capped, cap, pg)
        dpg = torch.where(capped, torch.zeros_like(dpg), dpg)
    pg_coef, ent_coef, kl_coef = spec[:, COL_PG_COEF], spec[:, COL_ENT_COEF], spec[:, COL_KL_COEF]
    loss = _coef_times(pg_coef, pg) - ent_coef * entropy
    g_logp = _coef_times(pg_coef, dpg)
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        delta = ref_logp - logp
        kl_type = spec[:, COL_KL_TYPE]
        exp_delta = torch.exp(delta)
        kl = torch.where(kl_type == 0, -delta, torch.where(kl_type == 1, 0.5 * delta * delta,
                                                           exp_delta - delta - 1.0))
        dkl = torch.where(kl_type == 0, torch.ones_like(delta),
                          torch.where(kl_type == 1, -delta, 1.0 - exp_delta))
        loss = loss + _coef_times(kl_coef, kl)
        g_logp = g_logp + _coef_times(kl_coef, dkl)
    return {
        "loss": loss,
        "g_logp": g_logp,
        "g_entropy": -ent_coef,
        "advantage": A,
        "clipped": (pg2 > pg1).to(torch.float32),
        "pg": pg,
        "kl": kl,
    }


def role_stats(terms: Dict[str, torch.Tensor], logp: torch.Tensor, entropy: torch.Tensor, inputs: LossInputs,
               n_roles: int) -> Dict[int, Dict[str, torch.Tensor]]:
    """Per-role means of the stat inputs (one ``index_add_`` for all roles; no host sync).

    Returns ``{r: {name: 0-d fp32 tensor}}`` for every role ``r`` in ``range(n_roles)``; means over
    a role without tokens are 0.
    """
    old_logp, teacher_logp = inputs.old_logp, inputs.teacher_logp
    opd_ratio = teacher_logp - old_logp if teacher_logp is not None else torch.zeros_like(logp)
    columns = torch.stack([torch.ones_like(logp), terms["advantage"], terms["clipped"], old_logp - logp,
                           entropy, opd_ratio, terms["pg"], terms["kl"]], dim=1)
    sums = torch.zeros(n_roles, len(STAT_NAMES), dtype=torch.float32, device=logp.device)
    sums.index_add_(0, inputs.roles.long(), columns.float())
    count = sums[:, :1]
    means = torch.cat([count, sums[:, 1:] / count.clamp(min=1)], dim=1)
    return {r: {name: means[r, j] for j, name in enumerate(STAT_NAMES)} for r in range(n_roles)}


def stats_to_floats(stats: Dict[int, Dict[str, torch.Tensor]],
                    role_names: Optional[List[str]] = None) -> Dict[str, float]:
    """Flatten ``stats`` to ``{"<role>/<stat>": float}`` with one host transfer (for loggers)."""
    if not stats:
        return {}
    roles = sorted(stats)
    table = torch.stack([torch.stack([stats[r][k] for k in STAT_NAMES]) for r in roles]).tolist()
    out = {}
    for r, row in zip(roles, table, strict=True):
        name = role_names[r] if role_names is not None else f"role{r}"
        for k, v in zip(STAT_NAMES, row, strict=True):
            out[f"{name}/{k}"] = float(v)
    return out
