"""Naive references: full ``[T, V]`` logits and plain autograd. The ground truth for every backend.

Written to be obviously right rather than fast or small: the logits, their log-softmax and the
softmax are all materialised, the loss is a per-role Python loop over boolean masks, and the
gradients come from ``loss.backward()``. Nothing here is shared with the chunked or Triton paths
except the argument containers (``RoleSpec``, ``PolicyLossSettings``, ``LossInputs``: plain data),
so a bug in their shared code cannot hide in the comparison.

Numerics convention shared by all backends: the lm-head matmul runs in the input dtype (as
``hidden @ weight.T`` does), the result is cast to fp32 and divided by the temperature, and all
softmax / loss arithmetic is fp32.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from mopd_kernels.inputs import LossInputs
from mopd_kernels.settings import PolicyLossSettings


def reference_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    return (hidden @ weight.T).float() / temperature


def reference_linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                              temperature: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(h W^T / temperature)[t, targets[t]]`` and the entropy of each row, fp32 [T].

    A target outside ``[0, V)`` (e.g. -100 padding) gets log-prob 0 and no gradient.
    """
    logits = reference_logits(hidden, weight, temperature)
    V = logits.shape[-1]
    logp_all = torch.log_softmax(logits, dim=-1)
    valid = (targets >= 0) & (targets < V)
    picked = logp_all.gather(1, targets.clamp(0, V - 1).long().unsqueeze(1)).squeeze(1)
    logp = torch.where(valid, picked, torch.zeros_like(picked))
    entropy = -(logp_all.exp() * logp_all).sum(dim=-1)
    return logp, entropy


def _kl(kl_type: str, logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    if kl_type == "k1":
        return logp - ref
    if kl_type == "k2":
        return 0.5 * (logp - ref) ** 2
    return torch.exp(ref - logp) - (ref - logp) - 1.0


def reference_policy_loss(hidden, weight, targets, inputs: LossInputs, settings: PolicyLossSettings,
                          normalizer=None) -> Tuple[torch.Tensor, Dict[int, Dict[str, torch.Tensor]]]:
    """The role-aware PPO/OPD loss by plain autograd (see ``mopd_kernels.terms`` for the maths).

    Same arguments as ``fused_linear_policy_loss`` (``settings.backend`` and ``chunk_rows`` are not
    used), without its argument checks.
    """
    roles, old_logp, advantages = inputs.roles, inputs.old_logp, inputs.advantages
    teacher_logp, ref_logp = inputs.teacher_logp, inputs.ref_logp
    clip_low, clip_high, dual_clip = settings.clip_low, settings.clip_high, settings.dual_clip
    temperature = settings.temperature
    logp_all, entropy_all = reference_linear_logprobs(hidden, weight, targets, temperature=temperature)
    old_all = old_logp.float()
    total = (logp_all * 0.0).sum()  # keeps the graph connected when no token is trained
    stats: Dict[int, Dict[str, torch.Tensor]] = {}
    for r, spec in enumerate(settings.role_specs):
        mask = roles == r
        logp, entropy, old = logp_all[mask], entropy_all[mask], old_all[mask]
        if spec.advantage == "opd":
            A = spec.opd_coef * (teacher_logp.float()[mask] - old)
        else:
            A = advantages.float()[mask]
        ratio = torch.exp(logp - old)
        pg1 = -A * ratio
        pg2 = -A * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
        pg = torch.maximum(pg1, pg2)
        if dual_clip is not None:
            pg = torch.where(A < 0, torch.minimum(pg, -A * dual_clip), pg)
        token_loss = spec.pg_coef * pg - spec.entropy_coef * entropy
        kl = torch.zeros_like(logp)
        if ref_logp is not None:
            kl = _kl(spec.kl_type, logp, ref_logp.float()[mask])
            if spec.kl_coef != 0:
                token_loss = token_loss + spec.kl_coef * kl
        total = total + token_loss.sum()
        n = int(mask.sum())
        d = max(n, 1)
        with torch.no_grad():
            opd = torch.tensor(0.0)
            if teacher_logp is not None:
                opd = (teacher_logp.float()[mask] - old).sum() / d
            stats[r] = {
                "tokens": torch.tensor(float(n)),
                "advantage_mean": A.sum() / d,
                "clip_frac": (pg2 > pg1).float().sum() / d,
                "approx_kl": (old - logp).sum() / d,
                "entropy_mean": entropy.sum() / d,
                "opd_log_ratio": opd,
                "pg_loss": pg.sum() / d,
                "kl": kl.sum() / d,
            }
    if normalizer is None:
        normalizer = max(int((roles >= 0).sum()), 1)
    return total / normalizer, stats
