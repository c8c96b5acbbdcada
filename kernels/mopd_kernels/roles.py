"""Role specifications for the fused policy loss, and the argument checks shared by every backend
(``PolicyLossSettings`` runs the hyperparameter checks once; ``check_loss_inputs`` the per-call ones).

A packed micro-batch mixes tokens of several roles (Leader, Searcher, Answerer, ...). Each token
carries a role id; ``roles[t] = r >= 0`` selects ``role_specs[r]``, ``-1`` marks a token that is
not trained (prompt, retrieved passage, padding). A role's spec says where its advantage comes
from and how its three loss terms are weighted; the kernels read the specs as a small
``[R, ROLE_FIELDS]`` float table (one row per role) so that one launch serves all roles.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence, Tuple

import torch

from mopd_kernels.role_spec import ADVANTAGE_SOURCES, KL_TYPES, RoleSpec  # noqa: F401 (re-exported)

# Columns of the role table, read by index by the per-token terms (terms.py) on every backend; the
# Triton kernels compute log-probs and entropy only and read no role table.
COL_IS_OPD, COL_OPD_COEF, COL_PG_COEF, COL_ENT_COEF, COL_KL_COEF, COL_KL_TYPE = range(6)
ROLE_FIELDS = 8  # padded to 8 floats per row

BACKENDS = ("auto", "triton", "torch", "reference")


def role_table(role_specs: Sequence[RoleSpec], device: torch.device) -> torch.Tensor:
    """The specs as a ``[R, ROLE_FIELDS]`` float32 table on ``device`` (columns ``COL_*``), cached."""
    return _role_table(tuple(role_specs), torch.device(device))


@functools.lru_cache(maxsize=64)
def _role_table(role_specs: Tuple[RoleSpec, ...], device: torch.device) -> torch.Tensor:
    rows = []
    for spec in role_specs:
        row = [0.0] * ROLE_FIELDS
        row[COL_IS_OPD] = 1.0 if spec.is_opd else 0.0
        row[COL_OPD_COEF] = float(spec.opd_coef)
        row[COL_PG_COEF] = float(spec.pg_coef)
        row[COL_ENT_COEF] = float(spec.entropy_coef)
        row[COL_KL_COEF] = float(spec.kl_coef)
        row[COL_KL_TYPE] = float(KL_TYPES.index(spec.kl_type))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float32).reshape(len(rows), ROLE_FIELDS).to(device)


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------


def _is_dtensor(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor"


def check_linear_inputs(hidden, weight, targets) -> Tuple[int, int, int]:
    """Shapes, dtypes and devices of the lm-head inputs; returns ``(T, H, V)``."""
    for name, t in (("hidden", hidden), ("weight", weight), ("targets", targets)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if _is_dtensor(t):
            raise ValueError(f"{name} is a DTensor: pass the unsharded local tensor (call the loss inside "
                             "the FSDP module's forward, or after unshard())")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [T, H] (flattened packed tokens), got shape {tuple(hidden.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"weight must be [V, H], got shape {tuple(weight.shape)}")
    T, H = hidden.shape
    V = weight.shape[0]
    if weight.shape[1] != H:
        raise ValueError(f"weight has hidden size {weight.shape[1]} but hidden has {H}")
    if not hidden.dtype.is_floating_point:
        raise ValueError(f"hidden must be a float tensor, got {hidden.dtype}")
    if weight.dtype != hidden.dtype:
        raise ValueError(f"weight dtype {weight.dtype} differs from hidden dtype {hidden.dtype}")
    if weight.device != hidden.device:
        raise ValueError(f"weight is on {weight.device} but hidden is on {hidden.device}")
    _check_vector("targets", targets, T, hidden.device, integer=True)
    return T, H, V


def check_bias(bias, weight: torch.Tensor, hidden: torch.Tensor) -> None:
    """The lm head's optional bias: a ``[V]`` float tensor of the weight's dtype and device."""
    if bias is None:
        return
    if not isinstance(bias, torch.Tensor):
        raise ValueError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    V = weight.shape[0]
    if bias.dim() != 1 or bias.shape[0] != V:
        raise ValueError(f"bias must have shape [{V}] (one per vocabulary row of weight), got {tuple(bias.shape)}")
    if bias.dtype != hidden.dtype:
        raise ValueError(f"bias dtype {bias.dtype} differs from hidden dtype {hidden.dtype}")
    if bias.device != hidden.device:
        raise ValueError(f"bias is on {bias.device} but hidden is on {hidden.device}")


def check_target_range(targets: torch.Tensor, V: int) -> None:
    """Targets must lie below ``V``: a negative target (the ignore index, e.g. -100) means "no
    target"; one at or past the vocabulary is a model/data vocabulary mismatch (one host sync)."""
    if targets.numel() and int(targets.max()) >= V:
        raise ValueError(f"targets must be < V={V} (the weight's vocabulary rows), got {int(targets.max())}; "
                         "a negative target (e.g. -100) means no target")


