"""Whether a step had a learning signal, beside the trainer: the step's counts summed over ranks,
its invalid-call fractions and the engine-vs-trainer log-prob gap as metrics, and the stop after
``trainer.max_signalless_steps`` steps in a row without a signal (a model that writes no valid
action, say, would otherwise train on nothing for hours)."""

from __future__ import annotations

from typing import Dict, List

from mopd.algo.advantages import role_specs
from mopd.core.roles import role_names
from mopd.train.distributed import all_reduce
from mopd.train.errors import TrainingError
from mopd.train.learning_signal import (counts_tensor, invalid_fractions, logprob_gap_sums, no_signal_reason,
                                        role_call_counts, role_fractions, signal_token_counts)


class SignalCheck:
    """For one :class:`PolicyTrainer`: its counter ``signalless_steps`` (checkpointed with it) is
    kept here up to date."""

    def __init__(self, trainer, say):
        self.trainer = trainer
        self.say = say

    def counts(self, records, batches) -> List[float]:
        """The step's calls and invalid calls per role, its trained tokens and those with a non-zero
        advantage, and the engine-vs-trainer log-prob gap's sum: summed over ranks (every rank then
        decides alike whether the run stops)."""
        t = self.trainer
        parts = [role_call_counts(records), signal_token_counts(batches, role_specs(t.cfg.algo)),
                 logprob_gap_sums(batches) if t.cfg.trainer.old_logprobs == "recompute" else [0.0, 0.0]]
        return all_reduce(counts_tensor(parts, t.device)).cpu().tolist()

    def check(self, counts: List[float], m: Dict[str, float]) -> Dict[str, float]:
        """The step's invalid-call fractions and log-prob gap as metrics; a step without a learning
        signal is named in one line, and ``trainer.max_signalless_steps`` of them in a row stop the
        run (that line, after a checkpoint)."""
        t = self.trainer
        n = 2 * len(role_names())
        invalid = invalid_fractions(counts[:n])
        out = {f"rollout/invalid_call_frac/{r}": f for r, f in invalid.items()}
        gap, gap_tokens = counts[n + 2:n + 4]
        if gap_tokens:   # the engine's sampling log-probs against the recomputed pi_old
            out["rollout_logprob_gap"] = gap / gap_tokens
        reason = no_signal_reason(counts[n:n + 2], invalid)
        if reason is None:
            t.signalless_steps = 0
            return out
        t.signalless_steps += 1
        line = f"step {t.step}: no learning signal: {reason}; {role_fractions('invalid calls', invalid)}"
        t.logger.event(t.step, "no_signal", line, consecutive=t.signalless_steps)
        limit = t.cfg.trainer.max_signalless_steps
        if not limit or t.signalless_steps < limit:
            self.say(line)
            return out
        t.logger.log(t.step, {**m, **out})
        path = t.save()
        raise TrainingError(f"{line}. Stopped after {t.signalless_steps} such steps in a row (checkpoint "
                            f"{path}): check that the model writes the action format (its chat template, "
                            "model.path), or set trainer.max_signalless_steps=0 to train on")
