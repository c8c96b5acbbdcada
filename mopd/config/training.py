"""How a run trains and evaluates: the ``trainer`` and ``eval`` sections of :class:`mopd.config.Config`."""

from __future__ import annotations

from dataclasses import dataclass

from mopd.config.checks import choice, positive
from mopd.config.inputs import DTYPES


@dataclass
class TrainerConfig:
    steps: int = 500
    """Training steps (one rollout batch and its PPO updates each)."""
    questions_per_step: int = 32
    """Questions per step (each sampled group_size times)."""
    ppo_minibatches: int = 5
    """PPO mini-batch updates per step."""
    micro_batch_tokens: int = 16384
    """Token budget of one packed micro-batch (per rank)."""
    lr: float = 1e-6
    """AdamW learning rate after warm-up."""
    warmup_steps: int = 0
    """Linear warm-up steps, then constant."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    max_bad_steps: int = 3
    """Consecutive non-finite updates before the run stops (with a checkpoint)."""
    max_signalless_steps: int = 3
    """Consecutive steps without a learning signal (every trained token's advantage 0, or every
    call an invalid action) before the run stops, with a checkpoint and the step's line; each such
    step is named on the terminal with its invalid-call fraction per role. 0: never stop."""
    seed: int = 0
    """Seed of data order, rollouts and initialisation."""
    out_dir: str = "runs/default"
    """Run directory: checkpoints, metrics.jsonl, plots."""
    checkpoint_every: int = 100
    """Steps between checkpoints (0 disables periodic ones; the final step is always saved)."""
    keep_checkpoints: int = 3
    """Checkpoints kept (oldest deleted first)."""
    val_every: int = 50
    """Steps between validations on the dev set (0 disables)."""
    val_attempts: int = 1
    """Workflows per dev question at each validation (more attempts: a less noisy dev curve; the
    validation cost grows linearly)."""
    log_every: int = 1
    """Steps between metric lines."""
    trace_every: int = 0
    """Steps between token traces (0: none): every such step appends a fixed sample of its
    workflows to ``<out_dir>/traces.jsonl`` with each model token's sampling, old and teacher
    log-probs and the advantage it was trained with (``mopd view RUN`` shows them). Tracing only
    writes a file: the run trains exactly as without it."""
    trace_workflows: int = 4
    """Workflows per trace: the first of each of the step's first this many groups."""
    tensorboard: bool = False
    """Also write TensorBoard events (needs tensorboard)."""
    wandb_project: str = ""
    """Also log to this W&B project (needs wandb)."""
    cpu_threads: int = 0
    """CPU runs only: torch intra-op threads for training (0 keeps torch's default). Small models
    train faster on 1 thread when the machine is shared, since every op's barrier waits for all."""
    old_logprobs: str = "recompute"
    """Where the PPO ratio's pi_old (and OPD's and the KL's) comes from: "recompute" (a no-grad
    forward of the policy over the batch, exact whatever the engine) or "rollout" (the log-probs the
    engine recorded while sampling: saves that forward, exact only when the engine computes them like
    the trainer, i.e. the HF engine at top_p 1; TRL's single-iteration GRPO makes the same saving)."""

    def __post_init__(self):
        choice("trainer.old_logprobs", self.old_logprobs, {"recompute", "rollout"})
        positive("trainer.cpu_threads", self.cpu_threads, allow_zero=True)
        positive("trainer.max_signalless_steps", self.max_signalless_steps, allow_zero=True)
        for name in ("steps", "questions_per_step", "ppo_minibatches", "micro_batch_tokens",
                     "keep_checkpoints", "max_bad_steps", "val_attempts"):
            positive(f"trainer.{name}", getattr(self, name))
        positive("trainer.lr", self.lr)
        for name in ("warmup_steps", "checkpoint_every", "val_every", "weight_decay"):
            positive(f"trainer.{name}", getattr(self, name), allow_zero=True)
        positive("trainer.grad_clip", self.grad_clip)
        positive("trainer.log_every", self.log_every)
        positive("trainer.trace_every", self.trace_every, allow_zero=True)
        positive("trainer.trace_workflows", self.trace_workflows)


@dataclass
class EvalConfig:
    attempts: int = 4
    """Independent workflows per question."""
    temperature: float = 0.6
    """Sampling temperature at evaluation."""
    top_p: float = 0.95
    """Nucleus mass at evaluation."""
    answer_candidates: int = 1
    """Answerer candidates per request at evaluation."""
    bootstrap_draws: int = 4000
    """Question-bootstrap draws for intervals."""
    bootstrap_seed: int = 20260912
    """Seed of the bootstrap."""
    dtype: str = "auto"
    """Weight dtype of evaluation engines: auto = float16 on GPU (the paper evaluates with vLLM in
    float16) and float32 on CPU; or float32, bfloat16, float16. Training keeps ``model.dtype``."""

    def __post_init__(self):
        choice("eval.dtype", self.dtype, DTYPES)
        positive("eval.attempts", self.attempts)
        positive("eval.answer_candidates", self.answer_candidates)
        positive("eval.bootstrap_draws", self.bootstrap_draws)

    def engine_dtype(self, cuda: bool) -> str:
        """The dtype an evaluation engine loads its weights in, on a GPU (``cuda``) or a CPU."""
        if self.dtype != "auto":
            return self.dtype
        return "float16" if cuda else "float32"
