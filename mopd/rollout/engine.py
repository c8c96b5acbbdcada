"""The inference-engine interface every workflow talks to: token ids in, sampled token ids out.

Requests and completions (``SamplingParams``, ``GenerationRequest``, ``Completion``) are defined
in ``mopd.core.generation``: token ids in, sampled token ids with their log-probs out.

Each engine says what it can do in its ``capabilities`` (:class:`EngineCapabilities`); the
schedulers, the trainer and the weight sync read that instead of looking at an engine's insides.
The engines themselves are listed, and built, in :mod:`mopd.rollout.engines`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

from mopd.core.generation import Completion, GenerationRequest


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine offers beyond ``generate``. An engine without a ``capabilities`` attribute
    (a scripted or test engine with a synchronous ``generate``) has none of them."""

    step_front: bool = False
    """It has ``step_front(max_rows) -> EngineFront``: a front whose requests join the running batch
    between decode steps and leave it the step they finish (continuous batching). Without it the
    asynchronous scheduler batches whole ``generate`` calls (:class:`~mopd.rollout.async_engine.BatchingFront`)."""
    prefers_async: bool = False
    """The asynchronous scheduler is the faster one for it (``run_rollout``'s choice unless
    ``rollout.scheduler`` says otherwise; bench/RESULTS.md, "Asynchronous rollout")."""
    frees_memory: bool = False
    """``sleep`` hands accelerator memory to the trainer (otherwise sleep and wake only drop caches)."""
    shares_trainer_model: bool = False
    """It samples from the trainer's own module (no copy): ``load_weights`` then copies nothing."""
    trainer_logprobs: bool = False
    """Its sampling log-probs are computed as the trainer computes pi_old (log-softmax of the
    temperature-scaled logits over the whole vocabulary, in the trainer's precision), so
    ``trainer.old_logprobs=rollout`` is exact with it at top_p 1."""
    loads_adapters: bool = False
    """``load_adapter(path)`` takes a PEFT LoRA adapter directory (``adapter_config.json`` and
    ``adapter_model.safetensors``, as ``PeftModel.save_pretrained`` writes them) and generates with it
    over the base weights from then on: with LoRA the trainer syncs the adapter alone (megabytes)
    instead of streaming the full weights."""


NO_CAPABILITIES = EngineCapabilities()


def capabilities_of(engine) -> EngineCapabilities:
    """The engine's declared capabilities (none for an engine that declares nothing)."""
    caps = getattr(engine, "capabilities", None)
    return caps if isinstance(caps, EngineCapabilities) else NO_CAPABILITIES


@runtime_checkable
class Engine(Protocol):
    capabilities: EngineCapabilities
    """What the engine can do (above)."""

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


def eos_ids_of(tokenizer, *eos_fields) -> set:
    """Every id a generation stops on: the tokenizer's EOS and each given ``eos_token_id`` field
    (the generation config's and the model config's; each an id, a list of ids, or None). Qwen3
    stops on ``<|im_end|>`` and ``<|endoftext|>``, only one of which is the tokenizer's EOS."""
    ids = set()
    for src in (*eos_fields, getattr(tokenizer, "eos_token_id", None)):
        if src is None:
            continue
        ids.update(src if isinstance(src, (list, tuple)) else [src])
    return {int(i) for i in ids}


def model_dir_eos_ids(model_path: str, tokenizer) -> set:
    """:func:`eos_ids_of` a model directory's ``generation_config.json`` and ``config.json`` (what
    vLLM stops on by default)."""
    fields = []
    for name in ("generation_config.json", "config.json"):
        try:
            fields.append(json.loads((Path(model_path) / name).read_text(encoding="utf-8")).get("eos_token_id"))
        except (OSError, ValueError, AttributeError):
            continue
    return eos_ids_of(tokenizer, *fields)

