"""Read run records for evaluation, fast.

``mopd.core.records.read_records`` checks every field of every record, token ids and log-probs
included: right for the trainer, but about 0.4 ms per record even without token segments, so
100,000 records take minutes. Evaluation needs only the answers, candidates, events and token
totals, so this loader builds ``WorkflowRecord``s whose calls keep their role and token counts but
not their segments, checking just the fields evaluation reads. The schema version is checked as in
``read_records``.

Time goes half to ``json.loads`` and half to building the objects (pyarrow's JSON reader with an
explicit schema was tried: no faster once rows are turned back into Python objects).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from mopd.core.records import (
    AgentCall,
    Event,
    Passage,
    RecordError,
    WorkflowRecord,
    iter_record_dicts,
)
from mopd.eval.alignment import EvalError

RECORDS_FILE = "records.jsonl"
_PASSAGE_FIELDS = {f.name for f in dataclasses.fields(Passage)}


_MISSING = object()


def _get(d: dict, key: str, types, where: str, default=_MISSING):
    """``d[key]`` checked against ``types`` (a bool is not an int here); ``default`` when absent."""
    if key not in d:
        if default is _MISSING:
            raise RecordError(f"{where}.{key}: missing required field")
        return default
    v = d[key]
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(v, allowed) or (isinstance(v, bool) and bool not in allowed):
        raise RecordError(f"{where}.{key}: unexpected value {v!r}")
    return v


def _passage(p, where: str) -> Passage:
    try:
        return Passage(**p)
    except TypeError:  # other fields than this version's Passage: keep the ones it has
        if not isinstance(p, dict):
            raise RecordError(f"{where}: expected an object") from None
        return Passage(**{k: v for k, v in p.items() if k in _PASSAGE_FIELDS})


def _event(e: dict, where: str) -> Event:
    if not isinstance(e, dict):
        raise RecordError(f"{where}: expected an object")
    kind, text = e.get("kind"), e.get("text", "")
    if not isinstance(kind, str) or not isinstance(text, str):
        raise RecordError(f"{where}: 'kind' and 'text' must be strings")
    raw = e.get("passages") or ()
    passages = [_passage(p, f"{where}.passages") for p in raw] if raw else []
    return Event(kind, e.get("step", 0), e.get("call_id", ""), text, passages)


def _call(c: dict, where: str) -> AgentCall:
    if not isinstance(c, dict):
        raise RecordError(f"{where}: expected an object")
    i, o = c.get("input_tokens", 0), c.get("output_tokens", 0)
    if type(i) is not int or type(o) is not int:
        raise RecordError(f"{where}: input_tokens and output_tokens must be integers")
    return AgentCall(call_id=c.get("call_id", ""), role=c.get("role"), input_tokens=i, output_tokens=o,
                     invalid=bool(c.get("invalid", False)))


def eval_record(d: dict, where: str) -> WorkflowRecord:
    """A WorkflowRecord with what evaluation reads (calls without segments), from a row of
    :func:`mopd.core.records.iter_record_dicts` (which checked that it is an object of this schema
    version)."""
    answers = list(_get(d, "answers", list, where))
    candidates = list(_get(d, "candidates", list, where, default=[]))
    if not all(isinstance(a, str) for a in answers):
        raise RecordError(f"{where}.answers: expected a list of strings")
    if not all(isinstance(c, str) for c in candidates):
        raise RecordError(f"{where}.candidates: expected a list of strings")
    try:
        return WorkflowRecord(
            question_id=_get(d, "question_id", str, where), dataset=_get(d, "dataset", str, where),
            question=d.get("question", ""), answers=answers, attempt=_get(d, "attempt", int, where, default=0),
            method=d.get("method", ""), workflow=_get(d, "workflow", str, where, default="cmas"),
            calls=[_call(c, f"{where}.calls[{i}]") for i, c in enumerate(_get(d, "calls", list, where, default=[]))],
            events=[_event(e, f"{where}.events[{i}]")
                    for i, e in enumerate(_get(d, "events", list, where, default=[]))],
            candidates=candidates, final_answer=d.get("final_answer"), steps=d.get("steps", 0),
            duration_s=float(_get(d, "duration_s", (int, float), where, default=0.0)),
        )
    except RecordError as e:
        raise RecordError(f"{where}: {e}") from None


def read_eval_records(path: str | os.PathLike) -> List[WorkflowRecord]:
    """All records of a JSONL file, loaded for evaluation; errors name the file, line and field."""
    return [eval_record(d, where) for where, d in iter_record_dicts(path)]


def records_file(path: str | os.PathLike) -> Path:
    """A run directory's ``records.jsonl``, or the path itself when it is a file."""
    p = Path(path)
    f = p / RECORDS_FILE if p.is_dir() else p
    if not f.is_file():
        raise EvalError(f"{path}: no records (expected a run directory with {RECORDS_FILE} or a .jsonl file)")
    return f


def load_runs(paths: Sequence[str | os.PathLike], names: Optional[Sequence[str]] = None
              ) -> Dict[str, List[WorkflowRecord]]:
    """Read each run under its name (default: the directory name, or the file stem)."""
    if names and len(names) != len(paths):
        raise EvalError(f"{len(paths)} runs but {len(names)} names; give one name per run")
    out: Dict[str, List[WorkflowRecord]] = {}
    for i, p in enumerate(paths):
        path = Path(p)
        name = names[i] if names else (path.name if path.is_dir() else path.stem)
        if name in out:
            raise EvalError(f"two runs are named {name!r}; give distinct names (--names)")
        out[name] = read_eval_records(records_file(path))
    return out
