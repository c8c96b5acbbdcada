"""An engine that replays given texts: for supervised demonstrations and for testing workflows.

``respond(prompt_text, params)`` chooses each output from the decoded prompt (which holds the
role's system prompt, see :func:`mopd.core.roles.role_of_prompt`). Run it through
:func:`mopd.rollout.scheduler.run_workflows` and the records come out exactly as a rollout of a
model that wrote those texts would: same prompts, same environment turns, same segments. That is
how demonstrations stay token-identical to rollouts.

A text becomes the ids a model would have sampled: its tokens, then EOS unless it ends with one
of the request's stop strings (generation would have stopped there), cut at ``max_new_tokens``
(finish 'length'). The log-probs are 0 (no model scored them).
"""

from __future__ import annotations

from typing import Callable, List, Sequence, Union

from mopd.core.generation import Completion, GenerationRequest, SamplingParams


def completion_from_text(tokenizer, text: str, params: SamplingParams) -> Completion:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not any(text.endswith(s) for s in params.stop if s):
        ids.append(tokenizer.eos_token_id)
    reason = "stop"
    if len(ids) > params.max_new_tokens:
        ids, reason = ids[:params.max_new_tokens], "length"
    return Completion(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=reason,
                      text=tokenizer.decode(ids, skip_special_tokens=True))


class ScriptedEngine:
    """The Engine protocol over a ``respond`` function. ``record_batches`` keeps every generate()
    call's requests in ``batches`` for tests to inspect (off for long runs)."""

    def __init__(self, tokenizer, respond: Callable[[str, SamplingParams], Union[str, Sequence[str]]],
                 record_batches: bool = True):
        self.tokenizer = tokenizer
        self.respond = respond
        self.record_batches = record_batches
        self.batches: List[List[GenerationRequest]] = []
        """Every generate() call's requests, for inspection (when ``record_batches``)."""
        # The Rust tokenizer directly where there is one: the Python wrapper's per-call overhead
        # dominates scripted generation.
        self._fast = getattr(tokenizer, "backend_tokenizer", None)

    def decode(self, ids) -> str:
        """The prompt text ``respond`` sees (special tokens kept: they carry the role prompts)."""
        if self._fast is not None:
            return self._fast.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def generate(self, requests: Sequence[GenerationRequest]) -> List[List[Completion]]:
        if self.record_batches:
            self.batches.append(list(requests))
        out = []
        for req in requests:
            texts = self.respond(self.decode(req.prompt_ids), req.params)
            if isinstance(texts, str):
                texts = [texts] * req.params.n
            if len(texts) != req.params.n:
                raise ValueError(f"respond() gave {len(texts)} texts for a request with n={req.params.n}")
            out.append([completion_from_text(self.tokenizer, t, req.params) for t in texts])
        return out

    def load_weights(self, named_tensors) -> None:
        """Nothing to load: the texts are the policy."""

    def reset_prefix_cache(self) -> None:
        """No cache."""

    def sleep(self, level: int = 1) -> None:
        """Nothing to free."""

    def wake_up(self, tags=None) -> None:
        """Nothing to restore."""
