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
    sampling = logp + 0.5 * torch.randn(B, T, generator=g)   # a vLLM-like sampler's log-probs
    sampling[0, 3] = float("nan")                             # a token it could not score
    is_ratio = torch.exp(0.2 * torch.randn(B, T, generator=g)).clamp(max=2.0)
    is_ratio = torch.where(mask, is_ratio, torch.ones_like(is_ratio))  # TRL's is exp(0) off the mask
    is_ratio[1, 2] = 0.0                                      # token_mask mode drops a token: log 0 -> ln 1e-8
    return dict(hidden=hidden, weight=weight, targets=targets, mask=mask, old=old, ref=ref, adv=adv,
                sampling=sampling, is_ratio=is_ratio)


def entropy_filter(b, quantile):
    """TRL's get_high_entropy_mask on one process: tokens whose entropy is at least the (1 - quantile)
    quantile of the masked tokens' entropies."""
    _, entropies = _logps_entropies(b["hidden"], b["weight"], b["targets"])
    m = b["mask"]
    threshold = torch.quantile(entropies[m], 1 - quantile)
    return (entropies * m >= threshold) & m


def vespo_phi(advantages, log_ratio, mask, is_ratio, k_pos=2.0, lambda_pos=3.0, k_neg=3.0, lambda_neg=2.0):
    """VESPO's gamma weight phi(w) = exp(lambda + k log w - lambda w) of each sequence, (B, 1), detached."""
    lo = torch.log(torch.tensor(1e-8, dtype=torch.float64))
    seq = (log_ratio.detach().clamp(-20, 20) * mask).sum(-1, keepdim=True)
    if is_ratio is not None:
        seq = seq + torch.log(is_ratio).clamp(lo, 20).sum(-1, keepdim=True)
    log_w = seq.clamp(lo, 20)
    pos = advantages >= 0
    k = torch.where(pos, k_pos, k_neg)
    lam = torch.where(pos, lambda_pos, lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def _logps_entropies(hidden, weight, targets):
    logits = (hidden.double() @ weight.double().T) / TEMPERATURE
    logp_all = torch.log_softmax(logits, -1)
    logps = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logps, -(logp_all.exp() * logp_all).sum(-1)


def trl_loss(b, loss_type, beta, entropy_coef, level="token", bias_correction=True, delta=None,
             on_policy=False, num_items=None, max_completion_length=16, off_policy=None, top_entropy=None,
             vllm_is=False):
    """TRL 1.16's GRPOTrainer._compute_loss (one micro-batch, no accumulation), in float64: with the
    off-policy sequence mask (threshold ``off_policy``), the entropy filter (``top_entropy`` < 1), and
    vLLM's importance-sampling ratio (``vllm_is``)."""
    hidden = b["hidden"].double().requires_grad_(True)
    weight = b["weight"].double().requires_grad_(True)
    per_token_logps, entropies = _logps_entropies(hidden, weight, b["targets"])
    mask = b["mask"].double()
    advantages = b["adv"].double()
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    old = per_token_logps.detach() if on_policy else b["old"].double()
    is_ratio = b["is_ratio"].double() if vllm_is else None
    if off_policy is not None:
        drift = torch.nan_to_num(b["sampling"].double() - per_token_logps.detach(), nan=0.0)
        avg = (drift * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
        off_policy_mask = ((advantages >= 0) | (avg <= off_policy)).double()
    effective_mask = mask
    if top_entropy is not None:
        high = entropy_filter(b, top_entropy).double()
        effective_mask = mask * high
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
    elif loss_type == "vespo":
        per_token_loss = -vespo_phi(advantages, log_ratio, mask, is_ratio) * advantages * per_token_logps
    else:
        coef_2 = torch.clamp(coef_1, 1 - EPS_LOW, 1 + EPS_HIGH)
        if delta is not None:
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    if off_policy is not None:
        per_token_loss = per_token_loss * off_policy_mask
    if top_entropy is not None:
        per_token_loss = per_token_loss * high
    if vllm_is and loss_type != "vespo":
        per_token_loss = per_token_loss * is_ratio
    if beta != 0.0:
        per_token_loss = per_token_loss + beta * per_token_kl
    if loss_type in ("grpo", "sapo"):
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    elif loss_type == "luspo":
        loss = (per_token_loss * mask).sum(-1).mean()
    else:  # dapo, cispo, vespo
        loss = (per_token_loss * mask).sum() / num_items
    if entropy_coef:
        loss = loss - entropy_coef * (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


AGG = {"grpo": "grpo", "sapo": "grpo", "bnpo": "bnpo", "dr_grpo": "dr_grpo", "dapo": "token-mean",
       "cispo": "token-mean", "luspo": "luspo", "vespo": "token-mean"}


def fused_loss(b, loss_type, beta, entropy_coef, level="token", bias_correction=True, delta=None,
               on_policy=False, num_items=None, max_completion_length=16, backend="torch", off_policy=None,
               top_entropy=None, vllm_is=False):
    objective = {"cispo": "cispo", "sapo": "sapo", "vespo": "vespo"}.get(loss_type, "ppo")
    settings = PolicyLossSettings(
        [RoleSpec(kl_coef=beta, kl_type="k3", entropy_coef=entropy_coef)], clip_low=EPS_LOW, clip_high=EPS_HIGH,
        dual_clip=delta, temperature=TEMPERATURE, backend=backend, objective=objective,
        importance_sampling=level, kl_bias_correction=bias_correction,
        cispo_max_weight=EPS_HIGH if loss_type == "cispo" else None, off_policy_threshold=off_policy)
    aggregation = Aggregation(AGG[loss_type], global_tokens=num_items, max_completion_length=max_completion_length)
    loss_fn = FusedLinearGRPOLoss(settings, aggregation, entropy_aggregation=Aggregation("bnpo"))
    hidden = b["hidden"].clone().requires_grad_(True)
    weight = b["weight"].clone().requires_grad_(True)
    completions = Completions(b["targets"], b["mask"], b["adv"], old_logp=None if on_policy else b["old"],
                              ref_logp=b["ref"] if beta else None, pg_scale=b["is_ratio"] if vllm_is else None,
                              sampling_logp=b["sampling"] if off_policy is not None else None,
                              entropy_filter=None if top_entropy is None else entropy_filter(b, top_entropy))
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
    dict(loss_type="luspo", beta=0.04, entropy_coef=0.01, level="sequence"),       # LUSPO, as its paper runs it
    dict(loss_type="luspo", beta=0.0, entropy_coef=0.0),
    dict(loss_type="vespo", beta=0.0, entropy_coef=0.0, num_items=31.0),
    dict(loss_type="vespo", beta=0.04, entropy_coef=0.01, num_items=31.0, vllm_is=True),
    dict(loss_type="grpo", beta=0.04, entropy_coef=0.0, off_policy=0.1),          # DeepSeek-V3.2's mask
    dict(loss_type="dapo", beta=0.0, entropy_coef=0.01, off_policy=-0.05, level="sequence", num_items=31.0),
    dict(loss_type="grpo", beta=0.04, entropy_coef=0.01, top_entropy=0.4),        # the entropy filter
    dict(loss_type="dapo", beta=0.0, entropy_coef=0.02, top_entropy=0.7, vllm_is=True, num_items=31.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_fused_loss_equals_trl_formula(case):
    b = _batch(seed=len(str(case)))
    want_loss, want_gh, want_gw = trl_loss(b, **case)
    got_loss, got_gh, got_gw, stats = fused_loss(b, **case)
    assert abs(float(got_loss) - float(want_loss)) <= 1e-5 * max(1.0, abs(float(want_loss))), (got_loss, want_loss)
    assert _rel(got_gh, want_gh) < 1e-5 and _rel(got_gw, want_gw) < 1e-5
    assert float(stats["tokens"]) == float(b["mask"].sum())


@pytest.mark.parametrize("case", [CASES[1], CASES[6], CASES[9], CASES[16], CASES[17], CASES[19]],
                         ids=["grpo-kl", "gspo-kl", "cispo-seq", "vespo-is", "off-policy", "entropy-filter"])
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
        PolicyLossSettings([RoleSpec()], objective="gpg")
    with pytest.raises(ValueError, match="off_policy_threshold"):
        PolicyLossSettings([RoleSpec()], off_policy_threshold=float("nan"))
    with pytest.raises(ValueError, match="vespo_params"):
        PolicyLossSettings([RoleSpec()], objective="vespo", vespo_params=(2.0, 3.0, 3.0))
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


def test_the_new_options_change_the_loss():
    """The off-policy mask, the entropy filter, luspo and vespo are not the plain grpo loss by accident."""
    b = _batch(seed=5)
    plain = float(trl_loss(b, "grpo", 0.0, 0.0)[0])
    for case in (dict(off_policy=0.0), dict(top_entropy=0.5)):
        assert abs(float(fused_loss(b, "grpo", 0.0, 0.0, **case)[0]) - plain) > 1e-4, case
    assert abs(float(fused_loss(b, "luspo", 0.0, 0.0)[0]) - plain) > 1e-4
    assert abs(float(fused_loss(b, "vespo", 0.0, 0.0, num_items=31.0)[0])
               - float(fused_loss(b, "dapo", 0.0, 0.0, num_items=31.0)[0])) > 1e-4


def test_vespo_logs_trls_phi_mean():
    """``seq_weight_mean`` is the mean of phi over the sequences with tokens (TRL's ``vespo/phi_seq_mean``
    counts an empty completion's phi, 1, too: the trainer adds it)."""
    b = _batch(seed=6)
    *_, stats = fused_loss(b, "vespo", 0.0, 0.0, num_items=31.0)
    logps, _ = _logps_entropies(b["hidden"], b["weight"], b["targets"])
    A = b["adv"].double().unsqueeze(1)
    phi = vespo_phi(A, logps - b["old"].double(), b["mask"].double(), None).squeeze(1)
    present = b["mask"].any(1)
    assert abs(float(stats["seq_weight_mean"]) - float(phi[present].mean())) < 1e-5
    assert float(phi[~present].max()) == 1.0
