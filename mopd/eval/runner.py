"""`mopd eval run`: K independent workflows per question, written to a resumable records file.

Protocol (Appendix A): one Answerer candidate per answering request, temperature 0.6, top-p 0.95,
8,192 input / 512 output tokens per call, K = 4 independent workflows per question; no workflow is
discarded. The settings come from ``cfg.eval`` (candidates, temperature, top-p, attempts) and
``cfg.rollout`` (limits, steps; C-MAS 5, H-MAS 12 steps).

Resumability: questions are run in chunks; after each chunk the records of its questions are
appended to ``OUT/records.jsonl`` and fsynced. On a restart the file is read back, a truncated last
line (a kill mid-write) is cut off, records of questions that do not have all K attempts are
dropped, and only the questions not yet complete are run. ``OUT/run.json`` keeps the settings of the
run; a restart with different settings (workflow, attempts, sampling, the model, the retriever and
its index, the engine, the manifest's questions) is refused rather than mixed.

One writer: an evaluation holds ``OUT/.mopd.lock`` (:mod:`mopd.core.run_lock`) while it runs, so a
second one into the same OUT is refused in one line; a records file that holds a workflow twice
anyway (written before the lock, or by hand) keeps its first record of it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

import torch

from mopd.core.atomic import atomic_write_json
from mopd.core.records import RecordError, WorkflowRecord, write_records
from mopd.core.run_lock import RunLock, RunLocked
from mopd.eval.alignment import EvalError
from mopd.eval.loading import RECORDS_FILE
from mopd.rollout.async_scheduler import run_rollout
from mopd.rollout.engines import build_engine, evaluation_dtype
from mopd.rollout.run_state import WorkflowSettings

RUN_FILE = "run.json"
RECORDED_SINCE = ("retriever_", "engine", "manifest")
"""Settings that run.json files of older evaluations lack (not compared when absent there)."""
RunWorkflows = Callable[..., List[WorkflowRecord]]
"""``run_workflows(engine, retriever, tokenizer, questions, settings, *, attempts, method, progress)
-> records``; default: ``mopd.rollout.async_scheduler.run_rollout`` (the asynchronous scheduler where
it is the faster one, else lock-step; the records are the same)."""


@dataclass(frozen=True)
class Rollout:
    """What runs an evaluation's workflows: the engine, the retriever, the tokenizer, and the
    scheduler that drives them (``run_fn``, a :data:`RunWorkflows`; None: its default)."""

    engine: object
    retriever: object
    tokenizer: object
    run_fn: Optional[RunWorkflows] = None


@dataclass(frozen=True)
class EvalPlan:
    """One evaluation run: where it goes, what it runs, and how it is stored."""

    out_dir: Path
    """Run directory: records.jsonl and run.json."""
    settings: WorkflowSettings
    """Workflow, limits, sampling and seed (``WorkflowSettings.for_evaluation``)."""
    attempts: int = 4
    """Independent workflows per question (K)."""
    method: str = ""
    """Method name written into every record."""
    chunk_questions: int = 32
    """Questions per rollout call; records are appended and fsynced after each chunk."""
    keep_token_ids: bool = False
    """Keep token ids and sampling log-probs in the records (about 10x larger files)."""
    run_info: dict = field(default_factory=dict)
    """Extra facts written into run.json (model path, preset, ...)."""
    model: dict = field(default_factory=dict)
    """The evaluated model's fingerprint (``mopd.core.fingerprint.model_fingerprint``: resolved path
    and weights hash); part of the fixed settings, so a restart with another model is refused even
    when its directory has the same name (every export is called ``export``)."""
    retriever: dict = field(default_factory=dict)
    """The retriever's identity (``mopd.retriever.retriever_identity``: kind, index directory or URL,
    the index's fingerprint); part of the fixed settings: records retrieved from two indexes are
    not one evaluation."""
    engine: str = ""
    """The rollout engine (``rollout.engine``); part of the fixed settings (engines sample differently)."""
    manifest: str = ""
    """The fingerprint of the manifest's questions (:func:`manifest_fingerprint`: ids, datasets,
    texts, gold answers; ``mopd eval run`` takes all of the manifest's, before ``--limit``); part of
    the fixed settings: records of an edited test file are not one evaluation. Empty: not
    compared (a caller that evaluates a fixed question list, as the pipeline does)."""

    def __post_init__(self):
        if self.attempts < 1 or self.chunk_questions < 1:
            raise EvalError("attempts and chunk size must be >= 1")
        object.__setattr__(self, "out_dir", Path(self.out_dir))

    def fixed_settings(self) -> dict:
        """What must not change between the starts of one run (the batching knobs change no record)."""
        fixed = dataclasses.asdict(self.settings)
        for knob in ("max_batch_calls", "max_active_runs", "retrieval_workers", "retrieval_timeout_s"):
            fixed.pop(knob, None)
        model = {f"model_{k}": v for k, v in self.model.items()}
        retriever = {f"retriever_{k}": v for k, v in self.retriever.items()}
        engine = {"engine": self.engine} if self.engine else {}
        manifest = {"manifest": self.manifest} if self.manifest else {}
        return {"attempts": self.attempts, "method": self.method, **model, **retriever, **engine, **manifest,
                **fixed}


def manifest_fingerprint(questions: Sequence) -> str:
    """sha256 of the questions in order: dataset, id, text and gold answers of each."""
    h = hashlib.sha256()
    for q in questions:
        h.update(json.dumps([q.dataset, q.id, q.question, list(q.answers)], ensure_ascii=False).encode())
        h.update(b"\n")
    return h.hexdigest()


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
    elsewhere is an error. A second record of one workflow (question and attempt) is dropped, the
    first kept. When incomplete questions or such duplicates are found the file is rewritten
    without them.
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
    seen: Set[Tuple[str, str, int]] = set()
    unique = []
    for r in records:
        if (r.dataset, r.question_id, r.attempt) not in seen:
            seen.add((r.dataset, r.question_id, r.attempt))
            unique.append(r)
    by_q: Dict[Tuple[str, str], Set[int]] = {}
    for r in unique:
        by_q.setdefault((r.dataset, r.question_id), set()).add(r.attempt)
    done = {q for q, a in by_q.items() if a == set(range(attempts))}
    kept = [r for r in unique if (r.dataset, r.question_id) in done]
    if len(kept) != len(records):
        write_records(path, kept)
    return kept, done


def settings_changes(out: Path, settings: dict) -> dict:
    """{key: (old, new)} where the evaluation in ``out`` was started with other fixed settings
    (:meth:`EvalPlan.fixed_settings`); empty when it has none or the same."""
    f = out / RUN_FILE
    if not f.is_file():
        return {}
    old = json.loads(f.read_text(encoding="utf-8")).get("settings", {})
    # As run.json holds them (tuples read back as lists); a run recorded before run.json held the
    # retriever and the engine is compared on the rest.
    new = {k: v for k, v in json.loads(json.dumps(settings)).items() if k in old or not k.startswith(RECORDED_SINCE)}
    return {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}


def _check_settings(out: Path, settings: dict) -> None:
    diff = settings_changes(out, settings)
    if "manifest" in diff:
        old, new = diff["manifest"]
        raise EvalError(f"{out} holds an evaluation of other questions (the manifest's ids, texts or gold answers "
                        f"changed: {str(old)[:12]} -> {str(new)[:12]}); use another --out directory, or the "
                        "manifest it was started with to resume")
    if diff:
        raise EvalError(f"{out} holds a run with other settings {diff} (old, new); "
                        "use another --out directory or the same settings to resume")


def check_continuation(plan: EvalPlan) -> None:
    """Refuse (:class:`EvalError`, one line) a plan whose out_dir another process is writing, or
    holds an evaluation with other fixed settings, before an engine loads. From here the out
    directory's lock is held (:func:`hold_out_dir`) until :func:`run_evaluation` ends, which
    checks the settings again."""
    hold_out_dir(plan.out_dir)
    try:
        _check_settings(plan.out_dir, plan.fixed_settings())
    except EvalError:
        release_out_dir(plan.out_dir)
        raise


_HELD: Dict[Path, RunLock] = {}
"""The out directories whose one-writer lock this process holds (one evaluation each)."""


def hold_out_dir(out: Path) -> None:
    """Take the one-writer lock of ``out`` (``OUT/.mopd.lock``, :mod:`mopd.core.run_lock`) unless this
    process holds it already; another process holding it is :class:`EvalError`, one line naming it."""
    key = Path(out).resolve()
    if key in _HELD:
        return
    try:
        _HELD[key] = RunLock(out, "mopd eval run")
    except RunLocked as e:
        raise EvalError(f"{e} (two evaluations into one --out would both append every record)") from None


def release_out_dir(out: Path) -> None:
    """Drop the lock of ``out`` (and the directory, when the lock made it and nothing else was written)."""
    lock = _HELD.pop(Path(out).resolve(), None)
    if lock is not None:
        lock.release(discard_if_alone=True)


def _write_run_file(out: Path, settings: dict, questions: int, finished: int, extra: dict) -> None:
    atomic_write_json(out / RUN_FILE, {"settings": settings, "questions": questions,
                                       "finished_questions": finished, **extra})


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


def run_evaluation(engine, retriever, tokenizer, questions: Sequence, plan: EvalPlan, *,
                   run_fn: Optional[RunWorkflows] = None, progress: bool = False,
                   log: Callable[[str], None] = lambda s: None) -> Path:
    """Run the questions not yet finished in ``plan.out_dir`` and return the records file's path.

    Records are saved without token ids and sampling log-probs unless ``plan.keep_token_ids``.
    The out directory's lock is held for the run (:func:`hold_out_dir`; ``mopd eval run`` takes it
    before its engine loads, with :func:`check_continuation`) and dropped at its end.
    """
    keys = [(q.dataset, q.id) for q in questions]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise EvalError(f"question {dup[0]}/{dup[1]} appears twice in the manifest")
    hold_out_dir(plan.out_dir)
    try:
        return _run_locked(engine, retriever, tokenizer, questions, plan, run_fn, progress, log)
    finally:
        release_out_dir(plan.out_dir)


def _run_locked(engine, retriever, tokenizer, questions: Sequence, plan: EvalPlan, run_fn: Optional[RunWorkflows],
                progress: bool, log: Callable[[str], None]) -> Path:
    keys = [(q.dataset, q.id) for q in questions]
    if run_fn is None:
        run_fn = run_rollout
    out, attempts, method = plan.out_dir, plan.attempts, plan.method
    out.mkdir(parents=True, exist_ok=True)
    settings = plan.fixed_settings()
    _check_settings(out, settings)
    path = out / RECORDS_FILE
    _, done = read_finished(path, attempts)
    extra = dict(plan.run_info)
    _write_run_file(out, settings, len(questions), len(done & set(keys)), extra)
    todo = [q for q in questions if (q.dataset, q.id) not in done]
    log(f"{len(questions) - len(todo)} of {len(questions)} questions already finished; {len(todo)} to run")
    finished = len(questions) - len(todo)
    for start in range(0, len(todo), plan.chunk_questions):
        chunk = todo[start:start + plan.chunk_questions]
        # One base seed for every chunk: the scheduler seeds each call from (seed, question, attempt,
        # call, turn), so a record does not depend on its chunk or on a restart.
        records = run_fn(engine, retriever, tokenizer, chunk, plan.settings, attempts=attempts, method=method,
                         progress=progress)
        _check_chunk(records, chunk, attempts)
        for r in records:
            r.method = r.method or method
            if not plan.keep_token_ids:
                drop_token_ids(r)
        write_records(path, records, append=True)
        finished += len(chunk)
        _write_run_file(out, settings, len(questions), finished, extra)
        log(f"{finished} of {len(questions)} questions finished")
    return path


def evaluate(model_or_engine, tokenizer, retriever, questions: Sequence, plan: EvalPlan, cfg, *,
             run_fn: Optional[RunWorkflows] = None, progress: bool = False) -> Path:
    """In-process evaluation (a pipeline's evaluation stages on a CPU, a recipe's checks).

    ``model_or_engine``: an engine (anything with ``generate``), an ``nn.Module`` (wrapped in an HF
    engine with ``tokenizer``; a trainer's model is shared, not copied) or a model directory, loaded
    with ``cfg.rollout.engine`` in ``eval.dtype`` (float16 on GPU). Returns the path of
    ``plan.out_dir/records.jsonl``; ``mopd eval report`` (or ``report_runs``) reads it.
    """
    engine = model_or_engine
    if not hasattr(model_or_engine, "generate") or _is_module(model_or_engine):
        dtype = evaluation_dtype(cfg.rollout, cfg.eval)
        if _is_module(model_or_engine):
            engine = build_engine(cfg.rollout, "", dtype=dtype, trainer_model=(model_or_engine, tokenizer))
        else:
            engine = build_engine(cfg.rollout, model_or_engine, dtype=dtype)
    if tokenizer is None:
        tokenizer = getattr(engine, "tokenizer", None)
    return run_evaluation(engine, retriever, tokenizer, questions, plan, run_fn=run_fn, progress=progress)


def _is_module(obj) -> bool:
    return isinstance(obj, torch.nn.Module)
