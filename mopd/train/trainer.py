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
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from mopd_kernels.kl import kl_penalty
from tqdm import tqdm

from mopd.algo.advantages import role_specs, step_advantages
from mopd.algo.critic import judge_items, judge_reports, verdicts_by_call
from mopd.algo.rewards import role_reward_objects
from mopd.config import Config, to_dict, to_yaml
from mopd.core.errors import Interrupted
from mopd.core.roles import role_id
from mopd.core.run_models import RunModels
from mopd.retriever import RetrieverUnavailable, load_retriever
from mopd.rollout.async_scheduler import run_rollout
from mopd.rollout.chat import check_chat_template
from mopd.rollout.context import fit_context
from mopd.rollout.run_state import WorkflowSettings
from mopd.train.checkpointer import Checkpointer
from mopd.train.engine_setup import build_trainer_engine
from mopd.train.errors import TrainingError
from mopd.train.signal_check import SignalCheck
from mopd.train.validator import Validator
from mopd.train.distributed import all_reduce, init_distributed, leave_process_group, rank_and_world
from mopd.train.metrics_log import MetricsLogger, plot_training
from mopd.train.model_checks import model_notices
from mopd.train.model import (PackedCausalLM, load_causal_lm, policy_dtype, policy_loss_head, resolve_dtype,
                              shard_model)
from mopd.train.packing import PackedBatch
from mopd.train.interrupts import StopSignals
from mopd.train.memory_plan import shard_frozen_models
from mopd.train.optimizer import build_adamw, describe as describe_optimizer
from mopd.train.partial_scoring import score_needed
from mopd.train.sampler import QuestionSampler, training_questions
from mopd.train.step_batches import StepBatches, pack_records
from mopd.train.step_metrics import LossStats, PhaseTimer, step_metrics
from mopd.train.teacher import attach_adapters, load_frozen_models
from mopd.train.token_trace import append_traces, trace_lines
from mopd.train.weight_sync import refresh_engine, release_engine