def _check_vector(name: str, t, T: int, device: torch.device, integer: bool = False) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1 or t.shape[0] != T:
        raise ValueError(f"{name} must have shape [{T}] (one per token row of hidden), got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but hidden is on {device}")
    if integer and (t.dtype.is_floating_point or t.dtype == torch.bool):
        raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
    if not integer and not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be a float tensor, got {t.dtype}")


def check_role_specs(role_specs) -> None:
    if not isinstance(role_specs, (list, tuple)) or not all(isinstance(s, RoleSpec) for s in role_specs):
        raise ValueError("role_specs must be a list of RoleSpec")
    if len(role_specs) == 0:
        raise ValueError("role_specs is empty")


def check_clip(clip_low, clip_high, dual_clip) -> None:
    for name, value in (("clip_low", clip_low), ("clip_high", clip_high), ("dual_clip", dual_clip)):
        if name == "dual_clip" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name}={value!r} must be a finite number")
    if not (0 <= clip_low < 1):
        raise ValueError(f"clip_low={clip_low} must lie in [0, 1)")
    if not (clip_high >= 0):
        raise ValueError(f"clip_high={clip_high} must be >= 0")
    if dual_clip is not None and not (dual_clip > 1):
        raise ValueError(f"dual_clip={dual_clip} must be > 1 (or None)")


def check_normalizer(normalizer) -> None:
    if normalizer is None:
        return
    if isinstance(normalizer, torch.Tensor):
        if normalizer.numel() != 1:
            raise ValueError("normalizer must be a number or a 0-d tensor, "
                             f"got shape {tuple(normalizer.shape)}")
    elif not isinstance(normalizer, (int, float)) or not normalizer > 0:
        raise ValueError(f"normalizer={normalizer!r} must be a positive number (the global token count)")


def check_loss_inputs(hidden, weight, targets, inputs, settings, normalizer) -> Tuple[int, int, int]:
    """The tensors of one ``fused_linear_policy_loss`` call against each other and against the
    (already checked) ``settings``; a ValueError names the first bad one. Returns ``(T, H, V)``."""
    T, H, V = check_linear_inputs(hidden, weight, targets)
    dev = hidden.device
    role_specs = settings.role_specs
    if inputs.old_logp is not None:
        _check_vector("old_logp", inputs.old_logp, T, dev)
    _check_vector("advantages", inputs.advantages, T, dev)
    _check_vector("roles", inputs.roles, T, dev, integer=True)
    for name in ("weights", "pg_scale", "entropy_weights", "sampling_logp"):
        if getattr(inputs, name) is not None:
            _check_vector(name, getattr(inputs, name), T, dev)
    if inputs.sequence_ids is not None:
        _check_vector("sequence_ids", inputs.sequence_ids, T, dev, integer=True)
    elif settings.per_sequence:
        raise ValueError("sequence_ids is required: importance_sampling='sequence', off_policy_threshold and "
                         f"objective={settings.objective!r} read each token's sequence")
    if inputs.teacher_logp is None and any(s.is_opd for s in role_specs):
        names = [s.name or str(i) for i, s in enumerate(role_specs) if s.is_opd]
        raise ValueError(f"teacher_logp is required: role(s) {names} take the OPD advantage")
    if inputs.teacher_logp is not None:
        _check_vector("teacher_logp", inputs.teacher_logp, T, dev)
    if inputs.ref_logp is None and any(s.kl_coef != 0 for s in role_specs):
        names = [s.name or str(i) for i, s in enumerate(role_specs) if s.kl_coef != 0]
        raise ValueError(f"ref_logp is required: role(s) {names} have kl_coef != 0")
    if inputs.ref_logp is not None:
        _check_vector("ref_logp", inputs.ref_logp, T, dev)
    check_normalizer(normalizer)
    if T > 0:
        roles = inputs.roles
        # One host sync for the four value checks.
        untargeted = ((targets < 0) & (roles >= 0)).any()
        lo, hi, bad, top = torch.stack([roles.min().to(torch.int64), roles.max().to(torch.int64),
                                        untargeted.to(torch.int64), targets.max().to(torch.int64)]).tolist()
        if lo < -1 or hi >= len(role_specs):
            raise ValueError(f"roles must lie in [-1, {len(role_specs) - 1}] (index into role_specs), "
                             f"got values in [{lo}, {hi}]")
        if top >= V:
            raise ValueError(f"targets must be < V={V} (the weight's vocabulary rows), got {top}; a negative "
                             "target (e.g. -100) means no target")
        if bad:
            raise ValueError(f"targets must lie in [0, {V}) on every trained token (role >= 0)")
    return T, H, V


def check_temperature(temperature) -> None:
    if not isinstance(temperature, (int, float)) or not temperature > 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature={temperature!r} must be a positive number")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: choose one of {BACKENDS}")

