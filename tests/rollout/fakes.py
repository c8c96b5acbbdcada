"""Test doubles for the workflow state machines: an engine that replays scripted texts, and an
in-memory retriever with the real retriever's interface."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, List

from mopd.rollout.engine import Completion


@dataclass
class FakePassage:
    id: str
    title: str
    text: str
    score: float = 0.0


class FakeRetriever:
    """Returns k made-up passages per query (ids name the query); logs every batch."""

    def __init__(self):
        self.batches: List[List[str]] = []

    def search(self, queries, k):
        self.batches.append(list(queries))
        return [[FakePassage(id=f"{q}#{i}", title=f"T{i}", text=f"passage {i} about {q}") for i in range(k)]
                for q in queries]


def role_of(prompt: str) -> str:
    """The role, from phrases near the end of each system prompt (they survive a left cut)."""
    for role, phrase in (("searcher", "who sees only your report"), ("leader", "the Answerer should read"),
                         ("answerer", "a short phrase such as")):
        if phrase in prompt:
            return role
    raise AssertionError("no role prompt found")


def turn_of(prompt: str) -> int:
    """1 on a call's first turn, 2 on the next, ..."""
    return prompt.count("<|im_start|>assistant")


def last_user(prompt: str) -> str:
    return prompt.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


def field(prompt: str, name: str) -> str:
    m = re.search(rf"{name}: (.*)", prompt)
    return m.group(1).split("<|im_end|>")[0] if m else ""


class ScriptedEngine:
    """Replays texts chosen by ``respond(prompt_text, params) -> str | list[str]`` (one per sample).

    A text is tokenised as the model would have written it: EOS appended unless it ends with one
    of the request's stop strings; cut at max_new_tokens (finish 'length'). Log-probs are -1.
    """

    def __init__(self, tokenizer, respond: Callable):
        self.tokenizer = tokenizer
        self.respond = respond
        self.batches: List[List] = []

    def generate(self, requests):
        self.batches.append(list(requests))
        out = []
        for req in requests:
            prompt = self.tokenizer.decode(req.prompt_ids)
            texts = self.respond(prompt, req.params)
            if isinstance(texts, str):
                texts = [texts] * req.params.n
            assert len(texts) == req.params.n
            out.append([self._completion(t, req.params) for t in texts])
        return out

    def _completion(self, text, params):
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not any(text.endswith(s) for s in params.stop):
            ids.append(self.tokenizer.eos_token_id)
        reason = "stop"
        if len(ids) > params.max_new_tokens:
            ids, reason = ids[:params.max_new_tokens], "length"
        return Completion(token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason=reason,
                          text=self.tokenizer.decode(ids, skip_special_tokens=True))

    def load_weights(self, named_tensors):
        pass

    def sleep(self):
        pass

    def wake(self):
        pass
