"""Test doubles for the workflow state machines: an in-memory retriever with the real retriever's
interface, prompt inspection helpers, and the package's ScriptedEngine."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List

from mopd.rollout.scripted_engine import ScriptedEngine  # noqa: F401 (re-exported for the tests)


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
