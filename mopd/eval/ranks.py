"""Data-parallel evaluation: ``torchrun --nproc-per-node N -m mopd eval run ...``.

Every rank builds its own engine (on its own GPU) and evaluates a share of the questions that are
not finished yet; rank 0 merges the shares into ``OUT/records.jsonl``, each workflow once. The
records are those of a one-process run: every call's sampling seed is derived from the run's seed,
the question, the attempt, the call and the turn (``mopd.rollout.run_state.derive_seed``), so no
record depends on which rank, chunk or launch produced it.

Files::

    OUT/records.jsonl              the merged records (written whole, by rank 0 or a one-process run)
    OUT/run.json                   settings, questions, finished questions, and ``ranks``: how many shared the run
    OUT/ranks/rank{r}-of-{N}/      rank r's part: a one-process evaluation directory of its share
                                   (records.jsonl appended and fsynced after each chunk, run.json, its lock)

A launch, step by step:

1. Rank 0 takes ``OUT``'s one-writer lock (the other ranks only compare their settings with
   ``OUT/run.json``), folds whatever parts an earlier, killed launch left into ``records.jsonl``
   (:func:`fold_parts`), and sends every rank the positions of the unfinished questions.
2. Rank r takes every N-th of them, from the r-th on, and runs them as a one-process evaluation
   into its part directory (:func:`mopd.eval.runner.run_evaluation`, which resumes its own part).
3. After a barrier rank 0 folds the parts into ``records.jsonl``, removes them, checks that every
   question is finished and rewrites ``run.json``; every rank ends with rank 0's outcome.

Crash safety: a kill at any point loses at most the chunks in flight. Records live in a part until
``records.jsonl`` has been rewritten whole (an atomic rename) with them; the parts are removed only
after that, and a fold skips a workflow that is already there, so a kill between the two keeps
each workflow once. The next launch, with any number of ranks (one included), folds what is left
first. A one-process ``mopd eval run`` folds leftover parts too, so it never redoes their work.

Waiting: ranks meet twice, at the start and at the end, on a gloo group whose timeout is
:data:`WAIT`: the end barrier waits for the slowest share. A rank that fails ends the launch
(torchrun stops the others); ``OUT`` must be on a filesystem every rank reaches (several nodes:
a shared one), which the end check finds out when it is not.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Callable, List, Sequence

import torch
import torch.distributed as dist

from mopd.core.peers import register_peer
from mopd.core.records import write_records
from mopd.eval.alignment import EvalError
from mopd.eval.loading import RECORDS_FILE
from mopd.eval.runner import (
    RUN_FILE,
    EvalPlan,
    Rollout,
    _check_settings,
    _write_run_file,
    check_continuation,
    hold_out_dir,
    read_finished,
    release_out_dir,
    run_evaluation,
    settings_changes,
)

PARTS_DIR = "ranks"
WAIT = timedelta(hours=12)
"""How long a rank waits for the others at a meeting (the end one waits for the slowest share)."""


def part_dir(out: Path, rank: int, world: int) -> Path:
    """Rank ``rank``'s part of a launch of ``world`` ranks."""
    return Path(out) / PARTS_DIR / f"rank{rank}-of-{world}"


def part_dirs(out: Path) -> List[Path]:
    """The parts under ``out`` (of any launch), in name order."""
    root = Path(out) / PARTS_DIR
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def fold_parts(out: Path, questions: Sequence, plan: EvalPlan, log: Callable[[str], None] = lambda s: None) -> int:
    """Fold the finished questions of every part under ``out`` into ``out/records.jsonl`` (each
    workflow once; the new ones in manifest order) and remove the parts. Only while no rank writes
    a part: the caller holds ``out``'s lock and every rank of its launch has finished (or none has
    started). Returns how many questions were added.

    A part started with other fixed settings is refused (:class:`EvalError`) before anything is
    changed: its records are not this evaluation's."""
    out = Path(out)
    parts = part_dirs(out)
    if not parts:
        return 0
    settings = plan.fixed_settings()
    for part in parts:
        if settings_changes(part, settings):
            raise EvalError(f"{part} holds part of an evaluation with other settings than {out}'s; move it away "
                            "or use another --out directory")
    kept, _ = read_finished(out / RECORDS_FILE, plan.attempts)
    seen = {(r.dataset, r.question_id, r.attempt) for r in kept}
    new = []
    for part in parts:
        records, _ = read_finished(part / RECORDS_FILE, plan.attempts)
        for r in records:
            key = (r.dataset, r.question_id, r.attempt)
            if key not in seen:
                seen.add(key)
                new.append(r)
    order = {(q.dataset, q.id): i for i, q in enumerate(questions)}
    new.sort(key=lambda r: (order.get((r.dataset, r.question_id), len(order)), r.attempt))
    if new:   # the whole file anew (atomic): a kill leaves the old file and the parts, or the new file
        write_records(out / RECORDS_FILE, kept + new)
    for part in parts:
        shutil.rmtree(part)
    try:
        (out / PARTS_DIR).rmdir()
    except OSError:
        pass
    added = len({(r.dataset, r.question_id) for r in new})
    if added:
        log(f"{added} finished questions taken from {len(parts)} rank part(s)")
    return added


class OneRank:
    """A one-process evaluation: rank 0 of 1."""

    rank, world = 0, 1

    def broadcast(self, obj):
        return obj

    def barrier(self) -> None:
        pass

    def leave(self) -> None:
        pass


