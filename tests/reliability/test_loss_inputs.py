"""The fused loss's inputs at their edges (issue 54, items 14-16): a target at or past the vocabulary
is refused in one line while a negative target (the ignore index) still means "no target"; an empty
batch is a loss of 0 with zero gradients; a mask of weights (0.5, 2.0) is taken as weights, as TRL's
``(per_token_loss * mask)`` sums take it, and a negative or non-finite mask is refused in one line."""

import pytest
import torch

from mopd_kernels import (
    Aggregation,
    Completions,
    FusedLinearGRPOLoss,
    LossInputs,
    PolicyLossSettings,
    RoleSpec,
    fused_linear_policy_loss,
    linear_logprobs,
    reference_linear_logprobs,
)

BACKENDS = ["torch", "triton", "reference"]


def _head(T, H, V, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(T, H, generator=g, dtype=torch.float64).to(dtype).requires_grad_(True)
    weight = (0.5 * torch.randn(V, H, generator=g, dtype=torch.float64)).to(dtype).requires_grad_(True)
    return hidden, weight, torch.randint(0, V, (T,), generator=g)


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text, text
    return text


# ---- item 14: targets at or past V ----------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("past", [0, 7])
def test_scoring_refuses_a_target_at_or_past_the_vocabulary(backend, past):
    hidden, weight, targets = _head(19, 12, 131, seed=past)
    targets[11] = 131 + past  # a vocabulary mismatch between the model and the data
    with torch.no_grad(), pytest.raises(ValueError) as err:
        linear_logprobs(hidden, weight, targets, backend=backend, with_entropy=False)
    assert "targets must be < V=131" in _one_line(err) and str(131 + past) in str(err.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_ignore_index_still_means_no_target(backend):
    hidden, weight, targets = _head(23, 12, 97, seed=3)
    targets[[0, 5, 22]] = -100
    logp, _ = linear_logprobs(hidden, weight, targets, backend=backend, with_entropy=False, chunk_rows=8)
    ref, _ = reference_linear_logprobs(hidden.double(), weight.double(), targets)
    assert torch.equal(logp[[0, 5, 22]], torch.zeros(3))
    torch.testing.assert_close(logp.double(), ref, atol=2e-5, rtol=1e-5)
    logp.sum().backward()
    assert torch.equal(hidden.grad[[0, 5, 22]], torch.zeros(3, 12))  # no target: no gradient
    assert hidden.grad[1].abs().sum() > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_loss_refuses_a_target_past_the_vocabulary_even_on_an_untrained_row(backend):
    hidden, weight, targets = _head(17, 8, 61, seed=5)
    roles = torch.zeros(17, dtype=torch.long)
    roles[4] = -1
    targets[4] = 61 + 3  # not trained, but no ignore index either: the data's vocabulary is not the model's
    inputs = LossInputs(roles, None, torch.randn(17))
    settings = PolicyLossSettings([RoleSpec()], backend=backend)
    with pytest.raises(ValueError) as err:
        fused_linear_policy_loss(hidden, weight, targets, inputs, settings)
    assert "targets must be < V=61" in _one_line(err)
    targets[4] = -100  # the ignore index on an untrained row stays accepted
    loss, _ = fused_linear_policy_loss(hidden, weight, targets, inputs, settings)
    assert torch.isfinite(loss)


# ---- item 15: empty batches -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(0, 6), (4, 0), (0, 0)])
def test_an_empty_batch_is_a_zero_loss_with_zero_gradients(backend, shape):
    B, T = shape
    H, V = 10, 53
    hidden = torch.randn(B, T, H, requires_grad=True)
    weight = torch.randn(V, H, requires_grad=True)
    settings = PolicyLossSettings([RoleSpec(kl_coef=0.04, entropy_coef=0.01)], backend=backend)
    loss_fn = FusedLinearGRPOLoss(settings, Aggregation("grpo"))
    completions = Completions(torch.randint(0, V, (B, T)), torch.ones(B, T, dtype=torch.long), torch.randn(B),
                              old_logp=torch.randn(B, T), ref_logp=torch.randn(B, T))
    loss, stats = loss_fn(hidden, weight, completions)
    assert loss.shape == () and float(loss.detach()) == 0.0
    assert float(stats["tokens"]) == 0.0
    loss.backward()
    assert hidden.grad.shape == hidden.shape and torch.equal(weight.grad, torch.zeros_like(weight))


@pytest.mark.parametrize("backend", BACKENDS)
def test_scoring_no_rows_gives_empty_log_probs(backend):
    hidden, weight, targets = _head(0, 8, 40, seed=0)
    logp, entropy = linear_logprobs(hidden, weight, targets, backend=backend)
    assert logp.shape == (0,) and entropy.shape == (0,)


# ---- item 16: non-binary masks ----------------------------------------------------------------------


def _grpo_by_hand(hidden, weight, targets, mask, advantages, old_logp, clip=0.2):
    """TRL's GRPO loss in float64 with the mask as it writes it: ``((l * mask).sum(-1) /
    mask.sum(-1).clamp(min=1)).mean()``, ``l = -min(r A, clip(r) A)``."""
    B, T, H = hidden.shape
    logp, _ = reference_linear_logprobs(hidden.reshape(B * T, H), weight, targets.reshape(B * T))
    ratio = torch.exp(logp.reshape(B, T) - old_logp)
    A = advantages.unsqueeze(1)
    per_token = -torch.minimum(ratio * A, ratio.clamp(1 - clip, 1 + clip) * A)
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mask_of_weights_weighs_the_tokens(backend):
    g = torch.Generator().manual_seed(11)
    B, T, H, V = 3, 7, 12, 89
    hidden = torch.randn(B, T, H, generator=g, dtype=torch.float64)
    weight = 0.5 * torch.randn(V, H, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (B, T), generator=g)
    mask = torch.tensor([[1.0, 0.5, 2.0, 0.0, 1.0, 1.0, 0.5],
                         [2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                         [0.5, 1.0, 1.0, 2.0, 1.0, 0.0, 1.0]])
    advantages = torch.randn(B, generator=g, dtype=torch.float64)
    with torch.no_grad():
        logp, _ = reference_linear_logprobs(hidden.reshape(B * T, H), weight, targets.reshape(B * T))
    old = (logp.reshape(B, T) + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).float()
    h64 = hidden.clone().requires_grad_(True)
    expected = _grpo_by_hand(h64, weight, targets, mask.double(), advantages, old.double())
    expected.backward()
    binary = _grpo_by_hand(hidden, weight, targets, (mask > 0).double(), advantages, old.double())
    assert abs(float(expected.detach()) - float(binary)) > 1e-3  # the weights matter on this batch

    h32 = hidden.float().requires_grad_(True)
    loss_fn = FusedLinearGRPOLoss(PolicyLossSettings([RoleSpec()], backend=backend), Aggregation("grpo"))
    loss, stats = loss_fn(h32, weight.float(), Completions(targets, mask, advantages.float(), old_logp=old))
    loss.backward()
    torch.testing.assert_close(loss.double(), expected.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h32.grad.double(), h64.grad, atol=1e-5, rtol=1e-4)
    assert float(stats["tokens"]) == float((mask > 0).sum())  # stats stay unweighted token means


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_a_negative_or_non_finite_mask_is_refused_in_one_line(bad):
    B, T, H, V = 2, 5, 8, 31
    mask = torch.ones(B, T)
    mask[1, 2] = bad
    loss_fn = FusedLinearGRPOLoss(PolicyLossSettings([RoleSpec()], backend="torch"))
    with pytest.raises(ValueError) as err:
        loss_fn(torch.randn(B, T, H), torch.randn(V, H), Completions(torch.randint(0, V, (B, T)), mask, torch.randn(B)))
    assert "mask must be 0/1 or non-negative finite weights" in _one_line(err)
