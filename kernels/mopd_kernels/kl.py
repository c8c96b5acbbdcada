"""Estimators of KL(pi || ref) from one sampled token, registered by name (``RoleSpec.kl_type``).

An estimator is a function ``(logp, ref) -> [n]`` of the token's log-prob under the policy and the
reference. Registering one adds its name to ``role_spec.KL_TYPES`` (what a ``RoleSpec`` and the run
config accept) and gives it the next index in the kernels' role table. Its gradient is taken by
autograd (``terms.token_terms``); nothing else changes (``tests/test_kernels_added_terms.py`` adds one).
"""

from __future__ import annotations

from typing import Callable, Dict

import torch

from mopd_kernels import role_spec

Estimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

KL_ESTIMATORS: Dict[str, Estimator] = {}
"""Name -> estimator, in ``role_spec.KL_TYPES`` order."""


def register_kl_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Register ``fn`` as the KL estimator ``name`` (a decorator)."""
    def decorator(fn: Estimator) -> Estimator:
        KL_ESTIMATORS[name] = fn
        if name not in role_spec.KL_TYPES:
            role_spec.KL_TYPES.append(name)
        return fn
    return decorator


@register_kl_estimator("k1")
def k1(logp, ref):
    """``logp - ref``: unbiased, high variance, can be negative."""
    return logp - ref


@register_kl_estimator("k2")
def k2(logp, ref):
    """``(logp - ref)^2 / 2``: low variance, biased."""
    return 0.5 * (logp - ref) * (logp - ref)


@register_kl_estimator("k3")
def k3(logp, ref):
    """``exp(ref - logp) - (ref - logp) - 1``: unbiased and non-negative (Schulman)."""
    delta = ref - logp
    return torch.exp(delta) - delta - 1.0


def kl_estimate(kl_type: torch.Tensor, logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Each token's estimate by its own estimator (``kl_type``: index into ``role_spec.KL_TYPES``).
    Every estimator sees its own tokens only (the others' log-prob is replaced by ``ref``), so an
    extreme log-ratio of a k1 token cannot overflow k3's exponential, nor its gradient turn NaN."""
    out = torch.zeros_like(logp)
    for index, name in enumerate(role_spec.KL_TYPES):
        chosen = kl_type == index
        value = KL_ESTIMATORS[name](torch.where(chosen, logp, ref), ref)
        out = torch.where(chosen, value, out)
    return out
