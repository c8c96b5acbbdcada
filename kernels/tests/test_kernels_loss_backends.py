"""Every backend of fused_linear_policy_loss against the naive reference: loss, both gradients, stats."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mopd_kernels import RoleSpec
from kernel_cases import (
    BACKENDS,
    assert_close_grads,
    assert_close_stats,
    make_batch,
    rel_err,
    run_loss,
)

MIXED = [
    RoleSpec("outcome", entropy_coef=0.01, kl_coef=0.1, kl_type="k3", name="leader"),
    RoleSpec("opd", opd_coef=0.5, kl_coef=0.05, kl_type="k1", name="searcher"),
    RoleSpec("outcome", pg_coef=0.5, entropy_coef=0.002, kl_coef=0.2, kl_type="k2", name="answerer"),
]

# name -> (T, H, V, specs, make_batch kwargs, loss kwargs)
CASES = {
    # T and V multiples of no block (V > the interpreter's BLOCK_V = 1024: two online blocks)
    "mixed": (27, 16, 1100, MIXED, {}, {"temperature": 0.7, "chunk_rows": 8}),
    "dual_clip_k3": (29, 12, 301, [RoleSpec("outcome", kl_coef=0.3, kl_type="k3"),
                                   RoleSpec("opd", opd_coef=1.0, kl_coef=0.1, kl_type="k3")],
                     {"drift": 1.5}, {"dual_clip": 3.0, "clip_low": 0.1, "clip_high": 0.28}),
    "dual_clip_k1": (29, 12, 301, [RoleSpec("outcome", kl_coef=0.3, kl_type="k1")],
                     {"drift": 1.5}, {"dual_clip": 2.0, "chunk_rows": 7}),
    "single_token": (1, 8, 67, [RoleSpec("outcome", entropy_coef=0.1)], {"role_probs": [0, 1]},
                     {"temperature": 1.3}),
    "vocab_smaller_than_hidden": (19, 40, 33, MIXED, {}, {"chunk_rows": 5}),
    "no_chunking_hint": (41, 16, 517, MIXED, {"role_probs": [0.1, 0.3, 0.3, 0.3]}, {}),
    # the paper's no_searcher_supervision: a role whose coefficients are all 0 still counts in the mean
    "silent_role": (23, 8, 200, [RoleSpec("outcome"), RoleSpec("opd", pg_coef=0.0)],
                    {"role_probs": [0.2, 0.4, 0.4], "ref": False}, {}),
}

TOL = {torch.float32: dict(loss=2e-6, grad=2e-5, stat=1e-5, clip=1e-6),
       torch.bfloat16: dict(loss=2e-2, grad=3e-2, stat=2e-2, clip=0.2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_backend_matches_reference(case, backend, dtype):
    T, H, V, specs, batch_kw, loss_kw = CASES[case]
    batch = make_batch(T, H, V, specs, dtype=dtype, temperature=loss_kw.get("temperature", 1.0), **batch_kw)
    want = run_loss(batch, "reference", **loss_kw)
    got = run_loss(batch, backend, **loss_kw)
    tol = TOL[dtype]
    assert got[0].dtype == torch.float32 and got[0].dim() == 0
    assert abs(float(got[0]) - float(want[0])) <= tol["loss"] * max(1.0, abs(float(want[0])))
    assert_close_grads(got[1], want[1], tol["grad"])
    assert_close_grads(got[2], want[2], tol["grad"])
    assert_close_stats(got[3], want[3], tol["stat"], tol["clip"])


def test_cases_exercise_clipping_and_dual_clip():
    """The dual-clip cases really take the clipped branches (else they would test nothing)."""
    T, H, V, specs, batch_kw, loss_kw = CASES["dual_clip_k3"]
    batch = make_batch(T, H, V, specs, **batch_kw)
    _, _, _, stats = run_loss(batch, "torch", **loss_kw)
    assert 0 < float(stats[0]["clip_frac"]) < 1
    no_dual = run_loss(batch, "torch", **{k: v for k, v in loss_kw.items() if k != "dual_clip"})
    with_dual = run_loss(batch, "torch", **loss_kw)
    assert float(no_dual[0]) != pytest.approx(float(with_dual[0]))


@pytest.mark.parametrize("backend", BACKENDS + ["reference"])
def test_no_trained_token_gives_zero_loss_and_grads(backend):
    batch = make_batch(13, 8, 150, MIXED)
    batch.roles = torch.full_like(batch.roles, -1)
    loss, gh, gw, stats = run_loss(batch, backend)
    assert float(loss) == 0.0
    assert torch.equal(gh, torch.zeros_like(gh)) and torch.equal(gw, torch.zeros_like(gw))
    for r in stats:
        assert all(math.isfinite(float(v)) for v in stats[r].values())
        assert float(stats[r]["tokens"]) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_advantages(backend):
    """A = 0 everywhere: the surrogate is 0, only the entropy term moves the weights."""
    specs = [RoleSpec("outcome"), RoleSpec("outcome", entropy_coef=0.05)]
    batch = make_batch(21, 8, 300, specs, ref=False, teacher=False, drift=1.0)
    batch.advantages = torch.zeros_like(batch.advantages)
    want = run_loss(batch, "reference")
    got = run_loss(batch, backend)
    assert float(got[3][0]["pg_loss"]) == 0.0 and float(got[3][0]["clip_frac"]) == 0.0
    assert float(got[0]) == pytest.approx(float(want[0]), abs=1e-6)
    assert_close_grads(got[1], want[1], 2e-5)
    assert_close_grads(got[2], want[2], 2e-5)
    batch.roles = torch.where(batch.roles == 1, torch.zeros_like(batch.roles), batch.roles)
    only_pg = run_loss(batch, backend)
    assert float(only_pg[0]) == 0.0 and not only_pg[1].any() and not only_pg[2].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_very_negative_teacher_logprobs(backend):
    """A teacher that gives the sampled token ~0 probability: big negative OPD advantages, no NaN."""
    specs = [RoleSpec("opd", opd_coef=0.01, entropy_coef=0.01), RoleSpec("outcome")]
    batch = make_batch(25, 8, 400, specs, ref=False)
    batch.teacher_logp = torch.full_like(batch.teacher_logp, -1e4)
    batch.teacher_logp[::3] = -80.0
    for dual in (None, 3.0):
        want = run_loss(batch, "reference", dual_clip=dual)
        got = run_loss(batch, backend, dual_clip=dual)
        assert math.isfinite(float(got[0]))
        assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-5)
        assert float(got[3][0]["advantage_mean"]) < -50
        assert_close_grads(got[1], want[1], 2e-5)
        assert_close_grads(got[2], want[2], 2e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_normalizer_number_and_tensor(backend):
    """The caller's global count replaces the local one; a tensor normaliser gives the same result."""
    batch = make_batch(31, 8, 260, MIXED)
    local = run_loss(batch, backend)
    n_local = int((batch.roles >= 0).sum())
    for norm in (4 * n_local, torch.tensor(4.0 * n_local)):
        got = run_loss(batch, backend, normalizer=norm)
        assert float(got[0]) == pytest.approx(float(local[0]) / 4, rel=1e-6)
        assert rel_err(got[1] * 4, local[1]) < 1e-6
        assert rel_err(got[2] * 4, local[2]) < 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_upstream_gradient_scales_the_stored_gradients(backend):
    batch = make_batch(17, 8, 120, MIXED)
    base = run_loss(batch, backend)
    h = batch.hidden.clone().requires_grad_(True)
    w = batch.weight.clone().requires_grad_(True)
    from mopd_kernels import fused_linear_policy_loss

    loss, _ = fused_linear_policy_loss(h, w, batch.targets, batch.inputs(), batch.settings(backend))
    (-2.5 * loss).backward()
    assert rel_err(h.grad, -2.5 * base[1]) < 1e-6
    assert rel_err(w.grad, -2.5 * base[2]) < 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_frozen_weight_and_no_grad(backend):
    """Only the gradients that are needed are made; under no_grad the loss and stats still come out."""
    from mopd_kernels import fused_linear_policy_loss

    batch = make_batch(19, 8, 140, MIXED)
    full = run_loss(batch, backend)
    h = batch.hidden.clone().requires_grad_(True)
    args = (batch.targets, batch.inputs(), batch.settings(backend))
    loss, _ = fused_linear_policy_loss(h, batch.weight, *args)
    loss.backward()
    assert rel_err(h.grad, full[1]) < 1e-6
    with torch.no_grad():
        loss2, stats2 = fused_linear_policy_loss(h, batch.weight.clone().requires_grad_(True), *args)
    assert not loss2.requires_grad
    assert float(loss2) == pytest.approx(float(full[0]), rel=1e-6)
    assert float(stats2[1]["tokens"]) == float(full[3][1]["tokens"])


