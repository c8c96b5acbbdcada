"""The per-token tensors of the policy loss besides the lm-head's own (hidden, weight, targets).

They travel together through every hop of the loss (checks, the chunk loop, the row pass, the
per-token terms, the stats) and are cut the same way at each: the trained rows are gathered, then
sliced chunk by chunk. ``LossInputs`` keeps them side by side so that each hop takes one argument.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class LossInputs:
    """One micro-batch's per-token loss inputs, each ``[T]`` on the device of ``hidden``."""

    roles: torch.Tensor
    """Role id of each token (int): ``r >= 0`` trains it as ``settings.role_specs[r]``; ``-1`` marks
    a prompt, retrieved passage or padding token (never trained, never counted)."""
    old_logp: torch.Tensor
    """log pi_old of each target token (float): the PPO ratio's denominator."""
    advantages: torch.Tensor
    """A_t of outcome roles (float); ignored on tokens of OPD roles."""
    teacher_logp: torch.Tensor | None = None
    """Teacher log-prob of each target (float); required when a role takes the OPD advantage."""
    ref_logp: torch.Tensor | None = None
    """Reference-policy log-prob of each target (float); required when a role has ``kl_coef != 0``."""

    def map_values(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> LossInputs:
        """``fn`` applied to the four float tensors that are present (``roles`` kept as it is)."""
        return dataclasses.replace(self, old_logp=fn(self.old_logp), advantages=fn(self.advantages),
                                   teacher_logp=_maybe(fn, self.teacher_logp),
                                   ref_logp=_maybe(fn, self.ref_logp))

    def for_kernels(self) -> LossInputs:
        """Detached fp32 contiguous values and contiguous roles, as the chunk loops read them."""
        return dataclasses.replace(self.map_values(lambda x: x.detach().to(torch.float32).contiguous()),
                                   roles=self.roles.contiguous())

    def select(self, index: torch.Tensor | None) -> LossInputs:
        """The rows ``index`` of every tensor (all rows, ``self``, when ``index`` is None)."""
        if index is None:
            return self
        return dataclasses.replace(self.map_values(lambda x: x.index_select(0, index)),
                                   roles=self.roles.index_select(0, index))

    def rows(self, start: int, end: int) -> LossInputs:
        """Rows ``start:end`` of every tensor (views)."""
        return dataclasses.replace(self.map_values(lambda x: x[start:end]), roles=self.roles[start:end])


def _maybe(fn, x):
    return None if x is None else fn(x)
