"""The trainer's rollout engine: which one, with what GPU share, offered which module."""

from __future__ import annotations

import sys

import torch

from mopd.config import ROLLOUT_LOGPROBS_BF16, ConfigError
from mopd.rollout.engine import capabilities_of
from mopd.rollout.engines import build_engine
from mopd.train.memory_plan import PlanError, rollout_config_for_gpu
from mopd.train.model import resolve_dtype


def build_trainer_engine(cfg, *, device: torch.device, world: int, rank: int, offer=None, lora_rank: int = 0):
    """``(engine, memory note)``: the engine ``rollout.engine`` names, generating with the adapter's
    rank when the run trains adapters (``lora_rank``: ``RunModels.lora_rank``, 0 in full fine-tuning). ``offer``: ``(module, tokenizer)`` of a one-process trainer,
    which an engine that can sample from the very module being trained does (FSDP ranks generate
    different workloads, which sharded forwards cannot do: there every engine keeps its own copy,
    refreshed after every update). The note says what the memory plan chose for vLLM's GPU share
    (said on rank 0 before vLLM starts); empty when nothing was chosen."""
    rollout_cfg, note = engine_rollout_config(cfg, device=device, world=world, rank=rank)
    engine = build_engine(rollout_cfg, cfg.model.path, dtype=cfg.model.dtype, device=str(device),
                          trainer_model=offer, lora_rank=lora_rank)
    if cfg.trainer.old_logprobs == "rollout" and resolve_dtype(cfg.model.dtype, device) == torch.bfloat16:
        raise ConfigError(ROLLOUT_LOGPROBS_BF16 + f" (model.dtype={cfg.model.dtype} trains in bfloat16 on "
                          f"{device.type})")
    if cfg.trainer.old_logprobs == "rollout" and not capabilities_of(engine).trainer_logprobs:
        raise ConfigError(f"trainer.old_logprobs=rollout needs an engine whose sampling log-probs are the "
                          f"trainer's; rollout.engine={cfg.rollout.engine} computes them differently "
                          "(precision, processed logits): use trainer.old_logprobs=recompute")
    return engine, note


def engine_rollout_config(cfg, *, device: torch.device, world: int, rank: int):
    """``(rollout config, note)``: ``cfg.rollout`` with vLLM's GPU memory share from the memory plan
    of this GPU when it is left empty (``mopd.train.memory_plan.rollout_config_for_gpu``)."""
    if device.type == "cuda" and cfg.rollout.engine == "vllm":
        torch.cuda.empty_cache()   # what loading and sharding left cached is free for vLLM to count
    try:
        rollout_cfg, note = rollout_config_for_gpu(cfg, world, device)
    except PlanError as e:
        raise ConfigError(f"rollout.gpu_memory_utilization: {e}") from None
    if note and rank == 0:
        print(f"mopd: {note}", file=sys.stderr, flush=True)
    return rollout_cfg, note
