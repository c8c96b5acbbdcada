"""Every loss mode of TRL's GRPOTrainer and verl's policy loss, fused, against float64 references
written from those trainers' formulas (full logits, plain autograd): random data, odd sizes, an
empty and a one-token completion, ratios on both sides of every clip."""

import pytest
import torch

from mopd_kernels import (Aggregation, Completions, FusedLinearGRPOLoss, PolicyLossSettings, RoleSpec,
                          linear_logprobs)

B, T, H, V = 6, 11, 24, 97
TEMPERATURE = 0.7
EPS_LOW, EPS_HIGH = 0.2, 0.28


def _batch(seed=0, per_token_adv=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=g)
    weight = torch.randn(V, H, generator=g) / H ** 0.5 * 3
    targets = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.tensor([T, 7, 1, 0, 9, 4])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    with torch.no_grad():
        logp, _ = linear_logprobs(hidden.reshape(B * T, H).double(), weight.double(), targets.reshape(-1),
                                  temperature=TEMPERATURE, backend="reference")
    logp = logp.reshape(B, T).float()
    old = logp + 0.35 * torch.randn(B, T, generator=g)   # ratios well outside [0.8, 1.28] both ways
    ref = logp + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g) if per_token_adv else torch.randn(B, generator=g)
    return dict(hidden=hidden, weight=weight, targets=targets, mask=mask, old=old, ref=ref, adv=adv)


def _logps_entropies(hidden, weight, targets):
    logits = (hidden.double() @ weight.double().T) / TEMPERATURE
    logp_all = torch.log_softmax(logits, -1)
    logps = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logps, -(logp_all.exp() * logp_all).sum(-1)


def trl_loss(b, loss_type, beta, entropy_coef, level="token", bias_correction=True, delta=None,
             on_policy=False, num_items=None, max_completion_length=16):
    """TRL 1.16's GRPOTrainer._compute_loss (one micro-batch, no accumulation), in float64."""
    hidden = b["hidden"].double().requires_grad_(True)
    weight = b["weight"].double().requires_grad_(True)
    per_token_logps, entropies = _logps_entropies(hidden, weight, b["targets"])
    mask = b["mask"].double()
    advantages = b["adv"].double()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    old = per_token_logps.detach() if on_policy else b["old"].double()
    log_ratio = per_token_logps - old
    if level == "token":
        log_importance_weights = log_ratio
    else:
        log_importance_weights = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_importance_weights)
    if beta != 0.0:
        ref = b["ref"].double()
        per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
        if bias_correction:
            per_token_kl = per_token_kl * coef_1
    if loss_type == "cispo":
        per_token_loss = -torch.clamp(coef_1, max=EPS_HIGH).detach() * advantages * per_token_logps
    elif loss_type == "sapo":
        temperatures = torch.where(advantages > 0, 1.0, 1.05)
        per_token_loss = -torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures * advantages
    else:
        coef_2 = torch.clamp(coef_1, 1 - EPS_LOW, 1 + EPS_HIGH)
        if delta is not None:
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type in ("grpo", "sapo"):
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    else:  # dapo, cispo
        loss = (per_token_loss * mask).sum() / num_items
    if entropy_coef:
        loss = loss - entropy_coef * (entropies * mask).sum() / mask.sum().clamp(min=1.0)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


AGG = {"grpo": "grpo", "sapo": "grpo", "bnpo": "bnpo", "dr_grpo": "dr_grpo", "dapo": "token-mean",
       "cispo": "token-mean"}


def fused_loss(b, loss_type, beta, entropy_coef, level="token", bias_correction=True, delta=None,
               on_policy=False, num_items=None, max_completion_length=16, backend="torch"):
    objective = {"cispo": "cispo", "sapo": "sapo"}.get(loss_type, "ppo")
    settings = PolicyLossSettings(
        [RoleSpec(kl_coef=beta, kl_type="k3", entropy_coef=entropy_coef)], clip_low=EPS_LOW, clip_high=EPS_HIGH,
        dual_clip=delta, temperature=TEMPERATURE, backend=backend, objective=objective,
        importance_sampling=level, kl_bias_correction=bias_correction,
        cispo_max_weight=EPS_HIGH if loss_type == "cispo" else None)
    aggregation = Aggregation(AGG[loss_type], global_tokens=num_items, max_completion_length=max_completion_length)
    loss_fn = FusedLinearGRPOLoss(settings, aggregation, entropy_aggregation=Aggregation("bnpo"))
    hidden = b["hidden"].clone().requires_grad_(True)
    weight = b["weight"].clone().requires_grad_(True)
    completions = Completions(b["targets"], b["mask"], b["adv"], old_logp=None if on_policy else b["old"],
                              ref_logp=b["ref"] if beta else None)
    loss, stats = loss_fn(hidden, weight, completions)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad, stats


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


