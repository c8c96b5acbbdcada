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

import math
from typing import Callable, Dict, NamedTuple, Optional

import torch

Objective = Callable[..., Dict[str, torch.Tensor]]

OBJECTIVES: Dict[str, Objective] = {}
"""Name -> objective; ``PolicyLossSettings`` accepts exactly these names."""


class ObjectiveTraits(NamedTuple):
    per_sequence: bool = False
    """The term of a token depends on its whole sequence: the objective is called with a fifth
    argument, a ``SequenceView``, and the loss scores every log-prob before any gradient (the
    sequence pass: one lm-head matmul more, as GSPO)."""
    owns_pg_scale: bool = False
    """The objective uses ``LossInputs.pg_scale`` itself (``SequenceView.pg_scale``); the loss does
    not multiply its term by it."""


OBJECTIVE_TRAITS: Dict[str, ObjectiveTraits] = {}
"""Name -> its ``ObjectiveTraits`` (the default for an objective registered without them)."""


class SequenceView(NamedTuple):
    """What a per-sequence objective sees of the tokens' sequences, all ``[n]`` over the trained tokens."""

    sum: Callable[[torch.Tensor], torch.Tensor]
    """``x`` -> each token's sum of ``x`` over the tokens of its sequence (differentiable)."""
    log_ratio: torch.Tensor
    """``logp - old_logp`` of each token (before any clamp or sequence mean; differentiable)."""
    pg_scale: Optional[torch.Tensor]
    """``LossInputs.pg_scale`` (e.g. TRL's vLLM importance-sampling ratio), or None."""


def register_objective(name: str, *, per_sequence: bool = False,
                       owns_pg_scale: bool = False) -> Callable[[Objective], Objective]:
    """Register ``fn`` as the objective ``name`` (a decorator); see ``ObjectiveTraits`` for the flags."""
    def decorator(fn: Objective) -> Objective:
        OBJECTIVES[name] = fn
        OBJECTIVE_TRAITS[name] = ObjectiveTraits(per_sequence, owns_pg_scale)
        return fn
    return decorator


def traits(name: str) -> ObjectiveTraits:
    return OBJECTIVE_TRAITS.get(name, ObjectiveTraits())


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


VESPO_LOG_W_RANGE = (math.log(1e-8), 20.0)
"""VESPO clamps a sequence's log-weight (and each log importance-sampling ratio) to this range, and
each token's log-ratio to ``[-20, 20]`` before summing."""


@register_objective("vespo", per_sequence=True, owns_pg_scale=True)
def gamma_weighted_reinforce(A, ratio, logp, settings, seq: SequenceView):
    """VESPO: REINFORCE weighted by the stopped gamma weight of the sequence's importance weight,
    ``-sg(phi(w)) A logp`` with ``phi(w) = w^k exp(lambda (1 - w))`` (so ``phi(1) = 1``), ``log w`` the
    sum over the sequence of its tokens' log-ratios (each clamped to +-20) plus, with ``pg_scale``, of
    their clamped log importance-sampling ratios, itself clamped to ``VESPO_LOG_W_RANGE``; ``(k,
    lambda)`` is ``settings.vespo_params``' positive pair for ``A >= 0``, its negative pair else
    (lambda at least 1e-4). A non-finite ``phi`` counts as 0. The ``seq_weight`` it returns is
    ``phi`` (TRL's ``vespo/phi_seq_mean``)."""
    lo, hi = VESPO_LOG_W_RANGE
    with torch.no_grad():
        log_w = seq.sum(seq.log_ratio.detach().clamp(-20.0, 20.0))
        if seq.pg_scale is not None:
            log_w = log_w + seq.sum(torch.log(seq.pg_scale).clamp(lo, hi))
        log_w = log_w.clamp(lo, hi)
        k_pos, lam_pos, k_neg, lam_neg = settings.vespo_params
        pos = A >= 0
        k = torch.where(pos, torch.full_like(A, k_pos), torch.full_like(A, k_neg))
        lam = torch.where(pos, torch.full_like(A, lam_pos), torch.full_like(A, lam_neg)).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    out = _indicators(-phi * A * logp)
    out["seq_weight"] = phi
    return out
