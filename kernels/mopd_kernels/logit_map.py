"""What the row passes do to a logit before the softmax: the temperature, a logit scale, a tanh soft cap.

An lm head's raw logit ``z = h W^T (+ b)`` becomes the softmax's input

    s = scale z / temperature                                   (no cap)
    s = cap tanh(scale z / cap) / temperature                   (soft cap ``cap``)

``scale`` is Cohere's ``logit_scale`` (and the multipliers other families call ``output_multiplier``,
``lm_head_multiplier`` or ``1 / logits_scaling``), ``cap`` Gemma 2's ``final_logit_softcapping``: the
order of the model's own forward and of TRL's chunked head (scale, then cap, then temperature).
The row passes apply it to each chunk in their sweep, never to a ``[T, V]`` copy, and take the
gradient through it in the same sweep:

    ds / dz = (scale / temperature)                  no cap
            = (scale / temperature) (1 - (s / c)^2)   with ``c = cap / temperature`` (``tanh' = 1 - tanh^2``)

The constant factor ``scale / temperature`` (``inv_t``) is folded into the gradient matmuls as the
temperature alone was before; the row pass multiplies each logit's gradient by the slope
``1 - (s / c)^2``, recovered from ``s = log p + lse`` (no second ``tanh``).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Union

import torch


class LogitMap(NamedTuple):
    """``s = z * inv_t`` (no cap) or ``s = cap * tanh(z * pre)``; ``inv_t`` is ``ds/dz`` at ``s = 0``."""

    inv_t: float
    """``scale / temperature``: the whole map without a cap, the gradient's constant factor with one."""
    cap: Optional[float] = None
    """The soft cap in units of ``s``: ``softcap / temperature`` (None: no cap)."""
    pre: float = 1.0
    """``scale / softcap``: the factor inside the ``tanh`` (1 without a cap, unused)."""

    @staticmethod
    def of(temperature: float = 1.0, scale: float = 1.0, softcap: Optional[float] = None) -> "LogitMap":
        inv_t = float(scale) / float(temperature)
        if softcap is None:
            return LogitMap(inv_t)
        return LogitMap(inv_t, float(softcap) / float(temperature), float(scale) / float(softcap))

    @property
    def capped(self) -> bool:
        return self.cap is not None

    @property
    def identity(self) -> bool:
        return self.cap is None and self.inv_t == 1.0

    def apply_(self, x: torch.Tensor) -> torch.Tensor:
        """``x <- s(x)`` in place (``x`` fp32)."""
        if self.cap is None:
            return x if self.inv_t == 1.0 else x.mul_(self.inv_t)
        return x.mul_(self.pre).tanh_().mul_(self.cap)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``s(x)``, a new tensor."""
        return self.apply_(x.clone())

    def slope_(self, s: torch.Tensor) -> torch.Tensor:
        """``s <- 1 - (s / cap)^2`` in place: ``ds/dz`` over ``inv_t`` at each mapped logit ``s`` (capped only)."""
        return s.mul_(1.0 / self.cap).square_().neg_().add_(1.0)


def as_logit_map(x: Union[float, LogitMap]) -> LogitMap:
    """A row pass's map argument: a ``LogitMap``, or a plain number ``inv_t`` (``1 / temperature``)."""
    return x if isinstance(x, LogitMap) else LogitMap(float(x))


def check_logit_head(logit_scale, logit_softcap) -> None:
    """ValueError naming the field for a scale that is not a finite number or a cap that is not positive."""
    if isinstance(logit_scale, bool) or not isinstance(logit_scale, (int, float)) or not math.isfinite(logit_scale):
        raise ValueError(f"logit_scale={logit_scale!r} must be a finite number")
    if logit_softcap is not None and (isinstance(logit_softcap, bool) or not isinstance(logit_softcap, (int, float))
                                      or not math.isfinite(logit_softcap) or logit_softcap <= 0):
        raise ValueError(f"logit_softcap={logit_softcap!r} must be a positive number (or None)")


def reference_map(z: torch.Tensor, temperature: float, scale: float = 1.0,
                  softcap: Optional[float] = None) -> torch.Tensor:
    """The map written out for autograd (the references and the tests): scale, cap, temperature."""
    z = z * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    return z / temperature
