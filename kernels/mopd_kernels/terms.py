"""Per-token loss terms of the policy loss, their gradients, and the per-role stats (pure torch, [n]).

This module is the one place where the loss is written down. Every backend (the chunked torch
pass, the compiled CPU pass, the Triton kernels) computes ``logp_t`` and the entropy ``H_t`` of each
trained token from the logits, hands them here, and gets back the token losses and the two
scalars its logits gradient needs; the Triton kernels hold no loss formula. For a trained token t of
role r (its spec's columns gathered from the role table):

    A_t     = advantages[t]                                  outcome role
            = opd_coef * (teacher_logp[t] - old_logp[t])     OPD role
    rho_t   = exp(logp_t - old_logp[t])                      token-level importance sampling
            = exp(mean_{s in seq(t)} (logp_s - old_logp[s])) sequence level (GSPO)
              (old_logp None: the detached logp, so rho = 1 with rho's gradient; the log-ratio may be
              clamped to [-c, c] first, as verl does)
    pg_t    = the settings' objective (``mopd_kernels.objectives``), e.g. PPO's
              max(-A rho, -A clip(rho, 1 - clip_low, 1 + clip_high)), capped at -A c for A < 0;
              a per-sequence one (VESPO) also sees its sequence (``SequenceView``); times 0 where
              the off-policy mask drops it (``off_policy_keep``)
    kl_t    = the role's estimator (``mopd_kernels.kl``: k1, k2, k3), times rho_t with
              ``kl_bias_correction``
    loss_t  = w_t (pg_coef s_t pg_t + kl_coef kl_t) - v_t entropy_coef H_t

with ``w = weights``, ``s = pg_scale``, ``v = entropy_weights`` (1, 1 and ``w`` when absent).

The loss depends on the logits only through ``logp`` and ``H``, so its logits gradient needs only
``g_logp = d loss / d logp_t`` and ``g_H = d loss / d H_t`` per token. They are taken by autograd
through the formulas above, on ``[n]`` vectors (no logits in that graph), so a new objective or
estimator is its forward formula and its registration, nothing else. A coefficient of 0 switches its term off exactly:
its tokens' ``logp`` enters that term detached, so an extreme log-prob gives no 0 * inf = NaN.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from mopd_kernels.inputs import LossInputs
from mopd_kernels.kl import kl_estimate
from mopd_kernels.objectives import OBJECTIVES, SequenceView, traits
from mopd_kernels.roles import (COL_ENT_COEF, COL_IS_OPD, COL_KL_COEF, COL_KL_TYPE, COL_OPD_COEF, COL_PG_COEF,
                                role_table)
from mopd_kernels.settings import PolicyLossSettings

MEAN_STAT_NAMES = ("tokens", "advantage_mean", "clip_frac", "clip_low_frac", "clip_high_frac", "approx_kl",
                   "entropy_mean", "opd_log_ratio", "pg_loss", "kl")
STAT_NAMES = MEAN_STAT_NAMES + ("policy_loss", "clip_low_seq_min", "clip_high_seq_max", "seq_weight_mean")
"""Per-role stats: token count; mean A_t; fraction of tokens where the clipped branch is larger
(pg2 > pg1, verl's pg_clipfrac); fractions clipped below (rho < 1 - clip_low, A < 0) and above
(rho > 1 + clip_high, or the CISPO cap, A > 0), TRL's clip_ratio/low_mean and high_mean; mean
old_logp - logp; mean H_t; mean teacher_logp - old_logp (0 without teacher_logp); mean pg_t; mean
kl_t (0 without ref_logp) -- unweighted means over the role's tokens (``MEAN_STAT_NAMES``); then
``policy_loss``, the role's share of the loss without the entropy bonus, ``sum_t w_t (pg_coef s_t pg_t
+ kl_coef kl_t) / normalizer`` (TRL's ``policy_loss`` before its accumulation divisor), and the
per-sequence extremes of the clip fractions: the smallest over the role's sequences of a sequence's
fraction clipped below, the largest clipped above (TRL's ``clip_ratio/low_min`` / ``high_max``; a
sequence is a ``sequence_ids`` value with a token of the role, every token its own sequence when
``sequence_ids`` is None; 0 for a role without tokens), and ``seq_weight_mean``, the mean over the
role's sequences of the objective's per-sequence weight (VESPO's ``phi``, TRL's ``vespo/phi_seq_mean``;
0 for an objective without one)."""

def _coef_times(coef: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.where(coef != 0, coef * x, torch.zeros_like(x))


def _gated(coef: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``logp`` where ``coef != 0``, its detached value elsewhere (same values, no gradient path)."""
    return torch.where(coef != 0, logp, logp.detach())


def sequence_mean(x: torch.Tensor, sequence_ids: torch.Tensor) -> torch.Tensor:
    """Each token's mean of ``x`` over the tokens of its sequence, ``[n]`` (differentiable)."""
    _, inverse = torch.unique(sequence_ids, return_inverse=True)
    n_seq = int(inverse.max()) + 1 if inverse.numel() else 0
    sums = torch.zeros(n_seq, dtype=x.dtype, device=x.device).index_add(0, inverse, x)
    counts = torch.zeros(n_seq, dtype=x.dtype, device=x.device).index_add(0, inverse, torch.ones_like(x))
    return (sums / counts)[inverse]


def token_advantages(spec: torch.Tensor, advantages: torch.Tensor, old: torch.Tensor,
                     teacher: Optional[torch.Tensor]) -> torch.Tensor:
    """``A_t`` of each token: its outcome advantage, or for a token of an OPD role (``spec``: its role
    table rows, ``roles.role_table(...)[roles]``) the distillation advantage
    ``opd_coef * (teacher_logp - old_logp)``. Without ``teacher`` every token keeps its outcome value."""
    if teacher is None:
        return advantages
    return torch.where(spec[:, COL_IS_OPD] != 0, spec[:, COL_OPD_COEF] * (teacher - old), advantages)


def trained_advantages(role_specs, roles: torch.Tensor, advantages: torch.Tensor,
                       old: Optional[torch.Tensor], teacher: Optional[torch.Tensor]) -> torch.Tensor:
    """Each position's advantage as its role's loss uses it (fp32, a new tensor), for a caller that
    holds role specs and role ids rather than table rows (a trainer's statistics): the outcome
    advantage, ``opd_coef * (teacher_logp - old_logp)`` for an OPD role (0 without both log-probs),
    0 for a role whose ``pg_coef`` is 0 and where ``roles < 0`` (untrained positions)."""
    spec = role_table(tuple(role_specs), roles.device)[roles.clamp(min=0).long()]
    adv = advantages.float()
    scored = teacher is not None and old is not None
    if scored:
        adv = token_advantages(spec, adv, old.float(), teacher.float())
    dead = (roles < 0) | (spec[:, COL_PG_COEF] == 0)
    if not scored:
        dead = dead | (spec[:, COL_IS_OPD] != 0)
    return torch.where(dead, torch.zeros_like(adv), adv)


def importance_ratio(logp: torch.Tensor, old: torch.Tensor, inputs: LossInputs,
                     settings: PolicyLossSettings) -> torch.Tensor:
    """``rho_t``: the token's or its sequence's ratio (see the module docstring)."""
    log_ratio = logp - old
    if settings.log_ratio_clip is not None:
        log_ratio = log_ratio.clamp(-settings.log_ratio_clip, settings.log_ratio_clip)
    if settings.importance_sampling == "sequence":
        log_ratio = sequence_mean(log_ratio, inputs.sequence_ids)
    return torch.exp(log_ratio)


def sequence_sum(x: torch.Tensor, sequence_ids: torch.Tensor) -> torch.Tensor:
    """Each token's sum of ``x`` over the tokens of its sequence, ``[n]`` (differentiable)."""
    _, inverse = torch.unique(sequence_ids, return_inverse=True)
    n_seq = int(inverse.max()) + 1 if inverse.numel() else 0
    return torch.zeros(n_seq, dtype=x.dtype, device=x.device).index_add(0, inverse, x)[inverse]


def policy_term(A: torch.Tensor, ratio: torch.Tensor, logp: torch.Tensor,
                settings: PolicyLossSettings, seq: Optional[SequenceView] = None) -> Dict[str, torch.Tensor]:
    """``pg_t`` of the settings' objective and its clip indicators (``mopd_kernels.objectives``); a
    per-sequence objective also gets ``seq``."""
    fn = OBJECTIVES[settings.objective]
    return fn(A, ratio, logp, settings, seq) if traits(settings.objective).per_sequence else fn(A, ratio, logp, settings)


def off_policy_keep(A: torch.Tensor, logp: torch.Tensor, sampling: torch.Tensor, inputs: LossInputs,
                    threshold: float) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (TRL's ``off_policy_mask_threshold``): 1 where the
    token's advantage is >= 0 or its sequence's mean ``sampling_logp - logp`` (the drift of the
    sampling policy from the current one, a missing (NaN) sampling log-prob counting 0) is at most
    ``threshold``, else 0 (fp32 [n], no gradient)."""
    drift = torch.nan_to_num(sampling - logp.detach(), nan=0.0)
    return ((A >= 0) | (sequence_mean(drift, inputs.sequence_ids) <= threshold)).to(torch.float32)


def token_losses(logp: torch.Tensor, entropy: torch.Tensor, inputs: LossInputs,
                 settings: PolicyLossSettings) -> Dict[str, torch.Tensor]:
    """The forward formulas: ``loss_t`` and the stat inputs of trained tokens, fp32 [n] each.

    ``logp``, ``entropy`` and every tensor of ``inputs`` are [n], over trained tokens only
    (``inputs.roles >= 0``), values fp32 and detached (``LossInputs.for_kernels``); ``logp`` and
    ``entropy`` may require grad (``token_terms`` differentiates this).
    """
    spec = settings.role_table(logp.device)[inputs.roles.long()]
    pg_coef, ent_coef, kl_coef = spec[:, COL_PG_COEF], spec[:, COL_ENT_COEF], spec[:, COL_KL_COEF]
    old = inputs.old_logp if inputs.old_logp is not None else logp.detach()
    A = token_advantages(spec, inputs.advantages, old, inputs.teacher_logp)
    logp_pg = _gated(pg_coef, logp)
    ratio = importance_ratio(logp_pg, old, inputs, settings)
    own = traits(settings.objective)
    seq = None
    if own.per_sequence:
        seq = SequenceView(lambda x: sequence_sum(x, inputs.sequence_ids), logp_pg - old, inputs.pg_scale)
    out = policy_term(A, ratio, logp_pg, settings, seq)
    pg = out["pg"] if inputs.pg_scale is None or own.owns_pg_scale else out["pg"] * inputs.pg_scale
    if settings.off_policy_threshold is not None:
        sampling = inputs.sampling_logp if inputs.sampling_logp is not None else old
        pg = pg * off_policy_keep(A, logp, sampling, inputs, settings.off_policy_threshold)
    out.setdefault("seq_weight", torch.zeros_like(logp))
    policy = _coef_times(pg_coef, pg)
    kl = torch.zeros_like(logp)
    kl_term = None
    if inputs.ref_logp is not None:
        logp_kl = _gated(kl_coef, logp)
        kl = kl_estimate(spec[:, COL_KL_TYPE], logp_kl, inputs.ref_logp)
        if settings.kl_bias_correction:
            ratio_kl = importance_ratio(logp_kl, old, inputs, settings)
            kl = kl * ratio_kl
        kl_term = _coef_times(kl_coef, kl)
    if inputs.weights is None and inputs.entropy_weights is None:
        loss = policy - ent_coef * entropy
        if kl_term is not None:
            loss = loss + kl_term
    else:
        main = policy if kl_term is None else policy + kl_term
        w = inputs.weights
        v = inputs.entropy_weights if inputs.entropy_weights is not None else w
        loss = (main if w is None else main * w) - (ent_coef * entropy if v is None else ent_coef * entropy * v)
    main = policy if kl_term is None else policy + kl_term
    out.update(loss=loss, advantage=A, kl=kl, old=old, policy_loss=main if inputs.weights is None else main * inputs.weights)
    return out


def token_terms(logp: torch.Tensor, entropy: torch.Tensor, inputs: LossInputs, settings: PolicyLossSettings,
                need_grad: bool = True) -> Dict[str, torch.Tensor]:
    """``token_losses``' values (detached) and, with ``need_grad``, the gradient scalars
    ``g_logp = d sum(loss) / d logp_t`` and ``g_entropy = d sum(loss) / d H_t`` (fp32 [n] each)."""
    if not need_grad:
        with torch.no_grad():
            return token_losses(logp, entropy, inputs, settings)
    with torch.enable_grad():
        lp = logp.detach().requires_grad_(True)
        ent = entropy.detach().requires_grad_(True)
        out = token_losses(lp, ent, inputs, settings)
        g_logp, g_ent = torch.autograd.grad(out["loss"].sum(), (lp, ent), allow_unused=True)
    out = {k: v.detach() for k, v in out.items()}
    out["g_logp"] = g_logp if g_logp is not None else torch.zeros_like(logp)
    out["g_entropy"] = g_ent if g_ent is not None else torch.zeros_like(logp)
    return out


def _sequence_extremes(terms: Dict[str, torch.Tensor], inputs: LossInputs, n_roles: int) -> torch.Tensor:
    """``[n_roles, 3]``: per role, the smallest per-sequence mean of ``clipped_low`` and the largest
    of ``clipped_high`` over the sequences with a token of the role (0 for a role without one), and
    the mean over those sequences of their mean ``seq_weight``.
    Grouped by ``index_add_`` on (role, sequence) keys: no host sync when ``inputs.n_sequences``
    bounds the ids (every token its own sequence without ``sequence_ids``)."""
    n = terms["clipped_low"].shape[0]
    weight = terms.get("seq_weight", torch.zeros_like(terms["clipped_low"]))
    roles = inputs.roles.long()
    if inputs.sequence_ids is None:
        seq, n_seq = torch.arange(n, device=roles.device), max(n, 1)
    elif inputs.n_sequences is not None:
        seq, n_seq = inputs.sequence_ids.long(), max(int(inputs.n_sequences), 1)
    else:
        seq = torch.unique(inputs.sequence_ids, return_inverse=True)[1].long()
        n_seq = max(n, 1)
    key = roles * n_seq + seq
    sums = torch.zeros(n_roles * n_seq, 4, dtype=torch.float32, device=roles.device)
    sums.index_add_(0, key, torch.stack([terms["clipped_low"], terms["clipped_high"], weight.float(),
                                         torch.ones_like(terms["clipped_low"])], dim=1).float())
    count = sums[:, 3]
    present = (count > 0).view(n_roles, n_seq)
    means = (sums[:, :3] / count.clamp(min=1).unsqueeze(1)).view(n_roles, n_seq, 3)
    low = torch.where(present, means[..., 0], torch.full_like(means[..., 0], float("inf"))).amin(dim=1)
    high = torch.where(present, means[..., 1], torch.full_like(means[..., 1], float("-inf"))).amax(dim=1)
    any_seq = present.any(dim=1)
    weight_mean = (means[..., 2] * present).sum(dim=1) / present.sum(dim=1).clamp(min=1)
    return torch.stack([torch.where(any_seq, low, torch.zeros_like(low)),
                        torch.where(any_seq, high, torch.zeros_like(high)), weight_mean], dim=1)


def role_stats(terms: Dict[str, torch.Tensor], logp: torch.Tensor, entropy: torch.Tensor, inputs: LossInputs,
               n_roles: int, divisor=1.0) -> Dict[int, Dict[str, torch.Tensor]]:
    """Per-role stats (one ``index_add_`` for all roles' means; no host sync); ``divisor`` is the
    loss's normaliser (a number or a 0-d tensor), which divides ``policy_loss``.

    Returns ``{r: {name: 0-d fp32 tensor}}`` for every role ``r`` in ``range(n_roles)``, in
    ``STAT_NAMES`` order; means over a role without tokens are 0.
    """
    old_logp, teacher_logp = terms["old"], inputs.teacher_logp
    opd_ratio = teacher_logp - old_logp if teacher_logp is not None else torch.zeros_like(logp)
    columns = torch.stack([torch.ones_like(logp), terms["advantage"], terms["clipped"], terms["clipped_low"],
                           terms["clipped_high"], old_logp - logp, entropy, opd_ratio, terms["pg"],
                           terms["kl"], terms["policy_loss"]], dim=1)
    sums = torch.zeros(n_roles, len(MEAN_STAT_NAMES) + 1, dtype=torch.float32, device=logp.device)
    sums.index_add_(0, inputs.roles.long(), columns.float())
    count = sums[:, :1]
    means = torch.cat([count, sums[:, 1:-1] / count.clamp(min=1), sums[:, -1:] / divisor,
                       _sequence_extremes(terms, inputs, n_roles)], dim=1)
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
