"""linear_logprobs: the scoring pass (no grad) and the differentiable op, every backend."""

import pytest
import torch

from mopd_kernels import LossInputs, PolicyLossSettings, RoleSpec, fused_linear_policy_loss, linear_logprobs
from kernel_cases import BACKENDS, assert_close_grads, make_batch, rel_err

# (T, H, V, temperature): T=1, V > the interpreter's BLOCK_V (two online blocks), V < H
SHAPES = [(1, 8, 5, 1.0), (37, 16, 1500, 0.6), (23, 40, 33, 1.3), (48, 12, 257, 1.0)]


def _by_hand(hidden, weight, targets, temperature):
    logits = (hidden @ weight.T).float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(1, targets.unsqueeze(1)).squeeze(1)
    p = log_probs.exp()
    return logp, -(p * log_probs).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"T{t}H{h}V{v}t{tau}" for t, h, v, tau in SHAPES])
def test_scoring_pass_equals_log_softmax_gather(shape, backend, dtype):
    T, H, V, temperature = shape
    g = torch.Generator().manual_seed(T + V)
    hidden = torch.randn(T, H, generator=g).to(dtype)
    weight = torch.randn(V, H, generator=g).to(dtype)
    targets = torch.randint(0, V, (T,), generator=g)
    want_logp, want_ent = _by_hand(hidden, weight, targets, temperature)
    with torch.no_grad():
        logp, ent = linear_logprobs(hidden, weight, targets, temperature=temperature, backend=backend,
                                    chunk_rows=16)
    assert logp.dtype == torch.float32 and ent.dtype == torch.float32
    assert logp.shape == (T,) and ent.shape == (T,)
    torch.testing.assert_close(logp, want_logp, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ent, want_ent, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_without_entropy_and_padding_targets(backend):
    hidden, weight = torch.randn(9, 8), torch.randn(50, 8)
    targets = torch.randint(0, 50, (9,))
    targets[[2, 5]] = -100
    logp, ent = linear_logprobs(hidden, weight, targets, with_entropy=False, backend=backend)
    assert ent is None
    assert logp[2] == 0 and logp[5] == 0
    ok = targets >= 0
    want, _ = _by_hand(hidden[ok], weight, targets[ok], 1.0)
    torch.testing.assert_close(logp[ok], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_of_arbitrary_upstream(backend, dtype):
    """d/d(hidden, weight) of sum(a * logp + b * entropy) with random a, b, vs plain autograd."""
    T, H, V = 19, 12, 1100
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(T, H, generator=g).to(dtype)
    weight = (torch.randn(V, H, generator=g) * 0.5).to(dtype)
    targets = torch.randint(0, V, (T,), generator=g)
    targets[3] = -100
    a, b = torch.randn(T, generator=g), torch.randn(T, generator=g)
    grads = {}
    for be in ("reference", backend):
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        logp, ent = linear_logprobs(h, w, targets, temperature=0.8, backend=be, chunk_rows=8)
        ((a * logp).sum() + (b * ent).sum()).backward()
        grads[be] = (h.grad, w.grad)
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    assert_close_grads(grads[backend][0], grads["reference"][0], tol)
    assert_close_grads(grads[backend][1], grads["reference"][1], tol)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_of_logp_only_and_frozen_weight(backend):
    T, H, V = 11, 8, 70
    hidden, weight = torch.randn(T, H), torch.randn(V, H)
    targets = torch.randint(0, V, (T,))
    h_ref = hidden.clone().requires_grad_(True)
    linear_logprobs(h_ref, weight, targets, backend="reference")[0].sum().backward()
    h = hidden.clone().requires_grad_(True)
    w = weight.clone()
    logp, _ = linear_logprobs(h, w, targets, backend=backend, with_entropy=False)
    logp.sum().backward()
    assert w.grad is None
    assert rel_err(h.grad, h_ref.grad) < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_scoring_pass_feeds_the_loss_consistently(backend):
    """old_logp from the scoring pass makes every ratio 1 at the first update: approx KL 0, no clip."""
    specs = [RoleSpec("outcome"), RoleSpec("opd", opd_coef=0.01)]
    batch = make_batch(33, 16, 600, specs, ref=False)
    with torch.no_grad():
        old, _ = linear_logprobs(batch.hidden, batch.weight, batch.targets, backend=backend)
    inputs = LossInputs(batch.roles, old, batch.advantages, teacher_logp=batch.teacher_logp)
    _, stats = fused_linear_policy_loss(batch.hidden, batch.weight, batch.targets, inputs,
                                        PolicyLossSettings(specs, backend=backend))
    for r in (0, 1):
        assert abs(float(stats[r]["approx_kl"])) < 1e-6
        assert float(stats[r]["clip_frac"]) == 0.0
