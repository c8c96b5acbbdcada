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

import math
from typing import Dict, Optional, Tuple

import torch

from mopd_kernels.inputs import LossInputs
from mopd_kernels.kl import KL_ESTIMATORS
from mopd_kernels.logit_map import reference_map
from mopd_kernels.objectives import OBJECTIVES
from mopd_kernels.settings import PolicyLossSettings


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32 for 16-bit and fp32 inputs, fp64 for fp64 ones (the float64 references of the tests)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def reference_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float, bias=None,
                     head: Tuple[float, Optional[float]] = (1.0, None)) -> torch.Tensor:
    """The softmax's input: ``softcap(scale (h W^T + b)) / temperature`` with ``head = (scale, softcap)``."""
    z = hidden @ weight.T if bias is None else hidden @ weight.T + bias
    return reference_map(z.to(_compute_dtype(hidden)), temperature, *head)


def reference_linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                              temperature: float = 1.0, bias=None, logit_scale: float = 1.0,
                              logit_softcap: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(softcap(scale (h W^T + b)) / temperature)[t, targets[t]]`` and the entropy of each
    row, fp32 [T] (fp64 for fp64 inputs); ``bias`` ``b``, the scale and the soft cap optional.

    A target outside ``[0, V)`` (e.g. -100 padding) gets log-prob 0 and no gradient.
    """
    logits = reference_logits(hidden, weight, temperature, bias, (logit_scale, logit_softcap))
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
    if kl_type == "k3":
        return torch.exp(ref - logp) - (ref - logp) - 1.0
    return KL_ESTIMATORS[kl_type](logp, ref)  # one registered beside these: its own formula


def _ratio(logp, old, seq, settings: PolicyLossSettings):
    """Each token's importance ratio: its own, or (GSPO) its sequence's geometric mean, as TRL's
    ``(log_ratio * mask).sum(-1) / mask.sum(-1)`` per completion."""
    log_ratio = logp - old
    if settings.log_ratio_clip is not None:
        log_ratio = torch.clamp(log_ratio, -settings.log_ratio_clip, settings.log_ratio_clip)
    if settings.importance_sampling == "sequence":
        per_seq = {int(s): log_ratio[seq == s].mean() for s in torch.unique(seq)}
        log_ratio = torch.stack([per_seq[int(s)] for s in seq]) if len(seq) else log_ratio
    return torch.exp(log_ratio)


def _vespo_phi(A, log_ratio, seq, pg_scale, settings: PolicyLossSettings):
    """VESPO's gamma weight of each token's sequence, by the paper's formula, a Python loop over sequences:
    ``log w = clamp(sum_seq clamp(log_ratio, +-20) [+ sum_seq clamp(log is_ratio, ln 1e-8, 20)], ln 1e-8, 20)``,
    ``phi = exp(lambda + k log w - lambda w)``."""
    lo = math.log(1e-8)
    k_pos, lam_pos, k_neg, lam_neg = settings.vespo_params
    phi = torch.zeros_like(A)
    for s in torch.unique(seq):
        on = seq == s
        log_w = log_ratio[on].detach().clamp(-20, 20).sum()
        if pg_scale is not None:
            log_w = log_w + torch.log(pg_scale[on]).clamp(lo, 20).sum()
        log_w = log_w.clamp(lo, 20)
        for i in on.nonzero().flatten().tolist():
            k, lam = (k_pos, lam_pos) if A[i] >= 0 else (k_neg, lam_neg)
            lam = max(lam, 1e-4)
            value = math.exp(lam + k * float(log_w) - lam * math.exp(float(log_w)))
            phi[i] = value if math.isfinite(value) else 0.0
    return phi


def _policy(A, ratio, logp, settings: PolicyLossSettings):
    """(pg, clipped, clipped below, clipped above) per token, by the objective's published formula."""
    lo, hi = 1 - settings.clip_low, 1 + settings.clip_high
    none = torch.zeros_like(A, dtype=torch.bool)
    if settings.objective not in ("ppo", "cispo", "sapo", "vespo"):  # one registered beside these: its own formula
        out = OBJECTIVES[settings.objective](A, ratio, logp, settings)
        return out["pg"], out["clipped"] > 0, out["clipped_low"] > 0, out["clipped_high"] > 0
    if settings.objective == "cispo":  # MiniMax-M1: REINFORCE with a clipped, stopped IS weight
        cap = settings.cispo_cap
        high = (ratio > cap) & (A > 0)
        return -torch.clamp(ratio, max=cap).detach() * A * logp, high, none, high
    if settings.objective == "sapo":  # soft adaptive policy optimisation's sigmoid gate
        tau = torch.where(A > 0, torch.full_like(A, settings.sapo_temperatures[0]),
                          torch.full_like(A, settings.sapo_temperatures[1]))
        return -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * A, none, none, none
    pg1 = -A * ratio
    pg2 = -A * torch.clamp(ratio, lo, hi)
    pg = torch.maximum(pg1, pg2)
    if settings.dual_clip is not None:
        pg = torch.where(A < 0, torch.minimum(pg, -A * settings.dual_clip), pg)
    return pg, pg2 > pg1, (ratio < lo) & (A < 0), (ratio > hi) & (A > 0)


def _ones_or(x, mask, like):
    return x[mask].to(like.dtype) if x is not None else torch.ones_like(like)