class TorchRanks:
    """This process as one rank of a torchrun launch: its GPU (``LOCAL_RANK``) made current, the
    default process group joined (NCCL on CUDA, as training's, which vLLM's external launcher then
    uses; gloo on CPU) and a gloo group for the meetings, with the timeout :data:`WAIT`."""

    def __init__(self, env=None):
        env = os.environ if env is None else env
        self.rank, self.world = int(env["RANK"]), int(env["WORLD_SIZE"])
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")))
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        register_peer()   # so that a rank that loses a peer can say which one died
        self._group = dist.new_group(backend="gloo", timeout=WAIT)

    def broadcast(self, obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def barrier(self) -> None:
        dist.barrier(group=self._group)

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group(self._group)


def join_ranks(env=None):
    """The ranks of this evaluation: a torchrun launch of more than one process (``WORLD_SIZE``)
    joins it (:class:`TorchRanks`); otherwise :class:`OneRank`."""
    env = os.environ if env is None else env
    if int(env.get("WORLD_SIZE", "1")) > 1:
        return TorchRanks(env)
    return OneRank()


def check_rank_continuation(ranks, plan: EvalPlan) -> None:
    """:func:`mopd.eval.runner.check_continuation` for this rank: rank 0 takes ``OUT``'s lock and
    compares the settings; the other ranks compare only (rank 0 holds the lock for them all)."""
    if ranks.rank == 0:
        check_continuation(plan)
    else:
        _check_settings(plan.out_dir, plan.fixed_settings())


def run_ranked_evaluation(ranks, rollout: Rollout, questions: Sequence, plan: EvalPlan, *, progress: bool = False,
                          log: Callable[[str], None] = lambda s: None) -> Path:
    """Evaluate ``questions`` on ``ranks`` (every rank calls it with the same questions and plan)
    and return ``plan.out_dir/records.jsonl``, which holds every question's records once all have
    returned. One rank: a one-process :func:`mopd.eval.runner.run_evaluation` (after folding any
    parts a killed multi-rank launch left)."""
    plan = dataclasses.replace(plan, run_info={**plan.run_info, "ranks": ranks.world})
    out = plan.out_dir
    if ranks.world == 1:
        hold_out_dir(out)
        try:
            _check_settings(out, plan.fixed_settings())
            fold_parts(out, questions, plan, log)
        except BaseException:
            release_out_dir(out)
            raise
        return run_evaluation(rollout.engine, rollout.retriever, rollout.tokenizer, questions, plan,
                              run_fn=rollout.run_fn, progress=progress, log=log)
    tag = f"[rank {ranks.rank} of {ranks.world}]"
    try:
        pending = ranks.broadcast(_start(out, questions, plan, log) if ranks.rank == 0 else None)
        if isinstance(pending, str):
            raise EvalError(pending)
        share = [questions[i] for i in pending[ranks.rank::ranks.world]]
        log(f"{tag} {len(share)} of the {len(pending)} unfinished questions")
        run_evaluation(rollout.engine, rollout.retriever, rollout.tokenizer, share,
                       dataclasses.replace(plan, out_dir=part_dir(out, ranks.rank, ranks.world)),
                       run_fn=rollout.run_fn, progress=progress and ranks.rank == 0, log=lambda s: log(f"{tag} {s}"))
        ranks.barrier()
        outcome = ranks.broadcast(_finish(out, questions, plan, ranks.world, log) if ranks.rank == 0 else None)
        if outcome:
            raise EvalError(outcome)
        return out / RECORDS_FILE
    finally:
        if ranks.rank == 0:
            release_out_dir(out)


def _start(out: Path, questions: Sequence, plan: EvalPlan, log) -> "List[int] | str":
    """Rank 0 at the start: the positions of the unfinished questions, or the error every rank raises."""
    try:
        hold_out_dir(out)
        settings = plan.fixed_settings()
        _check_settings(out, settings)
        fold_parts(out, questions, plan, log)
        _, done = read_finished(out / RECORDS_FILE, plan.attempts)
    except EvalError as e:
        return str(e)
    pending = [i for i, q in enumerate(questions) if (q.dataset, q.id) not in done]
    _write_run_file(out, settings, len(questions), len(questions) - len(pending), plan.run_info)
    log(f"{len(questions) - len(pending)} of {len(questions)} questions already finished; {len(pending)} to run")
    return pending


def _finish(out: Path, questions: Sequence, plan: EvalPlan, world: int, log) -> str:
    """Rank 0 once every share is done: the parts folded, every question checked; "" or the error."""
    try:
        fold_parts(out, questions, plan)
        _, done = read_finished(out / RECORDS_FILE, plan.attempts)
    except EvalError as e:
        return str(e)
    missing = [q for q in questions if (q.dataset, q.id) not in done]
    if missing:
        return (f"{len(missing)} of {len(questions)} questions have no records in {out} after all {world} ranks "
                f"finished (first: {missing[0].dataset}/{missing[0].id}): --out must be a directory every rank "
                "writes to, on a filesystem all nodes share")
    _write_run_file(out, plan.fixed_settings(), len(questions), len(questions), plan.run_info)
    log(f"{len(questions)} of {len(questions)} questions finished ({world} ranks; records merged into "
        f"{out / RECORDS_FILE})")
    return ""


__all__ = ["PARTS_DIR", "RUN_FILE", "WAIT", "OneRank", "TorchRanks", "check_rank_continuation",
           "fold_parts", "join_ranks", "part_dir", "part_dirs", "run_ranked_evaluation"]
