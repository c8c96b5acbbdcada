"""A new objective and a new KL estimator, added the way a user adds one: a forward formula and its
registration, nothing else. The fused loss (every backend) then trains with them, with gradients equal
to plain autograd through full logits, and the settings and role specs accept their names."""

import pytest
import torch

from mopd_kernels import (KL_ESTIMATORS, KL_TYPES, OBJECTIVES, LossInputs, PolicyLossSettings, RoleSpec,
                          fused_linear_policy_loss, register_kl_estimator, register_objective)


@pytest.fixture
def added_terms():
    @register_objective("reinforce")
    def reinforce(A, ratio, logp, settings):
        """Plain REINFORCE with the stopped ratio as weight: -sg(rho) A logp."""
        zeros = torch.zeros_like(logp)
        return {"pg": -ratio.detach() * A * logp, "clipped": zeros, "clipped_low": zeros,
                "clipped_high": zeros, "dual_capped": zeros}

    @register_kl_estimator("abs")
    def abs_kl(logp, ref):
        return (logp - ref).abs()

    yield
    OBJECTIVES.pop("reinforce")
    KL_ESTIMATORS.pop("abs")
    KL_TYPES.remove("abs")


def _full_logits_loss(hidden, weight, targets, roles, old, adv, ref, kl_coef, temperature):
    logp_all = torch.log_softmax((hidden.double() @ weight.double().T) / temperature, -1)
    logp = logp_all.gather(1, targets.unsqueeze(1)).squeeze(1)[roles >= 0]
    A, o, r = adv.double()[roles >= 0], old.double()[roles >= 0], ref.double()[roles >= 0]
    per_token = -torch.exp(logp - o).detach() * A * logp + kl_coef * (logp - r).abs()
    return per_token.sum() / len(per_token)


@pytest.mark.parametrize("backend", ["torch", "triton", "reference"])
def test_a_registered_objective_and_estimator_train_through_the_fused_loss(added_terms, backend):
    g = torch.Generator().manual_seed(0)
    T, H, V = 53, 12, 71
    hidden = torch.randn(T, H, generator=g)
    weight = torch.randn(V, H, generator=g)
    targets = torch.randint(0, V, (T,), generator=g)
    roles = torch.where(torch.rand(T, generator=g) < 0.8, 0, -1)
    old, adv, ref = -4 + torch.randn(T, generator=g), torch.randn(T, generator=g), -4 + torch.randn(T, generator=g)
    settings = PolicyLossSettings([RoleSpec(kl_coef=0.3, kl_type="abs")], objective="reinforce", temperature=0.8,
                                  backend=backend)
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    loss, _ = fused_linear_policy_loss(h, w, targets, LossInputs(roles, old, adv, ref_logp=ref), settings)
    loss.backward()
    h64, w64 = hidden.double().requires_grad_(True), weight.double().requires_grad_(True)
    want = _full_logits_loss(h64, w64, targets, roles, old, adv, ref, 0.3, 0.8)
    want.backward()
    assert abs(float(loss) - float(want)) < 1e-5 * max(1.0, abs(float(want)))
    torch.testing.assert_close(h.grad.double(), h64.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=1e-5, rtol=1e-4)


def test_unregistered_names_are_refused(added_terms):
    with pytest.raises(ValueError, match="objective"):
        PolicyLossSettings([RoleSpec()], objective="reinforce2")
    with pytest.raises(ValueError, match="kl_type"):
        RoleSpec(kl_type="abs2")
    assert RoleSpec(kl_type="abs").kl_type == "abs"
