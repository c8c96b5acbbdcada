"""The engines' table: each engine registers a builder here under the name ``rollout.engine`` takes,
and :func:`build_engine` builds the one a config names.

- ``hf``: :class:`mopd.rollout.hf_engine.HFEngine` (transformers, CPU and CUDA). It can sample
  from the trainer's own module (one process: no copy, no weight sync) or load its own copy.
- ``vllm``: :class:`mopd.rollout.vllm_engine.VLLMEngine` (colocated vLLM, the ``gpu`` extra, or
  vLLM's CPU build). It always loads its own copy; with LoRA it loads the trainer's adapter
  (``load_adapter``) over its base weights instead of the full weights.

An adapter directory (PEFT's format, ``mopd export --adapter``) is a model too, for evaluation:
:func:`mopd.core.adapter_dir.adapter_of` reads it and checks its base (by the fingerprint of the base's weights); the HF
engine merges it into the base it names, the vLLM engine starts on that base with room for the
adapter's rank and loads it.

Adding an engine: a class with the :class:`~mopd.rollout.engine.Engine` protocol (its
``capabilities`` say what the schedulers and the trainer may ask of it), and a builder registered
with ``@register_engine("name")`` (:mod:`mopd.config.registries`), here or in a module imported
before configs are built; the config then accepts ``rollout.engine=name``. Backends are imported
only when chosen: without vLLM, choosing it fails at once with the install line.
"""

from __future__ import annotations

import inspect
from typing import Optional, Tuple

from mopd.config import ENGINES, ConfigError, register_engine
from mopd.core.adapter_dir import adapter_of


def evaluation_dtype(rollout_cfg, eval_cfg) -> str:
    """The weight dtype of an evaluation engine: ``eval.dtype``, whose auto is float16 on a GPU (as
    the paper evaluates with vLLM) and float32 on a CPU, whichever the engine."""
    import torch

    return eval_cfg.engine_dtype(cuda=torch.cuda.is_available())


def build_engine(rollout_cfg, model_path: str, *, dtype: str = "auto", device: Optional[str] = None,
                 trainer_model: Optional[Tuple[object, object]] = None, lora_rank: int = 0):
    """The engine named by ``rollout_cfg.engine`` for the model at ``model_path``.

    ``trainer_model``: ``(module, tokenizer)`` of a one-process trainer, offered to an engine that
    can sample from it (``capabilities.shares_trainer_model``); an engine that cannot loads
    ``model_path`` instead. ``device``: where an engine that places its own copy puts it.
    ``model_path`` may be an adapter directory (:func:`mopd.core.adapter_dir.adapter_of`); an engine then generates with
    the adapter over its base. ``lora_rank``: the rank of the trainer's LoRA adapters
    (``model.lora.rank``; 0: none). Only when it is positive is it passed on, as the builder's ``lora_rank`` keyword, so a builder without
    that keyword keeps working for full fine-tuning; with LoRA such a builder is refused.
    """
    build = ENGINES.lookup(rollout_cfg.engine)
    extra = {}
    if lora_rank > 0:
        if not accepts_keyword(build, "lora_rank"):
            raise ConfigError(f"rollout.engine={rollout_cfg.engine} cannot generate with LoRA adapters (its "
                              "builder takes no lora_rank): use rollout.engine=hf or vllm, or model.lora.rank=0")
        extra["lora_rank"] = lora_rank
    return build(rollout_cfg, model_path, dtype=dtype, device=device, trainer_model=trainer_model, **extra)


def accepts_keyword(fn, name: str) -> bool:
    """Whether ``fn`` can be called with the keyword ``name`` (named, or taken by ``**kwargs``)."""
    params = inspect.signature(fn).parameters.values()
    return any((p.name == name and p.kind is not p.POSITIONAL_ONLY) or p.kind is p.VAR_KEYWORD for p in params)


@register_engine("hf")
def build_hf(rollout_cfg, model_path: str, *, dtype: str, device: Optional[str], trainer_model, lora_rank: int = 0):
    """transformers' generate, on the trainer's own module when it offers one.

    ``lora_rank`` is not needed here: the trainer's own module already carries its adapters (PEFT
    injects them into it), and an engine-owned copy is a plain model that ``load_weights`` refreshes.
    An adapter directory as ``model_path`` is merged into its base (``HFEngine.from_pretrained``)."""
    from mopd.rollout.hf_engine import HFEngine

    if trainer_model is not None:
        module, tokenizer = trainer_model
        return HFEngine(module, tokenizer)
    return HFEngine.from_pretrained(model_path, dtype=dtype, device=device)


@register_engine("vllm")
def build_vllm(rollout_cfg, model_path: str, *, dtype: str, device: Optional[str], trainer_model,
               lora_rank: int = 0):
    """Colocated vLLM with its own copy of the weights (and, with ``lora_rank`` > 0, room for one
    LoRA adapter of that rank, loaded with ``load_adapter``). An adapter directory as ``model_path``:
    vLLM starts on its base with room for the adapter's rank and loads it (vLLM's LoRA, unmerged)."""
    from mopd.rollout.vllm_engine import VLLMEngine

    adapter = adapter_of(model_path)
    if adapter is not None:
        model_path, lora_rank = adapter.base_dir, max(lora_rank, adapter.rank)
    # The longest sequence one call can reach: vLLM would otherwise size its KV cache and
    # its checks for the model's full context (256K tokens for Qwen3-4B-Instruct-2507).
    engine = VLLMEngine(model_path, gpu_memory_utilization=rollout_cfg.vllm_memory_share(),
                        tensor_parallel_size=rollout_cfg.tensor_parallel_size, dtype=dtype,
                        seed=rollout_cfg.seed,
                        max_model_len=rollout_cfg.max_input_tokens + rollout_cfg.max_output_tokens,
                        lora_rank=lora_rank)
    if adapter is not None:
        engine.load_adapter(adapter.path)
    return engine
