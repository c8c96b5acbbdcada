"""Peak memory of the chunked torch path: no [T, V] tensor at T=4096, far below the naive path."""

import pytest
import torch

from mopd_kernels import LossInputs, PolicyLossSettings, RoleSpec, fused_linear_policy_loss, linear_logprobs
from mopd_kernels.memtrack import TensorMemoryTracker


def test_tracker_sees_the_naive_logits():
    """The tracker itself: the reference path does allocate [T, V] fp32 tensors, several at once."""
    T, H, V = 256, 16, 2048
    h = torch.randn(T, H, requires_grad=True)
    w = torch.randn(V, H, requires_grad=True)
    t = torch.randint(0, V, (T,))
    with TensorMemoryTracker() as mem:
        logp, ent = linear_logprobs(h, w, t, backend="reference")
        (logp.sum() + ent.sum()).backward()
    assert mem.largest_bytes >= T * V * 4 and mem.largest_shape == (T, V)
    assert mem.peak_bytes >= 3 * T * V * 4
    with TensorMemoryTracker() as mem2:
        x = torch.empty(1000)
        del x
        y = h[:10].t()  # a view of a tensor made before the block is no allocation
    assert mem2.peak_bytes == 4000 and mem2.live_bytes == 0 and y.shape == (16, 10)


@pytest.mark.parametrize("what", ["loss", "scoring", "logprobs_grad"])
def test_torch_path_never_allocates_logits_for_all_rows(what):
    T, H, V = 4096, 16, 32768
    full = T * V * 4  # one [T, V] fp32 tensor: 512 MiB
    g = torch.Generator().manual_seed(0)
    h = torch.randn(T, H, generator=g).requires_grad_(True)
    w = (torch.randn(V, H, generator=g) * 0.3).requires_grad_(True)
    t = torch.randint(0, V, (T,), generator=g)
    specs = [RoleSpec("outcome", entropy_coef=1e-3), RoleSpec("opd", kl_coef=0.01)]
    roles = torch.randint(-1, 2, (T,), generator=g)
    old = torch.full((T,), -10.0)
    with TensorMemoryTracker() as mem:
        if what == "loss":
            inputs = LossInputs(roles, old, torch.randn(T, generator=g), teacher_logp=old - 1, ref_logp=old)
            loss, _ = fused_linear_policy_loss(h, w, t, inputs, PolicyLossSettings(specs, backend="torch"))
            loss.backward()
        elif what == "scoring":
            with torch.no_grad():
                linear_logprobs(h, w, t, backend="torch")
        else:
            logp, ent = linear_logprobs(h, w, t, backend="torch")
            (logp.sum() - ent.sum()).backward()
    assert mem.largest_bytes < full // 4, mem.largest_shape
    assert mem.peak_bytes < full // 3, mem.peak_bytes / 2**20
