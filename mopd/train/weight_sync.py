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

LoRA (``model.lora``): the base never changes, so an engine that takes adapters
(``capabilities.loads_adapters``: vLLM built with LoRA) keeps its base weights across the cycle
(sleep level 1: offloaded to host memory, not freed) and receives the adapter alone, written in
PEFT's format to a directory of this process and loaded by path (Qwen3-4B at rank 16: 0.12 GiB in
fp32 instead of 8 GB of bf16 weights). An engine with its own copy that takes no adapters (the HF
engine under FSDP) is streamed the merged weights ``W + alpha/r * B A``, one parameter at a time as
before. Each sync reports its bytes and seconds (``SyncStats``, logged as ``sync/*``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from mopd.rollout.engine import capabilities_of
from mopd.train import lora
from mopd.train.param_names import engine_name

SLEEP_LEVEL = 2
"""Level 2 frees the engine's weights too (level 1 would copy them to host memory, 8 GB per rank
for Qwen3-4B, only to be overwritten by the sync)."""
ADAPTER_SLEEP_LEVEL = 1
"""With adapters the base weights are never re-sent, so they are kept (in host memory) while asleep."""


@dataclass
class SyncStats:
    """What one weight sync moved into the engine."""

    bytes: int = 0
    seconds: float = 0.0
    adapter: bool = False
    """Whether the adapter alone was sent (LoRA into an engine that takes adapters)."""

    def as_metrics(self) -> dict:
        return {"perf/sync_mbytes": self.bytes / 2 ** 20, "perf/sync_s": self.seconds,
                "perf/sync_adapter_only": float(self.adapter)}


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


def merged_parameters(model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> Iterator[tuple[str, torch.Tensor]]:
    """:func:`stream_parameters` of a LoRA model with its adapter merged: ``(hf_name, W + s B A)`` for
    every adapted weight (``s`` = alpha / r, as PEFT scales it), the other parameters as they are, no
    adapter tensors; the Hugging Face names of the plain model (``q_proj.weight``, not
    ``q_proj.base_layer.weight``). The sum is formed in fp32 and cast once."""
    layers = {engine_name(n): m for n, m in model.named_modules() if lora.is_lora_layer(m)}
    for name, param in model.named_parameters():
        hf = engine_name(name)
        if ".lora_" in hf:
            continue
        tensor = _full(param)
        if ".base_layer." in hf:
            module, _, leaf = hf.rpartition(".base_layer.")
            layer = layers[module]
            if leaf == "weight" and lora.STUDENT in layer.lora_A:
                a, b = _full(layer.lora_A[lora.STUDENT].weight), _full(layer.lora_B[lora.STUDENT].weight)
                tensor = tensor.float() + (b.float() @ a.float()) * layer.scaling[lora.STUDENT]
            hf = f"{module}.{leaf}"
        yield hf, tensor.to(dtype)


def _full(param: torch.Tensor) -> torch.Tensor:
    t = param.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def shares_model(engine, model: nn.Module) -> bool:
    """True when the engine samples from ``model`` itself (nothing to free or to copy): it declares
    that it can (``capabilities.shares_trainer_model``) and holds this very module."""
    return capabilities_of(engine).shares_trainer_model and getattr(engine, "model", None) is model


def takes_adapter(engine, model: nn.Module) -> bool:
    """True when the sync sends the adapter alone: a LoRA model and an engine that loads adapters."""
    return capabilities_of(engine).loads_adapters and lora.is_adapted(model)


def release_engine(engine, model: nn.Module) -> None:
    """After the rollout: free the engine's GPU memory for scoring and training."""
    if shares_model(engine, model):
        engine.reset_prefix_cache()
        return
    engine.sleep(level=ADAPTER_SLEEP_LEVEL if takes_adapter(engine, model) else SLEEP_LEVEL)


def refresh_engine(engine, model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> SyncStats:
    """After the updates: weights back in, streamed; then the KV cache; then a clean prefix cache.

    The KV cache is woken only after the weights are written, so the peak on the GPU during the
    sync is trainer state + engine weights + one gathered parameter, never + the KV cache. With
    LoRA: the adapter alone (:func:`sync_adapter`), or the merged weights streamed.
    """
    start = time.perf_counter()
    if shares_model(engine, model):
        engine.reset_prefix_cache()
        return SyncStats(seconds=time.perf_counter() - start)
    empty_cuda_cache()
    engine.wake_up(tags=["weights"])
    if takes_adapter(engine, model):
        sent, adapter = sync_adapter(engine, model), True
    else:
        counted = _Counted(merged_parameters(model, dtype) if lora.is_adapted(model) else stream_parameters(model, dtype))
        engine.load_weights(counted)
        sent, adapter = counted.bytes, False
    empty_cuda_cache()
    engine.wake_up(tags=["kv_cache"])
    engine.reset_prefix_cache()
    return SyncStats(bytes=sent, seconds=time.perf_counter() - start, adapter=adapter)


class _Counted:
    """An iterator over ``(name, tensor)`` that adds up the bytes it has handed out."""

    def __init__(self, pairs):
        self._pairs, self.bytes = iter(pairs), 0

    def __iter__(self):
        return self

    def __next__(self):
        name, tensor = next(self._pairs)
        self.bytes += tensor.numel() * tensor.element_size()
        return name, tensor


def sync_adapter(engine, model: nn.Module) -> int:
    """Write the trained adapter (PEFT's format, gathered under FSDP: every rank calls it) into a
    fresh directory of this process, hand its path to the engine, and remove the previous one;
    returns the bytes written. The engine's base stays as it was (never re-sent)."""
    state = lora.adapter_state_dict(model)
    root = _sync_root(engine)
    target = Path(tempfile.mkdtemp(prefix="adapter-", dir=root))
    lora.write_adapter_dir(target, state, lora.settings_of(model), {"path": "", "weights": None})
    engine.load_adapter(str(target))
    for old in root.iterdir():
        if old != target:
            shutil.rmtree(old, ignore_errors=True)
    return sum(t.numel() * t.element_size() for t in state.values())


_SYNC_DIRS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""engine -> the TemporaryDirectory of its adapter syncs (removed when the engine goes, or at exit)."""


def _sync_root(engine) -> Path:
    """A private directory for this engine's adapter syncs."""
    if engine not in _SYNC_DIRS:
        _SYNC_DIRS[engine] = tempfile.TemporaryDirectory(prefix="mopd-adapter-sync-")
    return Path(_SYNC_DIRS[engine].name)


def empty_cuda_cache() -> None:
    """Hand the blocks torch's caching allocator keeps (the step's activations and gradients, the
    gathered parameters of the sync) back to the driver: vLLM wakes through its own allocator, which
    cannot use memory torch has cached, so without this a wake-up can run out of memory with the
    GPU mostly idle (verl's users hit it: verl issues 575 and 6912). A no-op without CUDA."""
    torch.cuda.empty_cache()
