"""The workflow record: what one run of a multi-agent workflow leaves behind.

Everything downstream reads these: the method (rewards, advantages), the trainer (token ids,
loss masks, sampling log-probs), and evaluation (answers, events, costs). One agent call is one
sequence: a list of token segments, each written either by the model (trainable, with sampling
log-probs) or by the environment (prompt, retrieved passages, reports shown to the Leader; never
trained). Segments are tokenised separately and concatenated, so the trainer sees exactly the ids
the engine saw; a conversation is never decoded and re-tokenised.

Records are stored as JSONL with a schema version; loading checks every field and reports the
file, line and field of the first mismatch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Tuple

from mopd.core.atomic import atomic_open
from mopd.core.roles import role_names

SCHEMA_VERSION = 1

EVENT_KINDS = ("search", "report", "subtask", "dropped_subtask", "select", "answer", "invalid", "limit")


class RecordError(ValueError):
    """A record file or record that does not match the schema."""


@dataclass
class Segment:
    """A run of tokens in one agent call, all written by the same side."""

    token_ids: List[int]
    source: str
    """'model' (sampled by the policy; trained) or 'env' (chat template, prompt, passages, reports)."""
    text: str = ""
    """Decoded text of these tokens (for people and parsers; the ids are the truth)."""
    logprobs: Optional[List[float]] = None
    """Sampling log-probs of model tokens, at the sampling temperature; None for env segments."""

    def __post_init__(self):
        if self.source not in ("model", "env"):
            raise RecordError(f"segment source must be 'model' or 'env', not {self.source!r}")
        if self.source == "model" and self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise RecordError(f"model segment has {len(self.token_ids)} tokens but {len(self.logprobs)} logprobs")

    @property
    def trainable(self) -> bool:
        return self.source == "model"


@dataclass
class AgentCall:
    """One call of one role: one sequence, possibly multi-turn (a Searcher's queries and passages)."""

    call_id: str
    """Unique within its workflow, e.g. 's0.1' (Searcher 1 of wave 0) or 'a0.2' (candidate 2)."""
    role: str
    """leader, searcher or answerer."""
    segments: List[Segment] = field(default_factory=list)
    step: int = 0
    """Environment step at which the call started."""
    group: str = ""
    """Answerer: id of the answering request whose candidates are normalised together."""
    parent: str = ""
    """Searcher: the subtask text (H-MAS) or the question (C-MAS)."""
    input_tokens: int = 0
    """Prompt tokens summed over the call's turns, each counted after the chat template and the
    input limit (so repeated history counts again)."""
    output_tokens: int = 0
    """Generated tokens summed over turns, EOS included."""
    invalid: bool = False
    """Any output of this call had an invalid action format (its role reward becomes -1)."""
    finish_reasons: List[str] = field(default_factory=list)
    """Engine finish reason of each turn (stop, length, ...)."""
    truncated_input: bool = False
    """A turn's prompt exceeded max_input_tokens and was cut (the call was then ended)."""

    def __post_init__(self):
        if self.role not in role_names():
            raise RecordError(f"call role must be one of {role_names()}, not {self.role!r}")

    # Flattened views used by the trainer ---------------------------------------------------
    def token_ids(self) -> List[int]:
        return [t for s in self.segments for t in s.token_ids]

    def loss_mask(self) -> List[int]:
        return [int(s.trainable) for s in self.segments for _ in s.token_ids]

    def sampling_logprobs(self) -> List[float]:
        """Per-token sampling log-probs, 0.0 on environment tokens."""
        out: List[float] = []
        for s in self.segments:
            if s.trainable and s.logprobs is not None:
                out.extend(s.logprobs)
            else:
                out.extend([0.0] * len(s.token_ids))
        return out

    def model_text(self) -> str:
        return "".join(s.text for s in self.segments if s.trainable)

    def outputs(self) -> List[str]:
        """Texts of the model turns, in order."""
        return [s.text for s in self.segments if s.trainable]

    def __len__(self) -> int:
        return sum(len(s.token_ids) for s in self.segments)


@dataclass
class Passage:
    id: str
    text: str
    title: str = ""


@dataclass
class Event:
    """Something the environment observed: a search, a report, a subtask, ..."""

    kind: str
    """search | report | subtask | dropped_subtask | select | answer | invalid | limit."""
    step: int
    call_id: str = ""
    text: str = ""
    """search: the query; report: the report; subtask: its text; dropped_subtask: the text of a
    subtask beyond rollout.max_searchers_per_wave (never run); answer: the full candidate output;
    invalid: the offending output; limit: what limit was hit."""
    passages: List[Passage] = field(default_factory=list)
    """search: the passages returned (none when the search was not run: a query in an invalid
    output or on the forced-report turn still counts as a search action, as in the paper)."""
    selection: List[int] = field(default_factory=list)
    """select: the 1-based report indices the Leader chose."""

    def __post_init__(self):
        if self.kind not in EVENT_KINDS:
            raise RecordError(f"event kind must be one of {EVENT_KINDS}, not {self.kind!r}")


@dataclass
class WorkflowRecord:
    """One run of a workflow on one question."""

    question_id: str
    dataset: str
    question: str
    answers: List[str]
    attempt: int = 0
    group_id: str = ""
    """The sampled prompt this run belongs to (verl stamps a uid): the G runs sampled for one
    question in one step share it, and role rewards are normalised within it. Two copies of one
    question in a step (across an epoch boundary) get two ids, so they form two groups. Empty in
    records written before it existed; the question is the group then."""
    method: str = ""
    workflow: str = "cmas"
    calls: List[AgentCall] = field(default_factory=list)
    events: List[Event] = field(default_factory=list)
    candidates: List[str] = field(default_factory=list)
    """Answerer outputs of the final answering request, in order (full text)."""
    final_answer: Optional[str] = None
    """Strictly extracted answer of the final candidate (None when absent)."""
    steps: int = 0
    """Environment steps used."""
    duration_s: float = 0.0
    schema_version: int = SCHEMA_VERSION

    # Cost counts (docs/architecture.md, "Workflows and the action grammar") --------------------------------------------------------------
    def events_of(self, kind: str) -> List[Event]:
        return [e for e in self.events if e.kind == kind]

    @property
    def search_actions(self) -> int:
        return sum(1 for e in self.events if e.kind == "search" and e.text.strip())

    @property
    def returned_passages(self) -> int:
        return sum(len(e.passages) for e in self.events if e.kind == "search")

    @property
    def input_tokens(self) -> int:
        return sum(c.input_tokens for c in self.calls)

    @property
    def output_tokens(self) -> int:
        return sum(c.output_tokens for c in self.calls)

    def calls_of(self, role: str) -> List[AgentCall]:
        return [c for c in self.calls if c.role == role]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "record") -> "WorkflowRecord":
        return _build(cls, d, where)


