"""The compiled CPU row pass (mopd_kernels.compiled_rows) against the naive reference, the eager
pass it replaces, and its fallbacks.

Most tests lower ``COMPILED_MIN_VOCAB`` so that small odd shapes take the compiled path; they all
use one vocabulary size so that each kernel compiles once per dtype for the file (the first test
pays for importing inductor and compiling: ~15 s cold on a loaded 2-core box, ~5 s with inductor's
on-disk cache; bf16 and the memory check, which compile more, are marked slow)."""

import os
import warnings

import pytest
import torch

from mopd_kernels import (
    RoleSpec,
    chunked,
    compiled_rows,
    fused_linear_policy_loss,
    linear_logprobs,
    reference_linear_logprobs,
)
from kernel_cases import assert_close_grads, assert_close_stats, make_batch, run_loss

V = 1100  # one vocabulary for the file: one compilation per kernel and dtype
SPECS = [
    RoleSpec("outcome", entropy_coef=0.01, kl_coef=0.1, kl_type="k3"),
    RoleSpec("opd", opd_coef=0.5, kl_coef=0.05, kl_type="k1"),
    RoleSpec("outcome", pg_coef=0.5, entropy_coef=0.002, kl_coef=0.2, kl_type="k2"),
]
TOL = {torch.float32: dict(loss=2e-6, grad=2e-5, stat=1e-5, clip=1e-6, logp=2e-5),
       torch.bfloat16: dict(loss=2e-2, grad=3e-2, stat=2e-2, clip=0.2, logp=2e-5)}


@pytest.fixture
def compiled_calls(monkeypatch):
    """Lower the vocabulary threshold to 0 and count the compiled kernels' calls."""
    monkeypatch.setattr(compiled_rows, "COMPILED_MIN_VOCAB", 0)
    monkeypatch.setenv("MOPD_KERNELS_COMPILE", "1")
    calls = []
    run = compiled_rows._run

    def counting(name, *args):
        calls.append(name)
        return run(name, *args)
    monkeypatch.setattr(compiled_rows, "_run", counting)
    return calls


def test_exp_nonpositive_is_exp_to_a_few_ulp():
    x = torch.cat([torch.linspace(-100.0, 0.5, 200_001), torch.tensor([0.0, -1e-8, -88.0, -88.4, -88.6, -1e30])])
    got = compiled_rows.exp_nonpositive(x).double()
    want = torch.exp(x.double())
    normal = want > 2 ** -126
    assert float(((got - want) / want)[normal].abs().max()) < 2.5e-7
    assert float(got[~normal].abs().max()) <= 2 ** -126  # underflow: 0 or a normal float's worth
    assert float(got[x <= -88.5].abs().max()) == 0.0 and torch.isfinite(got).all()


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)],
                         ids=["fp32", "bf16"])
@pytest.mark.parametrize("with_entropy", [True, False], ids=["entropy", "no_entropy"])
def test_scoring_pass_matches_the_reference(compiled_calls, dtype, with_entropy):
    """T=53 over chunks of 16 (a short last chunk), temperature 0.6, ignore-index targets (-100, -1, -7)."""
    T, H = 53, 24
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(T, H, generator=g).to(dtype)
    weight = torch.randn(V, H, generator=g).to(dtype)
    targets = torch.randint(0, V, (T,), generator=g)
    targets[[0, 17, 52]] = torch.tensor([-100, -1, -7])
    with torch.no_grad():
        logp, ent = linear_logprobs(hidden, weight, targets, temperature=0.6, with_entropy=with_entropy,
                                    backend="torch", chunk_rows=16)
    want_logp, want_ent = reference_linear_logprobs(hidden, weight, targets, temperature=0.6)
    assert "sums" in compiled_calls
    assert logp[[0, 17, 52]].tolist() == [0.0, 0.0, 0.0]
    torch.testing.assert_close(logp, want_logp, atol=TOL[dtype]["logp"], rtol=1e-5)
    if with_entropy:
        torch.testing.assert_close(ent, want_ent, atol=2e-5, rtol=1e-5)
    else:
        assert ent is None


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)],
                         ids=["fp32", "bf16"])
