"""The fused loss under FSDP2 on two gloo ranks: an lm head sharded by ``fully_shard`` (a DTensor
weight), passed outside the module's forward or used inside it, gives each rank the gradient shard
of the unsharded loss. Torch alone; in the integration tier (make test-integrations) because it
starts processes."""

import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = [pytest.mark.integration]

T, H, V = 37, 16, 101


def _data():
    g = torch.Generator().manual_seed(0)
    B, C = 4, 9
    hidden = torch.randn(B, C, H, generator=g)
    targets = torch.randint(0, V, (B, C), generator=g)
    mask = torch.arange(C).unsqueeze(0) < torch.tensor([[9], [4], [1], [7]])
    return hidden, targets, mask, torch.randn(B, generator=g), torch.randn(B, C, generator=g) - 2.5


def _loss_fn():
    from mopd_kernels import FusedLinearGRPOLoss, PolicyLossSettings, RoleSpec

    return FusedLinearGRPOLoss(PolicyLossSettings([RoleSpec(entropy_coef=0.01)], clip_high=0.28, backend="torch"),
                               "grpo")


class _Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.lm_head = torch.nn.Linear(H, V, bias=False)

    def forward(self, hidden, completions):
        return _loss_fn()(hidden, self.lm_head.weight, completions)[0]


def _worker(rank, world, init_file, out_dir):
    from torch.distributed.fsdp import fully_shard

    from mopd_kernels import Completions

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        hidden, targets, mask, adv, old = _data()
        completions = Completions(targets, mask, adv, old_logp=old)
        results = {}
        for where in ("outside", "inside"):
            head = _Head()
            fully_shard(head)
            weight = head.lm_head.weight
            assert type(weight).__name__ == "DTensor"
            if where == "outside":
                loss = _loss_fn()(hidden, weight, completions)[0]
            else:
                loss = head(hidden, completions)
            loss.backward()
            grad = head.lm_head.weight.grad
            results[where] = (float(loss), grad.full_tensor().clone())
        if rank == 0:
            torch.save(results, os.path.join(out_dir, "fsdp.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not built")
def test_dtensor_lm_head_gets_the_unsharded_gradient(tmp_path):
    mp.start_processes(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, start_method="spawn")
    results = torch.load(tmp_path / "fsdp.pt")
    hidden, targets, mask, adv, old = _data()
    from mopd_kernels import Completions

    head = _Head()
    loss = _loss_fn()(hidden, head.lm_head.weight, Completions(targets, mask, adv, old_logp=old))[0]
    loss.backward()
    for where, (got_loss, got_grad) in results.items():
        assert abs(got_loss - float(loss)) < 1e-6, where
        torch.testing.assert_close(got_grad, head.lm_head.weight.grad, atol=1e-6, rtol=1e-5), where


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
