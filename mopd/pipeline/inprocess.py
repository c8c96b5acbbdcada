"""Stages run in this process and in spawned worker processes (the in-process launcher: CPU
runs).

A training stage and its export share one trainer (the export is of the weights just trained);
Stage II arms train side by side in processes of one thread, evaluations likewise, each worker
with its own retriever over the same index, every query searched alone (and remembered), so a
result is the same with one worker as with several.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, List, Sequence

from mopd.config import RetrieverConfig
from mopd.core.errors import UserError
from mopd.pipeline.stages import EvalStage, ExportStage, TrainStage, move_aside
from concurrent.futures import FIRST_EXCEPTION, wait
from mopd.core.fingerprint import model_fingerprint
from mopd.core.reproducible import deterministic_torch
from mopd.core.run_lock import RunLock, RunLocked
from mopd.core.spawn_map import spawn_map, worker_pool
from mopd.eval import runner
from mopd.eval.runner import settings_changes
from mopd.pipeline.log import logger
from mopd.retriever import load_retriever
from mopd.retriever.memo import QueryMemo
from mopd.rollout.run_state import WorkflowSettings
from mopd.rollout.scheduler import run_workflows
from mopd.train import checkpoint as ckpt
from mopd.train.trainer import PolicyTrainer
import os

Log = Callable[[str], None]


class StageLocked(UserError):
    """A training stage's run directory is held by another process (the message names it)."""


def rollout_fn(lockstep: bool):
    """The scheduler stages roll out with (None: the trainer's and evaluator's default)."""
    if not lockstep:
        return None

    return run_workflows


def open_retriever(cfg: RetrieverConfig):
    """The retriever of this process: every query searched alone (and remembered), so its passages
    never depend on its batch."""

    return QueryMemo(load_retriever(cfg))


def train(stage: TrainStage, exports: Sequence[ExportStage], retriever, lockstep: bool, log: Log,
          progress: bool = True) -> None:
    """Train ``stage`` (resuming a killed run) and write each of its ``exports`` with the same
    trainer (a LoRA Stage I: the merged model and the adapter alone); a finished and exported stage
    is reused."""
    name, cfg = stage.spec.name, stage.config
    if stage.done() and all(e.done() for e in exports):
        log(f"{name}: reusing " + (", ".join(str(e.export_dir) for e in exports) or str(stage.run_dir)))
        return

    if stage.done():   # trained: only its export is missing
        log(f"{name}: trained in {cfg.trainer.out_dir}; exporting")
    else:
        log(f"{name}: training {cfg.trainer.steps} steps ({cfg.method}) -> {cfg.trainer.out_dir}")
    lock = lock_stage(cfg.trainer.out_dir, name)   # one writer per run directory, as `mopd train`
    try:
        stage.begin(log)
        if not lock.path.exists():   # begin moved a build of other settings aside, its lock with it
            lock.release()
            lock = lock_stage(cfg.trainer.out_dir, name)
        t0 = time.perf_counter()
        deterministic_torch(max(1, cfg.trainer.cpu_threads))
        trainer = PolicyTrainer(cfg, retriever=retriever, resume=True, rollout_fn=rollout_fn(lockstep),
                                progress=progress)
        try:
            trainer.fit()
            for export in exports:
                if export.which == "best":
                    export_best(name, trainer, export.export_dir, log, adapter=export.adapter)
                else:
                    log(f"{name}: exporting the last step, {trainer.step}" + (" (adapter)" if export.adapter else ""))
                    trainer.export(export.export_dir, which="last", adapter=export.adapter)
        finally:
            trainer.close()
        for done in exports or [stage]:
            done.mark_done()
    finally:
        lock.release()
    log(f"{name}: done in {time.perf_counter() - t0:.0f}s"
        + (f"; exported {', '.join(str(e.export_dir) for e in exports)}" if exports else ""))


def lock_stage(run_dir, name: str):
    """The run lock of a training stage's directory (:mod:`mopd.core.run_lock`), or
    :class:`StageLocked` naming its holder."""

    try:
        return RunLock(run_dir, f"mopd pipeline stage {name}")
    except RunLocked as e:
        raise StageLocked(str(e)) from None


def export_best(name: str, trainer, export_dir: Path, log: Log, adapter: bool = False) -> Path:
    """Export the checkpoint with the best dev validation (the paper's model selection; step 0,
    the starting model, is not a candidate); the last weights when no validation ran. ``adapter``:
    a LoRA run's adapter alone (`mopd export --adapter`)."""

    best = ckpt.read_best(trainer.run_dir)
    what = " (adapter)" if adapter else ""
    if best is None or best["step"] == trainer.step:
        log(f"{name}: exporting the last step, {trainer.step}{what}" + (", also the best on dev" if best else ""))
    else:
        log(f"{name}: exporting step {best['step']}{what}, the best dev {best['metric']} ({best['value']:.3f})")
    return trainer.export(export_dir, which="best", adapter=adapter)


