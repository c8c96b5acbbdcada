"""The inference-engine interface every workflow talks to: token ids in, sampled token ids out.

Workflows never hand an engine text: a request is the exact prompt token ids, so the ids the
trainer later trains on are the ids the engine saw. A completion carries the sampled ids with
their sampling log-probs (float32, under ``softmax(logits / temperature)``; top-p shapes only the
sampling, not the reported log-prob; at temperature 0, greedy, the log-probs are those of the
untempered ``softmax(logits)``), why it stopped, and its decoded text (special tokens skipped) for
the action parser.

Engines: :class:`mopd.rollout.hf_engine.HFEngine` (transformers, CPU and CUDA) and
:class:`mopd.rollout.vllm_engine.VLLMEngine` (colocated vLLM, the ``gpu`` extra). Use
:func:`build_engine` to pick one from the rollout config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

FINISH_REASONS = ("stop", "length")
"""stop: an EOS token or a stop string was generated; length: max_new_tokens was reached."""


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    """Independent samples of the same prompt."""
    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus mass kept for sampling (the smallest set of most likely tokens reaching it)."""
    max_new_tokens: int = 512
    """Generated tokens at most, EOS included."""
    stop: Tuple[str, ...] = ()
    """Stop strings: generation ends with the token that completes one of them (kept in the output)."""
    seed: Optional[int] = None
    """Fixed seed: the same request gives the same samples, whatever else is in the batch.
    Sample j of a request draws from the stream ``derive_seed(seed, j)``."""

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"SamplingParams.n={self.n} must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature={self.temperature} must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p={self.top_p} must be in (0, 1]")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens={self.max_new_tokens} must be >= 1")
        object.__setattr__(self, "stop", tuple(self.stop))


@dataclass
class GenerationRequest:
    prompt_ids: List[int]
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass
class Completion:
    token_ids: List[int]
    """Sampled ids, EOS included when generated."""
    logprobs: List[float]
    """Sampling log-prob of each sampled id (see the module docstring)."""
    finish_reason: str
    """'stop' or 'length'."""
    text: str
    """The ids decoded with special tokens skipped."""


@runtime_checkable
class Engine(Protocol):
    def generate(self, requests: Sequence[GenerationRequest]) -> List[List[Completion]]:
        """One list of ``params.n`` completions per request, in request order."""
        ...

    def load_weights(self, named_tensors: Iterable[Tuple[str, "object"]]) -> None:
        """Copy the trainer's parameters (Hugging Face names) into the engine's model."""
        ...

    def sleep(self) -> None:
        """Free what memory the engine can while the trainer runs."""
        ...

    def wake(self) -> None:
        """Undo sleep() before the next generate()."""
        ...


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
        return VLLMEngine(model, gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
                          tensor_parallel_size=rollout_cfg.tensor_parallel_size, dtype=dtype,
                          seed=rollout_cfg.seed)
    raise ValueError(f"unknown engine {rollout_cfg.engine!r}; choose hf or vllm")
