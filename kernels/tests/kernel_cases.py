"""Random packed batches and comparison helpers for the kernel tests (small shapes: the Triton
interpreter runs one Python-level program per row)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch

from mopd_kernels import (
    LossInputs,
    PolicyLossSettings,
    RoleSpec,
    fused_linear_policy_loss,
    reference_linear_logprobs,
)

BACKENDS = ["torch", "triton"]


@dataclass
class Batch:
    hidden: torch.Tensor
    weight: torch.Tensor
    targets: torch.Tensor
    old_logp: torch.Tensor
    advantages: torch.Tensor
    roles: torch.Tensor
    teacher_logp: Optional[torch.Tensor]
    ref_logp: Optional[torch.Tensor]
    specs: List[RoleSpec] = field(default_factory=list)

    def inputs(self) -> LossInputs:
        return LossInputs(self.roles, self.old_logp, self.advantages, self.teacher_logp, self.ref_logp)

    def settings(self, backend: str, **kwargs) -> PolicyLossSettings:
        return PolicyLossSettings(tuple(self.specs), backend=backend, **kwargs)


def make_batch(T: int, H: int, V: int, specs: List[RoleSpec], *, dtype=torch.float32, seed: int = 0,
               temperature: float = 1.0, drift: float = 0.3, role_probs=None, teacher: bool = True,
               ref: bool = True, weight_scale: float = 0.5) -> Batch:
    """A batch whose old log-probs sit near the current ones (ratios around 1, some clipped)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=g).to(dtype)
    weight = (torch.randn(V, H, generator=g) * weight_scale).to(dtype)
    targets = torch.randint(0, V, (T,), generator=g)
    with torch.no_grad():
        logp, _ = reference_linear_logprobs(hidden, weight, targets, temperature=temperature)
    old = logp + drift * torch.randn(T, generator=g)
    adv = torch.randn(T, generator=g)
    R = len(specs)
    if role_probs is None:
        roles = torch.randint(-1, R, (T,), generator=g)
    else:
        roles = torch.multinomial(torch.tensor(role_probs, dtype=torch.float), T, replacement=True,
                                  generator=g) - 1
    teacher_logp = logp + torch.randn(T, generator=g) if teacher else None
    ref_logp = logp + 0.2 * torch.randn(T, generator=g) if ref else None
    return Batch(hidden, weight, targets, old, adv, roles, teacher_logp, ref_logp, list(specs))


def run_loss(batch: Batch, backend: str, normalizer=None, **settings):
    """(loss, grad_hidden, grad_weight, stats) of one forward+backward on fresh leaf copies;
    ``settings`` are ``PolicyLossSettings`` fields besides the role specs and the backend."""
    h = batch.hidden.clone().requires_grad_(True)
    w = batch.weight.clone().requires_grad_(True)
    loss, stats = fused_linear_policy_loss(h, w, batch.targets, batch.inputs(),
                                           batch.settings(backend, **settings), normalizer)
    loss.backward()
    return loss.detach(), h.grad, w.grad, stats


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / max(||b||, tiny) in fp64."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def assert_close_grads(got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.isfinite(got).all()
    if float(want.double().norm()) == 0.0:
        assert float(got.double().abs().max()) <= 1e-12
    else:
        assert rel_err(got, want) <= rtol, rel_err(got, want)


def assert_close_stats(got, want, atol: float, clip_atol: float) -> None:
    assert set(got) == set(want)
    for r in want:
        assert set(got[r]) == set(want[r])
        for k, v in want[r].items():
            tol = clip_atol if k == "clip_frac" else atol
            assert abs(float(got[r][k]) - float(v)) <= tol * max(1.0, abs(float(v))), (r, k, got[r][k], v)
