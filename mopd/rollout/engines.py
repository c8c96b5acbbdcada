"""The engines' table: each engine registers a builder here under the name ``rollout.engine`` takes,
and :func:`build_engine` builds the one a config names.

- ``hf``: :class:`mopd.rollout.hf_engine.HFEngine` (transformers, CPU and CUDA). It can sample
  from the trainer's own module (one process: no copy, no weight sync) or load its own copy.
- ``vllm``: :class:`mopd.rollout.vllm_engine.VLLMEngine` (colocated vLLM, the ``gpu`` extra, or
  vLLM's CPU build). It always loads its own copy.

Adding an engine: a class with the :class:`~mopd.rollout.engine.Engine` protocol (its
``capabilities`` say what the schedulers and the trainer may ask of it), and a builder registered
with ``@register_engine("name")`` (:mod:`mopd.config.registries`), here or in a module imported
before configs are built; the config then accepts ``rollout.engine=name``. Backends are imported
only when chosen: without vLLM, choosing it fails at once with the install line.
"""

from __future__ import annotations

from typing import Optional, Tuple

from mopd.config import ENGINES, register_engine


def evaluation_dtype(rollout_cfg, eval_cfg) -> str:
    """The weight dtype of an evaluation engine: ``eval.dtype``, whose auto is float16 on a GPU (as
    the paper evaluates with vLLM) and float32 on a CPU, whichever the engine."""
    import torch

    return eval_cfg.engine_dtype(cuda=torch.cuda.is_available())


def build_engine(rollout_cfg, model_path: str, *, dtype: str = "auto", device: Optional[str] = None,
                 trainer_model: Optional[Tuple[object, object]] = None):
    """The engine named by ``rollout_cfg.engine`` for the model at ``model_path``.

    ``trainer_model``: ``(module, tokenizer)`` of a one-process trainer, offered to an engine that
    can sample from it (``capabilities.shares_trainer_model``); an engine that cannot loads
    ``model_path`` instead. ``device``: where an engine that places its own copy puts it.
    """
    build = ENGINES.lookup(rollout_cfg.engine)
    return build(rollout_cfg, model_path, dtype=dtype, device=device, trainer_model=trainer_model)


@register_engine("hf")
def build_hf(rollout_cfg, model_path: str, *, dtype: str, device: Optional[str], trainer_model):
    """transformers' generate, on the trainer's own module when it offers one."""
    from mopd.rollout.hf_engine import HFEngine

    if trainer_model is not None:
        module, tokenizer = trainer_model
        return HFEngine(module, tokenizer)
    return HFEngine.from_pretrained(model_path, dtype=dtype, device=device)


@register_engine("vllm")
def build_vllm(rollout_cfg, model_path: str, *, dtype: str, device: Optional[str], trainer_model):
    """Colocated vLLM with its own copy of the weights."""
    from mopd.rollout.vllm_engine import VLLMEngine

    # The longest sequence one call can reach: vLLM would otherwise size its KV cache and
    # its checks for the model's full context (256K tokens for Qwen3-4B-Instruct-2507).
    return VLLMEngine(model_path, gpu_memory_utilization=rollout_cfg.vllm_memory_share(),
                      tensor_parallel_size=rollout_cfg.tensor_parallel_size, dtype=dtype,
                      seed=rollout_cfg.seed,
                      max_model_len=rollout_cfg.max_input_tokens + rollout_cfg.max_output_tokens)
