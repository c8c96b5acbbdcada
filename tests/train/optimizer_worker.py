"""Worker for test_optimizer.py's FSDP2 test: `torchrun --nproc_per_node 2 optimizer_worker.py OUT_JSON`.

Each rank holds the same small model twice: one copy FSDP2-sharded (DTensor parameters, the trainer's
``build_adamw``), one whole (torch's per-parameter AdamW). Both get the same random gradients for a
few steps (the sharded copy its shard of each, ``distribute_tensor``); rank 0 writes the chosen
implementation and the largest difference between the gathered sharded weights and the whole ones.
"""

from __future__ import annotations

import copy
import json
import sys

import torch
import torch.distributed as dist
from torch import nn


def main(out: str) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, distribute_tensor

    from mopd.train.optimizer import build_adamw

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    whole = nn.Sequential(nn.Linear(7, 13), nn.Tanh(), nn.Linear(13, 5), nn.Linear(5, 3, bias=False))
    start = copy.deepcopy(whole)
    sharded = copy.deepcopy(whole)
    for layer in sharded:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(sharded)
    opt = build_adamw(sharded.parameters(), lr=3e-3, weight_decay=0.1)
    ref = torch.optim.AdamW(whole.parameters(), lr=3e-3, weight_decay=0.1, foreach=False, fused=False)
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        for p, q in zip(sharded.parameters(), whole.parameters()):
            g = torch.randn(q.shape, generator=gen)
            q.grad = g.clone()
            p.grad = distribute_tensor(g, p.device_mesh, p.placements)
        opt.step()
        ref.step()
    diffs = [(p.full_tensor() - q).abs().max().item() for p, q in zip(sharded.parameters(), whole.parameters())]
    moved = min((q - s).abs().max().item() for q, s in zip(whole.parameters(), start.parameters()))
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"implementation": opt.implementation, "max_abs_diff": max(diffs), "moved": moved,
                       "dtensor": all(isinstance(p, DTensor) for p in sharded.parameters())}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
