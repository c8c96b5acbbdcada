"""Validation during training, beside the trainer (as torchtitan keeps a validator beside its
trainer): when a finished step validates, and what it measures on the dev questions."""

from __future__ import annotations

from typing import Dict

from mopd.eval.metrics import validation_counts, validation_metrics
from mopd.rollout.run_state import WorkflowSettings
from mopd.train.distributed import all_reduce
from mopd.train.learning_signal import (ALL_INVALID, all_invalid, counts_tensor, invalid_fractions, role_call_counts,
                                        role_fractions)

VALIDATION_SEED = 12345
"""Base seed of validation rollouts (plus the step): the same dev questions, fresh samples."""


class Validator:
    """``trainer.val_attempts`` workflows per dev question of a :class:`PolicyTrainer` with the
    evaluation protocol (``cfg.eval``), scored by the evaluation code; ranks split the questions and
    add their counts."""

    def __init__(self, trainer, say):
        self.trainer = trainer
        self.say = say

    def due(self, target: int) -> bool:
        """Whether the finished step validates: every ``trainer.val_every`` steps and the last, and
        step 0 when there are dev questions (``validate`` gives nothing without them)."""
        t = self.trainer
        every = t.cfg.trainer.val_every
        return bool(every) and (t.step % every == 0 or t.step == target) and (t.step > 0 or bool(t.dev_questions))

    def validate(self) -> Dict[str, float]:
        t = self.trainer
        if not t.dev_questions:
            return {}
        settings = WorkflowSettings.for_evaluation(t.cfg, seed=VALIDATION_SEED + t.step)
        records = t.rollout(t.dev_questions[t.rank::t.world], settings, attempts=t.cfg.trainer.val_attempts)
        val = validation_counts(records)
        counts = all_reduce(counts_tensor([val, role_call_counts(records)], t.device)).cpu().tolist()
        m = validation_metrics(counts[:len(val)])
        invalid = invalid_fractions(counts[len(val):])
        valid = {r: 1.0 - f for r, f in invalid.items()}
        m.update({f"val/valid_call_frac/{r}": v for r, v in valid.items()})
        if all_invalid(invalid):
            line = f"validation at step {t.step}: {ALL_INVALID}; {role_fractions('invalid calls', invalid)}"
            t.logger.event(t.step, "no_signal", line)
        else:
            line = f"validation at step {t.step}: val/em {m['val/em']:.4f}; {role_fractions('valid calls', valid)}"
        self.say(line)
        return m
