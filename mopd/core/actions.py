"""The action grammar as small pure parsers, one per role (docs/architecture.md, "The action grammar").

An output is: optionally ``<think>...</think>`` first (or ``...</think>`` when the chat template's
generation prompt opened the block), then exactly the role's action tags, with
any whitespace around and between them and nothing else. Lenient about whitespace, strict about
tags: text outside the tags, a second action, a nested or unclosed grammar tag, or an empty
query/report/subtask/answer, or a placeholder copied from the instructions (``query``, ``...``),
makes the output invalid. An invalid output is a value
(``Action(kind="invalid", error=...)``), never an exception.

- Searcher: one ``<search>query</search>`` or one ``<report>...</report>``.
- Leader: one or more ``<subtask>...</subtask>``, or one ``<select>i,j</select>`` whose numbers
  (comma or space separated, repeats dropped) all name reports received so far.
- Answerer: one ``<answer>...</answer>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple

TAG_NAMES = ("think", "search", "information", "report", "subtask", "select", "answer")
_ANY_TAG = re.compile(r"</?(?:" + "|".join(TAG_NAMES) + r")>")
_SELECT_BODY = re.compile(r"\s*\d+(?:\s*[,\s]\s*\d+)*\s*")
PLACEHOLDERS = frozenset({"query", "...", "\u2026", "<...>", "your query", "search query"})
"""Bodies copied from an instruction instead of written: a model that answers ``<search>query</search>``
has not acted (real instruct models copy the prompt's placeholders)."""


def is_placeholder(body: str) -> bool:
    return body.strip().lower() in PLACEHOLDERS


@dataclass(frozen=True)
class Action:
    kind: str
    """search | report | subtasks | select | answer | invalid."""
    text: str = ""
    """search: the query; report: the report; answer: the answer (all stripped)."""
    subtasks: Tuple[str, ...] = ()
    selection: Tuple[int, ...] = ()
    """select: 1-based report numbers, in the order written, repeats dropped."""
    think: str = ""
    error: str = ""
    """invalid: why."""

    @property
    def valid(self) -> bool:
        return self.kind != "invalid"


def _invalid(error: str) -> Action:
    return Action(kind="invalid", error=error)


def split_think(text: str) -> Tuple[Optional[str], str, str]:
    """(think, rest, error): the leading think block and what follows it, or an error."""
    s = (text or "").strip()
    think = ""
    close = s.find("</think>")
    if not s.startswith("<think>") and close >= 0 and "<think>" not in s[:close]:
        # A thinking model's generation prompt opens the block (Qwen3-2507 Thinking writes
        # "<think>\n" itself), so its output is "reasoning</think>" and then the action.
        s = "<think>" + s
    if s.startswith("<think>"):
        end = s.find("</think>")
        if end < 0:
            return None, "", "unclosed <think>"
        think, s = s[len("<think>"):end].strip(), s[end + len("</think>"):].strip()
        if "<think>" in think:
            return None, "", "nested <think>"
    if "<think>" in s or "</think>" in s:
        return None, "", "<think> must come first, once"
    return think, s, ""


def _tag_bodies(rest: str, tag: str) -> Optional[list]:
    """Bodies of ``rest`` when it is one or more ``<tag>...</tag>`` and whitespace only; else None."""
    pattern = re.compile(rf"\s*<{tag}>(.*?)</{tag}>\s*", re.DOTALL)
    bodies, pos = [], 0
    while pos < len(rest):
        m = pattern.match(rest, pos)
        if not m:
            return None
        bodies.append(m.group(1))
        pos = m.end()
    return bodies or None


def _single(rest: str, tag: str) -> Tuple[Optional[str], str]:
    bodies = _tag_bodies(rest, tag)
    if bodies is None:
        return None, f"not a <{tag}> action"
    if len(bodies) > 1:
        return None, f"{len(bodies)} <{tag}> tags, expected one"
    body = bodies[0]
    if _ANY_TAG.search(body):
        return None, f"a tag inside <{tag}>"
    if not body.strip():
        return None, f"empty <{tag}>"
    if is_placeholder(body):
        return None, f"a placeholder inside <{tag}>"
    return body.strip(), ""


def parse_searcher(text: str) -> Action:
    think, rest, err = split_think(text)
    if err:
        return _invalid(err)
    if not rest:
        return _invalid("no action")
    for tag, kind in (("search", "search"), ("report", "report")):
        if rest.startswith(f"<{tag}>"):
            body, err = _single(rest, tag)
            return _invalid(err) if err else Action(kind=kind, text=body, think=think)
    return _invalid("expected <search> or <report>")


def parse_leader(text: str, n_reports: int) -> Action:
    think, rest, err = split_think(text)
    if err:
        return _invalid(err)
    if not rest:
        return _invalid("no action")
    if rest.startswith("<subtask>"):
        bodies = _tag_bodies(rest, "subtask")
        if bodies is None:
            return _invalid("text outside <subtask> tags")
        if any(_ANY_TAG.search(b) for b in bodies):
            return _invalid("a tag inside <subtask>")
        if any(not b.strip() for b in bodies):
            return _invalid("empty <subtask>")
        if any(is_placeholder(b) for b in bodies):
            return _invalid("a placeholder inside <subtask>")
        return Action(kind="subtasks", subtasks=tuple(b.strip() for b in bodies), think=think)
    if rest.startswith("<select>"):
        body, err = _single(rest, "select")
        if err:
            return _invalid(err)
        if not _SELECT_BODY.fullmatch(body):
            return _invalid("<select> must hold report numbers like 1,3")
        numbers = [int(x) for x in re.findall(r"\d+", body)]
        bad = [i for i in numbers if not 1 <= i <= n_reports]
        if bad:
            return _invalid(f"<select> names report(s) {bad}; there are {n_reports}")
        return Action(kind="select", selection=tuple(dict.fromkeys(numbers)), think=think)
    return _invalid("expected <subtask> or <select>")


_SEARCH_TAG = re.compile(r"<search>(.*?)</search>", re.DOTALL)


def search_queries(text: str) -> Tuple[str, ...]:
    """The search actions of a Searcher output as the paper's recorder counts them: every non-empty
    query inside a complete ``<search>...</search>`` tag (after a leading think block), whether or
    not the output is a valid action and whether or not the search is run."""
    _, rest, err = split_think(text)
    body = (text or "") if err else rest
    return tuple(q.strip() for q in _SEARCH_TAG.findall(body) if q.strip())


def parse_answerer(text: str) -> Action:
    think, rest, err = split_think(text)
    if err:
        return _invalid(err)
    if not rest:
        return _invalid("no action")
    body, err = _single(rest, "answer")
    return _invalid(err) if err else Action(kind="answer", text=body, think=think)
