"""Reading an agent's prompt back into what the agent knows: its role, task, searches and reports.

The scripted demonstration policy (:mod:`mopd.recipes.tiny_world.scripted_policy`) sees exactly what the model
sees, the decoded prompt ids of a request, and must act on it. This module turns that ChatML
text back into a :class:`PromptView`: the role (from the system prompt), the question, the H-MAS
subtask, the passages of every search so far, the Searcher's own earlier outputs, the reports a
Leader or Answerer has received, and whether the environment ordered the agent to finish.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from mopd.core.roles import ROLE_TABLE
from mopd.rollout import prompts

_MESSAGE = re.compile(r"<\|im_start\|>(system|user|assistant)\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL)
_DOC = re.compile(r"^Doc \d+\(Title: (.*?)\) (.*)$", re.MULTILINE)
_INFORMATION = re.compile(r"<information>(.*?)</information>", re.DOTALL)
_LEADER_REPORT = re.compile(r"^Report (\d+) \(task: (.*?)\):\n(.*?)(?=\n\nReport \d+ \(task: |\Z)",
                            re.DOTALL | re.MULTILINE)
_ANSWERER_REPORT = re.compile(r"^Report \d+: (.*)$", re.MULTILINE)


@dataclass
class Doc:
    title: str
    text: str

    @property
    def first_sentence(self) -> str:
        """The passage's first sentence (the tiny world puts every gold fact there)."""
        m = re.match(r"(.+?\.)(?:\s|$)", self.text)
        return m.group(1) if m else self.text


@dataclass
class PromptView:
    role: str
    question: str = ""
    subtask: Optional[str] = None
    """H-MAS Searcher under ``rollout.searcher_sees_question`` only; by default a Searcher's subtask
    arrives as its question (one interface in both workflows)."""
    searches: List[List[Doc]] = field(default_factory=list)
    """The passages of each search so far (Searcher), in order."""
    outputs: List[str] = field(default_factory=list)
    """The agent's own earlier outputs in this call."""
    reports: List[Tuple[int, str, str]] = field(default_factory=list)
    """(number, subtask, text) of every report received so far (Leader), or (i, '', text) (Answerer)."""
    forced: bool = False
    """The last environment turn ordered the agent to finish (report / select now)."""

    @property
    def docs(self) -> List[Doc]:
        return [d for s in self.searches for d in s]


def split_messages(prompt: str) -> List[Tuple[str, str]]:
    """(role, content) of every ChatML message; the open assistant header at the end gives ''."""
    return [(m.group(1), m.group(2)) for m in _MESSAGE.finditer(prompt)]


def parse_docs(information: str) -> List[Doc]:
    return [Doc(title=m.group(1), text=m.group(2)) for m in _DOC.finditer(information)]


def read_prompt(prompt: str) -> PromptView:
    """The :class:`PromptView` of a decoded request (special tokens kept)."""
    messages = split_messages(prompt)
    system = messages[0][1] if messages and messages[0][0] == "system" else ""
    role = next((r.name for r in ROLE_TABLE.values() if r.system_prompt == system), None)
    if role is None:
        raise ValueError("not a prompt of one of the team's roles (unknown system message)")
    view = PromptView(role=role)
    users = [c for r, c in messages if r == "user"]
    view.outputs = [c for r, c in messages[1:] if r == "assistant" and c]
    first = users[0] if users else ""
    if view.role == "searcher":
        m = re.match(r"Your task: (.*?)\nIt is part of the question: (.*?)(?:\n\n|$)", first, re.DOTALL)
        if m:
            view.subtask, view.question = m.group(1), m.group(2)
        else:
            view.question = first[len("Question: "):].split("\n\n")[0]
        for u in users[1:]:
            for info in _INFORMATION.findall(u):
                view.searches.append(parse_docs(info))
        view.forced = prompts.FORCE_REPORT in users[-1]
    elif view.role == "leader":
        view.question = first[len("Question: "):].split("\n\n")[0]
        for u in users[1:]:
            view.reports.extend((int(m.group(1)), m.group(2), m.group(3).strip())
                                for m in _LEADER_REPORT.finditer(u))
        view.forced = prompts.FORCE_SELECT in users[-1]
    else:
        body, _, question = first.rpartition("\n\nQuestion: ")
        view.question = question
        view.reports = [(i, "", t) for i, t in enumerate(_ANSWERER_REPORT.findall(body), 1)]
    return view