def test_reference_matches_hand_computed_tokens():
    """The ground truth itself, against the formulas evaluated by hand for three tokens."""
    from mopd_kernels import LossInputs, PolicyLossSettings, fused_linear_policy_loss

    torch.manual_seed(3)
    hidden = torch.randn(3, 4, dtype=torch.float64)
    weight = torch.randn(6, 4, dtype=torch.float64)
    targets = torch.tensor([1, 5, 2])
    logits = hidden @ weight.T
    logp_all = logits.log_softmax(-1)
    logp = [float(logp_all[i, targets[i]]) for i in range(3)]
    ent = [float(-(logp_all[i].exp() * logp_all[i]).sum()) for i in range(3)]
    old = torch.tensor([logp[0] - 0.5, logp[1] + 0.05, logp[2]], dtype=torch.float64)
    adv = torch.tensor([1.5, -2.0, 9.0], dtype=torch.float64)
    teacher = torch.tensor([0.0, 0.0, logp[2] - 3.0], dtype=torch.float64)
    ref = torch.tensor([logp[0] + 0.1, logp[1] - 0.2, 0.0], dtype=torch.float64)
    specs = [RoleSpec("outcome", entropy_coef=0.1, kl_coef=0.5, kl_type="k3"),
             RoleSpec("opd", opd_coef=0.01, kl_coef=0.0)]
    roles = torch.tensor([0, 0, 1])

    def clip(x, lo, hi):
        return min(max(x, lo), hi)

    total = 0.0
    for i, (A, r) in enumerate([(1.5, 0), (-2.0, 0), (0.01 * (-3.0), 1)]):
        ratio = math.exp(logp[i] - float(old[i]))
        pg = max(-A * ratio, -A * clip(ratio, 0.8, 1.2))
        if r == 0:
            d = float(ref[i]) - logp[i]
            total += pg - 0.1 * ent[i] + 0.5 * (math.exp(d) - d - 1)
        else:
            total += pg
    loss, stats = fused_linear_policy_loss(hidden, weight, targets, LossInputs(roles, old, adv, teacher, ref),
                                           PolicyLossSettings(specs, backend="reference"))
    assert float(loss) == pytest.approx(total / 3, rel=1e-6)  # the reference computes in fp32
    assert float(stats[0]["clip_frac"]) == 0.5  # token 0 (ratio e^0.5, A > 0) is clipped
    assert float(stats[1]["advantage_mean"]) == pytest.approx(-0.03)
    assert float(stats[1]["opd_log_ratio"]) == pytest.approx(-3.0)