def reference_policy_loss(hidden, weight, targets, inputs: LossInputs, settings: PolicyLossSettings,
                          normalizer=None, bias=None) -> Tuple[torch.Tensor, Dict[int, Dict[str, torch.Tensor]]]:
    """The policy loss by plain autograd (see ``mopd_kernels.terms`` for the maths).

    Same arguments as ``fused_linear_policy_loss`` (``settings.backend`` and ``chunk_rows`` are not
    used), without its argument checks. A sequence's ratio (GSPO) is over all its trained tokens,
    whatever their role.
    """
    roles, advantages = inputs.roles, inputs.advantages
    teacher_logp, ref_logp = inputs.teacher_logp, inputs.ref_logp
    logp_all, entropy_all = reference_linear_logprobs(hidden, weight, targets, temperature=settings.temperature,
                                                      bias=bias, logit_scale=settings.logit_scale,
                                                      logit_softcap=settings.logit_softcap)
    cd = logp_all.dtype
    old_all = inputs.old_logp.to(cd) if inputs.old_logp is not None else logp_all.detach()
    trained = roles >= 0
    seq_all = inputs.sequence_ids if inputs.sequence_ids is not None else torch.zeros_like(roles)
    ratio_trained = _ratio(logp_all[trained], old_all[trained], seq_all[trained], settings)
    ratio_all = torch.ones_like(logp_all).masked_scatter(trained, ratio_trained)
    A_all = advantages.to(cd).clone()
    for r, spec in enumerate(settings.role_specs):
        if spec.advantage == "opd":
            A_all[roles == r] = spec.opd_coef * (teacher_logp.to(cd)[roles == r] - old_all[roles == r])
    pg_scale_all = inputs.pg_scale.to(cd) if inputs.pg_scale is not None else None
    phi_all = torch.zeros_like(logp_all)
    if settings.objective == "vespo":
        phi_all[trained] = _vespo_phi(A_all[trained], (logp_all - old_all)[trained], seq_all[trained],
                                      None if pg_scale_all is None else pg_scale_all[trained], settings)
    keep_all = torch.ones_like(logp_all)
    if settings.off_policy_threshold is not None:  # DeepSeek-V3.2's mask, a loop over sequences
        sampling = inputs.sampling_logp.to(cd) if inputs.sampling_logp is not None else old_all
        drift = torch.nan_to_num(sampling - logp_all.detach(), nan=0.0)
        for s in torch.unique(seq_all[trained]):
            on = trained & (seq_all == s)
            far = drift[on].mean() > settings.off_policy_threshold
            keep_all[on] = torch.where(far & (A_all[on] < 0), 0.0, 1.0).to(cd)
    total = (logp_all * 0.0).sum()  # keeps the graph connected when no token is trained
    if normalizer is None:
        normalizer = 1.0 if inputs.weights is not None else max(int((roles >= 0).sum()), 1)
    stats: Dict[int, Dict[str, torch.Tensor]] = {}
    for r, spec in enumerate(settings.role_specs):
        mask = roles == r
        logp, entropy, old, ratio = logp_all[mask], entropy_all[mask], old_all[mask], ratio_all[mask]
        A = A_all[mask]
        pg, clipped, clipped_low, clipped_high = _policy(A, ratio, logp, settings)
        if settings.objective == "vespo":  # REINFORCE weighted by the stopped gamma weight of the sequence
            pg = -phi_all[mask] * A * logp
        w = _ones_or(inputs.weights, mask, logp)
        v = _ones_or(inputs.entropy_weights, mask, logp) if inputs.entropy_weights is not None else w
        scale = _ones_or(inputs.pg_scale, mask, logp) if settings.objective != "vespo" else torch.ones_like(logp)
        main = spec.pg_coef * pg * keep_all[mask] * scale
        kl = torch.zeros_like(logp)
        if ref_logp is not None:
            kl = _kl(spec.kl_type, logp, ref_logp.to(cd)[mask])
            if settings.kl_bias_correction:
                kl = kl * ratio
            if spec.kl_coef != 0:
                main = main + spec.kl_coef * kl
        token_loss = w * main - v * spec.entropy_coef * entropy
        seq = seq_all[mask] if inputs.sequence_ids is not None else torch.arange(int(mask.sum()))
        per_seq = [(clipped_low[seq == s].to(cd).mean(), clipped_high[seq == s].to(cd).mean(),
                    phi_all[mask][seq == s].mean()) for s in torch.unique(seq)]
        total = total + token_loss.sum()
        n = int(mask.sum())
        d = max(n, 1)
        with torch.no_grad():
            opd = torch.tensor(0.0)
            if teacher_logp is not None:
                opd = (teacher_logp.to(cd)[mask] - old).sum() / d
            stats[r] = {
                "tokens": torch.tensor(float(n)),
                "advantage_mean": A.sum() / d,
                "clip_frac": clipped.to(cd).sum() / d,
                "clip_low_frac": clipped_low.to(cd).sum() / d,
                "clip_high_frac": clipped_high.to(cd).sum() / d,
                "approx_kl": (old - logp).sum() / d,
                "entropy_mean": entropy.sum() / d,
                "opd_log_ratio": opd,
                "pg_loss": pg.sum() / d,
                "kl": kl.sum() / d,
                "policy_loss": (w * main).sum() / normalizer,
                "clip_low_seq_min": min(x[0] for x in per_seq) if per_seq else torch.tensor(0.0),
                "clip_high_seq_max": max(x[1] for x in per_seq) if per_seq else torch.tensor(0.0),
                "seq_weight_mean": sum(x[2] for x in per_seq) / len(per_seq) if per_seq else torch.tensor(0.0),
            }
    return total / normalizer, stats
