"""Checks a training config's inputs before anything heavy loads, each failing as one clear line.

Loading a 4B model takes minutes; an empty training set, a mistyped model path or a retrieval
server that is not running should not be discovered after that (or, for the server, never: a
policy that stops searching would train on without noticing that retrieval is down).
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import timedelta
from pathlib import Path

from mopd.core.adapter_dir import AdapterDirError, adapter_of
from mopd.core.errors import UserError
from mopd.core.model_dir import model_dir_problem
from mopd.core.model_weights import tokenizer_length, weights_problem
from mopd.core.qa import DataError, load_questions
from mopd.core.run_models import MERGED_COPY, VIEW_ADAPTER, RunModels
from mopd.retriever import HttpRetriever, RetrieverUnavailable
from mopd.retriever.identity import NO_RETRIEVER, is_bundled
from mopd.retriever.index_check import check_index
from mopd.retriever.index_store import read_meta


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

        problem = model_dir_problem(p)
        if problem:
            raise PreflightError(f"{key}={path}: {problem}" if problem.startswith("this is") else
                                 f"{key}={path} {problem}")

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


def check_step_size(per_step: int, n: int, train: str) -> None:
    """A step deals ``per_step`` questions of the ``n`` in data.train, running into the next epoch
    when it passes the end (so a step may hold a question twice); more than twice the training set
    is refused: it would go round the data again and again within one step (and a step of 10**23
    questions would grow its index list until memory ran out instead of starting)."""
    if per_step > 2 * n:
        raise PreflightError(f"trainer.questions_per_step={per_step} but data.train={train} holds {n} questions: "
                             f"a step may deal each question at most twice; set trainer.questions_per_step={n} "
                             "or less (one epoch a step), or give more questions")


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
        if not cfg.index.strip():
            raise PreflightError(NO_RETRIEVER)
        if not is_bundled(cfg.index) and not Path(cfg.index).expanduser().is_dir():
            raise PreflightError(f"retriever.index={cfg.index} is not a directory (build one with "
                                 "`mopd retriever build-index`)")
        if not is_bundled(cfg.index):
            check_index_dir(cfg.index)
        return

    try:
        HttpRetriever.for_config(cfg, quick=True).health()
    except RetrieverUnavailable as e:
        raise PreflightError(f"retriever.url: {e}") from None


def check_index_dir(index: str) -> None:
    """The index's meta.json, data files, encoder and corpus agree (``mopd.retriever.index_check``,
    milliseconds): an index of another corpus, or damaged, is refused before a model loads."""
    index_dir = Path(index).expanduser()
    try:
        check_index(read_meta(index_dir), index_dir)
    except UserError as e:        # IndexDirError, IndexMismatch, CorpusError
        raise PreflightError(f"retriever.index={index}: {e}") from None


def check_training_inputs(cfg, env=None) -> list[str]:
    """Everything above for a training config (model, teacher, train and dev data, retriever), and
    under torchrun the ranks (:func:`check_ranks`); returns the lines to say and record about inputs
    that pass (dev questions that are also training questions, an uneven deal). Every rank runs
    it: a refusal on a rank other than 0 names the rank and its host."""
    env = os.environ if env is None else env
    try:
        return _check_training_inputs(cfg) + check_ranks(cfg, env)
    except PreflightError as e:
        if int(env.get("WORLD_SIZE", "1")) > 1 and int(env.get("RANK", "0")) != 0 and " on rank " not in str(e):
            raise PreflightError(f"{e} (on rank {env['RANK']} of {env['WORLD_SIZE']}, host {socket.gethostname()})") \
                from None
        raise


def check_run_models(cfg) -> None:
    """The policy's base, its adapters and the frozen models (:class:`mopd.core.run_models.RunModels`):
    a frozen model that is a view of the base with an adapter needs an adapter directory over these
    weights, one of its own a model directory (or an adapter directory, loaded merged)."""
    check_model_path("model.path", cfg.model.path)
    models = RunModels.from_config(cfg)
    for f in models.frozen:
        key = f"{f.role}.path" if f.role == "teacher" or cfg.reference.path else "teacher.path"
        if not f.path:
            check_model_path(key, f.path)
        elif f.kind == VIEW_ADAPTER and f.planned:
            raise PreflightError(f"{key}={f.path} does not exist (an adapter directory `mopd train --export-adapter` "
                                 "or `mopd export RUN --adapter` writes, or a model directory)")
        elif f.kind == MERGED_COPY:
            _check_merged_adapter(key, f.path)
        elif f.kind != VIEW_ADAPTER:   # an adapter view: models.check() reads it against this base below
            check_model_path(key, f.path)
    try:
        models.check()
    except UserError as e:
        raise PreflightError(str(e)) from None


def _check_merged_adapter(key: str, path: str) -> None:
    """An adapter a run without LoRA loads as its base with the adapter merged: the base it names
    must be there, with the weights it was trained over."""
    try:
        adapter = adapter_of(path)   # reads, fits its config, its base is there with its weights
    except AdapterDirError as e:
        raise PreflightError(f"{key}: {e}") from None
    problem = model_dir_problem(adapter.base_dir)
    if problem:
        raise PreflightError(f"{key}={path} is an adapter over {adapter.base_path}, which {problem}")


def _check_training_inputs(cfg) -> list[str]:
    check_run_models(cfg)
    train = _questions("data.train", cfg.data.train, cfg.data.skip_malformed)
    check_step_size(cfg.trainer.questions_per_step, len(train), cfg.data.train)
    notes = []
    if cfg.data.dev:
        dev = _questions("data.dev", cfg.data.dev, cfg.data.skip_malformed)
        note = dev_overlap_note(train, dev, cfg.data.dev_size)
        if note:
            notes.append(note)
    check_retriever(cfg.retriever)
    return notes


# --------------------------------------------------------------------------------------------
# Under torchrun: the ranks a step's questions are dealt to, and a run directory all of them share.
# --------------------------------------------------------------------------------------------

SHARED_CHECK_FILE = ".mopd-ranks-check"
RANKS_WAIT = timedelta(minutes=10)
"""How long a rank waits for the others' preflight (they start within seconds of each other)."""


