"""Fused lm-head kernels for RL trainers: log-probs/entropy and the role-aware PPO/OPD loss.

Importable on its own (torch, and triton only when the Triton backend runs)::

    from mopd_kernels import (FusedLinearPolicyLoss, LossInputs, PolicyLossSettings, RoleSpec,
                              fused_linear_policy_loss, linear_logprobs)

See ``kernels/mopd_kernels/README.md`` for usage and ``chunked`` for the memory plan. The names below load
on first use (PEP 562), so ``mopd_kernels.role_spec`` alone (what a run config needs) imports no torch.
"""

import importlib

_EXPORTS = {
    "KL_TYPES": "mopd_kernels.role_spec",
    "RoleSpec": "mopd_kernels.role_spec",
    "STAT_NAMES": "mopd_kernels.terms",
    "stats_to_floats": "mopd_kernels.terms",
    "FusedLinearPolicyLoss": "mopd_kernels.ops",
    "fused_linear_policy_loss": "mopd_kernels.ops",
    "linear_logprobs": "mopd_kernels.ops",
    "resolve_backend": "mopd_kernels.ops",
    "LossInputs": "mopd_kernels.inputs",
    "PolicyLossSettings": "mopd_kernels.settings",
    "reference_linear_logprobs": "mopd_kernels.reference",
    "reference_policy_loss": "mopd_kernels.reference",
    "OBJECTIVES": "mopd_kernels.objectives",
    "register_objective": "mopd_kernels.objectives",
    "KL_ESTIMATORS": "mopd_kernels.kl",
    "register_kl_estimator": "mopd_kernels.kl",
    "IMPORTANCE_SAMPLING": "mopd_kernels.settings",
    "AGGREGATIONS": "mopd_kernels.aggregation",
    "Aggregation": "mopd_kernels.aggregation",
    "token_weights": "mopd_kernels.aggregation",
    "Completions": "mopd_kernels.completions",
    "FusedLinearGRPOLoss": "mopd_kernels.completions",
    "completion_inputs": "mopd_kernels.completions",
    "set_compiled_cpu_rows": "mopd_kernels.compiled_rows",
    "matmul_inputs": "mopd_kernels.ops",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mopd_kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
