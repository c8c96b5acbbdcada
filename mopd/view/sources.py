"""What ``mopd view`` reads: a records file, an evaluation's directory, or a training run's.

- a ``.jsonl`` records file, or an evaluation directory (``records.jsonl``, ``run.json``): every
  workflow, named after the directory (or the file);
- a training run directory (``traces.jsonl``, ``config.yaml``): the workflows the trainer traced
  (``trainer.trace_every``), each with its step and per-token values; a step traced twice (a
  resumed run) shows its last trace; a cut last line (a kill mid-write) is skipped.

Every field the page reads is checked first (``record_shape``): a malformed source is one line
naming the file, the line and the field.

The tokenizer that turns token ids into per-token text is the run's model's: the evaluation's
``run.json`` ``model``, a training run's ``run.json`` ``model.path`` or ``config.yaml``
``model.path``, or ``--tokenizer``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import yaml

from mopd.core.errors import UserError
from mopd.core.records import RecordError, iter_record_dicts
from mopd.view.page_data import System, Workflow
from mopd.view.record_shape import check_record, check_trace_line
from mopd.view.token_text import TokenDecoder

RECORDS_FILE = "records.jsonl"
TRACES_FILE = "traces.jsonl"


def _read_settings(path: Path) -> dict:
    """``run.json`` or ``config.yaml`` as a dict, or UserError naming the file (not JSON/YAML, not an object)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        info = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise UserError(f"{path}: not {'JSON' if path.suffix == '.json' else 'YAML'} "
                        f"({getattr(e, 'msg', None) or getattr(e, 'problem', None) or e})") from None
    if info is None and path.suffix != ".json":
        return {}
    if not isinstance(info, dict):
        raise UserError(f"{path}: holds {type(info).__name__ if info is not None else 'null'}, not an object")
    return info


def _path_in(value) -> Optional[str]:
    """A model path from a setting that is a path or a mapping with one (a training run's run.json
    records ``model: {path, weights, ...}``)."""
    if isinstance(value, dict):
        value = value.get("path")
    return value if isinstance(value, str) and value else None


def model_dir_of(path: Path) -> Optional[str]:
    """The model directory a run or evaluation names (None when it names none that exists): an
    evaluation's ``run.json`` ``model`` (or ``settings.model_path``), a training run's ``run.json``
    ``model.path`` or its ``config.yaml`` ``model.path``."""
    candidates = []
    if (path / "run.json").is_file():
        info = _read_settings(path / "run.json")
        settings = info.get("settings") if isinstance(info.get("settings"), dict) else {}
        config = info.get("config") if isinstance(info.get("config"), dict) else {}
        candidates += [_path_in(info.get("model")), _path_in(settings.get("model_path")),
                       _path_in(config.get("model.path"))]
    if (path / "config.yaml").is_file():
        model = _read_settings(path / "config.yaml").get("model")
        candidates.append(_path_in(model))
    return next((c for c in candidates if c and Path(c).is_dir()), None)


def load_tokenizer(model_dir: Optional[str]):
    if not model_dir:
        return None
    from transformers import AutoTokenizer

    from mopd.core.adapter_dir import AdapterDirError, tokenizer_dir

    try:
        return AutoTokenizer.from_pretrained(tokenizer_dir(model_dir))   # an adapter: its base's tokenizer
    except AdapterDirError as e:
        raise UserError(str(e)) from None
    except (OSError, ValueError) as e:
        raise UserError(f"tokenizer of {model_dir}: {e}") from None


def _records(path: Path) -> Iterator[Workflow]:
    try:
        for where, d in iter_record_dicts(path):
            check_record(d, where)
            yield Workflow(d)
    except RecordError as e:
        raise UserError(str(e)) from None


def read_traces(path: Path) -> Dict[Tuple, Workflow]:
    """The traced workflows of a run, the last trace of each (step, question, group, attempt). A cut
    last line (a kill mid-write, no newline after it) is skipped; any other line that is not a whole
    trace is a UserError naming the file, the line and the field."""
    out: Dict[Tuple, Workflow] = {}
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except ValueError as e:
                if not raw.endswith(b"\n"):
                    continue     # a cut last line
                raise UserError(f"{where}: not a JSON line ({getattr(e, 'msg', e)})") from None
            check_trace_line(line, where)
            rec = line["record"]
            key = (line["step"], rec.get("dataset"), rec["question_id"], rec.get("group_id"), rec.get("attempt"))
            out[key] = Workflow(rec, calls=line.get("calls") or {}, step=line["step"])
    return out


def open_source(path_text: str, name: Optional[str] = None, tokenizer_dir: Optional[str] = None) -> System:
    """One source as a :class:`System` (its workflows read lazily, once)."""
    path = Path(path_text)
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    if path.is_dir() and (path / TRACES_FILE).is_file():
        traces = read_traces(path / TRACES_FILE)
        if not traces:
            raise UserError(f"{path / TRACES_FILE} holds no trace yet")
        workflows = [traces[k] for k in sorted(traces, key=lambda k: (k[0], str(k[1:])))]
        source = str(path / TRACES_FILE)
    elif path.is_dir() and (path / RECORDS_FILE).is_file():
        workflows, source = _records(path / RECORDS_FILE), str(path / RECORDS_FILE)
    elif path.is_file():
        workflows, source = _records(path), str(path)
    else:
        raise UserError(f"{path}: no {RECORDS_FILE} (an evaluation) or {TRACES_FILE} (a training run with "
                        "trainer.trace_every) in it")
    home = path if path.is_dir() else path.parent
    tok = load_tokenizer(tokenizer_dir or model_dir_of(home))
    label = name or (path.name if path.is_dir() else (path.parent.name if path.stem == "records" else path.stem))
    return System(label, workflows, TokenDecoder(tok), source)
