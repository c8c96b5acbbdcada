"""Shared helpers of the workflow tests: run scripted workflows, check a call's token layout."""

from __future__ import annotations

import itertools

from mopd.core.qa import QAExample
from mopd.rollout.run_state import WorkflowSettings
from mopd.rollout.scheduler import run_workflows
from mopd.rollout.scripted_engine import ScriptedEngine
from tests.helpers.retrievers import FakeRetriever


def questions(n=1):
    return [QAExample(id=f"q{i}", dataset="toy", question=f"Where was band {i} formed?", answers=[f"Town{i}"])
            for i in range(n)]


def run_scripted(tokenizer, respond, workflow="cmas", n_questions=1, attempts=1, candidates=1, **cfg):
    engine, retriever = ScriptedEngine(tokenizer, respond), FakeRetriever()
    cfg.setdefault("max_steps", 5 if workflow == "cmas" else 12)
    settings = WorkflowSettings(workflow=workflow, answer_candidates=candidates, **cfg)
    records = run_workflows(engine, retriever, tokenizer, questions(n_questions), settings, attempts=attempts,
                            method="test", progress=False)
    return records, engine, retriever


def kinds(record, *only):
    return [(e.kind, e.text) if e.kind in ("limit",) else e.kind
            for e in record.events if not only or e.kind in only]


def check_call_layout(call, tokenizer):
    """Segments alternate env/model starting with env; masks cover model tokens exactly; the
    counts match the segments."""
    sources = [s.source for s in call.segments]
    assert sources[0] == "env"
    assert all(a != b for a, b in itertools.pairwise(sources)), sources
    mask = call.loss_mask()
    assert len(mask) == len(call.token_ids()) == len(call.sampling_logprobs())
    assert sum(mask) == sum(len(s.token_ids) for s in call.segments if s.source == "model") == call.output_tokens
    # input tokens: the prompt of every turn = everything before each model segment
    total, prefix = 0, 0
    for s in call.segments:
        if s.source == "model":
            total += prefix
        prefix += len(s.token_ids)
    assert call.input_tokens == total
    for s in call.segments:
        if s.source == "env":
            assert tokenizer.decode(s.token_ids) == s.text