def test_logprobs_gradients_match_the_reference(compiled_calls, dtype):
    """d/d(hidden, weight) of sum(a logp + b H), random a and b, a padding target, temperature 1.3."""
    T, H = 21, 12
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(T, H, generator=g).to(dtype)
    weight = (torch.randn(V, H, generator=g) * 0.5).to(dtype)
    targets = torch.randint(0, V, (T,), generator=g)
    targets[4] = -100
    a, b = torch.randn(T, generator=g), torch.randn(T, generator=g)
    grads = []
    for backend in ("torch", "reference"):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        logp, ent = linear_logprobs(h, w, targets, temperature=1.3, backend=backend, chunk_rows=8)
        (a * logp + b * ent).sum().backward()
        grads.append((h.grad, w.grad))
    assert "grads" in compiled_calls
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    assert_close_grads(grads[0][0], grads[1][0], tol)
    assert_close_grads(grads[0][1], grads[1][1], tol)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)],
                         ids=["fp32", "bf16"])
@pytest.mark.parametrize("temperature, chunk_rows, dual_clip", [(1.0, None, None), (0.7, 9, 3.0)])
def test_loss_matches_the_reference(compiled_calls, dtype, temperature, chunk_rows, dual_clip):
    """Three roles with entropy and KL terms, ~1/4 of the 67 rows role -1, odd chunking."""
    batch = make_batch(67, 16, V, SPECS, dtype=dtype, seed=11, temperature=temperature, drift=1.0)
    kwargs = dict(temperature=temperature, chunk_rows=chunk_rows, dual_clip=dual_clip)
    got = run_loss(batch, "torch", **kwargs)
    want = run_loss(batch, "reference", **kwargs)
    assert compiled_calls.count("grads") >= 1
    tol = TOL[dtype]
    assert abs(float(got[0]) - float(want[0])) <= tol["loss"] * max(1.0, abs(float(want[0])))
    assert_close_grads(got[1], want[1], tol["grad"])
    assert_close_grads(got[2], want[2], tol["grad"])
    assert_close_stats(got[3], want[3], tol["stat"], tol["clip"])


def test_loss_without_entropy_terms_and_frozen_weight(compiled_calls):
    """No role has an entropy bonus (the gradient's entropy term is off); weight frozen; no grad."""
    specs = [RoleSpec("outcome", kl_coef=0.04, kl_type="k3"), RoleSpec("opd", opd_coef=0.2)]
    batch = make_batch(45, 8, V, specs, seed=2)
    h = batch.hidden.clone().requires_grad_(True)
    loss, _ = fused_linear_policy_loss(h, batch.weight, batch.targets, batch.inputs(), batch.settings("torch"))
    loss.backward()
    h_ref = batch.hidden.clone().requires_grad_(True)
    loss_ref, _ = fused_linear_policy_loss(h_ref, batch.weight, batch.targets, batch.inputs(),
                                           batch.settings("reference"))
    loss_ref.backward()
    assert abs(float(loss.detach()) - float(loss_ref.detach())) <= 2e-6 * max(1.0, abs(float(loss_ref.detach())))
    assert_close_grads(h.grad, h_ref.grad, 2e-5)
    with torch.no_grad():
        loss_ng, _ = fused_linear_policy_loss(batch.hidden, batch.weight, batch.targets, batch.inputs(),
                                              batch.settings("torch"))
    assert abs(float(loss_ng) - float(loss_ref.detach())) <= 2e-6 * max(1.0, abs(float(loss_ref.detach())))


def test_new_chunk_sizes_reuse_the_compiled_code(compiled_calls):
    """The row count is dynamic: after one call, other chunk sizes run without recompiling."""
    g = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(90, 8, generator=g), torch.randn(V, 8, generator=g)
    targets = torch.randint(0, V, (90,), generator=g)
    with torch.no_grad():
        linear_logprobs(hidden, weight, targets, with_entropy=False, backend="torch", chunk_rows=32)
        with torch._dynamo.config.patch(error_on_recompile=True):
            for rows in (17, 40, 90):
                linear_logprobs(hidden, weight, targets, with_entropy=False, backend="torch", chunk_rows=rows)


