"""The frozen teacher pi_T: scores the student's packed sequences, never trained.

It sees exactly the student's tokens (role prompt, subtask, retrieved passages, generated
prefix), so its per-token log-probs are the OPD target ``log pi_T(a_t | h_t)``. Under torchrun it
is FSDP2-sharded like the student (optionally with its shards offloaded to CPU between passes).
"""

from __future__ import annotations

import torch

from mopd.train.model import PackedCausalLM, check_same_tokenizer, load_causal_lm, resolve_dtype, shard_model
from mopd.train.packing import PackedBatch


class Teacher:
    def __init__(self, path: str, *, student_tokenizer, device: torch.device, dtype: str = "auto",
                 attn: str = "auto", shard: bool = False, cpu_offload: bool = False):
        self.path = path
        self.model, tok = load_causal_lm(path, dtype=resolve_dtype(dtype, device), device=device, attn=attn)
        check_same_tokenizer(student_tokenizer, tok, path)
        self.model.eval()
        self.model.requires_grad_(False)
        self.scorer = PackedCausalLM(self.model)
        if shard:
            if cpu_offload:
                from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

                for layer in self.model.model.layers:
                    fully_shard(layer, offload_policy=CPUOffloadPolicy())
                fully_shard(self.scorer, offload_policy=CPUOffloadPolicy())
            else:
                shard_model(self.model, device, root=self.scorer)

    @torch.no_grad()
    def logprobs(self, batch: PackedBatch, temperature: float = 1.0) -> torch.Tensor:
        return self.scorer(batch, "logprobs", temperature=temperature)
