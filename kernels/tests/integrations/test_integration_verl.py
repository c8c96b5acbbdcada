"""mopd_kernels inside the real verl (0.9.1): linear_logprobs through verl's patched fused-kernel
forward gives verl's torch backend's log-probs, entropies and gradients; the registered "mopd" policy
loss equals verl's "vanilla" over its aggregation modes; the triton slot takes it too; uninstall
restores verl. Runs in .venv-integrations (make test-integrations)."""

import pytest

from integration_env import require

require("verl")

import torch  # noqa: E402
import verl.models.transformers.monkey_patch as verl_monkey_patch  # noqa: E402
import verl.utils.experimental.torch_functional as verl_torch_functional  # noqa: E402
import verl.utils.kernel.linear_cross_entropy as verl_lce  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn  # noqa: E402
from verl.workers.config import FSDPActorConfig  # noqa: E402

from mopd_kernels.integrations import verl as mopd_verl  # noqa: E402

pytestmark = pytest.mark.integration

B, T, P, V, H = 4, 13, 5, 211, 64
TEMPERATURE = 0.7


@pytest.fixture
def patched_model():
    """A tiny Qwen2 whose class forward verl has patched (use_fused_kernels, torch backend); the class
    forward is restored afterwards, and mopd's install undone."""
    original = Qwen2ForCausalLM.forward
    # verl 0.9.1 imports trl.AutoModelForCausalLMWithValueHead whenever trl is installed; trl >= 1 has none
    verl_monkey_patch.is_trl_available = lambda: False
    config = Qwen2Config(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float()
    verl_monkey_patch.apply_monkey_patch(model, use_remove_padding=False, ulysses_sp_size=1, use_fused_kernels=True,
                                         fused_kernels_backend="torch")
    yield model
    mopd_verl.uninstall()
    Qwen2ForCausalLM.forward = original


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, V, (B, T), generator=g)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[0, -3:] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    upstream = (torch.randn(B, T, generator=g), torch.randn(B, T, generator=g))
    return dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids), upstream


def _forward_backward(model, inputs, upstream):
    model.zero_grad()
    out = model(**inputs, temperature=TEMPERATURE, return_dict=True, use_cache=False)
    ((out.log_probs * upstream[0]).sum() + (out.entropy.float() * upstream[1]).sum()).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.log_probs.detach(), out.entropy.detach().float(), grads


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


def test_install_puts_linear_logprobs_into_the_fused_forward(patched_model, monkeypatch):
    inputs, upstream = _inputs()
    want_logp, want_ent, want = _forward_backward(patched_model, inputs, upstream)
    calls = []
    mopd_verl.install()
    original = mopd_verl.linear_logprobs
    monkeypatch.setattr(mopd_verl, "linear_logprobs", lambda *a, **k: calls.append(1) or original(*a, **k))
    got_logp, got_ent, got = _forward_backward(patched_model, inputs, upstream)
    assert calls, "verl's forward did not reach mopd_kernels"
    assert torch.allclose(got_logp, want_logp, atol=2e-6, rtol=1e-5)
    assert torch.allclose(got_ent, want_ent, atol=2e-5, rtol=1e-5)
    assert set(got) == set(want)
    for n in want:
        assert _rel(got[n], want[n]) < 1e-5, n


def test_the_triton_slot_takes_linear_logprobs_too(patched_model):
    """verl's triton backend calls linear_cross_entropy (CUDA only in verl); installed, it runs here."""
    verls_own = verl_torch_functional.FusedLinearForPPO
    mopd_verl.install()
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(B, T, H, generator=g)
    weight = torch.randn(V, H, generator=g)
    labels = torch.randint(0, V, (B, T), generator=g)
    logp, entropy = verl_lce.linear_cross_entropy(hidden, weight, labels, TEMPERATURE, "none")
    want_logp, want_ent = verls_own(impl_backend="torch").forward(hidden, weight, labels, TEMPERATURE)
    assert logp.shape == (B * T,)
    assert torch.allclose(logp, want_logp.reshape(-1), atol=1e-5)
    assert torch.allclose(entropy, want_ent.reshape(-1), atol=1e-5)


def _actor_config(agg_mode, mask):
    config = FSDPActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=B, clip_ratio=0.2,
                             clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=agg_mode)
    config.global_batch_info.update(dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=B,
                                    loss_scale_factor=None)
    return config


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                      "seq-mean-token-sum-norm"])
def test_registered_loss_equals_vanilla(agg_mode):
    mopd_verl.install()
    try:
        g = torch.Generator().manual_seed(5)
        R = T - P
        mask = torch.arange(R).unsqueeze(0) < torch.tensor([[R], [3], [1], [6]])
        log_prob = (-3 * torch.rand(B, R, generator=g)).requires_grad_(True)
        old = log_prob.detach() + torch.randn(B, R, generator=g)   # both sides of the clip, and the cap
        adv = torch.randn(B, R, generator=g) * 2
        weights = torch.rand(B, R, generator=g) + 0.5
        config = _actor_config(agg_mode, mask)
        results = {}
        for name in ("vanilla", mopd_verl.POLICY_LOSS_NAME):
            log_prob.grad = None
            loss, metrics = get_policy_loss_fn(name)(old_log_prob=old, log_prob=log_prob, advantages=adv,
                                                     response_mask=mask, loss_agg_mode=agg_mode, config=config,
                                                     rollout_is_weights=weights)
            loss.backward()
            results[name] = (float(loss), log_prob.grad.clone(), metrics)
        (want, want_g, want_m), (got, got_g, got_m) = results["vanilla"], results[mopd_verl.POLICY_LOSS_NAME]
        assert abs(got - want) <= 1e-6 * max(1.0, abs(want))
        assert torch.allclose(got_g, want_g, atol=1e-7, rtol=1e-6)
        assert 0 < want_m["actor/pg_clipfrac"] < 1 and 0 < want_m["actor/pg_clipfrac_lower"] < 1
        for key in want_m:
            assert abs(got_m[key] - want_m[key]) < 1e-6, key
    finally:
        mopd_verl.uninstall()


def test_uninstall_restores_verl():
    before = (verl_torch_functional.FusedLinearForPPO, verl_lce.linear_cross_entropy)
    mopd_verl.install()
    mopd_verl.install()   # idempotent
    assert verl_torch_functional.FusedLinearForPPO is mopd_verl.FusedLinearForPPO
    assert mopd_verl.POLICY_LOSS_NAME in POLICY_LOSS_REGISTRY
    mopd_verl.uninstall()
    assert (verl_torch_functional.FusedLinearForPPO, verl_lce.linear_cross_entropy) == before
    assert mopd_verl.POLICY_LOSS_NAME not in POLICY_LOSS_REGISTRY
