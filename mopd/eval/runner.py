"""`mopd eval run`: K independent workflows per question, written to a resumable records file.

Protocol (Appendix A): one Answerer candidate per answering request, temperature 0.6, top-p 0.95,
8,192 input / 512 output tokens per call, K = 4 independent workflows per question; no workflow is
discarded. The settings come from ``cfg.eval`` (candidates, temperature, top-p, attempts) and
``cfg.rollout`` (limits, steps; C-MAS 5, H-MAS 12 steps).

Resumability: questions are run in chunks; after each chunk the records of its questions are
appended to ``OUT/records.jsonl`` and fsynced. On a restart the file is read back, a truncated last
line (a kill mid-write) is cut off, records of questions that do not have all K attempts are
dropped, and only the questions not yet complete are run. ``OUT/run.json`` keeps the settings of the
run; a restart with different settings (workflow, attempts, sampling) is refused rather than mixed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from mopd.core.records import RecordError, WorkflowRecord, write_records
from mopd.eval.alignment import EvalError

RECORDS_FILE = "records.jsonl"
RUN_FILE = "run.json"
WORKFLOW_STEPS = {"cmas": 5, "hmas": 12}
"""The paper's environment-step limits, used when the config was made for the other workflow."""

RunWorkflows = Callable[..., List[WorkflowRecord]]
"""``run_workflows(engine, retriever, tokenizer, questions, *, workflow, attempts, rollout_cfg,
answer_candidates, temperature, top_p, seed, method, progress, topk) -> records``
(``mopd.rollout.scheduler.run_workflows``)."""


def eval_rollout_config(cfg, workflow: str):
    """The rollout settings of an evaluation: the config's, with eval sampling and the workflow."""
    r = cfg.rollout
    steps = r.max_steps if r.workflow == workflow else WORKFLOW_STEPS[workflow]
    return dataclasses.replace(r, workflow=workflow, answer_candidates=cfg.eval.answer_candidates,
                               temperature=cfg.eval.temperature, top_p=cfg.eval.top_p, max_steps=steps)


def _run_settings(cfg, workflow: str, attempts: int, method: str) -> dict:
    """What must not change between the starts of one run."""
    r = eval_rollout_config(cfg, workflow)
    return {"workflow": workflow, "attempts": attempts, "method": method,
            "answer_candidates": r.answer_candidates, "temperature": r.temperature, "top_p": r.top_p,
            "max_input_tokens": r.max_input_tokens, "max_output_tokens": r.max_output_tokens,
            "max_steps": r.max_steps, "max_rounds": r.max_rounds, "seed": r.seed}


def drop_token_ids(record: WorkflowRecord) -> WorkflowRecord:
    """Empty every segment's token ids and log-probs, keeping its text (evaluation reads texts,
    events and token counts; ids and log-probs make an evaluation file some 10x larger)."""
    for call in record.calls:
        for seg in call.segments:
            seg.token_ids = []
            seg.logprobs = None
    return record


def read_finished(path: Path, attempts: int) -> Tuple[List[WorkflowRecord], Set[Tuple[str, str]]]:
    """Records of the questions that have all ``attempts`` attempts, and those questions' keys.

    A last line that is not valid JSON (a kill mid-write) is cut from the file; an invalid line
    elsewhere is an error. When incomplete questions are found the file is rewritten without them.
    """
    if not path.is_file():
        return [], set()
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    records: List[WorkflowRecord] = []
    good_bytes = 0
    for i, line in enumerate(lines):
        if not line.strip():
            good_bytes += len(line) + 1
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            if all(not rest.strip() for rest in lines[i + 1:]):
                with path.open("r+b") as f:
                    f.truncate(good_bytes)
                break
            raise RecordError(f"{path}:{i + 1}: not valid JSON (only a truncated last line is tolerated)") from None
        records.append(WorkflowRecord.from_dict(d, f"{path}:{i + 1}"))
        good_bytes += len(line) + 1
    by_q: Dict[Tuple[str, str], Set[int]] = {}
    for r in records:
        by_q.setdefault((r.dataset, r.question_id), set()).add(r.attempt)
    done = {q for q, a in by_q.items() if a == set(range(attempts))}
    kept = [r for r in records if (r.dataset, r.question_id) in done]
    if len(kept) != len(records):
        write_records(path, kept)
    return kept, done


def _check_settings(out: Path, settings: dict) -> None:
    f = out / RUN_FILE
    if f.is_file():
        old = json.loads(f.read_text(encoding="utf-8")).get("settings", {})
        diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
        if diff:
            raise EvalError(f"{out} holds a run with other settings {diff} (old, new); "
                            "use another --out directory or the same settings to resume")


def _write_run_file(out: Path, settings: dict, questions: int, finished: int, extra: dict) -> None:
    tmp = out / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps({"settings": settings, "questions": questions, "finished_questions": finished,
                               **extra}, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out / RUN_FILE)


