"""The colocation cycle: the rollout engine and the trainer take turns on the same GPU.

Per step and per rank (docs/architecture.md, "Performance targets")::

    rollout -> engine.sleep(level=2)          # KV cache and weights freed: the GPU is the trainer's
            -> scoring and PPO updates
            -> torch.cuda.empty_cache()          # torch's cached blocks back to the driver, before each wake-up
            -> engine.wake_up(tags=["weights"])  # weight memory back (contents undefined after level 2)
            -> engine.load_weights(stream)       # one full parameter at a time, bf16, tied weights once
            -> torch.cuda.empty_cache()
            -> engine.wake_up(tags=["kv_cache"]) # KV cache back, scheduling resumes
            -> engine.reset_prefix_cache()       # cached prefixes belong to the old weights

Memory: ``stream_parameters`` casts ONE parameter's local shard to the engine dtype and gathers
it (``DTensor.full_tensor()``, an all-gather over the FSDP mesh) right before the engine consumes
it, so the transient cost is the largest single parameter in the engine dtype (Qwen3-4B: the
151936 x 2560 embedding, 0.78 GB in bf16; gathering the fp32 master first would hold 1.56 GB more)
instead of a full state dict (8 GB, plus the tied embedding twice). Every rank must iterate
the stream to the end in the same order: each ``full_tensor()`` is a collective.

An engine that shares the trainer's module (the one-process HF engine) needs none of this: it
samples from the very tensors being trained, so the cycle only clears its prefix cache.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from mopd.rollout.engine import capabilities_of

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
"""Module names that wrappers (activation checkpointing, torch.compile, FSDP1) insert into
parameter names; the engine knows the plain Hugging Face names."""

SLEEP_LEVEL = 2
"""Level 2 frees the engine's weights too (level 1 would copy them to host memory, 8 GB per rank
for Qwen3-4B, only to be overwritten by the sync)."""


def engine_name(name: str) -> str:
    """The Hugging Face parameter name with every wrapper's component removed."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def stream_parameters(model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` one parameter at a time, cast to ``dtype``.

    ``named_parameters()`` yields a tied parameter once (under its first name, e.g.
    ``model.embed_tokens.weight``; the engine's model ties ``lm_head`` to it). Buffers are not
    sent: the rotary tables are recomputed by the engine, never trained. A sharded parameter
    (``DTensor``) is all-gathered here, one at a time; the previous one is already released
    when the consumer asks for the next, as long as it does not keep references.
    """
    for name, param in model.named_parameters():
        # Cast the local shard first, then gather: the gather then moves and holds the engine
        # dtype only. Gathering the fp32 master and casting after would hold the full fp32
        # tensor beside its bf16 copy (Qwen3-4B's embedding: 1.56 + 0.78 GB instead of 0.78).
        tensor = param.detach().to(dtype)
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        yield engine_name(name), tensor


def shares_model(engine, model: nn.Module) -> bool:
    """True when the engine samples from ``model`` itself (nothing to free or to copy): it declares
    that it can (``capabilities.shares_trainer_model``) and holds this very module."""
    return capabilities_of(engine).shares_trainer_model and getattr(engine, "model", None) is model


def release_engine(engine, model: nn.Module) -> None:
    """After the rollout: free the engine's GPU memory for scoring and training."""
    if shares_model(engine, model):
        engine.reset_prefix_cache()
        return
    engine.sleep(level=SLEEP_LEVEL)


def refresh_engine(engine, model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
    """After the updates: weights back in, streamed; then the KV cache; then a clean prefix cache.

    The KV cache is woken only after the weights are written, so the peak on the GPU during the
    sync is trainer state + engine weights + one gathered parameter, never + the KV cache.
    """
    if shares_model(engine, model):
        engine.reset_prefix_cache()
        return
    empty_cuda_cache()
    engine.wake_up(tags=["weights"])
    engine.load_weights(stream_parameters(model, dtype))
    empty_cuda_cache()
    engine.wake_up(tags=["kv_cache"])
    engine.reset_prefix_cache()


def empty_cuda_cache() -> None:
    """Hand the blocks torch's caching allocator keeps (the step's activations and gradients, the
    gathered parameters of the sync) back to the driver: vLLM wakes through its own allocator, which
    cannot use memory torch has cached, so without this a wake-up can run out of memory with the
    GPU mostly idle (verl's users hit it: verl issues 575 and 6912). A no-op without CUDA."""
    torch.cuda.empty_cache()
