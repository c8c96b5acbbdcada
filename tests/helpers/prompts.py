"""Reading a decoded prompt in scripted policies: which role, which turn, which field."""

from __future__ import annotations

import re


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
