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

FLOAT_FIELDS = ("old_logp", "advantages", "teacher_logp", "ref_logp", "weights", "pg_scale", "entropy_weights",
                "sampling_logp")
"""The optional float ``[T]`` fields, in the order the checks name them."""


@dataclass(frozen=True, eq=False)
class LossInputs:
    """One micro-batch's per-token loss inputs, each ``[T]`` on the device of ``hidden``.

    The loss of a trained token ``t`` (``roles[t] >= 0``) is
    ``weights[t] * (pg_scale[t] * pg_coef * pg_t + kl_coef * kl_t) - entropy_weights[t] * entropy_coef * H_t``
    (``mopd_kernels.terms``); a field left None is 1 (``entropy_weights``: ``weights``).
    """

    roles: torch.Tensor
    """Role id of each token (int): ``r >= 0`` trains it as ``settings.role_specs[r]``; ``-1`` marks
    a prompt, retrieved passage or padding token (never trained, never counted)."""
    old_logp: torch.Tensor | None
    """log pi_old of each target token (float): the PPO ratio's denominator. None: on-policy, the
    detached current log-probs (ratio 1 with the gradient of ``logp``; no extra pass)."""
    advantages: torch.Tensor
    """A_t of outcome roles (float; a sequence's advantage repeated over its tokens); ignored on
    tokens of OPD roles."""
    teacher_logp: torch.Tensor | None = None
    """Teacher log-prob of each target (float); required when a role takes the OPD advantage."""
    ref_logp: torch.Tensor | None = None
    """Reference-policy log-prob of each target (float); required when a role has ``kl_coef != 0``."""
    weights: torch.Tensor | None = None
    """Weight of each token's policy and KL terms (float): how the loss aggregates tokens, e.g.
    ``1 / (len(sequence) * n_sequences)`` for GRPO's sequence mean of token means
    (``mopd_kernels.aggregation``). None: 1 (the sum over tokens, divided by ``normalizer``)."""
    pg_scale: torch.Tensor | None = None
    """A factor on the policy-gradient term alone (float), e.g. TRL's vLLM importance-sampling
    correction. None: 1."""
    entropy_weights: torch.Tensor | None = None
    """Weight of each token's entropy bonus (float), when it aggregates otherwise than the policy
    term (TRL averages the entropy over tokens whatever its loss type). None: ``weights``."""
    sequence_ids: torch.Tensor | None = None
    """Which sequence each token belongs to (int, any ids); required by sequence-level importance
    sampling (GSPO), where a sequence's ratio is ``exp(mean of its tokens' logp - old_logp)``."""
    n_sequences: int | None = None
    """A bound on ``sequence_ids`` (all lie in ``[0, n_sequences)``), when the caller knows one
    (``completion_inputs``: the batch's B): the per-sequence stats then group without a host sync.
    None: any ids (grouped by ``torch.unique``, a sync on CUDA)."""
    sampling_logp: torch.Tensor | None = None
    """The sampling policy's log-prob of each target (float; TRL's ``sampling_per_token_logps``, e.g.
    vLLM's), read by the off-policy sequence mask (``PolicyLossSettings.off_policy_threshold``). None:
    ``old_logp`` (then the current log-probs)."""

    def map_values(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> LossInputs:
        """``fn`` applied to the float tensors that are present (``roles``, ``sequence_ids`` kept)."""
        return dataclasses.replace(self, **{f: _maybe(fn, getattr(self, f)) for f in FLOAT_FIELDS})

    def map_all(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> LossInputs:
        """``fn`` applied to every tensor that is present, the integer ones included."""
        return dataclasses.replace(self.map_values(fn), roles=fn(self.roles),
                                   sequence_ids=_maybe(fn, self.sequence_ids))

    def for_kernels(self) -> LossInputs:
        """Detached fp32 contiguous values and contiguous ids, as the chunk loops read them."""
        return dataclasses.replace(self.map_values(lambda x: x.detach().to(torch.float32).contiguous()),
                                   roles=self.roles.contiguous(),
                                   sequence_ids=_maybe(lambda x: x.contiguous(), self.sequence_ids))

    def select(self, index: torch.Tensor | None) -> LossInputs:
        """The rows ``index`` of every tensor (all rows, ``self``, when ``index`` is None)."""
        if index is None:
            return self
        return self.map_all(lambda x: x.index_select(0, index))

    def rows(self, start: int, end: int) -> LossInputs:
        """Rows ``start:end`` of every tensor (views)."""
        return self.map_all(lambda x: x[start:end])


def _maybe(fn, x):
    return None if x is None else fn(x)
