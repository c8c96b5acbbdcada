"""The frozen models: the OPD teacher pi_T and the KL reference pi_ref, scoring the student's
packed sequences, never trained.

They see exactly the student's tokens (role prompt, subtask, retrieved passages, generated
prefix), so the teacher's per-token log-probs are the OPD target ``log pi_T(a_t | h_t)`` and the
reference's enter the KL terms. Under torchrun they are FSDP2-sharded like the student (optionally
with their shards offloaded to CPU between passes). In the paper both are the Stage-I policy (one
model, loaded once); base_teacher makes the teacher pi_0 and keeps the Stage-I reference.

Whether a frozen model is a copy or, in a LoRA run, a view of the policy's own base is the run's
models' one rule (:class:`mopd.core.run_models.RunModels`). A view scores through the policy's
module (:class:`mopd.train.lora.AdapterView`): an adapter directory over that base (the Stage-I
run's ``mopd export --adapter``) is attached to the policy before it is sharded
(:func:`attach_adapters`) and scores with that adapter alone active; the base itself (pi_0, e.g.
base_teacher's teacher) scores with no adapter active. A copy is loaded as its own model (an
adapter directory then as its base with the adapter merged).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

from mopd.core.adapter_dir import AdapterDirError
from mopd.core.errors import UserError
from mopd.core.run_models import FrozenModel, RunModels
from mopd.train import lora
from mopd.train.model import (ModelLoadError, PackedCausalLM, check_same_tokenizer, load_causal_lm, resolve_dtype,
                              shard_model)
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
        self.collective = shard
        """Whether scoring is a collective (sharded: every rank must score every micro-batch)."""
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
    teacher: Optional[Teacher | lora.AdapterView]
    """The OPD teacher, when some role learns by OPD."""
    reference: Optional[Teacher | lora.AdapterView]
    """The KL reference, when some role carries a KL term; the teacher itself when both name the
    same directory."""


def attach_adapters(models: RunModels, model) -> None:
    """A LoRA run's adapters, before the policy is sharded or given an optimizer: the student's
    (trainable) and those of the frozen models that are adapter views of the same base (frozen; an
    adapter over other base weights is refused in one line). Nothing in full fine-tuning."""
    if not models.trains_adapters:
        return
    try:
        lora.add_adapters(model, models.adapters, models.base)
    except lora.LoraError as e:
        raise ModelLoadError(str(e)) from None
    for f in models.adapter_views():
        try:
            models.check_adapter_view(f)
            lora.load_frozen_adapter(model, f.path, f.adapter_name)
        except (lora.LoraError, UserError) as e:
            raise ModelLoadError(str(e)) from None
        except AdapterDirError as e:
            raise ModelLoadError(f"{f.role}.path: {e}") from None


def load_frozen_models(cfg, *, student_tokenizer, device: torch.device, shard: bool = False,
                       policy=None, models: Optional[RunModels] = None) -> FrozenModels:
    """The teacher and the reference a config needs (``Config.opd_roles`` / ``reference_roles``),
    each loaded at most once: equal directories give one model. The views of a LoRA run's base
    (``models``, :class:`mopd.core.run_models.RunModels`; ``policy``: the trainer's PackedCausalLM
    after :func:`attach_adapters`) score through the policy (:class:`mopd.train.lora.AdapterView`),
    loading nothing."""
    models = models or RunModels.from_config(cfg)
    loaded = {}

    def load(f: FrozenModel):
        key = f.key or models.base
        if key not in loaded and policy is not None and f.is_view:
            loaded[key] = lora.AdapterView(policy, f.adapter_name, f.path or models.base)
        if key not in loaded:
            loaded[key] = Teacher(f.path, student_tokenizer=student_tokenizer, device=device,
                                  dtype=cfg.model.dtype, attn=cfg.model.attn_implementation, shard=shard,
                                  cpu_offload=cfg.teacher.cpu_offload)
        return loaded[key]

    teacher, reference = models.teacher, models.reference
    return FrozenModels(load(teacher) if teacher else None, load(reference) if reference else None)
