"""Checks a training config's inputs before anything heavy loads, each failing as one clear line.

Loading a 4B model takes minutes; an empty training set, a mistyped model path or a retrieval
server that is not running should not be discovered after that (or, for the server, never: a
policy that stops searching would train on without noticing that retrieval is down).
"""

from __future__ import annotations

from pathlib import Path


class PreflightError(ValueError):
    """An input of the run is missing or unusable (the message names it)."""


def check_model_path(key: str, path: str) -> None:
    """``path`` must be a local model directory or look like a Hugging Face Hub id (``org/name``)."""
    if not path or not path.strip():
        raise PreflightError(f"{key} is empty: set {key}=DIR (a Hugging Face model directory, e.g. runs/quick/pi0) "
                             "or a Hub id such as Qwen/Qwen3-4B-Instruct-2507")
    p = Path(path).expanduser()
    if p.exists():
        if not p.is_dir():
            raise PreflightError(f"{key}={path} is a file; it must be a model directory (config.json, weights)")
        from mopd.core.model_dir import model_dir_problem

        problem = model_dir_problem(p)
        if problem:
            raise PreflightError(f"{key}={path}: {problem}" if problem.startswith("this is") else
                                 f"{key}={path} {problem}")
        from mopd.core.model_weights import tokenizer_length, weights_problem

        # a truncated safetensors file, a config.json of another size, more tokens than embedding rows
        problem = weights_problem(p, tokenizer_length(p))
        if problem:
            raise PreflightError(f"{key}: {problem}")
        return
    parts = path.split("/")
    hub_like = len(parts) == 2 and all(parts) and not path.startswith((".", "~")) and not Path(parts[0]).is_dir()
    if not hub_like:
        raise PreflightError(f"{key}={path} does not exist")


def check_questions(key: str, path: str, skip_malformed: bool = False) -> int:
    """The dataset must load, be UTF-8 and hold at least one question; returns how many."""
    return len(_questions(key, path, skip_malformed))


def _questions(key: str, path: str, skip_malformed: bool = False) -> list:
    from mopd.core.qa import DataError, load_questions

    if not path:
        raise PreflightError(f"{key} is empty: set {key}=FILE (FlashRAG .jsonl or Search-R1 .parquet)")
    try:
        questions, _ = load_questions(path, skip_malformed=skip_malformed)
    except UnicodeDecodeError as e:
        raise PreflightError(f"{key}={path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
    except DataError as e:
        raise PreflightError(str(e)) from None
    if not questions:
        raise PreflightError(f"{key}={path} holds no questions")
    return questions


def _question_key(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(" ?.!")


def dev_overlap_note(train: list, dev: list, dev_size: int | None = None) -> str | None:
    """One line when validation questions (the first ``dev_size`` of data.dev, as the trainer takes
    them) are also training questions (the same text, case and spacing aside): their validation
    score measures recall of trained questions. None when there are none."""
    validated = dev[:dev_size] if dev_size else dev
    seen = {_question_key(q.question) for q in train}
    shared = [q for q in validated if _question_key(q.question) in seen]
    if not shared:
        return None
    ids = ", ".join(q.id for q in shared[:3]) + (", ..." if len(shared) > 3 else "")
    return (f"data.dev: {len(shared)} of the {len(validated)} validation questions are also in data.train (same "
            f"question text; ids {ids}): val/em on them measures recall of trained questions, not generalisation")


def check_retriever(cfg) -> None:
    """An HTTP retriever must answer /health now (one quick try, not the client's full backoff);
    an in-process one must name an index directory that exists, or ``bundled``: no retriever
    setting is refused, never a silent bundled corpus of invented passages."""
    if cfg.kind != "http":
        from mopd.retriever.identity import NO_RETRIEVER, is_bundled

        if not cfg.index.strip():
            raise PreflightError(NO_RETRIEVER)
        if not is_bundled(cfg.index) and not Path(cfg.index).expanduser().is_dir():
            raise PreflightError(f"retriever.index={cfg.index} is not a directory (build one with "
                                 "`mopd retriever build-index`)")
        if not is_bundled(cfg.index):
            check_index_dir(cfg.index)
        return
    from mopd.retriever import HttpRetriever, RetrieverUnavailable

    try:
        HttpRetriever(cfg.url, timeout_s=min(cfg.timeout_s, 10.0), retries=1, backoff_s=0.5).health()
    except RetrieverUnavailable as e:
        raise PreflightError(f"retriever.url: {e}") from None


def check_index_dir(index: str) -> None:
    """The index's meta.json, data files, encoder and corpus agree (``mopd.retriever.index_check``,
    milliseconds): an index of another corpus, or damaged, is refused before a model loads."""
    from mopd.core.errors import UserError
    from mopd.retriever.index_check import check_index
    from mopd.retriever.index_store import read_meta

    index_dir = Path(index).expanduser()
    try:
        check_index(read_meta(index_dir), index_dir)
    except UserError as e:        # IndexDirError, IndexMismatch, CorpusError
        raise PreflightError(f"retriever.index={index}: {e}") from None


def check_training_inputs(cfg) -> list[str]:
    """Everything above for a training config (model, teacher, train and dev data, retriever);
    returns the lines to say and record about inputs that pass (dev questions that are also
    training questions)."""
    check_model_path("model.path", cfg.model.path)
    if cfg.opd_roles():
        check_model_path("teacher.path", cfg.teacher.path)
    if cfg.reference_roles():
        check_model_path("reference.path" if cfg.reference.path else "teacher.path", cfg.reference_path())
    train = _questions("data.train", cfg.data.train, cfg.data.skip_malformed)
    notes = []
    if cfg.data.dev:
        dev = _questions("data.dev", cfg.data.dev, cfg.data.skip_malformed)
        note = dev_overlap_note(train, dev, cfg.data.dev_size)
        if note:
            notes.append(note)
    check_retriever(cfg.retriever)
    return notes
