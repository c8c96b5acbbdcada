"""The run's checkpoint policy, beside the trainer (as torchtitan keeps a checkpoint manager beside
its trainer): when to save, what a save holds, how a resume restores it, which checkpoint is the
best, and what an interrupted run keeps.

A step is *finished* once its updates are applied and its counters moved (``mark_finished``
remembers its data position, RNG states and counters, cheaply). Until the next step's first update
nothing but the RNGs has changed, so a run stopped there is rewound to the finished step and saved
(``save_finished``): ``--resume`` then repeats exactly what the uninterrupted run does. From the
first update on, the weights are no finished step's (``weights_moved``) and are never saved as one.
A finished step whose validation, log line or checkpoint is still to come is ``pending`` (its
metrics): a checkpoint written then records them and ``--resume`` does them first.

The files themselves are :mod:`mopd.train.checkpoint`'s (atomic, verified, adapters only with
LoRA); exports are :mod:`mopd.train.export`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Optional

from torch.distributed.checkpoint.api import CheckpointException

from mopd.core.errors import Interrupted
from mopd.train import checkpoint as ckpt
from mopd.train.disk_space import (checkpoint_bytes, is_out_of_space, no_space_message, save_failed_message,
                                   write_failure)
from mopd.train.errors import TrainingError
from mopd.train.export import export_weights
from mopd.train.export_target import ExportTargetError, check_export_target, marker, repair_export
from mopd.train.metrics_log import plot_training
from mopd.train.run_dir import truncate_metrics


class Checkpointer:
    """Saves, resumes, keeps the best and rewinds an interrupted step for one :class:`PolicyTrainer`
    (``trainer``): its model, optimizer, scheduler, sampler, step and counters are what a
    checkpoint holds, its logger and ``say`` where each decision is told."""

    def __init__(self, trainer, say: Callable[[str], None]):
        self.trainer = trainer
        self.cfg = trainer.cfg
        self.run_dir: Path = trainer.run_dir
        self.say = say
        self.saved_step: Optional[int] = None
        """The step of the last checkpoint written (a best validation re-uses it)."""
        self.pending: Optional[Dict[str, float]] = {}
        """The metrics of the last finished step while its validation, log line and checkpoints are
        still to come (``{}`` at step 0: the first validation); None once they are done."""
        self.finished: dict = {}
        """What the last finished step left: data position, RNG states, counters, ``pending``."""
        self.weights_moved = False
        """Whether an optimizer update has touched the weights since the last finished step."""

    # ------------------------------------------------------------------ what a checkpoint holds
    def trainer_state(self) -> dict:
        t = self.trainer
        return {"sampler": t.sampler.state_dict(), "scheduler": t.scheduler.state_dict(),
                "bad_steps": t.bad_steps, "signalless_steps": t.signalless_steps,
                "model_path": self.cfg.model.path, "method": self.cfg.method,
                "base_model_weights": ckpt.run_base_model_weights(self.run_dir) or self._lora_base(),
                "lora": t.models.record(),
                # a step whose validation or log line was cut off: --resume does them first
                "pending": None if self.pending is None else {k: float(v) for k, v in self.pending.items()}}

    def _lora_base(self) -> Optional[str]:
        """A LoRA run's base fingerprint where no run.json records it (a trainer driven from Python):
        an adapter-only checkpoint is nothing without the base it was trained over."""
        models = self.trainer.models
        return models.base_weights if models.trains_adapters else None

    def save(self) -> Path:
        """Checkpoint the current step; a second Ctrl-C during the write, a full disk and any other
        write failure (a file-size limit, a failing disk) are one line each (``Interrupted``,
        ``TrainingError``), the older checkpoints untouched."""
        t = self.trainer
        previous = ckpt.list_checkpoints(self.run_dir)
        try:
            path = ckpt.save_checkpoint(self.run_dir, t.step, t.model, t.optimizer, self.trainer_state(),
                                        keep=self.cfg.trainer.keep_checkpoints)
        except (OSError, RuntimeError, CheckpointException, KeyboardInterrupt) as e:   # DCP wraps a rank's error
            if _is_interrupt(e):
                # a second Ctrl-C (DCP wraps its KeyboardInterrupt): the partial save was removed
                # and the older checkpoints were not touched
                kept = (f"the previous checkpoint {previous[-1].name} is intact" if previous else
                        "no checkpoint of this run exists yet")
                raise Interrupted(f"stopped while checkpoint step {t.step} was written; {kept}") from None
            need = _dir_bytes(previous[-1]) if previous else checkpoint_bytes(self.cfg.model.path)
            kept = previous[-1].name if previous else None
            if is_out_of_space(e, self.run_dir, need):
                raise TrainingError(no_space_message(self.run_dir, need, kept)) from None
            cause = write_failure(e)   # any other write failure (a file-size limit, EIO, EROFS): the same
            if cause is None:
                raise
            raise TrainingError(save_failed_message(self.run_dir / "checkpoints" / f"step_{t.step:06d}", cause, kept)
                                ) from None
        self.saved_step = t.step
        t.logger.event(t.step, "checkpoint", f"saved {path}")
        return path

    def save_unless_saved(self) -> None:
        """The run's last checkpoint, unless this step's exists."""
        if self.saved_step != self.trainer.step:
            self.save()

    def keep_if_best(self, val: Dict[str, float]) -> None:
        """A validation better than every earlier one saves this step (unless just saved) and marks it
        as the best checkpoint, which retention keeps beside the last ``keep_checkpoints``."""
        t = self.trainer
        v = val.get("val/em")
        if v is None or not self.cfg.trainer.checkpoint_every or not ckpt.is_new_best(self.run_dir, v):
            return
        problem = ckpt.best_problem(self.run_dir)
        if problem:   # counted as no best: this validation's checkpoint becomes the best
            line = f"{problem}: treated as no best-validation checkpoint; step {t.step} replaces it"
            t.logger.event(t.step, "checkpoint_best", line)
            self.say(line)
        self.save_unless_saved()
        ckpt.mark_best(self.run_dir, t.step, "val/em", v)
        keep = self.cfg.trainer.keep_checkpoints
        message = (f"val/em {v:.4f} is the best validation so far: checkpoint step {t.step} is kept "
                   f"beside the last {keep} (`mopd export RUN --checkpoint best`)")
        t.logger.event(t.step, "checkpoint_best", message, value=v)

    def resume(self) -> Optional[Path]:
        """Restore the newest checkpoint that verifies and fits this run (each newer one skipped is
        said); step 0 when the run has none. The trainer then refreshes its engine."""
        t = self.trainer
        passed = []

        def skipped(p, why):
            passed.append(p)
            t.logger.event(0, "checkpoint_skipped", f"{p} does not verify ({why}); trying an older one")
            self.say(f"checkpoint {p.name} skipped: {why}")

        path, state = ckpt.load_latest(self.run_dir, t.model, t.optimizer, on_skip=skipped)
        if passed:
            self.say(f"resuming from {path.name}, the newest checkpoint that verifies and fits this run")
        if path is None:
            t.logger.event(0, "resume", "no checkpoint found; starting from step 0")
            self.say(f"{self.run_dir} has no checkpoint yet: training from step 0")
            if t.rank == 0:
                truncate_metrics(self.run_dir / "metrics.jsonl", None)
            return None
        t.step = int(state["step"])
        t.sampler.load_state_dict(state["sampler"])
        t.scheduler.load_state_dict(state["scheduler"])
        t.bad_steps = int(state.get("bad_steps", 0))
        t.signalless_steps = int(state.get("signalless_steps", 0))
        # a checkpoint written while its step's validation or log line was still to come: fit()
        # does them first, and the step's line (if a second Ctrl-C came after it) is written again
        self.pending = state.get("pending")
        self.saved_step = t.step if self.pending is None else None
        t.refresh_engine()
        if t.rank == 0:
            truncate_metrics(self.run_dir / "metrics.jsonl", t.step - (self.pending is not None))
        t.logger.event(t.step, "resume", f"resumed from {path}")
        return path

    # ------------------------------------------------------------------ finished steps and stops
    def mark_finished(self) -> None:
        """Remember the state of the last finished step (cheap: positions, counters, RNG states)."""
        t = self.trainer
        self.finished = {"sampler": t.sampler.state_dict(), "rng": ckpt.rng_state(),
                         "bad_steps": t.bad_steps, "signalless_steps": t.signalless_steps, "pending": self.pending}
        self.weights_moved = False

    def save_finished(self) -> Optional[Path]:
        """The checkpoint of the last finished step, for a run that stops in the middle of a step:
        the step's questions, RNG draws and counters are rewound (its weights are untouched before
        its first update), then it is saved unless that was already done. None when an update of
        the unfinished step had begun (only a second Ctrl-C stops there): the previous checkpoint
        is then kept as it is."""
        t = self.trainer
        if self.weights_moved:
            return None
        f = self.finished
        if f:
            t.sampler.load_state_dict(f["sampler"])
            ckpt.set_rng_state(f["rng"])
            t.bad_steps, t.signalless_steps, self.pending = f["bad_steps"], f["signalless_steps"], f["pending"]
        if self.saved_step == t.step and self.pending is None:
            return self.run_dir / "checkpoints" / f"step_{t.step:06d}"
        return self.save()

    def stop(self, cause: BaseException, validation_owed: Callable[[], bool]) -> None:
        """Save the last finished step (when the weights are still its own) and raise the line
        that says what was kept: ``Interrupted`` after a signal, ``TrainingError`` after a lost
        retriever. Runs outside the signal handlers: a second Ctrl-C during the save is said by
        ``save`` (the previous checkpoint stays intact). ``validation_owed``: whether the saved step's
        validation is still to run (its metrics pending)."""
        t = self.trainer
        at = t.step
        if isinstance(cause, KeyboardInterrupt):
            t.logger.event(t.step, "interrupt", f"interrupted ({cause}): writing a checkpoint")
        path = self.save_finished()
        if t.rank == 0:
            plot_training(self.run_dir)
        if path is None:
            kept = f"step {at + 1} had applied an update, which is not saved; {self.kept_line()}; resume with --resume"
        else:
            owed = ", its validation still to run" if self.pending is not None and validation_owed() else ""
            kept = f"checkpoint {path} holds step {t.step}, the last finished one{owed}; resume with --resume"
        if isinstance(cause, KeyboardInterrupt):
            raise Interrupted(kept) from None
        raise TrainingError(f"the retriever is unreachable ({cause}); stopped at step {t.step}: {kept} once "
                            "the server is back") from None

    def kept_line(self) -> str:
        found = ckpt.list_checkpoints(self.run_dir)
        return f"the last checkpoint, {found[-1]}, is kept" if found else "no checkpoint was written"

    # ------------------------------------------------------------------ exports
    def export(self, out_dir, which: str = "last", adapter: bool = False) -> Path:
        """A Hugging Face model directory (how Stage I becomes the teacher) of the current weights
        ("last") or of the best-validation checkpoint ("best", the paper's model selection; the
        current weights when no validation marked one). "best" loads those weights into the model:
        call it when training is over. A LoRA run writes its adapter merged into the base, or the
        adapter alone with ``adapter`` (:mod:`mopd.train.export`)."""
        t = self.trainer
        if which not in ("last", "best"):
            raise ValueError(f"export {which!r}: choose last or best")
        try:
            if t.rank == 0:   # before the check: the target may be what an interrupted export left
                for line in repair_export(out_dir):
                    self.say(line)
            ckpt.barrier()
            check_export_target(out_dir, self.run_dir, flag="--export")
        except ExportTargetError as e:
            raise TrainingError(str(e)) from None
        best = ckpt.read_best(self.run_dir) if which == "best" else None
        if which == "best" and best is None and ckpt.best_problem(self.run_dir):
            self.say(f"{ckpt.best_problem(self.run_dir)}: treated as no best-validation checkpoint; exporting "
                     "the current weights")
        step, source = t.step, "the current weights"
        if best is not None and best["step"] != t.step:
            step, source = best["step"], str(ckpt.best_checkpoint(self.run_dir).resolve())
            ckpt.load_model_weights(ckpt.best_checkpoint(self.run_dir), t.model)
        line = f"exporting step {step} to {out_dir}: {_export_reason(which, best, t.step)}"
        t.logger.event(t.step, "export", line)
        self.say(line)
        try:
            return export_weights(t.model, t.tokenizer, out_dir, marker(self.run_dir, source, step), models=t.models,
                                  adapter=adapter)
        except ckpt.CheckpointError as e:
            raise TrainingError(str(e)) from None


def _export_reason(which: str, best: Optional[dict], last: int) -> str:
    """Why an export takes the step it takes (best by validation, or the last weights)."""
    if which == "last":
        return f"the last weights (step {last} of the run; --export-checkpoint last)"
    if best is None:
        return f"the last weights (step {last}): no validation marked a best checkpoint"
    ran = "also the last step" if best["step"] == last else f"the run ended at step {last}"
    return f"the best validation ({best['metric'] or 'value'} {best['value']:.4f}; {ran})"


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _is_interrupt(e: BaseException) -> bool:
    """A KeyboardInterrupt, or DCP's CheckpointException around one (on any rank)."""
    if isinstance(e, KeyboardInterrupt):
        return True
    failures = getattr(e, "failures", None) if isinstance(e, CheckpointException) else None
    return any(isinstance(f[0], KeyboardInterrupt) for f in (failures or {}).values()
               if isinstance(f, tuple) and f)
