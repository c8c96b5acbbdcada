"""What an engine is asked and what it answers: token ids in, sampled token ids out.

Workflows never hand an engine text: a request is the exact prompt token ids, so the ids the
trainer later trains on are the ids the engine saw. A completion carries the sampled ids with
their sampling log-probs (float32, under ``softmax(logits / temperature)``; top-p shapes only the
sampling, not the reported log-prob; at temperature 0, greedy, the log-probs are those of the
untempered ``softmax(logits)``), why it stopped, and its decoded text (special tokens skipped) for
the action parser. The engines themselves live in ``mopd.rollout``; these types are shared by
the rollout, the prompted critic and the scripted demonstration engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

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