def deal_problem(per_step: int, world: int) -> tuple[str | None, str | None]:
    """``(refusal, note)`` of dealing ``per_step`` questions a step over ``world`` ranks
    (``QuestionSampler``: rank r takes every world-th): more ranks than questions leaves ranks with
    nothing to train on, refused; an uneven deal is said (the rank with more sets the pace)."""
    if world > per_step:
        return (f"{world} ranks but trainer.questions_per_step={per_step}: a step deals its {per_step} questions "
                f"over the ranks, so {world - per_step} rank(s) would roll out and train on nothing; run on at most "
                f"{per_step} ranks or set trainer.questions_per_step={world} or more"), None
    if per_step % world:
        more = per_step % world
        return None, (f"trainer.questions_per_step={per_step} over {world} ranks: {more} rank(s) get "
                      f"{per_step // world + 1} questions a step and {world - more} get {per_step // world} (the "
                      f"fuller ranks set the pace; a multiple of {world} evens it)")
    return None, None


def check_ranks(cfg, env=None, store=None) -> list[str]:
    """On every rank of a torchrun launch (``WORLD_SIZE`` > 1): the deal (:func:`deal_problem`), and
    ``trainer.out_dir`` is the directory rank 0 sees (:func:`check_shared_dir`: every rank writes its
    checkpoint shards there and reads all of them back, so on several nodes it must be on a shared
    filesystem). ``store``: where the ranks meet (default: torchrun's own store, before any process
    group exists; without one the directory check is skipped). Returns the notes to say."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1"))
    if world <= 1:
        return []
    refusal, note = deal_problem(cfg.trainer.questions_per_step, world)
    if refusal:
        raise PreflightError(refusal)
    if store is None:
        store = launcher_store(env)
    if store is not None:
        prefix = f"mopd/preflight/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        check_shared_dir("trainer.out_dir", cfg.trainer.out_dir, int(env.get("RANK", "0")), world, store, prefix)
    return [note] if note else []


def launcher_store(env):
    """A client of the key-value store torchrun's agent serves its workers (``MASTER_ADDR``:
    ``MASTER_PORT`` where ``TORCHELASTIC_USE_AGENT_STORE`` is True, torchrun's default), or None."""
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        return None
    import torch.distributed as dist

    try:
        return dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=RANKS_WAIT)
    except RuntimeError:   # not reachable: the process group's start will say so
        return None


def check_shared_dir(key: str, path: str, rank: int, world: int, store, prefix: str = "mopd/preflight") -> None:
    """Rank 0 writes a fresh token into ``path`` and every other rank must read it back from its own
    ``path``: a node whose ``path`` is another directory (a local disk, another mount) is refused in
    one line, on that rank and on rank 0. The token file is removed afterwards (and ``path`` with
    it, when this check made it and it is still empty)."""
    d = Path(path).expanduser()
    token_file, host = d / SHARED_CHECK_FILE, socket.gethostname()
    base = f"{prefix}/{key}"
    if rank == 0:
        made = not d.exists()
        d.mkdir(parents=True, exist_ok=True)
        token = f"{host}:{os.getpid()}:{secrets.token_hex(8)}"
        token_file.write_text(token, encoding="utf-8")
        store.set(f"{base}/token", token)
        try:
            store.wait([f"{base}/seen/{r}" for r in range(1, world)], RANKS_WAIT)
            answers = [store.get(f"{base}/seen/{r}").decode() for r in range(1, world)]
        except RuntimeError:   # torch's DistStoreError: a rank that never got here
            raise PreflightError(f"not every rank checked {key}={path} within {RANKS_WAIT.seconds // 60} minutes "
                                 "(a rank that failed its own preflight, or could not start)") from None
        finally:
            token_file.unlink(missing_ok=True)
            if made:
                try:
                    d.rmdir()
                except OSError:
                    pass
        bad = [a for a in answers if a != "ok"]
        if bad:
            raise PreflightError(f"{len(bad)} of {world - 1} other ranks do not see {key}={path} as this rank "
                                 f"does; the first: {bad[0]}")
        return
    try:
        token = store.get(f"{base}/token").decode()
    except RuntimeError:
        raise PreflightError(f"rank 0 did not check {key}={path} within {RANKS_WAIT.seconds // 60} minutes") from None
    try:
        seen = token_file.read_text(encoding="utf-8") if token_file.is_file() else None
    except OSError:
        seen = None
    answer = "ok" if seen == token else (
        f"{key}={path} on rank {rank} (host {host}) is not the directory rank 0 (host {token.split(':')[0]}) "
        "writes: every rank writes its checkpoint shards there and reads them all back, so on several nodes "
        "it must be on a filesystem all of them share (as the model, the data and the teacher)")
    store.set(f"{base}/seen/{rank}", answer)
    if answer != "ok":
        raise PreflightError(answer)
