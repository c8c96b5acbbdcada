"""An lm head that scales or soft-caps its logits (Cohere's ``logit_scale``, Gemma 2's
``final_logit_softcapping``): ``linear_logprobs`` and the fused loss apply both inside the row pass,
forward and backward, on every backend -- the eager torch pass, the compiled CPU pass, Triton (the
interpreter here) and the reference -- against float64 logits ``cap tanh(scale z / cap) / temperature``
materialised here and differentiated by autograd."""

import pytest
import torch

from mopd_kernels import LossInputs, PolicyLossSettings, RoleSpec, compiled_rows, fused_linear_policy_loss, linear_logprobs

BACKENDS = ["torch", "compiled", "triton", "reference"]
HEADS = [(0.37, None), (1.6, 2.5), (1.0, 4.0)]  # (logit_scale, logit_softcap): scale only, both, cap only
TEMPERATURE = 0.9
VOCAB = {"compiled": 1100}
"""The compiled pass's vocabulary is test_kernels_compiled_rows.py's (it compiles once per vocabulary,
dtype and map, so its uncapped kernels are already compiled); the others take a smaller odd one (the
Triton interpreter walks the row in Python-level blocks)."""


@pytest.fixture
def backend(request, monkeypatch):
    """``(backend name the ops take, vocabulary)``; ``compiled`` is the torch backend with the compiled
    CPU row pass on at any vocabulary (its kernels are counted, so the test fails if they did not run)."""
    name = request.param
    if name != "compiled":
        monkeypatch.setenv("MOPD_KERNELS_COMPILE", "0")
        yield name, VOCAB.get(name, 389)
        return
    monkeypatch.setattr(compiled_rows, "COMPILED_MIN_VOCAB", 0)
    monkeypatch.setenv("MOPD_KERNELS_COMPILE", "1")
    calls = []
    run = compiled_rows._run

    def counting(kernel, *args):
        calls.append(kernel)
        return run(kernel, *args)
    monkeypatch.setattr(compiled_rows, "_run", counting)
    yield "torch", VOCAB[name]
    assert "sums" in calls and "grads" in calls


def _head(T, H, V, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=g, dtype=torch.float64)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64)  # logits of a few units: the cap bends them
    targets = torch.randint(0, V, (T,), generator=g)
    return hidden, weight, targets, g


def _logprobs64(hidden, weight, targets, scale, cap):
    z = (hidden @ weight.T) * scale
    if cap is not None:
        z = cap * torch.tanh(z / cap)
    logp_all = torch.log_softmax(z / TEMPERATURE, dim=-1)
    picked = logp_all.gather(1, targets.clamp(min=0).unsqueeze(1)).squeeze(1)
    return torch.where(targets >= 0, picked, torch.zeros_like(picked)), -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("scale, cap", HEADS)
