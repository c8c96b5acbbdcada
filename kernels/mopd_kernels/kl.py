"""Estimators of KL(pi || ref) from one sampled token, registered by name: the one list of their
names (``KL_TYPES``: what ``RoleSpec.kl_type``, the run config's ``algo.roles.<role>.kl_type`` and
``reward.kl_type`` accept) and their formulas.

An estimator is a function ``(logp, ref) -> [n]`` of the token's log-prob under the policy and the
reference. Registering one adds its name to ``KL_TYPES`` and gives it the next index in the kernels'
role table. Its gradient is taken by autograd (``terms.token_terms``); nothing else changes
(``tests/test_kernels_added_terms.py`` adds one). The KL penalty in a reward goes through the same
estimators (:func:`kl_penalty`). The module imports no torch (the estimators use tensor methods), so
the torch-free ``role_spec`` and a run config read the names from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, List

if TYPE_CHECKING:
    import torch

Estimator = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]

KL_ESTIMATORS: Dict[str, Estimator] = {}
"""Name -> estimator, in ``KL_TYPES`` order."""
KL_TYPES: List[str] = []
"""The registered estimators' names, in registration order (a name's index is its code in the role
table): Schulman's k1, k2, k3 below, then any added one."""


def register_kl_estimator(name: str) -> Callable[[Estimator], Estimator]:
    """Register ``fn`` as the KL estimator ``name`` (a decorator)."""
    def decorator(fn: Estimator) -> Estimator:
        KL_ESTIMATORS[name] = fn
        if name not in KL_TYPES:
            KL_TYPES.append(name)
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
    return delta.exp() - delta - 1.0


def kl_estimate(kl_type: torch.Tensor, logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Each token's estimate by its own estimator (``kl_type``: index into ``KL_TYPES``).
    Every estimator sees its own tokens only (the others' log-prob is replaced by ``ref``), so an
    extreme log-ratio of a k1 token cannot overflow k3's exponential, nor its gradient turn NaN."""
    out = logp.new_zeros(logp.shape)
    for index, name in enumerate(KL_TYPES):
        chosen = kl_type == index
        value = KL_ESTIMATORS[name](logp.where(chosen, ref), ref)
        out = value.where(chosen, out)
    return out


def kl_penalty(logp: torch.Tensor, ref: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token KL(pi || ref) by the registered ``estimator`` (the KL in a reward: verl's
    ``core_algos.kl_penalty``); ``k1`` is ``logp - ref`` exactly."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {tuple(KL_TYPES)}")
    return KL_ESTIMATORS[estimator](logp, ref)
