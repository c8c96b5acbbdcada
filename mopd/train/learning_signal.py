"""Whether a step has anything to learn from, the format validity of each role's calls, and the
gap between the engine's sampling log-probs and the trainer's pi_old.

A step teaches nothing when every trained token's advantage is 0 (every GRPO group tied, and no
OPD role with a teacher gap) or when every call had an invalid action format (a model that does
not write the action grammar: a wrong chat template, a model too small or too large for the
preset's limits). Its updates then move only the entropy bonus, so a run of such steps is a run
that trains nothing; the trainer says so in one line and, after ``trainer.max_signalless_steps``
in a row, stops.

Every function returns sums (counts, not fractions), so ranks add theirs in one all-reduce before
anything is divided.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch
from mopd_kernels.terms import trained_advantages as kernel_trained_advantages

from mopd.core.roles import role_names


def role_call_counts(records: Sequence) -> List[float]:
    """[calls, invalid calls] of each role, in role-table order, flattened."""
    out: List[float] = []
    for role in role_names():
        calls = [c for r in records for c in r.calls if c.role == role]
        out += [float(len(calls)), float(sum(1 for c in calls if c.invalid))]
    return out


def invalid_fractions(counts: Sequence[float]) -> Dict[str, float]:
    """{role: invalid calls / calls} from :func:`role_call_counts` (summed over ranks); roles
    without a call are left out."""
    out = {}
    for i, role in enumerate(role_names()):
        calls, invalid = float(counts[2 * i]), float(counts[2 * i + 1])
        if calls > 0:
            out[role] = invalid / calls
    return out


def signal_token_counts(batches: Sequence, role_specs: Sequence) -> List[float]:
    """[trained tokens, trained tokens with a non-zero advantage] over a step's scored micro-batches.

    A token's advantage is the one its role's loss uses (``mopd_kernels.RoleSpec``): the filled
    outcome advantage, or ``opd_coef * (teacher_logp - old_logp)`` for an OPD role; a role whose
    ``pg_coef`` is 0 has no advantage term at all.
    """
    trained = nonzero = 0.0
    for b in batches:
        mask = b.roles >= 0
        trained += float(mask.sum())
        nonzero += float((mask & (trained_advantages(b, role_specs) != 0)).sum())
    return [trained, nonzero]


def trained_advantages(batch, role_specs: Sequence) -> torch.Tensor:
    """Each position's advantage as its role's loss uses it (fp32, a new tensor; the kernels'
    ``mopd_kernels.terms.trained_advantages``): the filled outcome advantage, ``opd_coef * (teacher_logp
    - old_logp)`` for an OPD role (0 before scoring), 0 for a role whose ``pg_coef`` is 0 and on
    untrained positions. Reads the batch only."""
    return kernel_trained_advantages(role_specs, batch.roles, batch.advantages, batch.old_logp, batch.teacher_logp)


def logprob_gap_sums(batches: Sequence) -> List[float]:
    """[sum of |sampling log-prob - pi_old| over trained tokens, trained tokens]: the engine's
    log-probs against the trainer's recomputed ones (a precision gap, or weights that did not
    reach the engine). Only meaningful when pi_old was recomputed."""
    total = count = 0.0
    for b in batches:
        if b.old_logp is None:
            continue
        mask = b.roles >= 0
        gap = (b.sampling_logp.float() - b.old_logp.float()).abs()
        total += float(gap[mask].double().sum())
        count += float(mask.sum())
    return [total, count]


def no_signal_reason(tokens: Sequence[float], invalid: Dict[str, float]) -> Optional[str]:
    """Why a step has nothing to learn from (None when it has something): ``tokens`` from
    :func:`signal_token_counts`, ``invalid`` from :func:`invalid_fractions`."""
    trained, nonzero = tokens
    if trained == 0:
        return "no call has a trained token"
    if nonzero == 0:
        return "every trained token has advantage 0"
    if all_invalid(invalid):
        return ALL_INVALID
    return None


ALL_INVALID = "every call has an invalid action format"


def all_invalid(invalid: Dict[str, float]) -> bool:
    """Every call of every role was invalid (and there was at least one call)."""
    return bool(invalid) and all(f == 1.0 for f in invalid.values())


def role_fractions(label: str, fractions: Dict[str, float]) -> str:
    """``invalid calls: leader 1.00, searcher 0.50`` (roles in role-table order)."""
    body = ", ".join(f"{r} {f:.2f}" for r, f in fractions.items())
    return f"{label}: {body or 'none'}"


def counts_tensor(parts: Sequence[Sequence[float]], device) -> torch.Tensor:
    """The lists above concatenated into one float64 tensor (one all-reduce for all of them)."""
    return torch.tensor([float(x) for p in parts for x in p], dtype=torch.float64, device=device)
