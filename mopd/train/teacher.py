"""The frozen models: the OPD teacher pi_T and the KL reference pi_ref, scoring the student's
packed sequences, never trained.

They see exactly the student's tokens (role prompt, subtask, retrieved passages, generated
prefix), so the teacher's per-token log-probs are the OPD target ``log pi_T(a_t | h_t)`` and the
reference's enter the KL terms. Under torchrun they are FSDP2-sharded like the student (optionally
with their shards offloaded to CPU between passes). In the paper both are the Stage-I policy (one
model, loaded once); base_teacher makes the teacher pi_0 and keeps the Stage-I reference.

In a LoRA run (``model.lora.rank`` > 0) a frozen model over the policy's own base is no copy but
a view of the policy's module (:class:`mopd.train.lora.AdapterView`): an adapter directory over that
base (the Stage-I run's ``mopd export --adapter``) is attached to the policy before it is sharded
(:func:`attach_adapters`) and scores with that adapter alone active; the base itself (pi_0, e.g.
base_teacher's teacher) scores with no adapter active. Any other directory, or any frozen model of
a full fine-tuning run, is loaded as its own model, as before (an adapter directory then as its base
with the adapter merged).
"""

from __future__ import annotations

import os
from typing import NamedTuple, Optional

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

from mopd.core.adapter_dir import AdapterDirError, is_adapter_dir
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


def frozen_paths(cfg) -> dict:
    """``{"teacher": path, "reference": path}`` of the frozen models the config needs (either may be
    absent)."""
    out = {}
    if cfg.opd_roles():
        out["teacher"] = cfg.teacher.path
    if cfg.reference_roles():
        out["reference"] = cfg.reference_path()
    return out


def _key(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def view_adapters(cfg) -> dict:
    """LoRA runs: ``{resolved path: adapter name}`` of the frozen models that are adapters over the
    policy's base (one name per directory: a teacher that is also the reference is attached once)."""
    if not cfg.model.lora.enabled:
        return {}
    names = {}
    for name, path in frozen_paths(cfg).items():
        if is_adapter_dir(path):
            names.setdefault(_key(path), name)
    return names


def is_base(cfg, path: str) -> bool:
    """LoRA runs: whether ``path`` is the policy's base model itself (by the fingerprint of its weights)."""
    if not cfg.model.lora.enabled or is_adapter_dir(path):
        return False
    mine = lora.base_weights(cfg.model.path)
    return _key(path) == _key(cfg.model.path) or (mine is not None and lora.base_weights(path) == mine)


def attach_adapters(cfg, model) -> None:
    """A LoRA run's adapters, before the policy is sharded or given an optimizer: the student's
    (trainable) and those of the frozen models that are adapters over the same base (frozen; a base
    of another fingerprint is refused in one line). Nothing without ``model.lora``."""
    if not cfg.model.lora.enabled:
        return
    try:
        lora.add_adapters(model, cfg.model.lora, cfg.model.path)
    except lora.LoraError as e:
        raise ModelLoadError(str(e)) from None
    for path, name in view_adapters(cfg).items():
        try:
            lora.check_same_base(path, cfg.model.path, f"{name}.path")
            lora.load_frozen_adapter(model, path, name)
        except lora.LoraError as e:
            raise ModelLoadError(str(e)) from None
        except AdapterDirError as e:
            raise ModelLoadError(f"{name}.path: {e}") from None


def load_frozen_models(cfg, *, student_tokenizer, device: torch.device, shard: bool = False,
                       policy=None) -> FrozenModels:
    """The teacher and the reference a config needs (``Config.opd_roles`` / ``reference_roles``),
    each loaded at most once: equal directories give one model. In a LoRA run (``policy``: the
    trainer's PackedCausalLM after :func:`attach_adapters`) those over the policy's base are views
    of it (:class:`mopd.train.lora.AdapterView`), loading nothing."""
    loaded = {}
    views = view_adapters(cfg)

    def load(path: str) -> Teacher:
        key = _key(path)
        if key not in loaded and policy is not None and (key in views or is_base(cfg, path)):
            loaded[key] = lora.AdapterView(policy, views.get(key), path)
        if key not in loaded:
            loaded[key] = Teacher(path, student_tokenizer=student_tokenizer, device=device,
                                  dtype=cfg.model.dtype, attn=cfg.model.attn_implementation, shard=shard,
                                  cpu_offload=cfg.teacher.cpu_offload)
        return loaded[key]

    teacher = load(cfg.teacher.path) if cfg.opd_roles() else None
    reference = load(cfg.reference_path()) if cfg.reference_roles() else None
    return FrozenModels(teacher, reference)
