"""Fused lm-head kernels for RL trainers: log-probs/entropy and the role-aware PPO/OPD loss.

Importable on its own (torch, and triton only when the Triton backend runs)::

    from mopd.kernels import (FusedLinearPolicyLoss, LossInputs, PolicyLossSettings, RoleSpec,
                              fused_linear_policy_loss, linear_logprobs)

See ``mopd/kernels/README.md`` for usage and ``chunked`` for the memory plan.
"""

from mopd.kernels.inputs import LossInputs
from mopd.kernels.ops import FusedLinearPolicyLoss, fused_linear_policy_loss, linear_logprobs, resolve_backend
from mopd.kernels.reference import reference_linear_logprobs, reference_policy_loss
from mopd.kernels.roles import KL_TYPES, RoleSpec
from mopd.kernels.settings import PolicyLossSettings
from mopd.kernels.terms import STAT_NAMES, stats_to_floats

__all__ = [
    "KL_TYPES",
    "STAT_NAMES",
    "FusedLinearPolicyLoss",
    "LossInputs",
    "PolicyLossSettings",
    "RoleSpec",
    "fused_linear_policy_loss",
    "linear_logprobs",
    "reference_linear_logprobs",
    "reference_policy_loss",
    "resolve_backend",
    "stats_to_floats",
]
