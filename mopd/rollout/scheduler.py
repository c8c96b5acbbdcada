"""Runs many workflows at once so the engine always sees big batches.

Each environment step, every active run says which agent turns it needs; all of them (all runs,
all roles, Answerer candidates included) go to the engine as one ``generate`` call, cut only at
``max_batch_calls`` sampled sequences; then every search query of the step goes to the retriever
as one ``search`` call. A run that finishes leaves its slot to the next waiting run, so at most
``max_active_runs`` runs are in flight (default: all of them, which maximises batching).

Entry point for the trainer and evaluation: :func:`run_workflows`.
"""

from __future__ import annotations

from collections import Counter
from typing import List, Optional, Sequence

from mopd.core.records import WorkflowRecord
from mopd.rollout import cmas, hmas  # noqa: F401  (their state machines register themselves)
from mopd.rollout.run_state import STATE_MACHINES, RunContext, WorkflowSettings


def new_run(workflow: str, example, attempt: int, tokenizer, settings: WorkflowSettings, method: str = "",
            copy: int = 0):
    """``copy``: how many earlier copies of this question the same batch holds (its group id and,
    when above 0, its sampling seeds tell it apart from them)."""
    state_machine = STATE_MACHINES.lookup(workflow)
    record = WorkflowRecord(question_id=example.id, dataset=example.dataset, question=example.question,
                            answers=list(example.answers), attempt=attempt, method=method, workflow=workflow,
                            group_id=f"{example.dataset}/{example.id}#{copy}")
    return state_machine(RunContext(record, tokenizer, settings, copy=copy))


def new_runs(questions, attempts: int, tokenizer, settings: WorkflowSettings, method: str = "") -> List:
    """``attempts`` runs of every question, question by question. Each entry of ``questions`` is one
    sampled prompt: its runs share a group id (``WorkflowRecord.group_id``). A question listed twice
    (a step across an epoch boundary) gives two groups, the second sampled with its own seeds."""
    seen: Counter = Counter()
    runs = []
    for q in questions:
        copy = seen[(q.dataset, q.id)]
        seen[(q.dataset, q.id)] += 1
        runs.extend(new_run(settings.workflow, q, a, tokenizer, settings, method, copy=copy) for a in range(attempts))
    return runs


def _generate(engine, turns, max_batch_calls: int) -> None:
    """Send the turns' requests in as few generate() calls as the batch cap allows."""
    start = 0
    while start < len(turns):
        end, rows = start, 0
        while end < len(turns) and (end == start or rows + turns[end].request.params.n <= max_batch_calls):
            rows += turns[end].request.params.n
            end += 1
        batch = turns[start:end]
        outputs = engine.generate([t.request for t in batch])
        for t, completions in zip(batch, outputs):
            t.deliver(completions)
        start = end


def run_steps(engine, retriever, runs: Sequence, *, topk: int, max_batch_calls: int = 256,
              max_active_runs: Optional[int] = None, progress=None) -> None:
    """Drive ``runs`` to completion, step by step, batching engine and retriever calls across runs."""
    waiting = list(runs)[::-1]
    active: List = []
    limit = max_active_runs or len(waiting)
    while waiting or active:
        while waiting and len(active) < limit:
            active.append(waiting.pop())
        turns = [t for run in active for t in run.begin_step()]
        _generate(engine, turns, max_batch_calls)
        needs = [n for run in active for n in run.searches()]
        if needs:
            results = retriever.search([n.query for n in needs], topk)
            if len(results) != len(needs):
                raise RuntimeError(f"retriever returned {len(results)} results for {len(needs)} queries")
            for need, passages in zip(needs, results):
                need.deliver(passages)
        for run in active:
            run.end_step()
        finished = [r for r in active if r.done]
        active = [r for r in active if not r.done]
        if progress is not None and finished:
            progress.update(len(finished))


def run_workflows(engine, retriever, tokenizer, questions, settings: WorkflowSettings, *, attempts: int,
                  method: str = "", progress: bool = True) -> List[WorkflowRecord]:
    """Run ``attempts`` workflows of ``settings.workflow`` on every question; records come back
    question by question, attempts in order. Sampling of every call is seeded from (seed, question,
    attempt, call, turn), so a record does not depend on what it was batched with."""
    settings = settings.with_engine(engine)  # the transcripts stop where the engine does
    runs = new_runs(questions, attempts, tokenizer, settings, method)
    engine.reset_prefix_cache()  # cached prefixes may predate the weights
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(runs), desc=f"rollout {settings.workflow}", unit="run", leave=False)
    try:
        run_steps(engine, retriever, runs, topk=settings.topk, max_batch_calls=settings.max_batch_calls,
                  max_active_runs=settings.max_active_runs or None, progress=bar)
    finally:
        if bar is not None:
            bar.close()
        engine.reset_prefix_cache()
    return [r.ctx.record for r in runs]
