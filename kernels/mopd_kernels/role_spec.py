"""How one role's tokens are trained: the one spec type of the loss kernels and of the run config.

Plain Python (no torch), so that a run's configuration (``mopd.config``, whose ``algo.roles`` maps
each role name to a ``RoleSpec``) loads without the kernels' dependencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional

from mopd_kernels.kl import KL_TYPES  # noqa: F401 (the estimators' names: their registry, torch-free)

ADVANTAGE_SOURCES = ("outcome", "opd")
COEFFICIENTS = ("opd_coef", "pg_coef", "entropy_coef", "kl_coef")
"""The weights of a role's terms: each a finite number >= 0."""


@dataclass(frozen=True)
class RoleSpec:
    """How the tokens of one role are trained.

    - ``advantage="outcome"``: ``A_t = advantages[t]`` (e.g. a GRPO advantage broadcast over the call);
      ``advantage="opd"``: ``A_t = opd_coef * (teacher_logp[t] - old_logp[t])`` (on-policy distillation).
    - token loss ``pg_coef * pg_t - entropy_coef * H_t + kl_coef * kl_t`` with the clipped PPO
      surrogate ``pg_t`` and the ``kl_type`` estimator of KL(pi || ref).

    A role whose coefficients are all 0 contributes nothing but still counts in the default
    normaliser (the paper's ``no_searcher_supervision`` ablation).
    """

    advantage: str = "outcome"
    """outcome (the group-normalised reward of the call, per token) or opd (beta * (teacher_logp -
    old_logp) per token)."""
    opd_coef: float = 0.01
    """beta of the OPD advantage."""
    pg_coef: float = 1.0
    """Weight of the clipped policy-gradient term."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss). The run config's default is 1e-3."""
    kl_coef: float = 0.0
    """Weight of a KL-to-reference loss term on this role's tokens (the paper keeps KL in the reward
    instead, so every preset leaves it 0)."""
    kl_type: str = "k3"
    """Estimator of the KL loss term: k1, k2 or k3."""
    name: Optional[str] = None
    """Label of the role's statistics (``role<r>`` when None)."""

    def __post_init__(self):
        problem = spec_problem(self.__dict__)
        if problem:
            raise ValueError(problem)

    @property
    def is_opd(self) -> bool:
        return self.advantage == "opd"


def spec_problem(fields: Mapping[str, object], where: str = "RoleSpec.") -> Optional[str]:
    """The first bad field of a role spec (``fields``: a RoleSpec's fields, or a config's mapping
    of them, whose full key ``where`` names), as one line; None when all are good. The one check of
    a role's fields: ``RoleSpec`` runs it, and so does the run config before it builds one."""
    for name, choices in (("advantage", ADVANTAGE_SOURCES), ("kl_type", KL_TYPES)):
        if fields[name] not in choices:
            return f"{where}{name}={fields[name]!r} is not valid; choose one of {sorted(choices)}"
    for name in COEFFICIENTS:
        value = fields[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"{where}{name}={value!r} must be a finite number"
        if value < 0:
            return f"{where}{name}={value!r} must be >= 0"
    return None
