"""The policy-gradient terms a token's loss can take, registered by name (``PolicyLossSettings.objective``).

An objective is a function ``(A, ratio, logp, settings) -> dict`` of ``[n]`` fp32 tensors: the
advantage, the importance ratio (token or sequence level, ``terms.importance_ratio``), the token's
log-prob (for REINFORCE-style terms) and the settings; it returns ``pg`` (the term, differentiable in
``ratio`` and ``logp``) and four 0/1 indicators for the stats: ``clipped`` (the clipped branch is the
larger, verl's ``pg_clipfrac``), ``clipped_low`` / ``clipped_high`` (TRL's ``clip_ratio/low_mean`` /
``high_mean``) and ``dual_capped`` (verl's ``pg_clipfrac_lower``). Its gradient is never written: the
kernels take it by autograd (``terms.token_terms``), so a new objective is this function and its
``@register_objective`` line, nothing else (``tests/test_kernels_added_terms.py`` adds one).
"""

from __future__ import annotations

from typing import Callable, Dict

import torch

Objective = Callable[..., Dict[str, torch.Tensor]]

OBJECTIVES: Dict[str, Objective] = {}
"""Name -> objective; ``PolicyLossSettings`` accepts exactly these names."""


def register_objective(name: str) -> Callable[[Objective], Objective]:
    """Register ``fn`` as the objective ``name`` (a decorator)."""
    def decorator(fn: Objective) -> Objective:
        OBJECTIVES[name] = fn
        return fn
    return decorator


def _indicators(pg: torch.Tensor, **given) -> Dict[str, torch.Tensor]:
    zeros = torch.zeros_like(pg)
    out = {"pg": pg}
    for key in ("clipped", "clipped_low", "clipped_high", "dual_capped"):
        out[key] = given.get(key, zeros)
    return out


@register_objective("ppo")
def clipped_surrogate(A, ratio, logp, settings):
    """PPO's clipped surrogate ``max(-A rho, -A clip(rho, 1 - clip_low, 1 + clip_high))``, capped at
    ``-A c`` for ``A < 0`` with dual clip ``c`` (GRPO, DAPO, Dr. GRPO, GSPO, verl's vanilla)."""
    lo, hi = 1.0 - settings.clip_low, 1.0 + settings.clip_high
    pg1 = -A * ratio
    pg2 = -A * ratio.clamp(lo, hi)
    pg = torch.maximum(pg1, pg2)
    capped = torch.zeros_like(pg)
    if settings.dual_clip is not None:
        cap = -A * settings.dual_clip
        is_capped = (A < 0) & (pg > cap)
        pg = torch.where(is_capped, cap, pg)
        capped = is_capped.to(torch.float32)
    return _indicators(pg, clipped=(pg2 > pg1).to(torch.float32),
                       clipped_low=((ratio < lo) & (A < 0)).to(torch.float32),
                       clipped_high=((ratio > hi) & (A > 0)).to(torch.float32), dual_capped=capped)


@register_objective("cispo")
def clipped_weight_reinforce(A, ratio, logp, settings):
    """CISPO (MiniMax-M1): REINFORCE with the stopped, capped ratio ``-sg(min(rho, cap)) A logp``."""
    cap = settings.cispo_cap
    high = ((ratio > cap) & (A > 0)).to(torch.float32)
    return _indicators(-ratio.clamp(max=cap).detach() * A * logp, clipped=high, clipped_high=high)


@register_objective("sapo")
def soft_gate(A, ratio, logp, settings):
    """SAPO: the soft gate ``-A sigmoid(tau (rho - 1)) 4 / tau``, tau by the sign of A."""
    t_pos, t_neg = settings.sapo_temperatures
    tau = torch.where(A > 0, torch.full_like(A, t_pos), torch.full_like(A, t_neg))
    return _indicators(-A * torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau)