CASES = [
    dict(loss_type="grpo", beta=0.0, entropy_coef=0.0),
    dict(loss_type="grpo", beta=0.04, entropy_coef=0.01),                       # TRL's default KL correction
    dict(loss_type="grpo", beta=0.04, entropy_coef=0.01, bias_correction=False),
    dict(loss_type="bnpo", beta=0.04, entropy_coef=0.0, delta=1.6),
    dict(loss_type="dr_grpo", beta=0.0, entropy_coef=0.01),
    dict(loss_type="dapo", beta=0.04, entropy_coef=0.0, num_items=31.0),
    dict(loss_type="grpo", beta=0.04, entropy_coef=0.0, level="sequence"),      # GSPO
    dict(loss_type="dapo", beta=0.0, entropy_coef=0.01, level="sequence", num_items=40.0),
    dict(loss_type="cispo", beta=0.0, entropy_coef=0.0, num_items=31.0),
    dict(loss_type="cispo", beta=0.04, entropy_coef=0.01, level="sequence", num_items=31.0),
    dict(loss_type="sapo", beta=0.0, entropy_coef=0.01),
    dict(loss_type="grpo", beta=0.04, entropy_coef=0.01, on_policy=True),       # TRL passes no old log-probs
    dict(loss_type="grpo", beta=0.0, entropy_coef=0.0, on_policy=True, level="sequence"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_fused_loss_equals_trl_formula(case):
    b = _batch(seed=len(str(case)))
    want_loss, want_gh, want_gw = trl_loss(b, **case)
    got_loss, got_gh, got_gw, stats = fused_loss(b, **case)
    assert abs(float(got_loss) - float(want_loss)) <= 1e-5 * max(1.0, abs(float(want_loss))), (got_loss, want_loss)
    assert _rel(got_gh, want_gh) < 1e-5 and _rel(got_gw, want_gw) < 1e-5
    assert float(stats["tokens"]) == float(b["mask"].sum())


@pytest.mark.parametrize("case", [CASES[1], CASES[6], CASES[9]], ids=["grpo-kl", "gspo-kl", "cispo-seq"])
def test_triton_backend_equals_trl_formula(case):
    """The Triton kernels (interpreter) take the same token terms: every mode runs on the GPU path too."""
    b = _batch(seed=3)
    want_loss, want_gh, want_gw = trl_loss(b, **case)
    got_loss, got_gh, got_gw, _ = fused_loss(b, backend="triton", **case)
    assert abs(float(got_loss) - float(want_loss)) <= 1e-5 * max(1.0, abs(float(want_loss)))
    assert _rel(got_gh, want_gh) < 1e-5 and _rel(got_gw, want_gw) < 1e-5


def test_the_clip_stats_split_low_and_high_as_trl_logs_them():
    b = _batch(seed=4)
    _, _, _, stats = fused_loss(b, "grpo", 0.0, 0.0)
    logps, _ = _logps_entropies(b["hidden"], b["weight"], b["targets"])
    ratio = torch.exp(logps - b["old"].double())
    A = b["adv"].double().unsqueeze(1).expand(B, T)
    m = b["mask"]
    low = ((ratio < 1 - EPS_LOW) & (A < 0))[m].double().mean()
    high = ((ratio > 1 + EPS_HIGH) & (A > 0))[m].double().mean()
    assert 0 < low < 1 and 0 < high < 1
    assert abs(float(stats["clip_low_frac"]) - float(low)) < 1e-6
    assert abs(float(stats["clip_high_frac"]) - float(high)) < 1e-6


def verl_vanilla_loss(b, agg_mode, clip_ratio_c=3.0, loss_scale_factor=None):
    """verl 0.9's compute_policy_loss_vanilla with agg_loss, on per-token advantages, in float64."""
    hidden = b["hidden"].double().requires_grad_(True)
    weight = b["weight"].double().requires_grad_(True)
    log_prob, _ = _logps_entropies(hidden, weight, b["targets"])
    mask = b["mask"].double()
    A = b["adv"].double()
    negative_approx_kl = torch.clamp(log_prob - b["old"].double(), min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -A * ratio
    pg_losses2 = -A * torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -A * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(A < 0, clip_pg_losses2, clip_pg_losses1)
    if agg_mode == "token-mean":
        loss = (pg_losses * mask).sum() / mask.sum()
    elif agg_mode == "seq-mean-token-mean":
        seq = (pg_losses * mask).sum(-1) / (mask.sum(-1) + 1e-8)
        nonempty = (mask.sum(-1) > 0).double()
        loss = (seq * nonempty).sum() / nonempty.sum()
    else:
        seq = (pg_losses * mask).sum(-1)
        nonempty = (mask.sum(-1) > 0).double()
        loss = (seq * nonempty).sum() / nonempty.sum()
        if agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_scale_factor or mask.shape[-1])
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_fused_loss_equals_verl_vanilla(mode):
    b = _batch(seed=7, per_token_adv=True)
    want_loss, want_gh, want_gw = verl_vanilla_loss(b, mode)
    settings = PolicyLossSettings([RoleSpec()], clip_low=EPS_LOW, clip_high=EPS_HIGH, dual_clip=3.0,
                                  temperature=TEMPERATURE, log_ratio_clip=20.0, backend="torch")
    hidden = b["hidden"].clone().requires_grad_(True)
    weight = b["weight"].clone().requires_grad_(True)
    loss, _ = FusedLinearGRPOLoss(settings, Aggregation(mode))(
        hidden, weight, Completions(b["targets"], b["mask"], b["adv"], old_logp=b["old"]))
    loss.backward()
    assert abs(float(loss) - float(want_loss)) <= 1e-5 * max(1.0, abs(float(want_loss)))
    assert _rel(hidden.grad, want_gh) < 1e-5 and _rel(weight.grad, want_gw) < 1e-5


def test_matmul_follows_autocast_and_keeps_each_gradient_in_its_dtype():
    """TRL runs the lm head under bf16 autocast with fp32 hidden states and a bf16 or fp32 weight:
    the fused loss casts as F.linear would, instead of refusing or silently running in fp32."""
    b = _batch(seed=9)
    settings = PolicyLossSettings([RoleSpec()], temperature=TEMPERATURE, backend="torch")
    loss_fn = FusedLinearGRPOLoss(settings, "bnpo")
    completions = Completions(b["targets"], b["mask"], b["adv"], old_logp=b["old"])
    hidden = b["hidden"].clone().requires_grad_(True)
    weight = b["weight"].clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = loss_fn(hidden, weight, completions)
    loss.backward()
    h16 = b["hidden"].bfloat16().requires_grad_(True)
    w16 = b["weight"].bfloat16().requires_grad_(True)
    want, _ = FusedLinearGRPOLoss(
        PolicyLossSettings([RoleSpec()], temperature=TEMPERATURE, backend="reference"), "bnpo")(h16, w16, completions)
    want.backward()
    assert hidden.grad.dtype == torch.float32 and weight.grad.dtype == torch.float32
    assert abs(float(loss) - float(want)) < 1e-3 * max(1.0, abs(float(want)))
    assert _rel(weight.grad, w16.grad.float()) < 3e-2
    fp32_loss, _ = loss_fn(b["hidden"], b["weight"], completions)
    assert float(fp32_loss) != float(loss)  # the cast happened: bf16 logits differ from fp32 ones


def test_explicit_matmul_dtype_and_mismatched_dtypes():
    b = _batch(seed=2)
    completions = Completions(b["targets"], b["mask"], b["adv"], old_logp=b["old"])
    plain = FusedLinearGRPOLoss(PolicyLossSettings([RoleSpec()], backend="torch"), "bnpo")
    with pytest.raises(ValueError, match="dtype"):
        plain(b["hidden"], b["weight"].bfloat16(), completions)
    cast = FusedLinearGRPOLoss(PolicyLossSettings([RoleSpec()], backend="torch", matmul_dtype=torch.bfloat16), "bnpo")
    loss, _ = cast(b["hidden"], b["weight"], completions)
    assert torch.isfinite(loss)


def test_bad_modes_and_shapes_raise_one_line_errors():
    with pytest.raises(ValueError, match="objective"):
        PolicyLossSettings([RoleSpec()], objective="vespo")
    with pytest.raises(ValueError, match="importance_sampling"):
        PolicyLossSettings([RoleSpec()], importance_sampling="sequence_token")
    with pytest.raises(ValueError, match="max_completion_length"):
        Aggregation("dr_grpo")
    with pytest.raises(ValueError, match="one of"):
        Aggregation("mean")
    b = _batch()
    loss_fn = FusedLinearGRPOLoss(PolicyLossSettings([RoleSpec()], backend="torch"))
    with pytest.raises(ValueError, match="advantages"):
        loss_fn(b["hidden"], b["weight"], Completions(b["targets"], b["mask"], torch.randn(B + 1)))
    with pytest.raises(ValueError, match="one policy"):
        FusedLinearGRPOLoss(PolicyLossSettings([RoleSpec(), RoleSpec()]))
