"""Role prompts and every piece of text the environment shows an agent, with their exact rendering.

One model plays every role; the system prompt selects the role. Rollouts and supervised
demonstrations must produce identical tokens, so everything an agent reads is built by the
functions here: the first prompt of each role (``render_*_prompt`` -> token ids through the chat
template) and the content of each later environment turn (``searcher_feedback``,
``leader_feedback``), appended with :func:`mopd.rollout.chat.continuation_ids`.

The action grammar (``mopd.core.actions``), as the prompts explain it:
- Searcher: ``<search>query</search>`` (passages come back in ``<information>``) or
  ``<report>...</report>`` (ends the Searcher's work).
- Leader: one or more ``<subtask>...</subtask>`` (a wave of parallel Searchers) or
  ``<select>i,j</select>`` (hand those reports to the Answerer).
- Answerer: ``<answer>...</answer>``.
Every role may think first inside ``<think>...</think>``.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

from mopd.core.roles import ANSWERER_SYSTEM, LEADER_SYSTEM, ROLE_TABLE, SEARCHER_SYSTEM
from mopd.retriever.passage import format_passages
from mopd.rollout.chat import render_ids

SEARCHER_USER = "Question: {question}"
"""The Searcher's task in both workflows: the question (C-MAS) or its subtask (H-MAS), in the same
place and words. The paper gives the Searcher one interface ("taking a question or a subtask"), so
the Stage-I teacher scores H-MAS Searchers on the context it was trained on."""
SEARCHER_SUBTASK_USER = "Your task: {subtask}\nIt is part of the question: {question}"
"""H-MAS opt-in (``rollout.searcher_sees_question``, off by default): the subtask and the whole
question, a template the Stage-I teacher never saw."""

LEADER_USER = "Question: {question}"

ANSWERER_USER = "{reports}\n\nQuestion: {question}"
"""The question comes last: an over-long prompt is cut from the left, dropping early reports first."""

NO_REPORTS = "There are no reports."
EMPTY_REPORT = "(no report)"

INVALID_SEARCHER = ("That was not a valid action. Write exactly one search, such as "
                    "<search>Eiffel Tower architect</search>, or one report inside <report></report> tags, "
                    "and nothing else.")
INVALID_LEADER = ("That was not a valid action. Write subtasks, such as <subtask>Who designed the Eiffel "
                  "Tower?</subtask>, or a selection of the reports you have received, such as "
                  "<select>1</select>, and nothing else.")
FORCE_REPORT = "You have no searches left. Write your report now, inside <report></report> tags."
FORCE_SELECT = ("No more Searchers can be sent. Choose the reports for the Answerer now: their numbers "
                "inside <select></select> tags, such as <select>1</select>.")


class Report(NamedTuple):
    """A Searcher's report as the Leader sees it: its number, the subtask, the report text."""

    index: int
    subtask: str
    text: str


# --------------------------------------------------------------------------------------------
# Messages (text) and first prompts (token ids)
# --------------------------------------------------------------------------------------------


def _join(*parts: str) -> str:
    return "\n\n".join(p for p in parts if p)


def searcher_messages(question: str, subtask: Optional[str] = None, force_report: bool = False,
                      show_question: bool = False) -> List[dict]:
    """An H-MAS Searcher (``subtask`` given) sees its subtask as a C-MAS Searcher sees the question;
    ``show_question`` selects the opt-in template that also names the whole question."""
    if subtask is None:
        user = SEARCHER_USER.format(question=question)
    elif show_question:
        user = SEARCHER_SUBTASK_USER.format(subtask=subtask, question=question)
    else:
        user = SEARCHER_USER.format(question=subtask)
    return [{"role": "system", "content": SEARCHER_SYSTEM},
            {"role": "user", "content": _join(user, FORCE_REPORT if force_report else "")}]


def leader_messages(question: str, force_select: bool = False) -> List[dict]:
    return [{"role": "system", "content": LEADER_SYSTEM},
            {"role": "user", "content": _join(LEADER_USER.format(question=question),
                                              FORCE_SELECT if force_select else "")}]


def answerer_reports(reports: Sequence[str]) -> str:
    """The Answerer's view of the selected reports: ``Report 1: ...`` lines, in selection order."""
    if not reports:
        return NO_REPORTS
    return "\n".join(f"Report {i}: {r.strip() or EMPTY_REPORT}" for i, r in enumerate(reports, 1))


def answerer_messages(question: str, reports: Sequence[str]) -> List[dict]:
    return [{"role": "system", "content": ANSWERER_SYSTEM},
            {"role": "user", "content": ANSWERER_USER.format(reports=answerer_reports(reports), question=question)}]


def render_searcher_prompt(tokenizer, question: str, subtask: Optional[str] = None,
                           force_report: bool = False, show_question: bool = False,
                           template_kwargs: Optional[dict] = None) -> List[int]:
    return render_ids(tokenizer, searcher_messages(question, subtask, force_report, show_question), template_kwargs)


def render_leader_prompt(tokenizer, question: str, force_select: bool = False,
                         template_kwargs: Optional[dict] = None) -> List[int]:
    return render_ids(tokenizer, leader_messages(question, force_select), template_kwargs)


def render_answerer_prompt(tokenizer, question: str, reports: Sequence[str],
                           template_kwargs: Optional[dict] = None) -> List[int]:
    return render_ids(tokenizer, answerer_messages(question, reports), template_kwargs)


# --------------------------------------------------------------------------------------------
# Environment turns after a model turn (content only; wrap with chat.continuation_ids)
# --------------------------------------------------------------------------------------------


def information_segment(passages) -> str:
    """``<information>Doc 1(Title: t) text\\nDoc 2...</information>``: what a search returns
    (the passages in the retriever's Search-R1 layout, :func:`mopd.retriever.format_passages`)."""
    return f"<information>{format_passages(passages)}</information>"


def reports_segment(reports: Sequence[Report]) -> str:
    """The Leader's view of a finished wave: each report with its number and subtask."""
    blocks = [f"Report {r.index} (task: {r.subtask.strip()}):\n{r.text.strip() or EMPTY_REPORT}" for r in reports]
    return "\n\n".join(blocks)


def searcher_feedback(passages=None, invalid: bool = False, force_report: bool = False) -> str:
    """Content of the Searcher's next user turn: the search results, or the invalid-action note,
    then (at the step limit) the order to report."""
    return _join(information_segment(passages) if passages is not None else "",
                 INVALID_SEARCHER if invalid else "", FORCE_REPORT if force_report else "")


def leader_feedback(reports: Sequence[Report] = (), invalid: bool = False, force_select: bool = False) -> str:
    """Content of the Leader's next user turn: new reports, or the invalid-action note, then (at
    the round or step limit) the order to select."""
    return _join(reports_segment(reports) if reports else "", INVALID_LEADER if invalid else "",
                 FORCE_SELECT if force_select else "")


def all_prompt_texts() -> Tuple[str, ...]:
    """Every fixed text an agent reads: the role table's system prompts and this module's
    templates and orders (a small model built with its own tokenizer trains it on them)."""
    return tuple(r.system_prompt for r in ROLE_TABLE.values()) + (
        SEARCHER_USER, SEARCHER_SUBTASK_USER, LEADER_USER, ANSWERER_USER, NO_REPORTS, EMPTY_REPORT,
        INVALID_SEARCHER, INVALID_LEADER, FORCE_REPORT, FORCE_SELECT)