@settings(max_examples=15, deadline=None)
@given(T=st.integers(1, 24), H=st.integers(1, 9), V=st.integers(2, 90), chunk=st.integers(1, 30),
       temperature=st.sampled_from([0.5, 1.0, 1.7]), dual=st.sampled_from([None, 1.5, 4.0]),
       seed=st.integers(0, 2**16))
def test_torch_backend_property(T, H, V, chunk, temperature, dual, seed):
    """Random small shapes, chunkings and options: the torch path equals the reference."""
    batch = make_batch(T, H, V, MIXED, seed=seed, temperature=temperature, drift=1.0)
    kw = dict(temperature=temperature, dual_clip=dual, chunk_rows=chunk)
    want = run_loss(batch, "reference", **kw)
    got = run_loss(batch, "torch", **kw)
    assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-5, abs=1e-6)
    assert_close_grads(got[1], want[1], 1e-4)
    assert_close_grads(got[2], want[2], 1e-4)
    assert_close_stats(got[3], want[3], 1e-5, 1e-6)


def test_strided_hidden_and_int32_indices():
    batch = make_batch(15, 8, 90, MIXED)
    want = run_loss(batch, "reference")
    wide = torch.randn(15, 16)
    wide[:, ::2] = batch.hidden
    batch.hidden = wide[:, ::2]  # non-contiguous rows
    batch.targets = batch.targets.int()
    batch.roles = batch.roles.int()
    got = run_loss(batch, "torch")
    assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-6)
    assert_close_grads(got[1], want[1], 1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp16_inputs(backend):
    """fp16 hidden/weight (logits in fp16, softmax in fp32), against the reference."""
    batch = make_batch(17, 16, 300, MIXED, dtype=torch.float16)
    want = run_loss(batch, "reference", temperature=0.8)
    got = run_loss(batch, backend, temperature=0.8)
    assert got[1].dtype == torch.float16 and got[2].dtype == torch.float16
    assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-3, abs=1e-5)
    assert_close_grads(got[1], want[1], 1e-2)
    assert_close_grads(got[2], want[2], 1e-2)


def test_second_backward_through_the_same_loss_is_refused():
    batch = make_batch(9, 8, 40, MIXED)
    from mopd_kernels import fused_linear_policy_loss

    h = batch.hidden.clone().requires_grad_(True)
    loss, _ = fused_linear_policy_loss(h, batch.weight, batch.targets, batch.inputs(),
                                       batch.settings("torch"))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward per forward"):
        loss.backward()
