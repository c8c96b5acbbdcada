"""How the chunked path sizes its row chunks by default (chunked.chunk_rows_for), and that the
default chunking computes what the reference computes."""

import pytest
import torch

from mopd_kernels import LossInputs, PolicyLossSettings, RoleSpec, fused_linear_policy_loss
from mopd_kernels import chunked
from mopd_kernels.chunked import CPU_FLOOR_MB, CPU_MIN_ROWS, chunk_rows_for
from mopd_kernels.memtrack import TensorMemoryTracker
from kernel_cases import assert_close_grads, make_batch, run_loss

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def no_budget_env(monkeypatch):
    monkeypatch.delenv("MOPD_KERNELS_CHUNK_MB", raising=False)


@pytest.mark.parametrize("H, V", [(512, 32768), (1024, 151936), (2560, 151936), (1000, 50257)])
def test_cpu_chunk_holds_at_most_half_the_weight_gradient(H, V):
    rows = chunk_rows_for(100_003, V, 4, CPU, H=H, element_size=4)
    assert rows * V * 4 <= 0.5 * V * H * 4  # the chunk's fp32 logits vs the [V, H] fp32 gradient
    assert rows >= CPU_MIN_ROWS and rows > 0.45 * H  # and not needlessly small


def test_cpu_chunk_never_falls_below_the_row_floor():
    assert chunk_rows_for(10_000, 32768, 4, CPU, H=16, element_size=4) >= CPU_MIN_ROWS
    assert CPU_MIN_ROWS - 8 <= chunk_rows_for(6144, 50257, 4, CPU, H=256, element_size=4) <= CPU_MIN_ROWS
    # bf16 hidden: half the gradient bytes, 6 bytes per logit in the torch pass
    rows = chunk_rows_for(10_000, 32768, 6, CPU, H=4096, element_size=2)
    assert 0.95 * 0.5 * 4096 * 2 / 6 <= rows <= 0.5 * 4096 * 2 / 6
    assert chunk_rows_for(100, 32768, 4, CPU, H=16) == 100  # never more rows than there are


def test_budget_env_and_other_devices_use_a_fixed_budget(monkeypatch):
    cuda = torch.device("cuda")
    assert chunk_rows_for(8192 * 5, 32768, 2, cuda, H=64) == 512 * 2**20 // (32768 * 2)  # 8192
    monkeypatch.setenv("MOPD_KERNELS_CHUNK_MB", "3")
    assert chunk_rows_for(240, 32768, 4, CPU, H=1024) == 3 * 2**20 // (32768 * 4)  # 24
    assert chunk_rows_for(480, 32768, 2, cuda, H=64) == 3 * 2**20 // (32768 * 2)  # 48
    assert chunk_rows_for(100_000, 32768, 4, CPU, H=1024, chunk_rows=77) == 77


def test_small_vocabularies_stay_in_one_chunk_up_to_the_floor():
    """The tiny demo's lm head (V=1024, H=128): one chunk for a whole 8,192-token micro-batch, as
    before the shape-based sizing (its results stay the same bits); past the floor, chunks again."""
    assert chunk_rows_for(8192, 1024, 4, CPU, H=128, element_size=4) == 8192
    assert (CPU_FLOOR_MB << 20) // (1024 * 4) == 8192
    rows = chunk_rows_for(20_000, 1024, 4, CPU, H=128, element_size=4)
    assert rows <= 8192 and -(-20_000 // rows) == 3


def test_default_chunking_over_several_chunks_matches_the_reference(monkeypatch):
    """T=700 rows, ~520 trained: the default CPU sizing (256 rows, the floor of 32 MiB set aside:
    V=301 would fit one chunk) cuts them into 3 chunks."""
    monkeypatch.setattr(chunked, "CPU_FLOOR_MB", 0)
    specs = [RoleSpec("outcome", entropy_coef=0.01, kl_coef=0.1, kl_type="k3"), RoleSpec("opd", kl_coef=0.05)]
    batch = make_batch(700, 8, 301, specs, seed=3)
    assert chunk_rows_for(int((batch.roles >= 0).sum()), 301, 4, CPU, H=8) < int((batch.roles >= 0).sum())
    want = run_loss(batch, "reference")
    got = run_loss(batch, "torch")
    assert abs(float(got[0]) - float(want[0])) <= 2e-6 * max(1.0, abs(float(want[0])))
    assert_close_grads(got[1], want[1], 2e-5)
    assert_close_grads(got[2], want[2], 2e-5)


def test_default_loss_working_set_is_within_half_the_weight_gradient(monkeypatch):
    """Peak extra memory of forward + backward: the two gradients it returns, plus a chunk working
    set of at most half the weight gradient (and the exp tile). The 32 MiB floor is set aside: at
    this small shape it alone would set the chunk (512 rows)."""
    monkeypatch.setattr(chunked, "CPU_FLOOR_MB", 0)
    T, H, V = 1024, 512, 16384
    g = torch.Generator().manual_seed(0)
    h = torch.randn(T, H, generator=g).requires_grad_(True)
    w = (torch.randn(V, H, generator=g) / H ** 0.5).requires_grad_(True)
    t = torch.randint(0, V, (T,), generator=g)
    roles = torch.where(torch.rand(T, generator=g) < 0.25, -1, 0)
    old = torch.full((T,), -9.0)
    inputs = LossInputs(roles, old, torch.randn(T, generator=g), ref_logp=old)
    settings = PolicyLossSettings([RoleSpec("outcome", entropy_coef=1e-3, kl_coef=0.04)], backend="torch")
    with TensorMemoryTracker() as mem:
        loss, _ = fused_linear_policy_loss(h, w, t, inputs, settings)
        loss.backward()
    grads = (V * H + T * H) * 4
    tiles = 64 * V * 4  # one exp tile of EXP_TILE_ROWS rows
    small = 2 * 2**20  # per-chunk [C, H] gathers, per-token vectors
    assert mem.peak_bytes <= grads + 0.5 * V * H * 4 + tiles + small, (mem.peak_bytes - grads) / 2**20
    assert mem.peak_bytes > grads + 0.4 * V * H * 4  # the chunk is not needlessly small either
