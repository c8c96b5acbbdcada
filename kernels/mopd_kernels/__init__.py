"""Fused lm-head kernels for RL trainers: log-probs/entropy and the role-aware PPO/OPD loss.

Importable on its own (torch, and triton only when the Triton backend runs)::

    from mopd.kernels import (FusedLinearPolicyLoss, LossInputs, PolicyLossSettings, RoleSpec,
                              fused_linear_policy_loss, linear_logprobs)

See ``mopd/kernels/README.md`` for usage and ``chunked`` for the memory plan. The names below load
on first use (PEP 562), so ``mopd.kernels.role_spec`` alone (what a run config needs) imports no torch.
"""

import importlib

_EXPORTS = {
    "KL_TYPES": "mopd.kernels.role_spec",
    "RoleSpec": "mopd.kernels.role_spec",
    "STAT_NAMES": "mopd.kernels.terms",
    "stats_to_floats": "mopd.kernels.terms",
    "FusedLinearPolicyLoss": "mopd.kernels.ops",
    "fused_linear_policy_loss": "mopd.kernels.ops",
    "linear_logprobs": "mopd.kernels.ops",
    "resolve_backend": "mopd.kernels.ops",
    "LossInputs": "mopd.kernels.inputs",
    "PolicyLossSettings": "mopd.kernels.settings",
    "reference_linear_logprobs": "mopd.kernels.reference",
    "reference_policy_loss": "mopd.kernels.reference",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mopd.kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