def test_small_vocabularies_keep_the_eager_bits():
    """Below COMPILED_MIN_VOCAB (the tiny demo's V of about 1k) the default row pass is the eager
    one, bit for bit: loss, both gradients and the scoring pass."""
    assert V < compiled_rows.COMPILED_MIN_VOCAB
    batch = make_batch(70, 16, V, SPECS, seed=4, temperature=0.8)
    settings = dict(temperature=0.8, chunk_rows=24)
    eager = chunked.TorchRowPass
    got = run_loss(batch, "torch", **settings)
    with pytest.MonkeyPatch.context() as mp:
        from mopd_kernels import ops

        mp.setattr(ops, "row_pass_for", lambda backend: eager())
        want = run_loss(batch, "torch", **settings)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    loop = chunked.ChunkLoop(eager(), 0.8, 24)
    with torch.no_grad():
        logp, _ = linear_logprobs(batch.hidden, batch.weight, batch.targets, temperature=0.8, with_entropy=False,
                                  backend="torch", chunk_rows=24)
    assert torch.equal(logp, chunked.logprobs_forward(batch.hidden, batch.weight, batch.targets, loop)[0])


def test_compile_failure_falls_back_to_the_eager_pass(compiled_calls, monkeypatch):
    """A compiler that fails (no C++ toolchain, say): one warning, the eager pass's results, and no
    second attempt."""
    monkeypatch.setattr(compiled_rows, "_FAILED", [])
    attempts = []

    def broken(name):
        attempts.append(name)
        raise RuntimeError("no working C++ compiler found")
    monkeypatch.setattr(compiled_rows, "_kernel", broken)
    batch = make_batch(30, 8, V, SPECS, seed=6)
    with pytest.warns(RuntimeWarning, match="compiled CPU row pass is unavailable"):
        got = run_loss(batch, "torch")
    want = run_loss(batch, "reference")
    assert attempts == ["sums"]
    assert_close_grads(got[1], want[1], 2e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_loss(batch, "torch")
    assert attempts == ["sums"]


def test_switched_off_by_the_environment(compiled_calls, monkeypatch):
    monkeypatch.setenv("MOPD_KERNELS_COMPILE", "0")
    batch = make_batch(20, 8, V, SPECS, seed=8)
    run_loss(batch, "torch")
    assert compiled_calls == []


@pytest.mark.slow  # compiles for another vocabulary: ~15 s on a loaded box
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc")
def test_compiled_pass_allocates_nothing_of_the_chunks_size():
    """The compiled sweeps work in place: resident memory grows by far less than one [C, V] fp32
    tensor (64 MiB here) during the sums and the gradient write of a chunk. (The eager pass is
    measured by memtrack; compiled code allocates outside the dispatcher, so RSS it is.)"""
    C, Vb = 512, 32768
    assert Vb >= compiled_rows.COMPILED_MIN_VOCAB
    g = torch.Generator().manual_seed(0)
    z = torch.randn(C, Vb, generator=g) * 3
    targets = torch.randint(0, Vb, (C,), generator=g)
    row_pass = compiled_rows.CompiledRowPass()
    out = [torch.empty(C) for _ in range(3)]
    with torch.no_grad():
        row_pass.stats(z, targets, 1.0, *out)  # compiles (untimed, unmeasured)
        row_pass.logprobs_grad(z.clone(), targets, 1.0, out[2], out[1], torch.randn(C), torch.randn(C))

    def status_kib(field):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_kib("VmRSS")
    with torch.no_grad():
        row_pass.stats(z, targets, 1.0, *out)
        row_pass.logprobs_grad(z, targets, 1.0, out[2], out[1], torch.randn(C), torch.randn(C))
    grown_mib = (status_kib("VmHWM") - before) / 1024
    assert grown_mib < 16, grown_mib
    assert torch.isfinite(z).all()
