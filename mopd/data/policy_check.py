"""A quick health check of a policy on the tiny world: format validity and strict EM per workflow.

Used to size pi_0 (valid in format, EM well between 0 and 1) and by ``mopd world pi0 --check``.
It runs the real HF engine and ``run_workflows``; the full evaluation with bootstrap intervals
and plots is ``mopd.eval``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, Sequence


def summarize(records) -> Dict[str, object]:
    """Answer validity (Answerer outputs with a valid ``<answer>`` action), invalid calls, strict
    EM overall and per dataset, searches and tokens per workflow."""
    from mopd.core.actions import parse_answerer
    from mopd.core.scoring import exact_match

    answers = [c for r in records for c in r.calls_of("answerer")]
    calls = [c for r in records for c in r.calls]
    by_ds = defaultdict(list)
    for r in records:
        by_ds[r.dataset].append(exact_match(r.final_answer, r.answers))
    n = max(1, len(records))
    return {
        "workflows": len(records),
        "answer_valid": sum(parse_answerer(c.outputs()[-1] if c.outputs() else "").valid for c in answers)
        / max(1, len(answers)),
        "invalid_calls": sum(c.invalid for c in calls) / max(1, len(calls)),
        "invalid_by_role": {role: sum(c.invalid for c in calls if c.role == role)
                            / max(1, sum(1 for c in calls if c.role == role))
                            for role in ("leader", "searcher", "answerer") if any(c.role == role for c in calls)},
        "em": sum(v for vs in by_ds.values() for v in vs) / n,
        "em_by_dataset": {k: sum(v) / len(v) for k, v in sorted(by_ds.items())},
        "searches": sum(r.search_actions for r in records) / n,
        "tokens": sum(r.input_tokens + r.output_tokens for r in records) / n,
    }


def check_policy(model_dir, world_dir, *, split: str = "test", workflows: Sequence[str] = ("cmas", "hmas"),
                 temperature: float = 0.6, top_p: float = 0.95, seed: int = 0, attempts: int = 1,
                 progress: bool = False) -> Dict[str, dict]:
    """``{workflow: summarize(records)}`` for ``model_dir`` on a split of the world."""
    from mopd.config import RetrieverConfig
    from mopd.data.tinyworld import WorldPaths, load_split
    from mopd.data.warmstart import CachedRetriever, workflow_settings
    from mopd.retriever import load_retriever
    from mopd.rollout.hf_engine import HFEngine
    from mopd.rollout.scheduler import run_workflows

    paths = WorldPaths.of(world_dir)
    engine = HFEngine.from_pretrained(str(model_dir), device="cpu")
    retriever = CachedRetriever(load_retriever(RetrieverConfig(kind="inprocess", index=str(paths.index))))
    questions = load_split(paths, split)
    out = {}
    for wf in workflows:
        settings = workflow_settings(wf, temperature=temperature, top_p=top_p, seed=seed)
        records = run_workflows(engine, retriever, engine.tokenizer, questions, settings, attempts=attempts,
                                method="pi0-check", progress=progress)
        out[wf] = summarize(records)
    return out