def _check_chunk(records: List[WorkflowRecord], chunk, attempts: int) -> None:
    want = {(q.dataset, q.id) for q in chunk}
    got: Dict[Tuple[str, str], List[int]] = {}
    for r in records:
        key = (r.dataset, r.question_id)
        if key not in want:
            raise EvalError(f"the rollout returned a record of question {key[0]}/{key[1]}, which it was not given")
        got.setdefault(key, []).append(r.attempt)
    for key in want:
        if sorted(got.get(key, [])) != list(range(attempts)):
            raise EvalError(f"the rollout returned attempts {sorted(got.get(key, []))} for question "
                            f"{key[0]}/{key[1]}; expected {list(range(attempts))}")


def run_evaluation(engine, retriever, tokenizer, questions: Sequence, workflow: str, attempts: int, cfg,
                   out_dir: str | os.PathLike, *, method: str = "", chunk_questions: int = 32,
                   run_fn: Optional[RunWorkflows] = None, progress: bool = False,
                   run_info: Optional[dict] = None, keep_token_ids: bool = False,
                   log: Callable[[str], None] = lambda s: None) -> Path:
    """Run the questions not yet finished in ``out_dir`` and return the records file's path.

    Records are saved without token ids and sampling log-probs unless ``keep_token_ids``.
    """
    if workflow not in WORKFLOW_STEPS:
        raise EvalError(f"workflow {workflow!r} is not valid; choose cmas or hmas")
    if attempts < 1 or chunk_questions < 1:
        raise EvalError("attempts and chunk size must be >= 1")
    keys = [(q.dataset, q.id) for q in questions]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise EvalError(f"question {dup[0]}/{dup[1]} appears twice in the manifest")
    if run_fn is None:
        from mopd.rollout.scheduler import run_workflows as run_fn
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings = _run_settings(cfg, workflow, attempts, method)
    _check_settings(out, settings)
    path = out / RECORDS_FILE
    _, done = read_finished(path, attempts)
    extra = dict(run_info or {})
    _write_run_file(out, settings, len(questions), len(done & set(keys)), extra)
    todo = [q for q in questions if (q.dataset, q.id) not in done]
    log(f"{len(questions) - len(todo)} of {len(questions)} questions already finished; {len(todo)} to run")
    rollout_cfg = eval_rollout_config(cfg, workflow)
    finished = len(questions) - len(todo)
    for start in range(0, len(todo), chunk_questions):
        chunk = todo[start:start + chunk_questions]
        # One base seed for every chunk: the scheduler seeds each call from (seed, question, attempt,
        # call, turn), so a record does not depend on its chunk or on a restart.
        records = run_fn(engine, retriever, tokenizer, chunk, workflow=workflow, attempts=attempts,
                         rollout_cfg=rollout_cfg, answer_candidates=rollout_cfg.answer_candidates,
                         temperature=rollout_cfg.temperature, top_p=rollout_cfg.top_p, seed=rollout_cfg.seed,
                         method=method, progress=progress, topk=cfg.retriever.topk)
        _check_chunk(records, chunk, attempts)
        for r in records:
            r.method = r.method or method
            if not keep_token_ids:
                drop_token_ids(r)
        write_records(path, records, append=True)
        finished += len(chunk)
        _write_run_file(out, settings, len(questions), finished, extra)
        log(f"{finished} of {len(questions)} questions finished")
    return path


def evaluate(model_or_engine, tokenizer, retriever, questions: Sequence, workflow: str, attempts: int, cfg,
             out_dir: str | os.PathLike, *, method: str = "", chunk_questions: int = 32,
             run_fn: Optional[RunWorkflows] = None, progress: bool = False,
             keep_token_ids: bool = False) -> Path:
    """In-process evaluation for the demo and the trainer's validation.

    ``model_or_engine``: an engine (anything with ``generate``), an ``nn.Module`` (wrapped in an HF
    engine with ``tokenizer``; the trainer's model is shared, not copied) or a model directory.
    Returns the path of ``out_dir/records.jsonl``; ``mopd eval report`` (or ``report_runs``) reads it.
    """
    engine = model_or_engine
    if not hasattr(model_or_engine, "generate") or _is_module(model_or_engine):
        from mopd.rollout.engine import build_engine

        engine = build_engine(cfg.rollout, model_or_engine, tokenizer, dtype=cfg.model.dtype)
    if tokenizer is None:
        tokenizer = getattr(engine, "tokenizer", None)
    return run_evaluation(engine, retriever, tokenizer, questions, workflow, attempts, cfg, out_dir,
                          method=method, chunk_questions=chunk_questions, run_fn=run_fn, progress=progress,
                          keep_token_ids=keep_token_ids)


def _is_module(obj) -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, torch.nn.Module)