def last_step(run_dir: Path) -> int:
    """The last step a run's metrics.jsonl logged (0 before the first)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        return int(json.loads(lines[-1]).get("step", 0)) if lines else 0
    except ValueError:   # a line being written
        return int(json.loads(lines[-2]).get("step", 0)) if len(lines) > 1 else 0


def _train_in_worker(stage: TrainStage, exports: Sequence[ExportStage], retriever: RetrieverConfig, lockstep: bool,
                     log_name: str) -> None:

    train(stage, exports, open_retriever(retriever), lockstep, logger(log_name), progress=False)


def train_side_by_side(jobs: Sequence[tuple], workers: int, retriever, retriever_cfg: RetrieverConfig,
                       lockstep: bool, log: Log, log_name: str) -> None:
    """Train each (train stage, its export stages) job, ``workers`` at a time (spawned processes, one
    thread each, each with its own retriever); one progress line per minute while they run."""

    workers = min(workers, len(jobs), os.cpu_count() or 1)
    if workers <= 1:
        for stage, exports in jobs:
            train(stage, exports, retriever, lockstep, log)
        return
    with worker_pool(workers) as pool:   # the workers end with this process (a kill -9 too)
        futures = [pool.submit(_train_in_worker, stage, exports, retriever_cfg, lockstep, log_name)
                   for stage, exports in jobs]
        while True:
            done, pending = wait(futures, timeout=60, return_when=FIRST_EXCEPTION)
            for f in done:
                f.result()   # re-raises a worker's error here
            if not pending:
                break
            log("Stage II arms: " + ", ".join(f"{s.spec.name} step {last_step(s.run_dir)}/{s.config.trainer.steps}"
                                              for s, _ in jobs))


def evaluate(stage: EvalStage, questions, retriever, lockstep: bool, log: Log) -> Path:
    """The paper's protocol (1 candidate, T 0.6, top-p 0.95) with the workflow limits and Searcher
    template of the training stages (``stage.config``)."""

    name, workflow, cfg = stage.system.name, stage.system.workflow, stage.config
    if stage.done():
        log(f"eval {name}: reusing {stage.out}")
        return stage.out / "records.jsonl"
    log(f"eval {name}: {len(questions)} questions x {stage.attempts} attempts ({workflow})")
    t0 = time.perf_counter()
    deterministic_torch(1)
    plan = runner.EvalPlan(stage.out, WorkflowSettings.for_evaluation(cfg, workflow), attempts=stage.attempts,
                           method=name, model=model_fingerprint(stage.model_dir),
                           manifest=runner.manifest_fingerprint(questions))   # an edited test set is a changed setting
    set_aside_if_stale(stage.out, plan.fixed_settings(), log)
    stage.begin(log)
    path = runner.evaluate(stage.model_dir, None, retriever, questions, plan, cfg, run_fn=rollout_fn(lockstep))
    stage.out.mkdir(parents=True, exist_ok=True)
    stage.mark_done()
    log(f"eval {name}: {time.perf_counter() - t0:.0f}s")
    return path


def set_aside_if_stale(out: Path, settings: dict, log: Log) -> None:
    """An evaluation written earlier for another model or other settings (a stage retrained with
    other steps, say) is moved to ``out.replaced-N``, never resumed or deleted: its records would
    otherwise be refused by the evaluator, or, before evaluations were keyed on the model's
    weights, silently reused."""

    if settings_changes(out, settings):
        move_aside(out, log, "was evaluated with another model or settings")


def _evaluate_in_worker(stage: EvalStage, questions, retriever: RetrieverConfig, lockstep: bool,
                        log_name: str) -> Path:

    return evaluate(stage, questions, open_retriever(retriever), lockstep, logger(log_name))


def evaluate_all(stages: List[EvalStage], questions, workers: int, retriever, retriever_cfg: RetrieverConfig,
                 lockstep: bool, log: Log, log_name: str) -> None:
    """Evaluate every stage, ``workers`` at a time (spawned processes; each loads its own retriever
    over the same index and searches every query alone, as this process does)."""

    workers = min(workers, len(stages), os.cpu_count() or 1)
    if workers <= 1:
        for s in stages:
            evaluate(s, questions, retriever, lockstep, log)
        return

    # H-MAS evaluations take about twice as long as C-MAS ones: submitted first, the two workers
    # finish together (longest job first)
    ordered = sorted(stages, key=lambda s: s.system.workflow != "hmas")
    spawn_map(_evaluate_in_worker, [(s, questions, retriever_cfg, lockstep, log_name) for s in ordered], workers)
