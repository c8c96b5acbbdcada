"""Small hand-made workflow records for the evaluation tests."""

from __future__ import annotations

from typing import List, Optional

from mopd.core.records import AgentCall, Event, Passage, WorkflowRecord


def make_record(qid: str, dataset: str, attempt: int, candidate: Optional[str], answers=("paris",), *,
                workflow: str = "cmas", searches: int = 0, empty_searches: int = 0,
                passages_per_search: int = 3, blank_queries: int = 0, reports: int = 0,
                subtasks: int = 0, input_tokens: int = 0, output_tokens: int = 0,
                duration_s: float = 0.0, candidates: Optional[List[str]] = None) -> WorkflowRecord:
    """One workflow: ``searches`` searches returning ``passages_per_search`` passages, ``empty_searches``
    returning none, ``blank_queries`` search events with an empty query (not a search action)."""
    events = []
    for i in range(searches):
        events.append(Event("search", 1, text=f"q{i}",
                            passages=[Passage(f"p{j}", "t") for j in range(passages_per_search)]))
    events += [Event("search", 1, text=f"e{i}") for i in range(empty_searches)]
    events += [Event("search", 1, text="  ") for _ in range(blank_queries)]
    events += [Event("report", 2, text="r") for _ in range(reports)]
    events += [Event("subtask", 1, text="s") for _ in range(subtasks)]
    calls = [AgentCall("s0", "searcher", input_tokens=input_tokens, output_tokens=output_tokens)]
    if candidates is None:
        candidates = [] if candidate is None else [candidate]
    return WorkflowRecord(question_id=qid, dataset=dataset, question=f"question {qid}?", answers=list(answers),
                          attempt=attempt, workflow=workflow, calls=calls, events=events,
                          candidates=candidates, duration_s=duration_s)


def right(answer: str = "Paris") -> str:
    return f"<think>hm</think><answer>{answer}</answer>"


WRONG = "<answer>London</answer>"
