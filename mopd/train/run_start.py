"""What `mopd train` checks and takes before the trainer loads: the outputs, the resume, the lock.

Nothing is written into the run directory before these pass (after the inputs: model, data,
retriever, ``mopd.train.preflight``): the directory and its ``checkpoints/`` must be writable,
with room for one checkpoint, and ``--export`` may write its target; ``--resume`` needs a run
there (``--resume-or-start`` starts one); then rank 0 takes the run's lock and records the run.
"""

from __future__ import annotations

from pathlib import Path

from mopd.core.out_path import out_dir_problem
from mopd.core.run_lock import RunLock, RunLocked
from mopd.train.disk_space import checkpoint_bytes, free_space_problem
from mopd.train.export_target import ExportTargetError, check_export_target
from mopd.train.run_dir import RunDirError, prepare_run_dir, present_entries


class RunCommandError(ValueError):
    """The run directory or an output path of `mopd train` cannot be used (one line)."""


def check_run_outputs(cfg, export_dir: str | None = None) -> None:
    """Before anything is written: trainer.out_dir is a writable directory (and its checkpoints/)
    with room for a checkpoint, and --export may write its directory."""
    out = cfg.trainer.out_dir
    check_not_a_model_dir(cfg)
    problem = out_dir_problem(out, inner=("checkpoints",))
    if problem:
        raise RunCommandError(f"trainer.out_dir={out} {problem}")
    problem = free_space_problem(out, checkpoint_bytes(cfg.model.path))   # every run saves its last step
    if problem:
        raise RunCommandError(f"trainer.out_dir={out} {problem}")
    if export_dir:
        try:
            check_export_target(export_dir, out, flag="--export")
        except ExportTargetError as e:
            raise RunCommandError(str(e)) from None


def check_not_a_model_dir(cfg) -> None:
    """trainer.out_dir is not the directory of a model the run reads (model.path, teacher.path,
    reference.path): its run.json and checkpoints would make that directory a run directory, which
    every command then refuses as a model."""
    out = Path(cfg.trainer.out_dir).expanduser().resolve()
    for key, path in (("model.path", cfg.model.path), ("teacher.path", cfg.teacher.path),
                      ("reference.path", cfg.reference.path)):
        if path and Path(path).expanduser().resolve() == out:
            raise RunCommandError(f"trainer.out_dir={cfg.trainer.out_dir} is {key}: the run would write its files "
                                  "(run.json, checkpoints) into the model's directory, which is then no longer "
                                  "loadable as a model; set another trainer.out_dir")


def resume_or_refuse(cfg, resume: bool, resume_or_start: bool) -> bool:
    """Whether this start resumes: --resume needs a run in trainer.out_dir (a mistyped path must not
    silently train from step 0); --resume-or-start resumes one if it is there."""
    if not (resume or resume_or_start):
        return False
    out = Path(cfg.trainer.out_dir)
    if out.is_dir() and present_entries(out):
        return True
    if resume_or_start:
        return False
    raise RunCommandError(f"--resume: trainer.out_dir={cfg.trainer.out_dir} holds no run to resume (no run.json, "
                          "checkpoints or metrics); check the path, or pass --resume-or-start to start a fresh "
                          "run there")


def lock_run(run_dir, purpose: str):
    try:
        return RunLock(run_dir, purpose)
    except RunLocked as e:
        raise RunCommandError(str(e)) from None


def prepare_run(cfg, resume: bool, overwrite: bool, allow_changed=()):
    try:
        return prepare_run_dir(cfg, resume=resume, overwrite=overwrite, allow_changed=allow_changed)
    except RunDirError as e:
        raise RunCommandError(str(e)) from None
