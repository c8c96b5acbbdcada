"""What every workflow run shares: its settings, its record, its clock, and the two kinds of work it
hands the scheduler each step (agent turns for the engine, queries for the retriever).

A run is a step-synchronous state machine. The scheduler calls, for every active run,
``begin_step()`` (the agent turns of this step), delivers their completions, then collects
``searches()`` and delivers the passages, then ``end_step()`` (the transitions). Runs never call
the engine or the retriever themselves, so the scheduler can batch them across all runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List

from mopd.core.generation import Completion, GenerationRequest, SamplingParams
from mopd.core.records import Event, Passage, WorkflowRecord
from mopd.rollout.prompts import ROLE_STOPS
from mopd.rollout.sampling import derive_seed


@dataclass(frozen=True)
class WorkflowSettings:
    """Limits and sampling of one batch of workflows (from RolloutConfig / EvalConfig)."""

    max_steps: int = 5
    max_rounds: int = 5
    max_searchers_per_wave: int = 0
    """0: no cap."""
    searcher_sees_question: bool = False
    max_input_tokens: int = 8192
    max_output_tokens: int = 512
    answer_candidates: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    topk: int = 3

    @classmethod
    def from_config(cls, rollout_cfg, *, answer_candidates: int, temperature: float, top_p: float,
                    seed: int, topk: int = 3) -> "WorkflowSettings":
        return cls(max_steps=rollout_cfg.max_steps, max_rounds=rollout_cfg.max_rounds,
                   max_searchers_per_wave=rollout_cfg.max_searchers_per_wave,
                   searcher_sees_question=rollout_cfg.searcher_sees_question,
                   max_input_tokens=rollout_cfg.max_input_tokens, max_output_tokens=rollout_cfg.max_output_tokens,
                   answer_candidates=answer_candidates, temperature=temperature, top_p=top_p, seed=seed, topk=topk)


@dataclass
class Turn:
    """One pending model call of this step: the request, and where its completions go."""

    request: GenerationRequest
    deliver: Callable[[List[Completion]], None]


@dataclass
class SearchNeed:
    """One pending search of this step: the query, and where the passages go."""

    query: str
    deliver: Callable[[list], None]


class RunContext:
    """The state every agent of one run writes to: the record, the step, the settings."""

    def __init__(self, record: WorkflowRecord, tokenizer, settings: WorkflowSettings, copy: int = 0):
        self.record = record
        self.tokenizer = tokenizer
        self.settings = settings
        self.copy = copy
        """Earlier copies of this question in the batch (see ``scheduler.new_run``)."""
        self.step = 0
        self.started = time.perf_counter()

    def event(self, kind: str, call_id: str = "", text: str = "", passages=None, selection=None) -> None:
        self.record.events.append(Event(kind=kind, step=self.step, call_id=call_id, text=text,
                                        passages=list(passages or []), selection=list(selection or [])))

    def params(self, role: str, call_id: str, turn: int, n: int = 1) -> SamplingParams:
        """Sampling of one turn; its seed depends only on the run, the call and the turn, so a
        run samples the same tokens however it is batched with others."""
        s, r = self.settings, self.record
        # A second copy of a question in one batch must not replay the first copy's samples; the
        # first copy keeps the seeds runs always had.
        parts = (s.seed, r.dataset, r.question_id, r.attempt, call_id, turn) + ((self.copy,) if self.copy else ())
        return SamplingParams(n=n, temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_output_tokens,
                              stop=ROLE_STOPS[role], seed=derive_seed(*parts))

    def finish(self) -> None:
        self.record.steps = self.step
        self.record.duration_s = time.perf_counter() - self.started


def to_record_passages(passages) -> List[Passage]:
    """Retriever passages (id, title, text, score) as record passages."""
    return [Passage(id=str(p.id), text=p.text, title=getattr(p, "title", "")) for p in passages]
