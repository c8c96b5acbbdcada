"""The fields of a record (and of a trace line) that the viewer reads, checked before it reads them.

The viewer works on the records' JSON dicts, not on ``WorkflowRecord`` (building the objects
costs more than the page), so a row without ``question_id``, a call without ``call_id`` or a
question that is ``null`` would otherwise be a ``KeyError`` traceback or a blank page. Each check
here follows the record schema (``mopd.core.records``) for the fields the page uses and raises
:class:`UserError` naming the file, the line and the field (``FILE:LINE: calls[2].call_id: ...``).
Fields the page does not use are not checked; unknown fields are left alone.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

from mopd.core.errors import UserError
from mopd.core.records import EVENT_KINDS


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _str(v) -> bool:
    return isinstance(v, str)


def _list_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and all(map(test, v))


def _optional(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or test(v)


# field: (required, test, what it must be)
RECORD: Dict[str, tuple] = {
    "question_id": (True, _str, "a string"),
    "dataset": (False, _str, "a string"),
    "question": (True, _str, "a string"),
    "answers": (True, _list_of(_str), "a list of strings"),
    "attempt": (False, _is_int, "an integer"),
    "group_id": (False, _str, "a string"),
    "method": (False, _str, "a string"),
    "workflow": (False, _str, "a string"),
    "calls": (False, lambda v: isinstance(v, list), "a list of calls"),
    "events": (False, lambda v: isinstance(v, list), "a list of events"),
    "candidates": (False, _list_of(_str), "a list of strings"),
    "final_answer": (False, _optional(_str), "a string or null"),
    "steps": (False, _is_int, "an integer"),
    "duration_s": (False, _is_number, "a number"),
}
CALL = {
    "call_id": (True, _str, "a string"),
    "role": (True, _str, "a string"),
    "segments": (False, lambda v: isinstance(v, list), "a list of segments"),
    "step": (False, _is_int, "an integer"),
    "group": (False, _str, "a string"),
    "parent": (False, _str, "a string"),
    "input_tokens": (False, _is_int, "an integer"),
    "output_tokens": (False, _is_int, "an integer"),
    "invalid": (False, lambda v: isinstance(v, bool), "true or false"),
    "finish_reasons": (False, _list_of(_str), "a list of strings"),
    "truncated_input": (False, lambda v: isinstance(v, bool), "true or false"),
}
SEGMENT = {
    "source": (True, lambda v: v in ("model", "env"), "'model' or 'env'"),
    "text": (False, _str, "a string"),
    "token_ids": (False, _optional(_list_of(_is_int)), "a list of integers"),
    "logprobs": (False, _optional(_list_of(_is_number)), "a list of numbers or null"),
}
EVENT = {
    "kind": (True, lambda v: v in EVENT_KINDS, f"one of {', '.join(EVENT_KINDS)}"),
    "step": (True, _is_int, "an integer"),
    "call_id": (False, _str, "a string"),
    "text": (False, _str, "a string"),
    "passages": (False, lambda v: isinstance(v, list), "a list of passages"),
    "selection": (False, _list_of(_is_int), "a list of integers"),
}
PASSAGE = {"id": (False, _str, "a string"), "text": (False, _str, "a string"), "title": (False, _str, "a string")}
TRACE_CALL = {
    "reward": (False, _optional(_is_number), "a number or null"),
    "advantage": (False, _optional(_is_number), "a number or null"),
    "tokens": (False, lambda v: isinstance(v, dict) and all(_list_of(_is_number)(x) for x in v.values()),
               "an object of per-token number lists"),
}


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _fields(d, spec: Dict[str, tuple], where: str, path: str) -> None:
    if not isinstance(d, dict):
        raise UserError(f"{where}: {path or 'the line'} is {_short(d)}, not an object")
    for name, (required, test, what) in spec.items():
        field = f"{path}.{name}" if path else name
        if name not in d:
            if required:
                raise UserError(f"{where}: {field}: missing (the viewer needs it)")
            continue
        if not test(d[name]):
            raise UserError(f"{where}: {field}: {_short(d[name])} is not {what}")


def check_record(d, where: str, path: str = "") -> None:
    """The viewer's fields of one record dict; ``where`` is ``FILE:LINE``, ``path`` the record's place
    in the line (``record`` in a trace line)."""
    at = f"{path}." if path else ""
    _fields(d, RECORD, where, path)
    for i, c in enumerate(d.get("calls") or []):
        _fields(c, CALL, where, f"{at}calls[{i}]")
        for j, s in enumerate(c.get("segments") or []):
            _fields(s, SEGMENT, where, f"{at}calls[{i}].segments[{j}]")
    for i, e in enumerate(d.get("events") or []):
        _fields(e, EVENT, where, f"{at}events[{i}]")
        for j, p in enumerate(e.get("passages") or []):
            _fields(p, PASSAGE, where, f"{at}events[{i}].passages[{j}]")


def check_trace_line(d, where: str) -> None:
    """One ``traces.jsonl`` line: its step, its record and its per-call values."""
    _fields(d, {"step": (True, _is_int, "an integer"), "record": (True, lambda v: isinstance(v, dict), "an object"),
                "calls": (False, lambda v: isinstance(v, dict), "an object of calls")}, where, "")
    check_record(d["record"], where, "record")
    for cid, c in (d.get("calls") or {}).items():
        _fields(c, TRACE_CALL, where, f"calls[{cid!r}]")
