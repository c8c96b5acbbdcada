"""The Prompted Critic baseline: the current policy judges each Searcher report (0/1).

The Searcher reward under this baseline is ``0.3 R_EM + 0.5 R_judge + 0.2 b_S`` (rewards.py);
this module renders the judge prompt, sends all of a step's reports to the engine in one batch,
and parses the verdicts. An unparsable verdict scores 0 and is counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from mopd.core.generation import GenerationRequest, SamplingParams

JUDGE_SYSTEM = "You are a strict reviewer of research notes written by a search assistant."

JUDGE_PROMPT = """A team is answering a question. One member was given a sub-question, searched a document collection, and wrote the report below.

Original question: {question}
Sub-question: {sub_query}
Report: {summary}

Does the report give correct, specific information that helps answer the sub-question? Reply with <verdict>yes</verdict> or <verdict>no</verdict> and nothing else."""

_VERDICT = re.compile(r"<verdict>\s*(.*?)\s*</verdict>", re.IGNORECASE | re.DOTALL)
_YES = {"yes", "y", "1", "true", "correct"}
_NO = {"no", "n", "0", "false", "incorrect"}


def render_judge_prompt(question: str, sub_query: str, summary: str) -> str:
    return JUDGE_PROMPT.format(question=question, sub_query=sub_query, summary=summary)


def parse_verdict(text: Optional[str]) -> Optional[int]:
    """1 for yes, 0 for no, None when the output holds no readable verdict (the last tag counts)."""
    if not text:
        return None
    found = _VERDICT.findall(text)
    if not found:
        return None
    v = found[-1].strip().lower().rstrip(".!")
    if v in _YES:
        return 1
    if v in _NO:
        return 0
    return None


@dataclass
class JudgeItem:
    key: str
    """Whatever identifies the report (e.g. 'record_index/call_id')."""
    question: str
    sub_query: str
    summary: str


def judge_items(records: Sequence) -> List[JudgeItem]:
    """One item per Searcher call of every record, keyed ``"<record index>\t<call id>"``: the
    question, the call's subtask (the question itself in C-MAS) and its last report ("" if none)."""
    items = []
    for i, rec in enumerate(records):
        for call in rec.calls_of("searcher"):
            reports = [e.text for e in rec.events if e.kind == "report" and e.call_id == call.call_id]
            items.append(JudgeItem(f"{i}\t{call.call_id}", rec.question, call.parent or rec.question,
                                   reports[-1] if reports else ""))
    return items


def verdicts_by_call(scores: Dict[str, float]) -> Dict[Tuple[int, str], float]:
    """``judge_reports``' scores keyed (record index, call id), as the Searcher reward reads them."""
    return {(int(k.split("\t")[0]), k.split("\t")[1]): v for k, v in scores.items()}


def judge_reports(engine, tokenizer, items: Sequence[JudgeItem], *, max_new_tokens: int = 16,
                  temperature: float = 1.0, seed: int = 0) -> Tuple[Dict[str, float], int]:
    """Judge every report in one engine batch; returns ({key: 0/1}, number unparsable).

    ``engine`` follows the rollout engine interface (generate(list[GenerationRequest])).
    """
    if not items:
        return {}, 0
    requests: List = []
    for i, it in enumerate(items):
        messages = [{"role": "system", "content": JUDGE_SYSTEM},
                    {"role": "user", "content": render_judge_prompt(it.question, it.sub_query, it.summary)}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        requests.append(GenerationRequest(list(ids), SamplingParams(
            n=1, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed + i)))
    completions = engine.generate(requests)
    scores: Dict[str, float] = {}
    bad = 0
    for it, outs in zip(items, completions):
        v = parse_verdict(outs[0].text)
        if v is None:
            bad += 1
            v = 0
        scores[it.key] = float(v)
    return scores, bad
