"""The loss head's hyperparameters, as one frozen object checked once.

``PolicyLossSettings`` is to ``fused_linear_policy_loss`` what the ``__init__`` arguments of a Liger
loss module are to its ``forward``: everything that stays fixed over a run (the role table, the
objective and its clip range, the sampling temperature, the backend and its chunking). The
per-micro-batch tensors travel separately (``LossInputs`` and the lm-head's hidden, weight and
targets), as does the per-mini-batch ``normalizer``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mopd_kernels import roles
from mopd_kernels.logit_map import LogitMap, check_logit_head
from mopd_kernels.objectives import OBJECTIVES, traits
from mopd_kernels.roles import RoleSpec, check_backend, check_clip, check_role_specs, check_temperature


IMPORTANCE_SAMPLING = ("token", "sequence")
"""The ratio a token's term uses: its own ``exp(logp - old_logp)``, or its sequence's
``exp(mean over the sequence of logp - old_logp)`` (GSPO)."""

MATMUL_DTYPES = (None, torch.float32, torch.bfloat16, torch.float16)


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
    objective: str = "ppo"
    """The policy-gradient term, by name in ``mopd_kernels.objectives``: ``ppo`` (clipped surrogate),
    ``cispo`` (``-sg(min(ratio, cispo_max_weight)) A logp``), ``sapo`` (``-A sigmoid(tau (ratio - 1))
    4 / tau``), or one registered with ``register_objective``."""
    importance_sampling: str = "token"
    """``token`` or ``sequence`` (GSPO: every token of a sequence takes the sequence's geometric-mean
    ratio; needs ``LossInputs.sequence_ids``; costs one more lm-head matmul: all log-probs are needed
    before any gradient)."""
    kl_bias_correction: bool = False
    """Multiply each token's KL term by its importance ratio (TRL's ``use_bias_correction_kl``)."""
    log_ratio_clip: float | None = None
    """Clamp ``logp - old_logp`` to ``[-c, c]`` before the exponential (verl clamps at 20). None: off."""
    cispo_max_weight: float | None = None
    """CISPO's cap on the (detached) ratio (TRL's ``epsilon_high`` for ``loss_type="cispo"``).
    None: ``1 + clip_high``."""
    sapo_temperatures: tuple[float, float] = (1.0, 1.05)
    """SAPO's gate temperatures for positive and negative advantages (TRL's defaults)."""
    matmul_dtype: torch.dtype | None = None
    """The dtype of the lm-head matmul: hidden and weight are cast to it (differentiably) when they
    differ. None: the autocast dtype when autocast is on for the device, else their own dtype (they
    must then agree). Softmax and loss arithmetic is fp32 whatever it is."""
    logit_scale: float = 1.0
    """The lm head's logit multiplier (Cohere's ``logit_scale``; ``1 / logits_scaling`` of Granite):
    the softmax is of ``softcap(logit_scale z) / temperature`` (``mopd_kernels.logit_map``). Any finite number."""
    logit_softcap: float | None = None
    """The lm head's tanh soft cap (Gemma 2's ``final_logit_softcapping``): ``cap tanh(x / cap)`` on the
    scaled logit ``x``, before the temperature. None: no cap."""
    off_policy_threshold: float | None = None
    """DeepSeek-V3.2's off-policy sequence mask (TRL's ``off_policy_mask_threshold``): a token's policy
    term is dropped when its advantage is negative and its sequence's mean ``sampling_logp - logp``
    exceeds this (``terms.off_policy_keep``). Costs one lm-head matmul more (the sequence pass: every
    log-prob before any gradient). None: off."""
    vespo_params: tuple[float, float, float, float] = (2.0, 3.0, 3.0, 2.0)
    """VESPO's ``(k_pos, lambda_pos, k_neg, lambda_neg)`` (TRL's ``vespo_*`` defaults): the gamma
    weight's power and decay for ``A >= 0`` and ``A < 0`` (``objectives.gamma_weighted_reinforce``)."""

    def __post_init__(self):
        check_role_specs(self.role_specs)
        object.__setattr__(self, "role_specs", tuple(self.role_specs))
        check_clip(self.clip_low, self.clip_high, self.dual_clip)
        check_temperature(self.temperature)
        check_backend(self.backend)
        if self.chunk_rows is not None and (isinstance(self.chunk_rows, bool)
                                            or not isinstance(self.chunk_rows, int) or self.chunk_rows < 1):
            raise ValueError(f"chunk_rows={self.chunk_rows!r} must be a positive int (or None)")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r}: choose one of {tuple(OBJECTIVES)}")
        if self.importance_sampling not in IMPORTANCE_SAMPLING:
            raise ValueError(f"importance_sampling={self.importance_sampling!r}: choose one of {IMPORTANCE_SAMPLING}")
        if not isinstance(self.kl_bias_correction, bool):
            raise ValueError(f"kl_bias_correction={self.kl_bias_correction!r} must be a bool")
        for name in ("log_ratio_clip", "cispo_max_weight"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                raise ValueError(f"{name}={value!r} must be a positive number (or None)")
        temps = tuple(self.sapo_temperatures)
        if len(temps) != 2 or not all(isinstance(t, (int, float)) and not isinstance(t, bool)
                                      and math.isfinite(t) and t > 0 for t in temps):
            raise ValueError(f"sapo_temperatures={self.sapo_temperatures!r} must be two positive numbers")
        object.__setattr__(self, "sapo_temperatures", temps)
        check_logit_head(self.logit_scale, self.logit_softcap)
        threshold = self.off_policy_threshold
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                      or not math.isfinite(threshold)):
            raise ValueError(f"off_policy_threshold={threshold!r} must be a finite number (or None)")
        vespo = tuple(self.vespo_params)
        if len(vespo) != 4 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                      for v in vespo):
            raise ValueError(f"vespo_params={self.vespo_params!r} must be four finite numbers "
                             "(k_pos, lambda_pos, k_neg, lambda_neg)")
        object.__setattr__(self, "vespo_params", vespo)
        if self.matmul_dtype not in MATMUL_DTYPES:
            raise ValueError(f"matmul_dtype={self.matmul_dtype!r}: choose one of {MATMUL_DTYPES}")

    @property
    def n_roles(self) -> int:
        return len(self.role_specs)

    @property
    def role_names(self) -> list[str]:
        """Each role's ``name``, or ``role<r>`` where it has none (labels for ``stats_to_floats``)."""
        return [s.name or f"role{r}" for r, s in enumerate(self.role_specs)]

    @property
    def cispo_cap(self) -> float:
        return self.cispo_max_weight if self.cispo_max_weight is not None else 1.0 + self.clip_high

    @property
    def per_sequence(self) -> bool:
        """The loss couples a sequence's tokens: all its log-probs are needed before any gradient
        (sequence-level importance sampling, the off-policy mask, a per-sequence objective: VESPO)."""
        return (self.importance_sampling == "sequence" or self.off_policy_threshold is not None
                or traits(self.objective).per_sequence)

    @property
    def has_entropy_term(self) -> bool:
        return any(s.entropy_coef != 0 for s in self.role_specs)

    @property
    def logit_map(self) -> LogitMap:
        """What the row passes do to a logit: scale, soft cap, temperature."""
        return LogitMap.of(self.temperature, self.logit_scale, self.logit_softcap)

    def role_table(self, device: torch.device) -> torch.Tensor:
        """The role specs as the kernels' ``[R, ROLE_FIELDS]`` float32 table on ``device`` (cached)."""
        return roles.role_table(self.role_specs, device)


def require_settings(settings) -> PolicyLossSettings:
    """``settings``, or ValueError when it is not a :class:`PolicyLossSettings` (the loss's entry points)."""
    if not isinstance(settings, PolicyLossSettings):
        raise ValueError(f"settings must be a PolicyLossSettings, got {type(settings).__name__}")
    return settings
