"""QA datasets: FlashRAG jsonl and Search-R1 parquet rows read into one example type."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

from mopd.core.atomic import atomic_open
from mopd.core.scoring import normalize_answer


class DataError(ValueError):
    """A malformed dataset file or row; the message names the file and the line (or row)."""


@dataclass
class QAExample:
    id: str
    dataset: str
    question: str
    answers: List[str]
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        d = asdict(self)
        # FlashRAG field names, so our manifests are readable by FlashRAG tools too.
        d["golden_answers"] = d.pop("answers")
        if not d["meta"]:
            d.pop("meta")
        return d


@dataclass
class LoadReport:
    path: str
    loaded: int = 0
    skipped: int = 0
    problems: List[str] = field(default_factory=list)
    aliases_dropped: int = 0
    """Gold answers that normalise to nothing (e.g. "A", "the"), dropped from rows that keep others."""
    alias_notes: List[str] = field(default_factory=list)
    """Where the first few dropped answers were (file:line or row, id, the answer)."""


MAX_ALIAS_NOTES = 20


def _example_from_flashrag(row, dataset: str, where: str) -> Tuple[QAExample, List[str]]:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object")
    for key in ("id", "question", "golden_answers"):
        if key not in row:
            raise DataError(f"{where}: missing field {key!r}")
    q, answers = row["question"], row["golden_answers"]
    if not isinstance(q, str) or not q.strip():
        raise DataError(f"{where}: field 'question' must be a non-empty string")
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        raise DataError(f"{where}: field 'golden_answers' must be a non-empty list of strings")
    kept, dropped = _usable_answers(answers, f"{where} (id {row['id']})", "golden_answers")
    ds = row.get("dataset") or row.get("data_source") or dataset
    return QAExample(id=str(row["id"]), dataset=str(ds), question=q.strip(), answers=kept), dropped


def _usable_answers(answers: List[str], where: str, key: str) -> Tuple[List[str], List[str]]:
    """The gold answers that keep some text after SQuAD normalisation, and the notes of those dropped.

    An empty one (``""``, blanks, a lone article such as "A", punctuation) equals the normalised
    empty answer, so exact match would pay full reward for saying nothing: it is dropped (the row
    keeps its other answers) and noted. A row left with no answer is malformed."""
    kept = [a for a in answers if normalize_answer(a)]
    if not kept:
        raise DataError(f"{where}: {key} is {answers!r}, every answer empty after answer normalisation "
                        "(lowercase, no punctuation or articles): it would score an empty answer as correct; "
                        "fix or drop the row")
    dropped = [f"{where}: {key}[{i}] {a!r}"
               for i, a in enumerate(answers) if not normalize_answer(a)]
    return kept, dropped


def load_flashrag(path: str | os.PathLike, dataset: Optional[str] = None,
                  skip_malformed: bool = False) -> Tuple[List[QAExample], LoadReport]:
    """Read FlashRAG jsonl rows ``{"id", "question", "golden_answers"}``.

    The dataset name is the row's ``dataset`` field, else ``dataset``, else the file's parent
    directory name (FlashRAG keeps ``nq/test.jsonl``) or its stem.
    """
    p = Path(path)
    if p.is_dir():
        raise DataError(f"{p} is a directory; pass a dataset file (FlashRAG .jsonl or Search-R1 .parquet)")
    if not p.is_file():
        raise DataError(f"dataset file {p} does not exist")
    name = dataset or (p.parent.name if p.stem in ("train", "dev", "test", "valid") else p.stem)
    def parse(item):
        lineno, line = item
        where = f"{p}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: not valid JSON ({e.msg})") from None
        return _example_from_flashrag(row, name, where)

    try:   # utf-8-sig: a byte-order mark at the start (Windows editors write one) is not part of row 1
        with p.open("r", encoding="utf-8-sig") as f:
            lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    except UnicodeDecodeError as e:
        raise DataError(f"{p} is not UTF-8 text (byte {e.start}: {e.reason}); datasets are UTF-8 JSONL") from None
    return _collect(lines, parse, p, skip_malformed)


def _collect(items, parse, path: Path, skip_malformed: bool) -> Tuple[List[QAExample], LoadReport]:
    """Parse every item into (example, notes of dropped answers); a DataError stops the load, or is
    counted and skipped when asked."""
    report = LoadReport(str(path))
    out: List[QAExample] = []
    for item in items:
        try:
            example, dropped = parse(item)
        except DataError as e:
            if not skip_malformed:
                raise
            report.skipped += 1
            report.problems.append(str(e))
            continue
        out.append(example)
        report.aliases_dropped += len(dropped)
        report.alias_notes.extend(dropped[:max(0, MAX_ALIAS_NOTES - len(report.alias_notes))])
    report.loaded = len(out)
    return out, report


def load_searchr1_parquet(path: str | os.PathLike, skip_malformed: bool = False
                          ) -> Tuple[List[QAExample], LoadReport]:
    """Read Search-R1 parquet rows (``data_source``, ``prompt``, ``reward_model.ground_truth.target``).

    The question is the row's ``question`` column when present, else the last user message of
    ``prompt`` (Search-R1 keeps its instruction template there; we keep the text after 'Question:').
    """
    import pyarrow.parquet as pq

    p = Path(path)
    if not p.is_file():
        raise DataError(f"dataset file {p} does not exist")
    try:
        rows = pq.read_table(p).to_pylist()
    except Exception as e:  # pyarrow raises many types for a broken file
        raise DataError(f"{p}: not a readable parquet file ({first_line(e)})") from None
    return _collect(enumerate(rows), lambda item: _example_from_searchr1(item[1], item[0], f"{p}: row {item[0]}"),
                    p, skip_malformed)


def _example_from_searchr1(row: dict, index: int, where: str) -> Tuple[QAExample, List[str]]:
    ds = row.get("data_source")
    if not isinstance(ds, str) or not ds:
        raise DataError(f"{where}: missing field 'data_source'")
    try:
        target = row["reward_model"]["ground_truth"]["target"]
    except (KeyError, TypeError):
        raise DataError(f"{where}: missing field 'reward_model.ground_truth.target'") from None
    if isinstance(target, str):
        target = [target]
    # Search-R1's layout (scripts/data_process/*.py) stores the golden answers there as a list of
    # strings; anything else (a mapping, a number) is refused: taking a mapping's keys silently made
    # every gold answer wrong.
    if not isinstance(target, (list, tuple)) or not all(isinstance(t, str) for t in target):
        bad = target if not isinstance(target, (list, tuple)) else next(t for t in target if not isinstance(t, str))
        raise DataError(f"{where}: field 'reward_model.ground_truth.target' must be a string or a list of strings "
                        f"(the golden answers), not {_kind(bad)}")
    target = list(target)
    if not target:
        raise DataError(f"{where}: field 'reward_model.ground_truth.target' is empty")
    q = row.get("question")
    if not isinstance(q, str) or not q.strip():
        prompt = row.get("prompt")
        if not isinstance(prompt, list) or not prompt:
            raise DataError(f"{where}: missing field 'prompt' (and no 'question')")
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            raise DataError(f"{where}: field 'prompt' has no user message")
        q = users[-1]
        if not isinstance(q, str):
            raise DataError(f"{where}: field 'prompt': the user message's content must be a string, not {_kind(q)}")
        if "Question:" in q:
            q = q.rsplit("Question:", 1)[1]
        q = q.strip()
        if not q:
            raise DataError(f"{where}: empty question")
    extra = row.get("extra_info") or {}
    qid = row.get("id") or (extra.get("index") if isinstance(extra, dict) else None)
    qid = f"{ds}_{qid if qid is not None else index}"
    kept, dropped = _usable_answers(target, f"{where} (id {qid})", "reward_model.ground_truth.target")
    return QAExample(id=str(qid), dataset=ds, question=q.strip(), answers=kept), dropped


def _kind(value) -> str:
    """A value's type and a short view of it, for an error line."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def first_line(e: BaseException) -> str:
    """An exception's message cut to its first line (pyarrow's carry a whole schema after it)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def load_questions(path: str | os.PathLike, dataset: Optional[str] = None,
                   skip_malformed: bool = False) -> Tuple[List[QAExample], LoadReport]:
    """Read a QA file by its suffix: ``.jsonl``/``.json`` (FlashRAG) or ``.parquet`` (Search-R1)."""
    p = Path(path)
    if p.suffix == ".parquet":
        return load_searchr1_parquet(p, skip_malformed)
    if p.suffix in (".jsonl", ".json"):
        return load_flashrag(p, dataset, skip_malformed)
    raise DataError(f"{p}: unknown dataset format {p.suffix!r}; use .jsonl (FlashRAG) or .parquet (Search-R1)")


def write_questions(path: str | os.PathLike, examples: List[QAExample]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(p) as f:
        for ex in examples:
            f.write(json.dumps(ex.to_json(), ensure_ascii=False) + "\n")
