"""The frozen models: the OPD teacher pi_T and the KL reference pi_ref, scoring the student's
packed sequences, never trained.

They see exactly the student's tokens (role prompt, subtask, retrieved passages, generated
prefix), so the teacher's per-token log-probs are the OPD target ``log pi_T(a_t | h_t)`` and the
reference's enter the KL terms. Under torchrun they are FSDP2-sharded like the student (optionally
with their shards offloaded to CPU between passes). In the paper both are the Stage-I policy (one
model, loaded once); base_teacher makes the teacher pi_0 and keeps the Stage-I reference.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Optional

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

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
                for layer in self.model.model.layers:
                    fully_shard(layer, offload_policy=CPUOffloadPolicy())
                fully_shard(self.scorer, offload_policy=CPUOffloadPolicy())
            else:
                shard_model(self.model, device, root=self.scorer, activation_checkpointing=False,
                            reshard_root_after_forward=True)

    @torch.no_grad()
    def logprobs(self, batch: PackedBatch, temperature: float = 1.0) -> torch.Tensor:
        return self.scorer(batch, temperature=temperature)


class FrozenModels(NamedTuple):
    teacher: Optional[Teacher]
    """The OPD teacher, when some role learns by OPD."""
    reference: Optional[Teacher]
    """The KL reference, when some role carries a KL term; the teacher itself when both name the
    same directory."""


def load_frozen_models(cfg, *, student_tokenizer, device: torch.device, shard: bool = False) -> FrozenModels:
    """The teacher and the reference a config needs (``Config.opd_roles`` / ``reference_roles``),
    each loaded at most once: equal directories give one model."""
    loaded = {}

    def load(path: str) -> Teacher:
        key = os.path.realpath(os.path.expanduser(path))
        if key not in loaded:
            loaded[key] = Teacher(path, student_tokenizer=student_tokenizer, device=device,
                                  dtype=cfg.model.dtype, attn=cfg.model.attn_implementation, shard=shard,
                                  cpu_offload=cfg.teacher.cpu_offload)
        return loaded[key]

    teacher = load(cfg.teacher.path) if cfg.opd_roles() else None
    reference = load(cfg.reference_path()) if cfg.reference_roles() else None
    return FrozenModels(teacher, reference)
