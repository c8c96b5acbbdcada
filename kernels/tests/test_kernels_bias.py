"""An lm head with a bias (Phi-2, GPT-J, CodeGen): ``linear_logprobs`` and the fused losses take it,
with its gradient, on every backend, against float64 logits ``h W^T + b`` materialised here."""

import pytest
import torch

from mopd_kernels import (
    Completions,
    FusedLinearGRPOLoss,
    LossInputs,
    PolicyLossSettings,
    RoleSpec,
    fused_linear_policy_loss,
    linear_logprobs,
)

BACKENDS = ["torch", "triton", "reference"]
TEMPERATURE = 0.8


def _head(T, H, V, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=g, dtype=torch.float64)
    weight = 0.4 * torch.randn(V, H, generator=g, dtype=torch.float64)
    bias = 2.0 * torch.randn(V, generator=g, dtype=torch.float64)  # large enough to move every softmax
    targets = torch.randint(0, V, (T,), generator=g)
    return hidden, weight, bias, targets, g


def _logprobs64(hidden, weight, bias, targets):
    logits = (hidden @ weight.T + bias) / TEMPERATURE
    logp_all = torch.log_softmax(logits, dim=-1)
    valid = targets >= 0
    picked = logp_all.gather(1, targets.clamp(min=0).unsqueeze(1)).squeeze(1)
    return torch.where(valid, picked, torch.zeros_like(picked)), -(logp_all.exp() * logp_all).sum(-1)


def _leaves(*tensors):
    return [t.float().requires_grad_(True) for t in tensors]


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_logprobs_with_a_bias(backend):
    hidden, weight, bias, targets, g = _head(45, 24, 301, seed=1)
    targets[[2, 30]] = -100
    g_logp, g_ent = torch.randn(45, generator=g, dtype=torch.float64), torch.randn(45, generator=g, dtype=torch.float64)
    want = [t.clone().requires_grad_(True) for t in (hidden, weight, bias)]
    logp64, ent64 = _logprobs64(*want, targets)
    ((logp64 * g_logp).sum() + (ent64 * g_ent).sum()).backward()

    h, w, b = _leaves(hidden, weight, bias)
    logp, ent = linear_logprobs(h, w, targets, temperature=TEMPERATURE, backend=backend, chunk_rows=16, bias=b)
    ((logp * g_logp.float()).sum() + (ent * g_ent.float()).sum()).backward()
    torch.testing.assert_close(logp.double(), logp64.detach(), atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ent.double(), ent64.detach(), atol=2e-5, rtol=1e-5)
    for got, ref in zip((h, w, b), want, strict=True):
        torch.testing.assert_close(got.grad.double(), ref.grad, atol=2e-5, rtol=1e-4)
    without, _ = linear_logprobs(h, w, targets, temperature=TEMPERATURE, backend=backend, with_entropy=False)
    assert (without - logp).abs().max() > 0.1  # the bias was not ignored


@pytest.mark.parametrize("importance_sampling", ["token", "sequence"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_loss_with_a_bias(backend, importance_sampling):
    T, H, V = 53, 16, 257
    hidden, weight, bias, targets, g = _head(T, H, V, seed=2)
    roles = torch.randint(-1, 1, (T,), generator=g)
    seq = torch.arange(T) // 9
    with torch.no_grad():
        logp_now, _ = _logprobs64(hidden, weight, bias, targets)
    old = logp_now + 0.3 * torch.randn(T, generator=g, dtype=torch.float64)
    ref = logp_now + 0.2 * torch.randn(T, generator=g, dtype=torch.float64)
    adv = torch.randn(T, generator=g, dtype=torch.float64)
    beta, ent_coef, clip = 0.05, 0.01, 0.2

    want = [t.clone().requires_grad_(True) for t in (hidden, weight, bias)]
    logp, ent = _logprobs64(*want, targets)
    on = roles >= 0
    log_ratio = logp - old
    if importance_sampling == "sequence":
        sums = torch.zeros(int(seq.max()) + 1, dtype=torch.float64).index_add(0, seq[on], log_ratio[on])
        counts = torch.zeros_like(sums).index_add(0, seq[on], torch.ones_like(log_ratio[on]))
        log_ratio = (sums / counts.clamp(min=1))[seq]
    ratio = torch.exp(log_ratio)
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip))
    kl = torch.exp(ref - logp) - (ref - logp) - 1
    expected = ((pg + beta * kl - ent_coef * ent)[on]).sum() / on.sum()
    expected.backward()

    settings = PolicyLossSettings([RoleSpec(kl_coef=beta, entropy_coef=ent_coef)], clip_low=clip, clip_high=clip,
                                  temperature=TEMPERATURE, backend=backend, chunk_rows=16,
                                  importance_sampling=importance_sampling)
    h, w, b = _leaves(hidden, weight, bias)
    inputs = LossInputs(roles, old.float(), adv.float(), ref_logp=ref.float(), sequence_ids=seq)
    loss, _ = fused_linear_policy_loss(h, w, targets, inputs, settings, bias=b)
    loss.backward()
    torch.testing.assert_close(loss.double(), expected.detach(), atol=1e-5, rtol=1e-5)
    for got, want_t in zip((h, w, b), want, strict=True):
        torch.testing.assert_close(got.grad.double(), want_t.grad, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grpo_loss_module_passes_the_bias_and_checks_it(backend):
    B, T, H, V = 3, 6, 8, 97
    hidden, weight, bias, _, g = _head(B * T, H, V, seed=3)
    h, w, b = _leaves(hidden.reshape(B, T, H), weight, bias)
    completions = Completions(torch.randint(0, V, (B, T), generator=g), torch.ones(B, T), torch.randn(B, generator=g))
    loss_fn = FusedLinearGRPOLoss(PolicyLossSettings([RoleSpec(entropy_coef=0.1)], backend=backend))
    loss, _ = loss_fn(h, w, completions, bias=b)
    loss.backward()
    assert b.grad is not None and b.grad.abs().sum() > 0  # moving b moves every row's softmax
    with pytest.raises(ValueError, match=r"bias must have shape \[97\]"):
        loss_fn(h, w, completions, bias=torch.zeros(V + 1))
    with pytest.raises(ValueError, match="bias dtype"):
        loss_fn(h, w, completions, bias=torch.zeros(V, dtype=torch.float64))
