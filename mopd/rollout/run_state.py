"""What every workflow run shares: its settings, its record, its clock, and the two kinds of work it
hands the scheduler each step (agent turns for the engine, queries for the retriever).

A run is a step-synchronous state machine. The scheduler calls, for every active run,
``begin_step()`` (the agent turns of this step), delivers their completions, then collects
``searches()`` and delivers the passages, then ``end_step()`` (the transitions). Runs never call
the engine or the retriever themselves, so the scheduler can batch them across all runs.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, List, Tuple

from mopd.core.generation import Completion, GenerationRequest, SamplingParams
from mopd.core.records import Event, Passage, WorkflowRecord
from mopd.core.registry import Registry
from mopd.core.roles import role as role_spec
from mopd.core.workflows import workflow as workflow_entry
from mopd.core.workflows import workflow_names
from mopd.rollout.sampling import derive_seed
from mopd.rollout.transcript import Transcript

STATE_MACHINES: Registry = Registry("workflow")
"""The state machine of each workflow of the table (:mod:`mopd.core.workflows`), by its name: a class
taking a :class:`RunContext`, registered where it is written with :func:`register_state_machine`."""


def register_state_machine(name: str):
    """Class decorator: the class runs the workflow ``name``, which must be in the workflow table (its
    roles and step limit are declared there, where the config reads them)."""
    if name not in workflow_names():
        raise ValueError(f"no workflow {name!r} in the workflow table {list(workflow_names())}: add_workflow it first")
    return STATE_MACHINES.register(name)


@dataclass(frozen=True)
class WorkflowSettings:
    """Everything a batch of workflows needs to know, in one object: which workflow, its limits,
    its sampling and its seed. Build it with :meth:`for_training` or :meth:`for_evaluation`; the
    rollout takes nothing beside it."""

    workflow: str = "cmas"
    """cmas or hmas."""
    max_steps: int = 5
    """Environment steps per workflow."""
    max_rounds: int = 5
    """H-MAS delegation rounds before the Leader must select."""
    max_searchers_per_wave: int = 0
    """H-MAS subtasks run per Leader output; 0: no cap."""
    searcher_sees_question: bool = False
    """H-MAS Searchers also see the whole question (off: the paper's one Searcher interface)."""
    max_input_tokens: int = 8192
    """Per-call prompt limit."""
    max_output_tokens: int = 512
    """Per-call output limit (EOS included)."""
    answer_candidates: int = 1
    """Answerer candidates per answering request."""
    temperature: float = 1.0
    """Sampling temperature of every role."""
    top_p: float = 1.0
    """Nucleus mass of every role."""
    seed: int = 0
    """Base seed; every call derives its own from (seed, question, attempt, call, turn)."""
    topk: int = 3
    """Passages per search action."""
    max_batch_calls: int = 256
    """Sampled sequences per engine batch at most."""
    max_active_runs: int = 0
    """Workflows in flight at once; 0: all of them (the largest batches)."""
    retrieval_workers: int = 1
    """Async scheduler: search calls in flight at once (1 for an in-process index, a few for HTTP)."""
    retrieval_timeout_s: float = 0.0
    """Async scheduler: a search call not answered by then fails its runs; 0: wait."""
    scheduler: str = "auto"
    """auto (the engine's preference), lockstep or async (``rollout.scheduler``)."""
    chat_template_kwargs: Tuple[Tuple[str, object], ...] = ()
    """``model.chat_template_kwargs`` as pairs: passed to every chat-template rendering of a call."""
    eos_ids: Tuple[int, ...] = ()
    """Token ids the engine stops on (its generation config's EOS ids as well as the tokenizer's);
    empty: the tokenizer's EOS. The schedulers fill it from the engine (:meth:`with_engine`)."""

    def template_kwargs(self) -> dict:
        return dict(self.chat_template_kwargs)

    def with_engine(self, engine) -> "WorkflowSettings":
        """These settings with the engine's EOS ids, unless they name their own."""
        eos = getattr(engine, "eos_ids", None)
        if self.eos_ids or not eos:
            return self
        return dataclasses.replace(self, eos_ids=tuple(sorted(int(i) for i in eos)))

    @classmethod
    def for_training(cls, cfg, seed: int) -> "WorkflowSettings":
        """Training rollouts: the config's workflow, limits and rollout sampling."""
        r = cfg.rollout
        return cls(workflow=r.workflow, max_steps=r.max_steps, max_rounds=r.max_rounds,
                   max_searchers_per_wave=r.max_searchers_per_wave,
                   searcher_sees_question=r.searcher_sees_question, max_input_tokens=r.max_input_tokens,
                   max_output_tokens=r.max_output_tokens, answer_candidates=r.answer_candidates,
                   temperature=r.temperature, top_p=r.top_p, seed=seed, topk=cfg.retriever.topk,
                   max_batch_calls=r.max_batch_calls, retrieval_workers=4 if cfg.retriever.kind == "http" else 1,
                   scheduler=r.scheduler,
                   chat_template_kwargs=tuple(sorted(dict(cfg.model.chat_template_kwargs or {}).items())))

    @classmethod
    def for_evaluation(cls, cfg, workflow: str = "", seed: int | None = None) -> "WorkflowSettings":
        """Evaluation (and validation): the config's limits with ``cfg.eval`` sampling and candidates.
        A workflow other than the config's gets the paper's step limit for it (the workflow table's)."""
        workflow = workflow or cfg.rollout.workflow
        limit = workflow_entry(workflow).max_steps   # an unknown name fails here
        train = cls.for_training(cfg, cfg.rollout.seed if seed is None else seed)
        steps = train.max_steps if workflow == cfg.rollout.workflow else limit
        return dataclasses.replace(train, workflow=workflow, max_steps=steps, temperature=cfg.eval.temperature,
                                   top_p=cfg.eval.top_p, answer_candidates=cfg.eval.answer_candidates)


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
        """The step of the agent acting now: the run's step, or inside an H-MAS wave the acting
        Searcher's own (each lane sets it before each of its sub-steps, see mopd.rollout.lanes)."""
        self.started = time.perf_counter()

    def event(self, kind: str, call_id: str = "", text: str = "", passages=None, selection=None) -> None:
        self.record.events.append(Event(kind=kind, step=self.step, call_id=call_id, text=text,
                                        passages=list(passages or []), selection=list(selection or [])))

    def transcript(self, call) -> "Transcript":
        """A transcript of ``call`` under these settings' limits, EOS ids and template kwargs."""
        s = self.settings
        return Transcript(call, self.tokenizer, s.max_input_tokens, eos_ids=s.eos_ids,
                          template_kwargs=s.template_kwargs())

    def params(self, role: str, call_id: str, turn: int, n: int = 1) -> SamplingParams:
        """Sampling of one turn; its seed depends only on the run, the call and the turn, so a
        run samples the same tokens however it is batched with others."""
        s, r = self.settings, self.record
        # A second copy of a question in one batch must not replay the first copy's samples; the
        # first copy keeps the seeds runs always had.
        parts = (s.seed, r.dataset, r.question_id, r.attempt, call_id, turn) + ((self.copy,) if self.copy else ())
        return SamplingParams(n=n, temperature=s.temperature, top_p=s.top_p, max_new_tokens=s.max_output_tokens,
                              stop=role_spec(role).stop, seed=derive_seed(*parts))

    def finish(self) -> None:
        self.record.steps = self.step
        self.record.duration_s = time.perf_counter() - self.started


def to_record_passages(passages) -> List[Passage]:
    """Retriever passages (id, title, text, score) as record passages."""
    return [Passage(id=str(p.id), text=p.text, title=getattr(p, "title", "")) for p in passages]
