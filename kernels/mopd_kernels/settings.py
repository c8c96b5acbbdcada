"""The loss head's hyperparameters, as one frozen object checked once.

``PolicyLossSettings`` is to ``fused_linear_policy_loss`` what the ``__init__`` arguments of a Liger
loss module are to its ``forward``: everything that stays fixed over a run (the role table, the
PPO clip range, the sampling temperature, the backend and its chunking). The per-micro-batch
tensors travel separately (``LossInputs`` and the lm-head's hidden, weight and targets), as does the
per-mini-batch ``normalizer``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mopd_kernels import roles
from mopd_kernels.roles import RoleSpec, check_backend, check_clip, check_role_specs, check_temperature


@dataclass(frozen=True)
class PolicyLossSettings:
    """Hyperparameters of the role-aware PPO/OPD loss (see ``mopd_kernels.terms`` for the maths)."""

    role_specs: tuple[RoleSpec, ...]
    """One spec per role id: ``roles[t] = r >= 0`` trains token t as ``role_specs[r]`` (a list is
    stored as a tuple)."""
    clip_low: float = 0.2
    """The ratio is clipped below at ``1 - clip_low``; in ``[0, 1)``."""
    clip_high: float = 0.2
    """The ratio is clipped above at ``1 + clip_high`` (DAPO's clip-higher when > clip_low); >= 0."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1: for A < 0 the surrogate is capped at ``-A c``. None: off."""
    temperature: float = 1.0
    """The sampling temperature: log-probs are of ``softmax(logits / temperature)``."""
    backend: str = "auto"
    """``"triton" | "torch" | "reference" | "auto"`` (triton on CUDA when it imports, else torch)."""
    chunk_rows: int | None = None
    """Rows per chunk of the lm-head passes; None: the default sizing (``chunked.chunk_rows_for``: on
    CPU from the shape, on CUDA from a 512 MiB budget, or ``MOPD_KERNELS_CHUNK_MB`` when set)."""

    def __post_init__(self):
        check_role_specs(self.role_specs)
        object.__setattr__(self, "role_specs", tuple(self.role_specs))
        check_clip(self.clip_low, self.clip_high, self.dual_clip)
        check_temperature(self.temperature)
        check_backend(self.backend)
        if self.chunk_rows is not None and (isinstance(self.chunk_rows, bool)
                                            or not isinstance(self.chunk_rows, int) or self.chunk_rows < 1):
            raise ValueError(f"chunk_rows={self.chunk_rows!r} must be a positive int (or None)")

    @property
    def n_roles(self) -> int:
        return len(self.role_specs)

    @property
    def role_names(self) -> list[str]:
        """Each role's ``name``, or ``role<r>`` where it has none (labels for ``stats_to_floats``)."""
        return [s.name or f"role{r}" for r, s in enumerate(self.role_specs)]

    @property
    def has_entropy_term(self) -> bool:
        return any(s.entropy_coef != 0 for s in self.role_specs)

    def role_table(self, device: torch.device) -> torch.Tensor:
        """The role specs as the kernels' ``[R, ROLE_FIELDS]`` float32 table on ``device`` (cached)."""
        return roles.role_table(self.role_specs, device)
