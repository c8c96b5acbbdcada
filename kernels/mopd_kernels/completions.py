"""The fused loss on ``[B, T]`` completions with a mask, as TRL and verl hold a micro-batch.

``FusedLinearGRPOLoss`` takes the last hidden states ``[B, T, H]`` of the completion positions, the
lm-head weight and a ``Completions`` (targets, mask, per-sequence or per-token advantages, optional
old / reference / teacher log-probs), and returns the aggregated loss (``aggregation``) with its
gradients, never holding ``[B, T, V]`` logits. It is ``fused_linear_policy_loss`` with one role:
the masked tokens are role 0, the rest -1 (no matmul is spent on them), each sequence's id is its
row, and the aggregation becomes per-token weights.

    loss_fn = FusedLinearGRPOLoss(PolicyLossSettings([RoleSpec(kl_coef=0.04, entropy_coef=0.01)],
                                                     clip_low=0.2, clip_high=0.28, temperature=0.7),
                                  Aggregation("token-mean", global_tokens=N))   # DAPO
    loss, stats = loss_fn(hidden, lm_head.weight, Completions(completion_ids, mask, advantages,
                                                             old_logp=old, ref_logp=ref))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

import torch

from mopd_kernels.aggregation import Aggregation, token_weights
from mopd_kernels.inputs import LossInputs
from mopd_kernels.ops import fused_linear_policy_loss
from mopd_kernels.settings import PolicyLossSettings, require_settings


@dataclass(frozen=True, eq=False)
class Completions:
    """One micro-batch of completions, ``[B, T]`` tensors on one device."""

    targets: torch.Tensor
    """The token each position predicts (int): the completion ids."""
    mask: torch.Tensor
    """1 (or True) on the tokens the loss trains; padding, tool output and the like 0. Other
    non-negative values are weights, as in TRL's ``(per_token_loss * mask)`` sums: a token's term
    counts ``mask`` times in the aggregation's sums and in its token counts (a mask of 0.5 and 2.0
    is not the 0/1 mask). Negative or non-finite values are a ValueError."""
    advantages: torch.Tensor
    """``[B]`` (one per sequence, TRL and GRPO) or ``[B, T]`` (per token, verl) float."""
    old_logp: Optional[torch.Tensor] = None
    """log pi_old per token; None: on-policy (the detached current log-probs, ratio 1)."""
    ref_logp: Optional[torch.Tensor] = None
    """Reference log-probs per token; required when the role has ``kl_coef != 0``."""
    teacher_logp: Optional[torch.Tensor] = None
    """Teacher log-probs per token; required when the role takes the OPD advantage."""
    pg_scale: Optional[torch.Tensor] = None
    """A factor on each token's policy term (e.g. TRL's vLLM importance-sampling ratio)."""
    sampling_logp: Optional[torch.Tensor] = None
    """The sampling policy's log-probs per token (TRL's ``sampling_per_token_logps``), read by the
    off-policy mask (``PolicyLossSettings.off_policy_threshold``); None: ``old_logp``."""
    entropy_filter: Optional[torch.Tensor] = None
    """``[B, T]`` 0/1: the tokens the policy term and the entropy bonus act on (TRL's
    ``top_entropy_quantile`` keeps the high-entropy ones); the KL term acts on every masked token, and
    the entropy bonus aggregates over ``mask * entropy_filter``. None: every masked token."""


def _rows(x: Optional[torch.Tensor], B: int, T: int, name: str) -> Optional[torch.Tensor]:
    if x is None:
        return None
    if not isinstance(x, torch.Tensor) or x.shape not in ((B, T), (B, 1), (B,)):
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be [B, T] = [{B}, {T}] (or [B] per sequence), got {shape}")
    # explicit shapes, not reshape(B, -1): an empty batch (B or T = 0) has no -1 to infer
    return (x.unsqueeze(1) if x.dim() == 1 else x).expand(B, T).reshape(B * T)


def _check_mask(mask: torch.Tensor) -> None:
    """A float or integer mask must be finite and >= 0 (its values are weights); one host sync."""
    if mask.dtype == torch.bool or mask.numel() == 0:
        return
    bad = ~torch.isfinite(mask) | (mask < 0) if mask.dtype.is_floating_point else mask < 0
    if bool(bad.any()):
        raise ValueError("mask must be 0/1 or non-negative finite weights, got a negative or non-finite value")


def completion_inputs(completions: Completions, aggregation: Aggregation,
                      entropy_aggregation: Optional[Aggregation] = None) -> Tuple[torch.Tensor, LossInputs]:
    """``(targets [B*T], LossInputs)`` of the packed rows: role 0 on masked tokens, -1 elsewhere,
    ``sequence_ids`` the row, ``weights`` (and ``entropy_weights``) from the aggregations."""
    c = completions
    if not isinstance(c.targets, torch.Tensor) or c.targets.dim() != 2:
        raise ValueError("targets must be a [B, T] tensor of token ids")
    B, T = c.targets.shape
    if not isinstance(c.mask, torch.Tensor) or c.mask.shape != (B, T):
        raise ValueError(f"mask must be [B, T] = [{B}, {T}]")
    _check_mask(c.mask)
    weights = token_weights(c.mask, aggregation).reshape(B * T)
    entropy_weights = None
    pg_scale = _rows(c.pg_scale, B, T, "pg_scale")
    if c.entropy_filter is not None:
        keep = _rows(c.entropy_filter, B, T, "entropy_filter").to(weights.dtype)
        pg_scale = keep if pg_scale is None else pg_scale * keep
        entropy_weights = token_weights(c.mask * c.entropy_filter.to(weights.dtype),
                                        entropy_aggregation or aggregation).reshape(B * T)
    elif entropy_aggregation is not None:
        entropy_weights = token_weights(c.mask, entropy_aggregation).reshape(B * T)
    roles = torch.where(c.mask != 0, 0, -1).reshape(B * T)
    seq = torch.arange(B, device=c.mask.device).unsqueeze(1).expand(B, T).reshape(B * T)
    inputs = LossInputs(roles=roles, old_logp=_rows(c.old_logp, B, T, "old_logp"),
                        advantages=_rows(c.advantages, B, T, "advantages"),
                        teacher_logp=_rows(c.teacher_logp, B, T, "teacher_logp"),
                        ref_logp=_rows(c.ref_logp, B, T, "ref_logp"), weights=weights,
                        pg_scale=pg_scale, entropy_weights=entropy_weights, sequence_ids=seq, n_sequences=B,
                        sampling_logp=_rows(c.sampling_logp, B, T, "sampling_logp"))
    return c.targets.reshape(B * T), inputs


class FusedLinearGRPOLoss(torch.nn.Module):
    """The GRPO-family loss of one policy on ``[B, T]`` completions, fused with the lm head.

    ``settings`` has one role spec (its ``kl_coef``/``kl_type`` are the KL penalty, its
    ``entropy_coef`` the entropy bonus, ``advantage="opd"`` distils from ``teacher_logp``); its
    ``objective`` and ``importance_sampling`` pick GRPO/DAPO (``ppo``), GSPO (``sequence``), CISPO or
    SAPO. ``aggregation`` weights the tokens (``mopd_kernels.aggregation``), ``entropy_aggregation``
    the entropy bonus when it aggregates otherwise (TRL: a token mean whatever the loss type).
    """

    def __init__(self, settings: PolicyLossSettings, aggregation: Union[Aggregation, str] = "grpo",
                 entropy_aggregation: Optional[Aggregation] = None):
        super().__init__()
        require_settings(settings)
        if settings.n_roles != 1:
            raise ValueError(f"FusedLinearGRPOLoss trains one policy: settings has {settings.n_roles} role specs")
        self.settings = settings
        self.aggregation = Aggregation(aggregation) if isinstance(aggregation, str) else aggregation
        self.entropy_aggregation = entropy_aggregation

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, completions: Completions,
                aggregation: Optional[Aggregation] = None,
                bias: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """``(loss, stats)``: ``hidden`` ``[B, T, H]`` (position t's state predicts ``targets[:, t]``),
        ``weight`` ``[V, H]`` and the lm head's optional ``bias`` ``[V]``; ``aggregation`` overrides the
        module's for this call (e.g. this step's global token count). ``stats`` are the role's 0-d
        tensors (``terms.STAT_NAMES``). An empty batch (B or T = 0) gives a loss of 0 (with zero
        gradients) and zero stats."""
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
            raise ValueError("hidden must be [B, T, H]: the last hidden states of the completion positions")
        targets, inputs = completion_inputs(completions, aggregation or self.aggregation, self.entropy_aggregation)
        if hidden.shape[:2] != completions.targets.shape:
            raise ValueError(f"hidden is {tuple(hidden.shape)} but targets are {tuple(completions.targets.shape)}")
        B, T, H = hidden.shape
        loss, stats = fused_linear_policy_loss(hidden.reshape(B * T, H), weight, targets, inputs, self.settings,
                                               bias=bias)
        return loss, stats[0]

    def extra_repr(self) -> str:
        return f"{self.settings!r}, {self.aggregation!r}"