log = logging.getLogger(__name__)

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
        self.models = RunModels.from_config(cfg)
        """The base, the adapters, and which frozen model is a view of the base (the one place that knows)."""
        self.model, self.tokenizer = load_causal_lm(
            cfg.model.path, dtype=policy_dtype(cfg.model.dtype, self.device, self.sharded,
                                               frozen_base=self.models.trains_adapters),
            device=self.device, attn=cfg.model.attn_implementation, use_liger=cfg.model.use_liger)
        attach_adapters(self.models, self.model)   # LoRA: the student's adapter and the frozen ones over this base

        check_chat_template(self.tokenizer, cfg.model.chat_template_kwargs, name=cfg.model.path)
        self.model.train()
        self.policy = PackedCausalLM(self.model)
        if self.sharded:
            shard_model(self.model, self.device, activation_checkpointing=cfg.model.activation_checkpointing,
                        root=self.policy)
        elif cfg.model.activation_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.loss = policy_loss_head(cfg)

        # Replicated in bf16 on every GPU when the memory plan fits that way (no all-gathers while scoring).
        self.frozen_sharded = self.sharded and shard_frozen_models(cfg, self.world)
        self.frozen = load_frozen_models(cfg, student_tokenizer=self.tokenizer, device=self.device,
                                         shard=self.frozen_sharded, policy=self.policy, models=self.models)
        # every parameter in full fine-tuning; the adapters alone with LoRA (the base is frozen)
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        # fused where torch has it (mopd.train.optimizer): chosen once, kept across a resume
        self.optimizer = build_adamw(trainable, lr=cfg.trainer.lr, weight_decay=cfg.trainer.weight_decay)
        warm = cfg.trainer.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm > 0 else 1.0)

        self.engine, self.memory_note = build_trainer_engine(
            cfg, device=self.device, world=self.world, rank=self.rank,
            offer=None if self.sharded else (self.model, self.tokenizer), lora_rank=self.models.lora_rank)
        if retriever is None:
            retriever = load_retriever(cfg.retriever)
        self.retriever = retriever
        self.rollout_fn = run_rollout if rollout_fn is None else rollout_fn
        """``run_workflows``-compatible: (engine, retriever, tokenizer, questions, settings, *,
        attempts, method, progress) -> records (with ``.stats``, a RolloutStats, when it has them);
        default: the asynchronous scheduler where it is the faster one (vLLM), else lock-step."""

        self.train_questions, self.dev_questions, skipped = training_questions(cfg.data)
        self.sampler = QuestionSampler(len(self.train_questions), cfg.trainer.questions_per_step,
                                       cfg.trainer.seed, self.rank, self.world)
        self.step = 0
        self.bad_steps = 0
        self.signalless_steps = 0
        """Steps in a row without a learning signal (``trainer.max_signalless_steps``)."""
        self._bar = None
        self.checkpoints = Checkpointer(self, say=self._say)
        """Saves, resumes, keeps the best, rewinds an interrupted step (:mod:`mopd.train.checkpointer`)."""
        self.validator = Validator(self, say=self._say)
        self.signal = SignalCheck(self, say=self._say)
        self._signals = StopSignals(say=_stderr_line if self.rank == 0 else (lambda line: None))
        self.logger = MetricsLogger(self.run_dir, cfg.trainer.tensorboard, cfg.trainer.wandb_project,
                                    to_dict(cfg), enabled=self.rank == 0)
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
            if skipped:
                self.logger.event(0, "data", f"skipped {skipped} malformed training rows")
        if self.memory_note:
            self.logger.event(0, "memory_plan", self.memory_note)
        self.logger.event(0, "optimizer", describe_optimizer(self.optimizer))
        self._say_model_notices()
        if resume:
            self.resume()

    def refresh_engine(self) -> None:
        """The updated weights into the engine, streamed one parameter at a time, then its cache."""
        dtype = resolve_dtype(self.cfg.model.dtype, self.device)
        self.last_sync = refresh_engine(self.engine, self.model, dtype)

    # ------------------------------------------------------------------ checkpoints (mopd.train.checkpointer)
    def save(self) -> Path:
        """Checkpoint the current step (:meth:`Checkpointer.save`)."""
        return self.checkpoints.save()

    def resume(self) -> Optional[Path]:
        """Continue from the run's newest usable checkpoint (:meth:`Checkpointer.resume`)."""
        return self.checkpoints.resume()

    def export(self, out_dir, which: str = "last", adapter: bool = False) -> Path:
        """A Hugging Face model (or a LoRA run's adapter) of this run (:meth:`Checkpointer.export`)."""
        return self.checkpoints.export(out_dir, which, adapter)

    # ------------------------------------------------------------------ one step
    def train_step(self) -> Dict[str, float]:
        """One step: rollout, scoring and advantages, PPO updates, engine refresh; returns its metrics.

        A step is dealt when it is done: its questions are taken from the sampler without moving
        the data position, which moves (with the step counter) only once the updates are applied.
        Until the first update nothing of the run's state has changed but the RNGs, so a step cut
        short there (a lost retriever, a signal) is rewound to the last finished one
        (``Checkpointer.save_finished``); from the first update to the end of the step a signal waits
        (``StopSignals.deferred``), so that weights which a step has partly updated are never
        saved as a finished step."""
        cfg, timer = self.cfg, PhaseTimer()
        self.checkpoints.pending = None
        self.checkpoints.mark_finished()
        questions, dealt = self.sampler.peek(self.train_questions)
        with timer("rollout"):
            settings = WorkflowSettings.for_training(cfg, self._step_seed())
            records = self.rollout(questions, settings, attempts=cfg.rollout.group_size)
            judge, unparsable = self._judge(records)
            self._release_engine()
        with timer("score"):
            step = self.score(records)
            kl = ([kl_penalty(b.old_logp, b.ref_logp, cfg.reward.kl_type) for b in step.batches]
                  if self._kl_in_reward() else None)
            kl_sums = step.per_call_sums(kl) if kl is not None else None
            rewards, advantages = step_advantages(cfg, records, kl_sums, judge)
            step.fill_advantages(advantages)
            signal = self.signal.counts(records, step.batches)
            self._trace(records, step, rewards, advantages)
        with self._signals.deferred():
            with timer("train"):
                losses = self.update(step.batches)
            self.scheduler.step()
            self.refresh_engine()
            self.sampler.commit(dealt)
            self.step += 1
            m = step_metrics(records, rewards, step.batches, losses, timer, self._scoring_passes())
            if getattr(records, "stats", None) is not None:  # engine busy fraction, batch rows, tokens/s
                m.update(records.stats.as_metrics())
            m["lr"] = self.scheduler.get_last_lr()[0]
            m.update(self.last_sync.as_metrics())   # what the weight sync moved into the engine, and how fast
            if judge is not None:
                m["critic/unparsable"] = unparsable
            m.update(self.signal.check(signal, m))
            self.checkpoints.pending = m    # finished; its validation, log line and checkpoint are to come
            self.checkpoints.mark_finished()
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
                # before: a cut optimizer step leaves weights half-updated
                self.checkpoints.weights_moved = True
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
            # the last finished step's checkpoint, this one's questions dealt again
            path = self.checkpoints.save_finished()
            kept = f"checkpoint {path}" if path is not None else \
                f"an update of step {at} was applied before, so it is not saved: {self.checkpoints.kept_line()}"
            raise TrainingError(f"{bad} non-finite updates in a row in step {at}; stopped ({kept}). "
                                "Lower trainer.lr or check the data.")

    def _judge(self, records):
        """``(verdicts, unparsable count)`` of the prompted critic on every Searcher report (the
        current policy judges), when a role's reward needs them; ``(None, 0)`` otherwise."""
        if not any(r.needs_judge for r in role_reward_objects(self.cfg.reward).values()):
            return None, 0

        scores, unparsable = judge_reports(self.engine, self.tokenizer, judge_items(records),
                                           seed=self._step_seed())
        return verdicts_by_call(scores), unparsable

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
        """The dev questions' metrics now (:class:`mopd.train.validator.Validator`)."""
        return self.validator.validate()

    def fit(self, steps: Optional[int] = None) -> Dict[str, float]:
        """Train until ``steps`` (default trainer.steps); checkpoints, validation, logs, plots.

        A lost retriever, Ctrl-C or SIGTERM stops the run with the checkpoint of the last
        finished step (``Checkpointer.save_finished``), so that ``--resume`` repeats exactly what the
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
                self.checkpoints.mark_finished()
                if self.checkpoints.pending is not None:   # the first validation, or one a resume still owes
                    last = self._finish_step(self.checkpoints.pending, target, bar)
                while self.step < target:
                    last = self._finish_step(self.train_step(), target, bar)
                with self._signals.deferred():
                    if self.checkpoints.saved_step != self.step:   # not when this step's checkpoint exists
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
        if stop is not None:   # the last finished step saved, and one line saying what was kept
            self.checkpoints.stop(stop, validation_owed=lambda: bool(self.dev_questions)
                                  and self.validator.due(target))
        if self.rank == 0:
            plot_training(self.run_dir)
        return last

    def _finish_step(self, m: Dict[str, float], target: int, bar) -> Dict[str, float]:
        """What follows a finished step (``m``, its metrics; step 0: the first validation): its
        validation, where a signal or a lost retriever stops the run with this step saved and the
        validation owed; then, uncut by signals, its log line, its periodic and best checkpoints."""
        cfg = self.cfg.trainer
        val: Dict[str, float] = {}
        if self.step == 0:
            if self.validator.due(target):
                val = self.validate()
            with self._signals.deferred():
                if val:
                    self.logger.log(0, val)
                self.checkpoints.pending = None
                self.checkpoints.mark_finished()
            return {}
        if self.validator.due(target):
            val = self.validate()
        with self._signals.deferred():
            m = {**m, **val}
            if self.step % cfg.log_every == 0 or self.step == target:
                self.logger.log(self.step, m)
            self.checkpoints.pending = None
            if bar is not None:
                bar.update(1)
                bar.set_postfix({k.split("/")[-1]: f"{m[k]:.3g}" for k in
                                 ("rollout/em", "val/em", "rollout/search_per_workflow") if k in m})
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 and self.step < target:
                self.save()
            self.checkpoints.keep_if_best(val)
            self.checkpoints.mark_finished()
        return m

    def _progress_bar(self, target: int):
        if not self.progress:
            return None

        return tqdm(total=target, initial=self.step, desc=f"train {self.cfg.method}", unit="step",
                    dynamic_ncols=True)

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


def _stderr_line(line: str) -> None:
    """One line on stderr from a signal handler (os.write: a handler may run inside a print)."""
    os.write(2, (line + "\n").encode())


def _retriever_errors():
    return (RetrieverUnavailable,)
