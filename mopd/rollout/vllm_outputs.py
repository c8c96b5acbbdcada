"""vLLM's request outputs as our :class:`~mopd.core.generation.Completion` (no vLLM import needed)."""

from __future__ import annotations

from typing import List

from mopd.core.generation import Completion


def completion_from_output(output, tokenizer) -> Completion:
    """A vLLM ``CompletionOutput`` (token_ids, per-token {id: Logprob} dicts, finish_reason) as ours."""
    ids = [int(t) for t in output.token_ids]
    logprobs: List[float] = []
    for tid, entry in zip(ids, output.logprobs or []):
        lp = entry[tid]
        logprobs.append(float(getattr(lp, "logprob", lp)))
    if len(logprobs) != len(ids):
        raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(ids)} tokens; request logprobs=0")
    reason = output.finish_reason if output.finish_reason in ("stop", "length") else "stop"
    return Completion(token_ids=ids, logprobs=logprobs, finish_reason=reason,
                      text=tokenizer.decode(ids, skip_special_tokens=True))
