"""The inference-engine interface every workflow talks to: token ids in, sampled token ids out.

Requests and completions (``SamplingParams``, ``GenerationRequest``, ``Completion``) are defined
in ``mopd.core.generation``: token ids in, sampled token ids with their log-probs out.

Engines: :class:`mopd.rollout.hf_engine.HFEngine` (transformers, CPU and CUDA) and
:class:`mopd.rollout.vllm_engine.VLLMEngine` (colocated vLLM, the ``gpu`` extra). Use
:func:`build_engine` to pick one from the rollout config.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

from mopd.core.generation import Completion, GenerationRequest


@runtime_checkable
class Engine(Protocol):
    def generate(self, requests: Sequence[GenerationRequest]) -> List[List[Completion]]:
        """One list of ``params.n`` completions per request, in request order."""
        ...

    def load_weights(self, named_tensors: Iterable[Tuple[str, "object"]]) -> None:
        """Copy the trainer's parameters (Hugging Face names) into the engine's model, consuming
        the iterable one pair at a time (the trainer streams them: see mopd.train.weight_sync)."""
        ...

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory while the trainer runs. 1: weights kept (host copy), KV cache freed;
        2: weights and KV cache freed (``load_weights`` must follow the next ``wake_up``)."""
        ...

    def wake_up(self, tags: Optional[Sequence[str]] = None) -> None:
        """Reallocate what ``sleep`` freed: ``["weights"]``, ``["kv_cache"]``, or all (None).
        The colocation cycle wakes the weights, loads them, then wakes the KV cache."""
        ...

    def reset_prefix_cache(self) -> None:
        """Forget cached prompt prefixes (their keys/values belong to the previous weights)."""
        ...


def evaluation_dtype(rollout_cfg, eval_cfg) -> str:
    """The weight dtype of an evaluation engine: ``eval.dtype``, whose auto is float16 on a GPU (as
    the paper evaluates with vLLM) and float32 on a CPU, for either engine (vLLM's CPU build runs
    there too, and float32 keeps its greedy output the HF engine's)."""
    import torch

    return eval_cfg.engine_dtype(cuda=torch.cuda.is_available())


def build_engine(rollout_cfg, model, tokenizer=None, *, dtype: str = "auto", device: Optional[str] = None):
    """The engine named by ``rollout_cfg.engine`` ('hf' or 'vllm') for a model path or module.

    vLLM is imported only here, when chosen; without it this fails at once with the install line.
    """
    if rollout_cfg.engine == "hf":
        from mopd.rollout.hf_engine import HFEngine

        if isinstance(model, str):
            return HFEngine.from_pretrained(model, dtype=dtype, device=device)
        if tokenizer is None:
            raise ValueError("HFEngine around an existing model needs its tokenizer")
        return HFEngine(model, tokenizer)
    if rollout_cfg.engine == "vllm":
        from mopd.rollout.vllm_engine import VLLMEngine

        if not isinstance(model, str):
            raise ValueError("VLLMEngine loads its own copy of the model: pass the model directory")
        # The longest sequence one call can reach: vLLM would otherwise size its KV cache and
        # its checks for the model's full context (256K tokens for Qwen3-4B-Instruct-2507).
        return VLLMEngine(model, gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
                          tensor_parallel_size=rollout_cfg.tensor_parallel_size, dtype=dtype,
                          seed=rollout_cfg.seed,
                          max_model_len=rollout_cfg.max_input_tokens + rollout_cfg.max_output_tokens)
    raise ValueError(f"unknown engine {rollout_cfg.engine!r}; choose hf or vllm")
