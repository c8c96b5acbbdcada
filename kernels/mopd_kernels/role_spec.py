"""How one role's tokens are trained: the one spec type of the loss kernels and of the run config.

Plain Python (no torch), so that a run's configuration (``mopd.config``, whose ``algo.roles`` maps
each role name to a ``RoleSpec``) loads without the kernels' dependencies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

KL_TYPES = ["k1", "k2", "k3"]
"""The names of the KL estimators (Schulman's k1 = logp - ref; k2 = (logp - ref)^2 / 2;
k3 = exp(ref - logp) - (ref - logp) - 1; their formulas are in ``mopd_kernels.kl``, where
``register_kl_estimator`` appends a new one here)."""

ADVANTAGE_SOURCES = ("outcome", "opd")


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
        if self.advantage not in ADVANTAGE_SOURCES:
            raise ValueError(f"RoleSpec.advantage={self.advantage!r}: choose one of {ADVANTAGE_SOURCES}")
        if self.kl_type not in KL_TYPES:
            raise ValueError(f"RoleSpec.kl_type={self.kl_type!r}: choose one of {tuple(KL_TYPES)}")
        for field in ("opd_coef", "pg_coef", "entropy_coef", "kl_coef"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"RoleSpec.{field}={value!r} must be a finite number")

    @property
    def is_opd(self) -> bool:
        return self.advantage == "opd"
