"""The policy trainer: rollout -> scoring -> advantages -> PPO updates -> engine refresh, per step.

One class holds the run's state (model, optimizer, engine, frozen models, data position, step);
every stage of a step is one call into the component that owns it: the rollout
(``mopd.rollout``), packing and per-call glue (``step_batches``), the method (``mopd.algo``),
the loss head (``mopd_kernels``), the engine's colocation cycle (``weight_sync``), bookkeeping
(``step_metrics``). It runs as one process on CPU for smoke runs and under ``torchrun`` with FSDP2
on GPUs. Each rank rolls out its share of the step's questions (all G trajectories of a question
stay on one rank, so group normalisation is local); the loss normaliser is the global number of
trained tokens of the mini-batch (all-reduced), and gradients are summed over ranks
(``model.shard_model``), so an update is the global token mean (docs/architecture.md).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from mopd_kernels import FusedLinearPolicyLoss, PolicyLossSettings, set_compiled_cpu_rows
from mopd_kernels.kl import kl_penalty
from torch.distributed.checkpoint.api import CheckpointException
from tqdm import tqdm

from mopd.algo.advantages import role_specs, step_advantages
from mopd.algo.critic import judge_items, judge_reports, verdicts_by_call
from mopd.algo.rewards import role_reward_objects
from mopd.config import ROLLOUT_LOGPROBS_BF16, Config, ConfigError, to_dict, to_yaml
from mopd.core.errors import Interrupted
from mopd.core.qa import load_questions
from mopd.core.roles import role_id, role_names
from mopd.eval.metrics import validation_counts, validation_metrics
from mopd.retriever import RetrieverUnavailable, load_retriever
from mopd.rollout.async_scheduler import run_rollout
from mopd.rollout.chat import check_chat_template
from mopd.rollout.context import fit_context
from mopd.rollout.engine import capabilities_of
from mopd.rollout.engines import build_engine
from mopd.rollout.run_state import WorkflowSettings
from mopd.train import checkpoint as ckpt
from mopd.train.disk_space import checkpoint_bytes, is_out_of_space, no_space_message
from mopd.train.distributed import all_reduce, init_distributed, leave_process_group, rank_and_world
from mopd.train.export import export_weights
from mopd.train.export_target import ExportTargetError, check_export_target, marker, repair_export
from mopd.train.learning_signal import (ALL_INVALID, all_invalid, counts_tensor, invalid_fractions, logprob_gap_sums,
                                        no_signal_reason, role_call_counts, role_fractions, signal_token_counts)
from mopd.train.metrics_log import MetricsLogger, plot_training
from mopd.train.model_checks import model_notices
from mopd.train.model import PackedCausalLM, load_causal_lm, policy_dtype, resolve_dtype, shard_model
from mopd.train.packing import PackedBatch
from mopd.train.interrupts import StopSignals
from mopd.train.memory_plan import PlanError, rollout_config_for_gpu, shard_frozen_models
from mopd.train.partial_scoring import score_needed
from mopd.train.run_dir import truncate_metrics
from mopd.train.sampler import QuestionSampler
from mopd.train.step_batches import StepBatches, pack_records
from mopd.train.step_metrics import LossStats, PhaseTimer, step_metrics
from mopd.train.teacher import attach_adapters, load_frozen_models
from mopd.train.token_trace import append_traces, trace_lines
from mopd.train.weight_sync import refresh_engine, release_engine

log = logging.getLogger(__name__)

VALIDATION_SEED = 12345
"""Base seed of validation rollouts (plus the step): the same dev questions, fresh samples."""


class TrainingError(RuntimeError):
    """The run cannot go on (repeated non-finite updates, lost retriever, ...); a checkpoint was written."""


class PolicyTrainer:
    """Trains the shared policy with the method named by ``cfg`` (a preset plus overrides)."""

    def __init__(self, cfg: Config, *, retriever=None, resume: bool = False, progress: bool = True,
                 rollout_fn=None):
        cfg.check_trainable()
        self._owns_process_group = init_distributed()
        self.rank, self.world = rank_and_world()

        cfg = fit_context(cfg, cfg.model.path, log=print if self.rank == 0 else (lambda _: None))
        self.cfg = cfg
        cuda = torch.cuda.is_available()
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if cuda else "cpu")
        self.run_dir = Path(cfg.trainer.out_dir)
        self.progress = progress and self.rank == 0
        torch.manual_seed(cfg.trainer.seed + self.rank)
        if self.device.type == "cpu" and cfg.trainer.cpu_threads:
            torch.set_num_threads(cfg.trainer.cpu_threads)

        # Sharded whenever a process group exists: every rank under torchrun, and one GPU alone.
        self.sharded = dist.is_initialized()
        self.model, self.tokenizer = load_causal_lm(
            cfg.model.path, dtype=policy_dtype(cfg.model, self.device, self.sharded),
            device=self.device, attn=cfg.model.attn_implementation, use_liger=cfg.model.use_liger)
        attach_adapters(cfg, self.model)   # LoRA: the student's adapter and the frozen ones over this base

        check_chat_template(self.tokenizer, cfg.model.chat_template_kwargs, name=cfg.model.path)
        self.model.train()
        self.policy = PackedCausalLM(self.model)
        if self.sharded:
            shard_model(self.model, self.device, activation_checkpointing=cfg.model.activation_checkpointing,
                        root=self.policy)
        elif cfg.model.activation_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.loss = _loss_head(cfg)

        # Replicated in bf16 on every GPU when the memory plan fits that way (no all-gathers while scoring).
        self.frozen_sharded = self.sharded and shard_frozen_models(cfg, self.world)
        self.frozen = load_frozen_models(cfg, student_tokenizer=self.tokenizer, device=self.device,
                                         shard=self.frozen_sharded, policy=self.policy)
        # every parameter in full fine-tuning; the adapters alone with LoRA (the base is frozen)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=cfg.trainer.lr,
                                           weight_decay=cfg.trainer.weight_decay, betas=(0.9, 0.999))
        warm = cfg.trainer.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm > 0 else 1.0)

        self.memory_note = ""
        """What the memory plan chose for vLLM's GPU share (empty when nothing was chosen)."""
        self.engine = self._build_engine()
        if retriever is None:
            retriever = load_retriever(cfg.retriever)
        self.retriever = retriever
        self.rollout_fn = run_rollout if rollout_fn is None else rollout_fn
        """``run_workflows``-compatible: (engine, retriever, tokenizer, questions, settings, *,
        attempts, method, progress) -> records (with ``.stats``, a RolloutStats, when it has them);
        default: the asynchronous scheduler where it is the faster one (vLLM), else lock-step."""

        self._load_data()
        self.step = 0
        self.bad_steps = 0
        self.signalless_steps = 0
        """Steps in a row without a learning signal (``trainer.max_signalless_steps``)."""
        self._bar = None
        self._saved_step: Optional[int] = None
        """The step of the last checkpoint this trainer wrote (a best validation re-uses it)."""
        self._pending: Optional[Dict[str, float]] = {}
        """The metrics of the last finished step while its validation, log line and checkpoints are
        still to come (``{}`` at step 0: the first validation); None once they are done."""
        self._finished: dict = {}
        """What the last finished step left: data position, RNG states, counters, ``_pending``
        (``_mark_finished``); an interrupted step is rewound to it before a checkpoint is written."""
        self._weights_moved = False
        """Whether an optimizer update has touched the weights since the last finished step: such
        weights are never saved as a finished step."""
        self._signals = StopSignals(say=_stderr_line if self.rank == 0 else (lambda line: None))
        self.logger = MetricsLogger(self.run_dir, cfg.trainer.tensorboard, cfg.trainer.wandb_project,
                                    to_dict(cfg), enabled=self.rank == 0)
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
            if self._skipped_rows:
                self.logger.event(0, "data", f"skipped {self._skipped_rows} malformed training rows")
        if self.memory_note:
            self.logger.event(0, "memory_plan", self.memory_note)
        self._say_model_notices()
        if resume:
            self.resume()

    # ------------------------------------------------------------------ set-up helpers
    def _load_data(self) -> None:
        cfg = self.cfg
        self.train_questions, rep = load_questions(cfg.data.train, skip_malformed=cfg.data.skip_malformed)
        self._skipped_rows = rep.skipped
        self.dev_questions = []
        if cfg.data.dev:
            dev, _ = load_questions(cfg.data.dev, skip_malformed=cfg.data.skip_malformed)
            self.dev_questions = dev[:cfg.data.dev_size]
        self.sampler = QuestionSampler(len(self.train_questions), cfg.trainer.questions_per_step,
                                       cfg.trainer.seed, self.rank, self.world)

    def _build_engine(self):
        cfg = self.cfg
        # One process, one model: an engine that can sample from the very module being trained
        # does. FSDP ranks generate different workloads, which sharded forwards cannot do: there
        # every engine keeps a full inference copy, refreshed after every update.
        offer = None if self.sharded else (self.model, self.tokenizer)
        rollout_cfg = self._engine_rollout_config()
        engine = build_engine(rollout_cfg, cfg.model.path, dtype=cfg.model.dtype, device=str(self.device),
                              trainer_model=offer, lora_rank=cfg.model.lora.rank)
        if cfg.trainer.old_logprobs == "rollout" and resolve_dtype(cfg.model.dtype, self.device) == torch.bfloat16:
            raise ConfigError(ROLLOUT_LOGPROBS_BF16 + f" (model.dtype={cfg.model.dtype} trains in bfloat16 on "
                              f"{self.device.type})")
        if cfg.trainer.old_logprobs == "rollout" and not capabilities_of(engine).trainer_logprobs:
            raise ConfigError(f"trainer.old_logprobs=rollout needs an engine whose sampling log-probs are the "
                              f"trainer's; rollout.engine={cfg.rollout.engine} computes them differently "
                              "(precision, processed logits): use trainer.old_logprobs=recompute")
        return engine

    def _engine_rollout_config(self):
        """``cfg.rollout`` with vLLM's GPU memory share from the memory plan of this GPU when it is left
        empty (``mopd.train.memory_plan.rollout_config_for_gpu``), said on rank 0 before vLLM starts."""
        if self.device.type == "cuda" and self.cfg.rollout.engine == "vllm":
            torch.cuda.empty_cache()   # what loading and sharding left cached is free for vLLM to count
        try:
            rollout_cfg, self.memory_note = rollout_config_for_gpu(self.cfg, self.world, self.device)
        except PlanError as e:
            raise ConfigError(f"rollout.gpu_memory_utilization: {e}") from None
        if self.memory_note and self.rank == 0:
            print(f"mopd: {self.memory_note}", file=sys.stderr, flush=True)
        return rollout_cfg

    def _refresh_engine(self) -> None:
        """The updated weights into the engine, streamed one parameter at a time, then its cache."""
        self.last_sync = refresh_engine(self.engine, self.model, resolve_dtype(self.cfg.model.dtype, self.device))

    # ------------------------------------------------------------------ checkpoints
    def trainer_state(self) -> dict:
        return {"sampler": self.sampler.state_dict(), "scheduler": self.scheduler.state_dict(),
                "bad_steps": self.bad_steps, "signalless_steps": self.signalless_steps,
                "model_path": self.cfg.model.path, "method": self.cfg.method,
                "base_model_weights": ckpt.run_base_model_weights(self.run_dir),
                "lora": asdict(self.cfg.model.lora) if self.cfg.model.lora.enabled else None,
                # a step whose validation or log line was cut off: --resume does them first
                "pending": None if self._pending is None else {k: float(v) for k, v in self._pending.items()}}

    def save(self) -> Path:
        previous = ckpt.list_checkpoints(self.run_dir)
        try:
            path = ckpt.save_checkpoint(self.run_dir, self.step, self.model, self.optimizer, self.trainer_state(),
                                        keep=self.cfg.trainer.keep_checkpoints)
        except (OSError, RuntimeError, CheckpointException, KeyboardInterrupt) as e:   # DCP wraps a rank's error
            if _is_interrupt(e):
                # a second Ctrl-C (DCP wraps its KeyboardInterrupt): the partial save was removed
                # and the older checkpoints were not touched
                kept = (f"the previous checkpoint {previous[-1].name} is intact" if previous else
                        "no checkpoint of this run exists yet")
                raise Interrupted(f"stopped while checkpoint step {self.step} was written; {kept}") from None
            need = _dir_bytes(previous[-1]) if previous else checkpoint_bytes(self.cfg.model.path)
            if not is_out_of_space(e, self.run_dir, need):
                raise
            raise TrainingError(no_space_message(self.run_dir, need, previous[-1].name if previous else None)
                                ) from None
        self._saved_step = self.step
        self.logger.event(self.step, "checkpoint", f"saved {path}")
        return path

    def _keep_if_best(self, val: Dict[str, float]) -> None:
        """A validation better than every earlier one saves this step (unless just saved) and marks it
        as the best checkpoint, which retention keeps beside the last ``keep_checkpoints``."""
        v = val.get("val/em")
        if v is None or not self.cfg.trainer.checkpoint_every or not ckpt.is_new_best(self.run_dir, v):
            return
        problem = ckpt.best_problem(self.run_dir)
        if problem:   # counted as no best: this validation's checkpoint becomes the best
            line = f"{problem}: treated as no best-validation checkpoint; step {self.step} replaces it"
            self.logger.event(self.step, "checkpoint_best", line)
            self._say(line)
        if self._saved_step != self.step:
            self.save()
        ckpt.mark_best(self.run_dir, self.step, "val/em", v)
        keep = self.cfg.trainer.keep_checkpoints
        message = (f"val/em {v:.4f} is the best validation so far: checkpoint step {self.step} is kept "
                   f"beside the last {keep} (`mopd export RUN --checkpoint best`)")
        self.logger.event(self.step, "checkpoint_best", message, value=v)

    def resume(self) -> Optional[Path]:
        passed = []

        def skipped(p, why):
            passed.append(p)
            self.logger.event(0, "checkpoint_skipped", f"{p} does not verify ({why}); trying an older one")
            self._say(f"checkpoint {p.name} skipped: {why}")

        path, state = ckpt.load_latest(self.run_dir, self.model, self.optimizer, on_skip=skipped)
        if passed:
            self._say(f"resuming from {path.name}, the newest checkpoint that verifies and fits this run")
        if path is None:
            self.logger.event(0, "resume", "no checkpoint found; starting from step 0")
            self._say(f"{self.run_dir} has no checkpoint yet: training from step 0")
            if self.rank == 0:
                truncate_metrics(self.run_dir / "metrics.jsonl", None)
            return None
        self.step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.bad_steps = int(state.get("bad_steps", 0))
        self.signalless_steps = int(state.get("signalless_steps", 0))
        # a checkpoint written while its step's validation or log line was still to come: fit()
        # does them first, and the step's line (if a second Ctrl-C came after it) is written again
        self._pending = state.get("pending")
        self._saved_step = self.step if self._pending is None else None
        self._refresh_engine()
        if self.rank == 0:
            truncate_metrics(self.run_dir / "metrics.jsonl", self.step - (self._pending is not None))
        self.logger.event(self.step, "resume", f"resumed from {path}")
        return path

    # ------------------------------------------------------------------ one step
    def train_step(self) -> Dict[str, float]:
        """One step: rollout, scoring and advantages, PPO updates, engine refresh; returns its metrics.

        A step is dealt when it is done: its questions are taken from the sampler without moving
        the data position, which moves (with the step counter) only once the updates are applied.
        Until the first update nothing of the run's state has changed but the RNGs, so a step cut
        short there (a lost retriever, a signal) is rewound to the last finished one
        (``_save_finished``); from the first update to the end of the step a signal waits
        (``StopSignals.deferred``), so that weights which a step has partly updated are never
        saved as a finished step."""
        cfg, timer = self.cfg, PhaseTimer()
        self._pending = None
        self._mark_finished()
        questions, dealt = self.sampler.peek(self.train_questions)
        with timer("rollout"):
            settings = WorkflowSettings.for_training(cfg, self._step_seed())
            records = self.rollout(questions, settings, attempts=cfg.rollout.group_size)
            judge = self._judge(records)
            self._release_engine()
        with timer("score"):
            step = self.score(records)
            kl = ([kl_penalty(b.old_logp, b.ref_logp, cfg.reward.kl_type) for b in step.batches]
                  if self._kl_in_reward() else None)
            kl_sums = step.per_call_sums(kl) if kl is not None else None
            rewards, advantages = step_advantages(cfg, records, kl_sums, judge)
            step.fill_advantages(advantages)
            signal = self._signal_counts(records, step.batches)
            self._trace(records, step, rewards, advantages)
        with self._signals.deferred():
            with timer("train"):
                losses = self.update(step.batches)
            self.scheduler.step()
            self._refresh_engine()
            self.sampler.commit(dealt)
            self.step += 1
            m = step_metrics(records, rewards, step.batches, losses, timer, self._scoring_passes())
            if getattr(records, "stats", None) is not None:  # engine busy fraction, batch rows, tokens/s
                m.update(records.stats.as_metrics())
            m["lr"] = self.scheduler.get_last_lr()[0]
            m.update(self.last_sync.as_metrics())   # what the weight sync moved into the engine, and how fast
            if judge is not None:
                m["critic/unparsable"] = self.unparsable_verdicts
            m.update(self._check_signal(signal, m))
            self._pending = m    # finished; its validation, log line and checkpoint are to come
            self._mark_finished()
        return m

    def _trace(self, records, step: StepBatches, rewards, advantages) -> None:
        """Every ``trainer.trace_every`` steps (rank 0): a sample of the step's workflows with their
        per-token log-probs and advantages into traces.jsonl (``mopd.train.token_trace``; reads
        only, draws no random number)."""
        every = self.cfg.trainer.trace_every
        if self.rank != 0 or not every or (self.step + 1) % every:
            return

        append_traces(self.run_dir, trace_lines(
            self.step + 1, records, step, role_specs(self.cfg.algo), rewards=rewards, advantages=advantages,
            teacher_roles=self.cfg.opd_roles(), count=self.cfg.trainer.trace_workflows))

    def _mark_finished(self) -> None:
        """Remember the state of the last finished step (cheap: positions, counters, RNG states)."""
        self._finished = {"sampler": self.sampler.state_dict(), "rng": ckpt.rng_state(),
                          "bad_steps": self.bad_steps, "signalless_steps": self.signalless_steps,
                          "pending": self._pending}
        self._weights_moved = False

    def _save_finished(self) -> Optional[Path]:
        """The checkpoint of the last finished step, for a run that stops in the middle of a step:
        the step's questions, RNG draws and counters are rewound (its weights are untouched before
        its first update), then it is saved unless that was already done. None when an update of
        the unfinished step had begun (only a second Ctrl-C stops there): the previous checkpoint
        is then kept as it is."""
        if self._weights_moved:
            return None
        f = self._finished
        if f:
            self.sampler.load_state_dict(f["sampler"])
            ckpt.set_rng_state(f["rng"])
            self.bad_steps, self.signalless_steps, self._pending = f["bad_steps"], f["signalless_steps"], f["pending"]
        if self._saved_step == self.step and self._pending is None:
            return self.run_dir / "checkpoints" / f"step_{self.step:06d}"
        return self.save()

    def _signal_counts(self, records, batches: List[PackedBatch]) -> List[float]:
        """The step's calls and invalid calls per role, its trained tokens and those with a non-zero
        advantage, and the engine-vs-trainer log-prob gap's sum: summed over ranks (every rank then
        decides alike whether the run stops)."""
        parts = [role_call_counts(records), signal_token_counts(batches, role_specs(self.cfg.algo)),
                 logprob_gap_sums(batches) if self.cfg.trainer.old_logprobs == "recompute" else [0.0, 0.0]]
        return all_reduce(counts_tensor(parts, self.device)).cpu().tolist()

    def _check_signal(self, counts: List[float], m: Dict[str, float]) -> Dict[str, float]:
        """The step's invalid-call fractions and log-prob gap as metrics; a step without a learning
        signal is named in one line, and ``trainer.max_signalless_steps`` of them in a row stop the
        run (that line, after a checkpoint)."""
        n = 2 * len(role_names())
        invalid = invalid_fractions(counts[:n])
        out = {f"rollout/invalid_call_frac/{r}": f for r, f in invalid.items()}
        gap, gap_tokens = counts[n + 2:n + 4]
        if gap_tokens:   # the engine's sampling log-probs against the recomputed pi_old
            out["rollout_logprob_gap"] = gap / gap_tokens
        reason = no_signal_reason(counts[n:n + 2], invalid)
        if reason is None:
            self.signalless_steps = 0
            return out
        self.signalless_steps += 1
        line = f"step {self.step}: no learning signal: {reason}; {role_fractions('invalid calls', invalid)}"
        self.logger.event(self.step, "no_signal", line, consecutive=self.signalless_steps)
        limit = self.cfg.trainer.max_signalless_steps
        if not limit or self.signalless_steps < limit:
            self._say(line)
            return out
        self.logger.log(self.step, {**m, **out})
        path = self.save()
        raise TrainingError(f"{line}. Stopped after {self.signalless_steps} such steps in a row (checkpoint "
                            f"{path}): check that the model writes the action format (its chat template, "
                            "model.path), or set trainer.max_signalless_steps=0 to train on")

    def _say_model_notices(self) -> None:
        """What the registered model checks (:mod:`mopd.train.model_checks`) say about this config
        and model (a preset's learning rate made for a far smaller model, say): an event and a line each."""
        for kind, line in model_notices(self.cfg, self.model):
            self.logger.event(self.step, kind, line)
            self._say(line)

    def rollout(self, questions, settings: WorkflowSettings, attempts: int) -> List:
        """Workflow records of ``questions`` under ``settings`` (the engine stays awake)."""
        self.model.eval()
        try:
            with torch.no_grad():
                return self.rollout_fn(self.engine, self.retriever, self.tokenizer, questions, settings,
                                       attempts=attempts, method=self.cfg.method, progress=False)
        finally:
            self.model.train()

    def _release_engine(self) -> None:
        """The engine frees its GPU memory (vLLM: sleep level 2) for scoring and training."""
        release_engine(self.engine, self.model)

    def score(self, records) -> StepBatches:
        """Pack the step's calls and attach pi_old, teacher and reference log-probs to every micro-batch."""
        step = pack_records(records, self.cfg.trainer.micro_batch_tokens, device=self.device,
                            pad_id=self.tokenizer.pad_token_id or 0, agree_count=self._agree_count)
        temp = self.cfg.rollout.temperature
        teacher, reference = self.frozen
        with torch.no_grad():
            for b in step.batches:
                # "rollout": the engine's sampling log-probs, same weights and temperature.
                b.old_logp = b.sampling_logp if self.cfg.trainer.old_logprobs == "rollout" else \
                    self.policy(b, temperature=temp)
                b.teacher_logp = self._score_frozen(teacher, b, temp)
                b.ref_logp = (None if reference is None else b.teacher_logp if reference is teacher
                              else self._score_frozen(reference, b, temp))
        return step

    def _score_frozen(self, model, batch: PackedBatch, temp: float) -> Optional[torch.Tensor]:
        """A frozen model's log-probs on the calls whose roles read them (zeros elsewhere, unread):
        the teacher's for OPD roles, the reference's for KL roles, both when they are one model."""
        if model is None:
            return None
        teacher, reference = self.frozen
        roles = set(self.cfg.opd_roles()) if model is teacher else set()
        roles |= set(self.cfg.reference_roles()) if model is reference else set()
        return score_needed(lambda b: model.logprobs(b, temp), batch, sorted(role_id(r) for r in roles),
                            collective=model.collective)

    def update(self, batches: List[PackedBatch]) -> LossStats:
        """``trainer.ppo_minibatches`` optimizer updates over the micro-batches; each normalised by
        its global trained-token count. A non-finite loss or gradient skips the update."""
        n_mb = max(1, min(self.cfg.trainer.ppo_minibatches, len(batches)))
        stats = LossStats()
        for group in (batches[i::n_mb] for i in range(n_mb)):
            n_tokens = torch.tensor([float(sum(b.loss_tokens for b in group))], device=self.device)
            normalizer = max(float(all_reduce(n_tokens).item()), 1.0)
            loss_sum = torch.zeros((), device=self.device)
            for batch in group:
                loss, mb_stats = self.policy(batch, self.loss, normalizer=normalizer)
                loss.backward()
                loss_sum = loss_sum + loss.detach()
                stats.add_micro_batch(mb_stats)
            loss_sum = all_reduce(loss_sum.clone())
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.trainer.grad_clip)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            applied = bool(torch.isfinite(loss_sum)) and bool(torch.isfinite(grad_norm))
            if applied:
                self._weights_moved = True    # before: a cut optimizer step leaves weights half-updated
                self.optimizer.step()
                self.bad_steps = 0
            else:
                self._skip_update(float(loss_sum), float(grad_norm))
            self.optimizer.zero_grad(set_to_none=True)
            stats.add_update(float(loss_sum), float(grad_norm), applied)
        return stats

    def _skip_update(self, loss: float, grad_norm: float) -> None:
        self.bad_steps += 1
        self.logger.event(self.step, "nonfinite", f"skipped an update: loss {loss}, grad norm {grad_norm}",
                          consecutive=self.bad_steps)
        if self.bad_steps >= self.cfg.trainer.max_bad_steps:
            self.optimizer.zero_grad(set_to_none=True)
            bad, at = self.bad_steps, self.step + 1
            path = self._save_finished()   # the last finished step's, this one's questions dealt again
            kept = f"checkpoint {path}" if path is not None else \
                f"an update of step {at} was applied before, so it is not saved: {self._kept_line()}"
            raise TrainingError(f"{bad} non-finite updates in a row in step {at}; stopped ({kept}). "
                                "Lower trainer.lr or check the data.")

    def _judge(self, records) -> Optional[Dict]:
        """The prompted critic's verdicts on every Searcher report (the current policy judges), when a
        role's reward needs them."""
        if not any(r.needs_judge for r in role_reward_objects(self.cfg.reward).values()):
            return None

        scores, self.unparsable_verdicts = judge_reports(self.engine, self.tokenizer, judge_items(records),
                                                          seed=self._step_seed())
        return verdicts_by_call(scores)

    def _kl_in_reward(self) -> bool:
        return self.cfg.reward.kl_coef > 0 and bool(self.cfg.reward.kl_roles)

    def _scoring_passes(self) -> int:
        return (self.cfg.trainer.old_logprobs == "recompute") + sum(m is not None for m in set(self.frozen))

    def _agree_count(self, n: int) -> int:
        """Micro-batches every rank runs: the most any rank has (FSDP's collectives must match)."""
        if not dist.is_initialized():
            return n
        return int(all_reduce(torch.tensor([n], device=self.device), dist.ReduceOp.MAX).item())

    def _step_seed(self) -> int:
        return (self.cfg.rollout.seed * 1_000_003 + self.step * 7919 + self.rank * 104_729) % (2 ** 31)

    # ------------------------------------------------------------------ validation and the loop
    def validate(self) -> Dict[str, float]:
        """``trainer.val_attempts`` workflows per dev question with the evaluation protocol
        (``cfg.eval``), scored by the evaluation code; ranks split the questions and add their counts."""
        if not self.dev_questions:
            return {}
        settings = WorkflowSettings.for_evaluation(self.cfg, seed=VALIDATION_SEED + self.step)
        records = self.rollout(self.dev_questions[self.rank::self.world], settings,
                               attempts=self.cfg.trainer.val_attempts)
        val = validation_counts(records)
        counts = all_reduce(counts_tensor([val, role_call_counts(records)], self.device)).cpu().tolist()
        m = validation_metrics(counts[:len(val)])
        invalid = invalid_fractions(counts[len(val):])
        valid = {r: 1.0 - f for r, f in invalid.items()}
        m.update({f"val/valid_call_frac/{r}": v for r, v in valid.items()})
        if all_invalid(invalid):
            line = f"validation at step {self.step}: {ALL_INVALID}; {role_fractions('invalid calls', invalid)}"
            self.logger.event(self.step, "no_signal", line)
        else:
            line = f"validation at step {self.step}: val/em {m['val/em']:.4f}; {role_fractions('valid calls', valid)}"
        self._say(line)
        return m

    def fit(self, steps: Optional[int] = None) -> Dict[str, float]:
        """Train until ``steps`` (default trainer.steps); checkpoints, validation, logs, plots.

        A lost retriever, Ctrl-C or SIGTERM stops the run with the checkpoint of the last
        finished step (``_save_finished``), so that ``--resume`` repeats exactly what the
        uninterrupted run does. A signal after a step's first update waits until that step is
        finished (one line says so), then stops the same way; a second Ctrl-C stops at once and
        keeps the previous checkpoint. A signal or a lost retriever during a validation saves the
        finished step with its validation still to run, which ``--resume`` runs first."""
        cfg = self.cfg.trainer
        target = steps if steps is not None else cfg.steps
        if self.step > target:
            # resuming a longer run with fewer steps would export the longer run's weights as if
            # they were the shorter one's
            raise TrainingError(f"{self.run_dir} is at step {self.step}, past trainer.steps={target}: it cannot "
                                "be shortened; train into a new out_dir, or ask for at least that many steps")
        last: Dict[str, float] = {}
        bar = self._bar = self._progress_bar(target)
        stop: Optional[BaseException] = None
        try:
            with self._signals:
                self._mark_finished()
                if self._pending is not None:   # the first validation, or one a resume still owes
                    last = self._finish_step(self._pending, target, bar)
                while self.step < target:
                    last = self._finish_step(self.train_step(), target, bar)
                with self._signals.deferred():
                    if self._saved_step != self.step:   # not when this step's checkpoint exists
                        self.save()
        except Interrupted:
            raise    # a second Ctrl-C while a checkpoint was written: said, and nothing more to save
        except KeyboardInterrupt as e:
            stop = e
        except _retriever_errors() as e:
            stop = e
        finally:
            if bar is not None:
                bar.close()
            self._bar = None
        if stop is not None:
            self._stop(stop, target)
        if self.rank == 0:
            plot_training(self.run_dir)
        return last

    def _stop(self, cause: BaseException, target: int) -> None:
        """Save the last finished step (when the weights are still its own) and raise the line
        that says what was kept: ``Interrupted`` after a signal, ``TrainingError`` after a lost
        retriever. Runs outside the signal handlers: a second Ctrl-C during the save is said by
        ``save`` (the previous checkpoint stays intact)."""
        at = self.step
        if isinstance(cause, KeyboardInterrupt):
            self.logger.event(self.step, "interrupt", f"interrupted ({cause}): writing a checkpoint")
        path = self._save_finished()
        if self.rank == 0:
            plot_training(self.run_dir)
        if path is None:
            kept = (f"step {at + 1} had applied an update, which is not saved; {self._kept_line()}; "
                    "resume with --resume")
        else:
            owed = (", its validation still to run" if self._pending is not None and self.dev_questions
                    and self._validation_due(target) else "")
            kept = f"checkpoint {path} holds step {self.step}, the last finished one{owed}; resume with --resume"
        if isinstance(cause, KeyboardInterrupt):
            raise Interrupted(kept) from None
        raise TrainingError(f"the retriever is unreachable ({cause}); stopped at step {self.step}: {kept} once "
                            "the server is back") from None

    def _validation_due(self, target: int) -> bool:
        """Whether the finished step validates: every ``trainer.val_every`` steps and the last, and
        step 0 when there are dev questions (``validate`` gives nothing without them)."""
        every = self.cfg.trainer.val_every
        return bool(every) and (self.step % every == 0 or self.step == target) and \
            (self.step > 0 or bool(self.dev_questions))

    def _kept_line(self) -> str:
        found = ckpt.list_checkpoints(self.run_dir)
        return f"the last checkpoint, {found[-1]}, is kept" if found else "no checkpoint was written"

    def _finish_step(self, m: Dict[str, float], target: int, bar) -> Dict[str, float]:
        """What follows a finished step (``m``, its metrics; step 0: the first validation): its
        validation, where a signal or a lost retriever stops the run with this step saved and the
        validation owed; then, uncut by signals, its log line, its periodic and best checkpoints."""
        cfg = self.cfg.trainer
        val: Dict[str, float] = {}
        if self.step == 0:
            if self._validation_due(target):
                val = self.validate()
            with self._signals.deferred():
                if val:
                    self.logger.log(0, val)
                self._pending = None
                self._mark_finished()
            return {}
        if self._validation_due(target):
            val = self.validate()
        with self._signals.deferred():
            m = {**m, **val}
            if self.step % cfg.log_every == 0 or self.step == target:
                self.logger.log(self.step, m)
            self._pending = None
            if bar is not None:
                bar.update(1)
                bar.set_postfix({k.split("/")[-1]: f"{m[k]:.3g}" for k in
                                 ("rollout/em", "val/em", "rollout/search_per_workflow") if k in m})
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 and self.step < target:
                self.save()
            self._keep_if_best(val)
            self._mark_finished()
        return m

    def _progress_bar(self, target: int):
        if not self.progress:
            return None

        return tqdm(total=target, initial=self.step, desc=f"train {self.cfg.method}", unit="step",
                    dynamic_ncols=True)

    def export(self, out_dir, which: str = "last", adapter: bool = False) -> Path:
        """A Hugging Face model directory (how Stage I becomes the teacher) of the current weights
        ("last") or of the best-validation checkpoint ("best", the paper's model selection; the
        current weights when no validation marked one). "best" loads those weights into the model:
        call it when training is over. A LoRA run writes its adapter merged into the base, or the
        adapter alone with ``adapter`` (:mod:`mopd.train.export`)."""
        if which not in ("last", "best"):
            raise ValueError(f"export {which!r}: choose last or best")
        try:
            if self.rank == 0:   # before the check: the target may be what an interrupted export left
                for line in repair_export(out_dir):
                    self._say(line)
            ckpt.barrier()
            check_export_target(out_dir, self.run_dir, flag="--export")
        except ExportTargetError as e:
            raise TrainingError(str(e)) from None
        best = ckpt.read_best(self.run_dir) if which == "best" else None
        if which == "best" and best is None and ckpt.best_problem(self.run_dir):
            self._say(f"{ckpt.best_problem(self.run_dir)}: treated as no best-validation checkpoint; exporting "
                      "the current weights")
        step, source = self.step, "the current weights"
        if best is not None and best["step"] != self.step:
            step, source = best["step"], str(ckpt.best_checkpoint(self.run_dir).resolve())
            ckpt.load_model_weights(ckpt.best_checkpoint(self.run_dir), self.model)
        lora = self.cfg.model.lora if self.cfg.model.lora.enabled else None
        try:
            return export_weights(self.model, self.tokenizer, out_dir, marker(self.run_dir, source, step), lora=lora,
                                  base_path=self.cfg.model.path, adapter=adapter)
        except ckpt.CheckpointError as e:
            raise TrainingError(str(e)) from None

    def _say(self, line: str) -> None:
        """One line on the terminal (stderr, rank 0), beside the event the logs keep."""
        if self.rank != 0:
            return
        if self._bar is not None:   # above the progress bar, which redraws below
            self._bar.write(f"mopd: {line}", file=sys.stderr)
        else:
            print(f"mopd: {line}", file=sys.stderr, flush=True)

    def close(self, *, failed: bool = False) -> None:
        """Close the logs and the engine and, when this trainer started the process group, leave
        it, the engine closed first: after a barrier on a clean close (``failed=False``, on every
        rank), without one after a failure (a failed rank must not wait for peers that may never
        come). A process that ran a
        multi-rank CPU group should then end through ``distributed.end_process``
        (``mopd train`` does): see that module for the exit race it avoids."""
        self.logger.close()
        # The engine goes first, while the group lives: vLLM (under torchrun, on the trainer's group)
        # destroys the groups it built on the default one, which fails once that is gone.
        if self._owns_process_group and dist.is_initialized():
            leave_process_group(wait_for_peers=not failed, before_destroy=self._close_engine)
            self._owns_process_group = False
        else:
            self._close_engine()

    def _close_engine(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()


def _loss_head(cfg: Config):
    """The fused PPO/OPD loss with this run's hyperparameters (role specs, clip, temperature). A
    training run is a long job: the compiled CPU row pass is worth its first-call compilation
    (``MOPD_KERNELS_COMPILE=0`` keeps the eager one)."""
    set_compiled_cpu_rows(True)
    return FusedLinearPolicyLoss(PolicyLossSettings(
        role_specs=tuple(role_specs(cfg.algo)), clip_low=cfg.algo.clip_low, clip_high=cfg.algo.clip_high,
        dual_clip=cfg.algo.dual_clip, temperature=cfg.rollout.temperature))


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _is_interrupt(e: BaseException) -> bool:
    """A KeyboardInterrupt, or DCP's CheckpointException around one (on any rank)."""
    if isinstance(e, KeyboardInterrupt):
        return True
    failures = getattr(e, "failures", None) if isinstance(e, CheckpointException) else None
    return any(isinstance(f[0], KeyboardInterrupt) for f in (failures or {}).values()
               if isinstance(f, tuple) and f)


def _stderr_line(line: str) -> None:
    """One line on stderr from a signal handler (os.write: a handler may run inside a print)."""
    os.write(2, (line + "\n").encode())


def _retriever_errors():
    return (RetrieverUnavailable,)
