"""How a loss aggregates its tokens, as per-token weights: the loss modes of TRL and verl.

A trainer's loss is ``sum_t w_t loss_t`` over the completion tokens of a micro-batch, with weights
that depend only on the mask (and on counts over the global batch): the fused loss takes them as
``LossInputs.weights`` and so aggregates any way without a pass of its own. For a ``[B, T]`` mask
``m`` with ``L_b`` tokens in sequence ``b``:

| mode | ``w_bt`` (on masked tokens) | who uses it |
|---|---|---|
| ``grpo`` | ``1 / (B max(L_b, 1))`` | TRL ``grpo``, ``sapo`` (sequence mean of token means) |
| ``seq-mean-token-mean`` | ``dp / (S L_b)`` | verl |
| ``bnpo`` | ``1 / max(sum m, 1)`` | TRL ``bnpo`` (token mean of the micro-batch) |
| ``token-mean`` | ``dp / N`` | verl; TRL ``dapo``, ``cispo`` with N its ``num_items_in_batch`` share |
| ``dr_grpo`` | ``1 / (B max_completion_length)`` | TRL ``dr_grpo`` |
| ``token-sum`` | ``dp`` | verl |
| ``seq-mean-token-sum`` | ``dp / S`` | verl |
| ``seq-mean-token-sum-norm`` | ``dp / (S loss_scale_factor)`` (factor default ``T``) | verl, Dr. GRPO |
| ``luspo`` | ``1 / B`` | TRL ``luspo`` (each sequence's token sum, averaged over the micro-batch's B rows) |

``N`` is ``global_tokens`` (default: the micro-batch's ``sum m``), ``S`` is ``global_sequences``
(default: its sequences with at least one token), ``dp`` the data-parallel size (each rank's loss
is scaled so that averaging gradients over ranks gives the global aggregate, as verl does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

AGGREGATIONS = ("grpo", "seq-mean-token-mean", "bnpo", "token-mean", "dr_grpo", "token-sum", "seq-mean-token-sum",
                "seq-mean-token-sum-norm", "luspo")


@dataclass(frozen=True)
class Aggregation:
    """A loss aggregation mode and the global counts it needs (see the module's table)."""

    mode: str = "grpo"
    """One of ``AGGREGATIONS``."""
    dp_size: int = 1
    """Data-parallel ranks whose gradients are averaged (verl's ``dp_size``)."""
    global_tokens: Optional[float] = None
    """``N`` of ``token-mean``: the loss tokens of the global batch (TRL's ``num_items_in_batch``
    share, verl's ``batch_num_tokens``). None: this micro-batch's."""
    global_sequences: Optional[float] = None
    """``S`` of the ``seq-mean-*`` modes (verl's ``global_batch_size``). None: this micro-batch's
    sequences with at least one token."""
    max_completion_length: Optional[int] = None
    """Dr. GRPO's constant (TRL's ``max_completion_length``); required by ``dr_grpo``."""
    loss_scale_factor: Optional[float] = None
    """``seq-mean-token-sum-norm``'s divisor (verl); None: the mask's length ``T``."""
    scale: float = 1.0
    """A factor on every weight (e.g. ``1 / gradient_accumulation_steps``, as TRL divides)."""

    def __post_init__(self):
        if self.mode not in AGGREGATIONS:
            raise ValueError(f"aggregation mode={self.mode!r}: choose one of {AGGREGATIONS}")
        if isinstance(self.dp_size, bool) or not isinstance(self.dp_size, int) or self.dp_size < 1:
            raise ValueError(f"dp_size={self.dp_size!r} must be a positive int")
        if self.mode == "dr_grpo" and not (isinstance(self.max_completion_length, int)
                                           and self.max_completion_length > 0):
            raise ValueError("aggregation mode='dr_grpo' needs max_completion_length, a positive int")
        for name in ("global_tokens", "global_sequences", "loss_scale_factor"):
            value = getattr(self, name)
            if value is not None and not float(value) > 0:
                raise ValueError(f"{name}={value!r} must be positive (or None)")


def token_weights(mask: torch.Tensor, aggregation: Aggregation) -> torch.Tensor:
    """``[B, T]`` float32 weights ``w`` with ``loss = sum(w * loss_t)`` the ``aggregation`` of the
    masked token losses; 0 off the mask. ``mask`` is ``[B, T]``: bool, 0/1, or non-negative weights
    (a token then counts ``mask`` times in the sums and lengths, as TRL's ``(x * mask).sum()``)."""
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, T], got shape {tuple(mask.shape)}")
    m = mask.to(torch.float32)
    B, T = m.shape
    lengths = m.sum(dim=1, keepdim=True)
    mode, dp = aggregation.mode, float(aggregation.dp_size)
    tokens = aggregation.global_tokens if aggregation.global_tokens is not None else m.sum().clamp(min=1.0)
    sequences = (aggregation.global_sequences if aggregation.global_sequences is not None
                 else (lengths > 0).sum().clamp(min=1).to(torch.float32))
    if mode == "grpo":
        w = 1.0 / (B * lengths.clamp(min=1.0))
    elif mode == "seq-mean-token-mean":
        w = dp / (sequences * lengths.clamp(min=1.0))
    elif mode == "bnpo":
        w = 1.0 / m.sum().clamp(min=1.0) * torch.ones_like(lengths)
    elif mode == "token-mean":
        w = dp / tokens * torch.ones_like(lengths)
    elif mode == "dr_grpo":
        w = torch.full_like(lengths, 1.0 / (B * aggregation.max_completion_length))
    elif mode == "token-sum":
        w = torch.full_like(lengths, dp)
    elif mode == "luspo":
        w = torch.full_like(lengths, 1.0 / max(B, 1))
    elif mode == "seq-mean-token-sum":
        w = dp / sequences * torch.ones_like(lengths)
    else:  # seq-mean-token-sum-norm
        factor = aggregation.loss_scale_factor if aggregation.loss_scale_factor is not None else T
        w = dp / (sequences * factor) * torch.ones_like(lengths)
    return (w * aggregation.scale).expand(B, T) * m