# --------------------------------------------------------------------------------------------
# Strict loading
# --------------------------------------------------------------------------------------------

_HINTS_CACHE: dict = {}


def _hints(cls) -> dict:
    if cls not in _HINTS_CACHE:
        _HINTS_CACHE[cls] = typing.get_type_hints(cls)
    return _HINTS_CACHE[cls]


def _check(tp, value, where: str):
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:  # Optional[X]
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)][0]
        return _check(inner, value, where)
    if origin in (list, List):
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, got {type(value).__name__}")
        return [_check(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecordError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecordError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise RecordError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise RecordError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def _build(cls, d, where: str):
    if not isinstance(d, dict):
        raise RecordError(f"{where}: expected an object, got {type(d).__name__}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(d) - set(fields)
    if unknown:
        raise RecordError(f"{where}: unknown field(s) {sorted(unknown)}")
    kwargs = {}
    for name, f in fields.items():
        if name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise RecordError(f"{where}.{name}: missing required field")
            continue
        kwargs[name] = _check(hints[name], d[name], f"{where}.{name}")
    try:
        return cls(**kwargs)
    except RecordError as e:
        raise RecordError(f"{where}: {e}") from None


# --------------------------------------------------------------------------------------------
# JSONL I/O
# --------------------------------------------------------------------------------------------


def iter_record_dicts(path: str | os.PathLike) -> Iterator[Tuple[str, dict]]:
    """``(where, row)`` of every non-blank line of a records file, each checked to be UTF-8 JSON of
    this schema version; ``where`` is ``"FILE:LINE"`` for error messages. Both readers build on
    it: :func:`iter_records` (every field checked) and the evaluation's lighter loader."""
    p = Path(path)
    if p.is_dir():
        raise RecordError(f"{p} is a directory; pass a records file (e.g. {p / 'records.jsonl'})")
    if not p.is_file():
        raise RecordError(f"records file {p} does not exist")
    with p.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{p}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise RecordError(f"{where}: not UTF-8 text (byte {e.start}: {e.reason}); records files are UTF-8 "
                                  "JSONL") from None
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise RecordError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(d, dict):
                raise RecordError(f"{where}: expected an object, got {type(d).__name__}")
            if d.get("schema_version") != SCHEMA_VERSION:
                raise RecordError(f"{where}: schema_version {d.get('schema_version')!r} is not supported "
                                  f"(this is {SCHEMA_VERSION})")
            yield where, d


def iter_records(path: str | os.PathLike) -> Iterator[WorkflowRecord]:
    """Yield records from a JSONL file, checking each; errors name the file, line and field."""
    for where, d in iter_record_dicts(path):
        yield WorkflowRecord.from_dict(d, where)


def read_records(path: str | os.PathLike) -> List[WorkflowRecord]:
    return list(iter_records(path))


def write_records(path: str | os.PathLike, records: Iterable[WorkflowRecord], append: bool = False) -> int:
    """Write records as JSONL, fsynced; returns how many. Without ``append``, into a temporary file
    renamed over ``path`` (atomic: a reader sees the old file or the whole new one)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with (p.open("a", encoding="utf-8") if append else atomic_open(p)) as f:
        for r in records:
            f.write(json.dumps(r.to_dict(), ensure_ascii=False) + "\n")
            n += 1
        f.flush()
        os.fsync(f.fileno())
    return n


def format_validity(records: Iterable[WorkflowRecord]) -> dict:
    """{role: (valid calls, calls)} over ``records``, in role-table order, roles with calls only:
    how well a model writes the action grammar (``mopd eval run`` prints it; a new model's first check)."""
    counts = {r: [0, 0] for r in role_names()}
    for rec in records:
        for c in rec.calls:
            n = counts.setdefault(c.role, [0, 0])
            n[0] += not c.invalid
            n[1] += 1
    return {r: (v, n) for r, (v, n) in counts.items() if n}


def format_validity_line(records: Iterable[WorkflowRecord]) -> str:
    """``format validity: leader 0.25 (15/60 calls), searcher ...``: one line for the terminal."""
    parts = [f"{r} {v / n:.2f} ({v}/{n} calls)" for r, (v, n) in format_validity(records).items()]
    return "format validity: " + (", ".join(parts) if parts else "no calls")
