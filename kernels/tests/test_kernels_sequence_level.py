"""Sequence-level importance sampling with CISPO and SAPO is computed, not refused: every token of a
sequence takes the sequence's ratio ``rho_s = exp(mean over its tokens of logp - old_logp)``, CISPO
weights the token's REINFORCE term by ``sg(min(rho_s, cap))`` and SAPO gates by
``sigmoid(tau (rho_s - 1))`` (TRL's formulas with its ``(B, 1)`` ratio). Checked on every backend
against float64 logits; and the per-sequence stats (TRL's clip_ratio/low_min, high_max) and
``policy_loss`` against numbers worked out by hand."""

import pytest
import torch

from mopd_kernels import LossInputs, PolicyLossSettings, RoleSpec, fused_linear_policy_loss

BACKENDS = ["torch", "triton", "reference"]


@pytest.mark.parametrize("objective", ["cispo", "sapo"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_sequence_level_cispo_and_sapo(backend, objective):
    T, H, V = 47, 12, 173
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(T, H, generator=g, dtype=torch.float64)
    weight = 0.5 * torch.randn(V, H, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (T,), generator=g)
    roles = torch.randint(-1, 1, (T,), generator=g)
    seq = torch.arange(T) // 8
    adv = torch.randn(T, generator=g, dtype=torch.float64)
    with torch.no_grad():
        logp0 = torch.log_softmax(hidden @ weight.T, -1).gather(1, targets.unsqueeze(1)).squeeze(1)
    old = logp0 + 0.4 * torch.randn(T, generator=g, dtype=torch.float64)
    cap, (t_pos, t_neg) = 1.1, (1.0, 1.05)

    h64 = hidden.clone().requires_grad_(True)
    logp = torch.log_softmax(h64 @ weight.T, -1).gather(1, targets.unsqueeze(1)).squeeze(1)
    on = roles >= 0
    sums = torch.zeros(int(seq.max()) + 1, dtype=torch.float64).index_add(0, seq[on], (logp - old)[on])
    counts = torch.zeros_like(sums).index_add(0, seq[on], torch.ones(int(on.sum()), dtype=torch.float64))
    rho = torch.exp((sums / counts.clamp(min=1))[seq])
    if objective == "cispo":
        per_token = -rho.clamp(max=cap).detach() * adv * logp
    else:
        tau = torch.where(adv > 0, torch.full_like(adv, t_pos), torch.full_like(adv, t_neg))
        per_token = -adv * torch.sigmoid(tau * (rho - 1)) * 4 / tau
    expected = per_token[on].sum() / on.sum()
    expected.backward()

    settings = PolicyLossSettings([RoleSpec()], objective=objective, importance_sampling="sequence",
                                  cispo_max_weight=cap, sapo_temperatures=(t_pos, t_neg), backend=backend,
                                  chunk_rows=16)
    h = hidden.float().requires_grad_(True)
    loss, _ = fused_linear_policy_loss(h, weight.float(), targets,
                                       LossInputs(roles, old.float(), adv.float(), sequence_ids=seq), settings)
    loss.backward()
    torch.testing.assert_close(loss.double(), expected.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h.grad.double(), h64.grad, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_sequences", [None, 3])
def test_per_sequence_clip_extremes_and_policy_loss_by_hand(backend, n_sequences):
    """Log-ratios set through ``old_logp`` (every logp is -log V: zero weights), clip 0.2, no KL or
    entropy. Role 0: sequence 0 has both tokens clipped below (A = -1, ratio e^-1), sequence 1 one of
    two (A = -2); so low_min 0.5, high_max 0. Role 1: sequence 2 both tokens clipped above (A = 0.5,
    ratio e), sequence 0 none; so low_min 0, high_max 1. ``pg = max(-A r, -A clip(r, 0.8, 1.2))``."""
    T, H, V = 7, 4, 11
    hidden, weight = torch.zeros(T, H), torch.zeros(V, H)
    targets = torch.arange(T) % V
    logp = -torch.log(torch.tensor(float(V)))
    log_ratio = torch.tensor([-1.0, -1.0, 0.0, -1.0, 1.0, 1.0, 0.0])
    adv = torch.tensor([-1.0, -1.0, 2.0, -2.0, 0.5, 0.5, 3.0])
    roles = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    seq = torch.tensor([0, 0, 1, 1, 2, 2, 0])
    inputs = LossInputs(roles, logp - log_ratio, adv, sequence_ids=seq, n_sequences=n_sequences)
    settings = PolicyLossSettings([RoleSpec(), RoleSpec()], clip_low=0.2, clip_high=0.2, backend=backend)
    loss, stats = fused_linear_policy_loss(hidden, weight, targets, inputs, settings, normalizer=4.0)
    pg = [0.8, 0.8, -2.0, 1.6, -0.6, -0.6, -3.0]
    assert float(stats[0]["clip_low_seq_min"]) == 0.5 and float(stats[0]["clip_high_seq_max"]) == 0.0
    assert float(stats[1]["clip_low_seq_min"]) == 0.0 and float(stats[1]["clip_high_seq_max"]) == 1.0
    assert float(stats[0]["clip_low_frac"]) == pytest.approx(3 / 4)
    assert float(stats[0]["policy_loss"]) == pytest.approx(sum(pg[:4]) / 4.0, abs=1e-6)
    assert float(stats[1]["policy_loss"]) == pytest.approx(sum(pg[4:]) / 4.0, abs=1e-6)
    assert float(loss) == pytest.approx(sum(pg) / 4.0, abs=1e-6)