def test_linear_logprobs_with_a_scaled_or_capped_head(backend, scale, cap):
    backend, V = backend
    T, H = 43, 20
    hidden, weight, targets, g = _head(T, H, V, seed=11)
    targets[[1, 40]] = -100
    g_logp, g_ent = (torch.randn(T, generator=g, dtype=torch.float64) for _ in range(2))
    want = [t.clone().requires_grad_(True) for t in (hidden, weight)]
    logp64, ent64 = _logprobs64(*want, targets, scale, cap)
    ((logp64 * g_logp).sum() + (ent64 * g_ent).sum()).backward()

    h, w = (t.float().requires_grad_(True) for t in (hidden, weight))
    logp, ent = linear_logprobs(h, w, targets, temperature=TEMPERATURE, backend=backend, chunk_rows=16,
                                logit_scale=scale, logit_softcap=cap)
    ((logp * g_logp.float()).sum() + (ent * g_ent.float()).sum()).backward()
    torch.testing.assert_close(logp.double(), logp64.detach(), atol=3e-5, rtol=1e-5)
    torch.testing.assert_close(ent.double(), ent64.detach(), atol=3e-5, rtol=1e-5)
    torch.testing.assert_close(h.grad.double(), want[0].grad, atol=3e-5, rtol=1e-4)
    torch.testing.assert_close(w.grad.double(), want[1].grad, atol=3e-5, rtol=1e-4)
    plain, _ = linear_logprobs(h, w, targets, temperature=TEMPERATURE, backend=backend)
    assert (plain - logp).abs().max() > 0.05  # the head's map was not ignored


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
@pytest.mark.parametrize("importance_sampling", ["token", "sequence"])
@pytest.mark.parametrize("scale, cap", HEADS[1:2])
def test_fused_loss_with_a_capped_head(backend, importance_sampling, scale, cap):
    """PPO with KL (k3) and an entropy bonus over ~2/3 trained rows in chunks of 16: loss and gradients."""
    backend, V = backend
    T, H = 61, 12
    hidden, weight, targets, g = _head(T, H, V, seed=12)
    roles = torch.randint(-1, 2, (T,), generator=g).clamp(max=0)
    seq = torch.arange(T) // 7
    with torch.no_grad():
        now, _ = _logprobs64(hidden, weight, targets, scale, cap)
    old = now + 0.3 * torch.randn(T, generator=g, dtype=torch.float64)
    ref = now + 0.2 * torch.randn(T, generator=g, dtype=torch.float64)
    adv = torch.randn(T, generator=g, dtype=torch.float64)
    beta, ent_coef, clip = 0.07, 0.02, 0.2

    want = [t.clone().requires_grad_(True) for t in (hidden, weight)]
    logp, ent = _logprobs64(*want, targets, scale, cap)
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
                                  importance_sampling=importance_sampling, logit_scale=scale, logit_softcap=cap)
    h, w = (t.float().requires_grad_(True) for t in (hidden, weight))
    inputs = LossInputs(roles, old.float(), adv.float(), ref_logp=ref.float(), sequence_ids=seq)
    loss, stats = fused_linear_policy_loss(h, w, targets, inputs, settings)
    loss.backward()
    torch.testing.assert_close(loss.double(), expected.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats[0]["entropy_mean"].double(), ent[on].mean().detach(), atol=3e-5, rtol=1e-5)
    torch.testing.assert_close(h.grad.double(), want[0].grad, atol=3e-5, rtol=1e-4)
    torch.testing.assert_close(w.grad.double(), want[1].grad, atol=3e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", ["torch", "triton"], indirect=True)
def test_logits_far_past_the_cap_stay_finite(backend):
    """Logits of hundreds against a cap of 1: on tanh's plateau the slope ``1 - (s/c)^2`` is 0 in fp32,
    the gradient finite and equal to the float64 one."""
    backend, _ = backend
    T, H, V = 9, 8, 50
    hidden, weight, targets, _ = _head(T, H, V, seed=13)
    weight = weight * 60.0
    want = [t.clone().requires_grad_(True) for t in (hidden, weight)]
    logp64, _ = _logprobs64(*want, targets, 1.0, 1.0)
    logp64.sum().backward()
    h, w = (t.float().requires_grad_(True) for t in (hidden, weight))
    logp, _ = linear_logprobs(h, w, targets, temperature=TEMPERATURE, backend=backend, logit_softcap=1.0)
    logp.sum().backward()
    assert float((hidden @ weight.T).abs().max()) > 100.0
    torch.testing.assert_close(logp.double(), logp64.detach(), atol=3e-5, rtol=1e-5)
    torch.testing.assert_close(h.grad.double(), want[0].grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(w.grad.double(), want[1].grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("field, value, match", [
    ("logit_softcap", 0.0, "logit_softcap=0.0 must be a positive number"),
    ("logit_softcap", float("inf"), "logit_softcap=inf must be a positive number"),
    ("logit_scale", float("nan"), "logit_scale=nan must be a finite number"),
    ("logit_scale", True, "logit_scale=True must be a finite number"),
])
def test_bad_head_settings_name_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        PolicyLossSettings([RoleSpec()], **{field: value})
    hidden, weight, targets, _ = _head(3, 4, 7, seed=14)
    with pytest.raises(ValueError, match=match):
        linear_logprobs(hidden.float(), weight.float(), targets, **{field: value})
