"""What ``mopd view`` reads: a records file, an evaluation's directory, or a training run's.

- a ``.jsonl`` records file, or an evaluation directory (``records.jsonl``, ``run.json``): every
  workflow, named after the directory (or the file);
- a training run directory (``traces.jsonl``, ``config.yaml``): the workflows the trainer traced
  (``trainer.trace_every``), each with its step and per-token values; a step traced twice (a
  resumed run) shows its last trace; a cut last line (a kill mid-write) is skipped.

The tokenizer that turns token ids into per-token text is the run's model's: the evaluation's
``run.json`` ``model``, the run's ``config.yaml`` ``model.path``, or ``--tokenizer``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import yaml

from mopd.core.errors import UserError
from mopd.core.records import RecordError, iter_record_dicts
from mopd.view.page_data import System, Workflow
from mopd.view.token_text import TokenDecoder

RECORDS_FILE = "records.jsonl"
TRACES_FILE = "traces.jsonl"


def model_dir_of(path: Path) -> Optional[str]:
    """The model directory a run or evaluation names (None when it names none that exists)."""
    found = None
    if (path / "run.json").is_file():
        info = json.loads((path / "run.json").read_text(encoding="utf-8"))
        found = info.get("model") or (info.get("settings") or {}).get("model_path")
    elif (path / "config.yaml").is_file():
        cfg = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8")) or {}
        found = (cfg.get("model") or {}).get("path")
    return found if found and Path(found).is_dir() else None


def load_tokenizer(model_dir: Optional[str]):
    if not model_dir:
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as e:
        raise UserError(f"tokenizer of {model_dir}: {e}") from None


def _records(path: Path) -> Iterator[Workflow]:
    try:
        for _, d in iter_record_dicts(path):
            yield Workflow(d)
    except RecordError as e:
        raise UserError(str(e)) from None


def read_traces(path: Path) -> Dict[Tuple, Workflow]:
    """The traced workflows of a run, the last trace of each (step, question, group, attempt)."""
    out: Dict[Tuple, Workflow] = {}
    with path.open("rb") as f:
        for raw in f:
            try:
                line = json.loads(raw)
            except ValueError:
                continue     # a cut last line
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
