"""The policy trainer: rollout -> rewards -> packing -> scoring -> advantages -> PPO -> sync.

One class holds the run's state (model, optimizer, engine, teacher, data position, step). It
runs as one process on CPU for smoke runs and under ``torchrun`` with FSDP2 on GPUs. Each rank
rolls out its share of the step's questions (all G trajectories of a question stay on one rank,
so group normalisation is local); the loss normaliser is the global number of trained tokens of
the mini-batch (all-reduced), as DESIGN §4 asks.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

from mopd.algo.advantages import call_token_signals, role_specs
from mopd.algo.diagnostics import batch_diagnostics
from mopd.config import Config, to_dict, to_yaml
from mopd.core.roles import ROLE_IDS, ROLES
from mopd.train import checkpoint as ckpt
from mopd.train.metrics_log import MetricsLogger, plot_training
from mopd.train.model import PackedCausalLM, load_causal_lm, resolve_dtype, shard_model
from mopd.train.packing import PackedBatch, build_packed_batch, pack_sequences, padding_fraction
from mopd.train.sampler import QuestionSampler
from mopd.train.signals import CallRef, compute_advantages, fill_advantages

log = logging.getLogger(__name__)


class TrainingError(RuntimeError):
    """The run cannot go on (repeated non-finite updates, lost retriever, ...); a checkpoint was written."""


def _dist_info():
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed() -> None:
    """Join the torchrun process group when launched by torchrun (gloo on CPU, NCCL on CUDA)."""
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)


def _all_reduce(x: torch.Tensor, op=None) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(x, op=op or dist.ReduceOp.SUM)
    return x


class PolicyTrainer:
    """Trains the shared policy with the method named by ``cfg`` (a preset plus overrides)."""

    def __init__(self, cfg: Config, *, retriever=None, resume: bool = False, progress: bool = True,
                 rollout_fn=None):
        cfg.check_trainable()
        init_distributed()
        self.cfg = cfg
        self.rank, self.world = _dist_info()
        self.device = torch.device(f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu")
        self.run_dir = Path(cfg.trainer.out_dir)
        self.progress = progress and self.rank == 0
        torch.manual_seed(cfg.trainer.seed + self.rank)
        if self.device.type == "cpu" and cfg.trainer.cpu_threads:
            torch.set_num_threads(cfg.trainer.cpu_threads)

        dtype = resolve_dtype(cfg.model.dtype, self.device)
        self.model, self.tokenizer = load_causal_lm(cfg.model.path, dtype=dtype, device=self.device,
                                                    attn=cfg.model.attn_implementation, use_liger=cfg.model.use_liger)
        self.model.train()
        self.policy = PackedCausalLM(self.model)
        self.sharded = self.world > 1
        if self.sharded:
            shard_model(self.model, self.device, activation_checkpointing=cfg.model.activation_checkpointing,
                        root=self.policy)
        elif cfg.model.activation_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.specs = role_specs(cfg.algo)
        self.teacher = None
        if cfg.teacher_roles():
            from mopd.train.teacher import Teacher

            self.teacher = Teacher(cfg.teacher.path, student_tokenizer=self.tokenizer, device=self.device,
                                   dtype=cfg.model.dtype, attn=cfg.model.attn_implementation, shard=self.sharded,
                                   cpu_offload=cfg.teacher.cpu_offload)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.trainer.lr,
                                           weight_decay=cfg.trainer.weight_decay, betas=(0.9, 0.999))
        warm = cfg.trainer.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm > 0 else 1.0)

        self.engine = self._build_engine()
        if retriever is None:
            from mopd.retriever import load_retriever

            retriever = load_retriever(cfg.retriever)
        self.retriever = retriever
        self._rollout_fn = rollout_fn

        from mopd.core.qa import load_questions

        self.train_questions, rep = load_questions(cfg.data.train, skip_malformed=cfg.data.skip_malformed)
        self.dev_questions = []
        if cfg.data.dev:
            self.dev_questions = load_questions(cfg.data.dev, skip_malformed=cfg.data.skip_malformed)[0][
                :cfg.data.dev_size]
        self.sampler = QuestionSampler(len(self.train_questions), cfg.trainer.questions_per_step,
                                       cfg.trainer.seed, self.rank, self.world)
        self.step = 0
        self.bad_steps = 0
        self.logger = MetricsLogger(self.run_dir, cfg.trainer.tensorboard, cfg.trainer.wandb_project,
                                    to_dict(cfg), enabled=self.rank == 0)
        if self.rank == 0:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
            if rep.skipped:
                self.logger.event(0, "data", f"skipped {rep.skipped} malformed training rows")
        if resume:
            self.resume()

    # ------------------------------------------------------------------ set-up helpers
    def _build_engine(self):
        from mopd.rollout.engine import build_engine

        cfg = self.cfg
        if cfg.rollout.engine == "hf" and not self.sharded:
            # One process, one model: the engine samples from the very module being trained.
            return build_engine(cfg.rollout, self.model, self.tokenizer)
        if cfg.rollout.engine == "hf":
            # FSDP ranks generate different workloads, which sharded forwards cannot do: each rank
            # keeps a full inference copy, refreshed after every update.
            return build_engine(cfg.rollout, cfg.model.path, dtype=cfg.model.dtype, device=str(self.device))
        return build_engine(cfg.rollout, cfg.model.path, dtype=cfg.model.dtype)

    def _sync_engine_weights(self) -> None:
        if getattr(self.engine, "model", None) is self.model:
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        self.engine.load_weights(sd.items())

    # ------------------------------------------------------------------ checkpoints
    def trainer_state(self) -> dict:
        return {"sampler": self.sampler.state_dict(), "scheduler": self.scheduler.state_dict(),
                "bad_steps": self.bad_steps, "model_path": self.cfg.model.path, "method": self.cfg.method}

    def save(self) -> Path:
        path = ckpt.save_checkpoint(self.run_dir, self.step, self.model, self.optimizer, self.trainer_state(),
                                    keep=self.cfg.trainer.keep_checkpoints)
        self.logger.event(self.step, "checkpoint", f"saved {path}")
        return path

    def resume(self) -> Optional[Path]:
        latest = ckpt.latest_checkpoint(self.run_dir)
        if latest is None:
            self.logger.event(0, "resume", "no checkpoint found; starting from step 0")
            return None
        state = ckpt.load_checkpoint(latest, self.model, self.optimizer)
        self.step = int(state["step"])
        self.sampler.load_state_dict(state["sampler"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.bad_steps = int(state.get("bad_steps", 0))
        self._sync_engine_weights()
        if self.rank == 0:
            _truncate_metrics(self.run_dir / "metrics.jsonl", self.step)
        self.logger.event(self.step, "resume", f"resumed from {latest}")
        return latest

    # ------------------------------------------------------------------ one step
    def _rollout(self, questions, *, step_seed: int, attempts: int, candidates: int, temperature: float,
                 top_p: float):
        from mopd.rollout.scheduler import run_workflows

        fn = self._rollout_fn or run_workflows
        return fn(self.engine, self.retriever, self.tokenizer, questions, workflow=self.cfg.rollout.workflow,
                  attempts=attempts, rollout_cfg=self.cfg.rollout, answer_candidates=candidates,
                  temperature=temperature, top_p=top_p, seed=step_seed, method=self.cfg.method, progress=False,
                  topk=self.cfg.retriever.topk)

    def _pack(self, records) -> tuple:
        refs = [CallRef(i, c) for i, rec in enumerate(records) for c in rec.calls if len(c) > 1]
        plan = pack_sequences([len(r.call) for r in refs], self.cfg.trainer.micro_batch_tokens)[0]
        n_local = torch.tensor([len(plan)], device=self.device)
        n_global = int(_all_reduce(n_local, dist.ReduceOp.MAX if dist.is_initialized() else None).item())
        plan = plan + [[] for _ in range(n_global - len(plan))]
        pad_id = self.tokenizer.pad_token_id or 0
        batches: List[PackedBatch] = []
        for b, members in enumerate(plan):
            toks, roles, advs, lps = [], [], [], []
            for s, idx in enumerate(members):
                r = refs[idx]
                r.batch, r.seq = b, s
                rl, _ = call_token_signals(r.call, 0.0)
                toks.append(r.call.token_ids())
                roles.append(rl)
                advs.append([0.0] * len(rl))
                lps.append(r.call.sampling_logprobs())
            pad = 8 if self.device.type == "cuda" else 1
            batches.append(build_packed_batch(toks, roles, advs, lps, items=members, pad_to_multiple=pad,
                                              pad_id=pad_id).to(self.device))
        return refs, batches

    def _critic(self, records) -> Optional[Dict]:
        if self.cfg.reward.searcher != "critic":
            return None
        from mopd.algo.critic import JudgeItem, judge_reports

        items = []
        for i, rec in enumerate(records):
            for call in rec.calls_of("searcher"):
                reports = [e.text for e in rec.events if e.kind == "report" and e.call_id == call.call_id]
                items.append(JudgeItem(f"{i}\t{call.call_id}", rec.question, call.parent or rec.question,
                                       reports[-1] if reports else ""))
        scores, bad = judge_reports(self.engine, self.tokenizer, items, seed=self._step_seed())
        self._last_judge_unparsable = bad
        return {(int(k.split("\t")[0]), k.split("\t")[1]): v for k, v in scores.items()}

    def _step_seed(self) -> int:
        return (self.cfg.rollout.seed * 1_000_003 + self.step * 7919 + self.rank * 104_729) % (2 ** 31)

    def train_step(self) -> Dict[str, float]:
        cfg = self.cfg
        t0 = time.perf_counter()
        questions = self.sampler.take(self.train_questions)
        self.model.eval()
        records = self._rollout(questions, step_seed=self._step_seed(), attempts=cfg.rollout.group_size,
                                candidates=cfg.rollout.answer_candidates, temperature=cfg.rollout.temperature,
                                top_p=cfg.rollout.top_p)
        self.model.train()
        t_rollout = time.perf_counter() - t0

        t1 = time.perf_counter()
        refs, batches = self._pack(records)
        temp = cfg.rollout.temperature
        if cfg.trainer.old_logprobs == "rollout":
            old_logp = [b.sampling_logp for b in batches]   # the engine's, same weights and temperature
        else:
            with torch.no_grad():
                old_logp = [self.policy(b, "logprobs", temperature=temp) for b in batches]
        teacher_logp = None
        if self.teacher is not None:
            teacher_logp = [self.teacher.logprobs(b, temp) for b in batches]
        judge = self._critic(records)
        rewards, advantages = compute_advantages(cfg, records, refs, batches, old_logp, teacher_logp, judge)
        fill_advantages(batches, refs, advantages)
        t_score = time.perf_counter() - t1

        t2 = time.perf_counter()
        train_stats = self._ppo_updates(batches, old_logp, teacher_logp)
        t_train = time.perf_counter() - t2
        self.scheduler.step()
        self._sync_engine_weights()
        self.step += 1

        n_tok = sum(b.num_tokens for b in batches)
        n_gen = sum(c.output_tokens for r in records for c in r.calls)
        m = {f"rollout/{k}": v for k, v in batch_diagnostics(records).items()}
        m.update({k: v for k, v in batch_diagnostics(records, rewards).items() if k.startswith("reward/")})
        m.update(self._advantage_stats(batches))
        m.update(train_stats)
        m.update({
            "rollout/em": sum(_team_em(r) for r in records) / max(1, len(records)),
            "perf/rollout_s": t_rollout, "perf/score_s": t_score, "perf/train_s": t_train,
            "perf/rollout_tokens_per_s": n_gen / max(t_rollout, 1e-9),
            "perf/score_tokens_per_s": n_tok * ((cfg.trainer.old_logprobs == "recompute") + (self.teacher is not None))
            / max(t_score, 1e-9),
            "perf/train_tokens_per_s": n_tok / max(t_train, 1e-9),
            "perf/padding_frac": padding_fraction(batches), "perf/micro_batches": len(batches),
            "lr": self.scheduler.get_last_lr()[0],
        })
        if torch.cuda.is_available():
            m["perf/max_memory_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
        if getattr(self, "_last_judge_unparsable", 0):
            m["critic/unparsable"] = self._last_judge_unparsable
        return m

    def _advantage_stats(self, batches) -> Dict[str, float]:
        out = {}
        for role in ROLES:
            rid = ROLE_IDS[role]
            vals = torch.cat([b.advantages[b.roles == rid] for b in batches]) if batches else torch.zeros(0)
            if vals.numel():
                out[f"adv/{role}_mean"] = float(vals.mean())
                out[f"adv/{role}_abs"] = float(vals.abs().mean())
        return out

    def _ppo_updates(self, batches, old_logp, teacher_logp) -> Dict[str, float]:
        cfg = self.cfg
        n_mb = max(1, min(cfg.trainer.ppo_minibatches, len(batches)))
        groups = [list(range(len(batches)))[i::n_mb] for i in range(n_mb)]
        totals: Dict[str, float] = {}
        counts: Dict[str, float] = {}
        skipped = 0
        for group in groups:
            n_tokens = torch.tensor([float(sum(batches[b].loss_tokens for b in group))], device=self.device)
            n_tokens = float(_all_reduce(n_tokens).item())
            loss_sum = torch.zeros((), device=self.device)
            for b in group:
                batch = batches[b]
                loss, stats = self.policy(
                    batch, "loss", temperature=cfg.rollout.temperature, old_logp=old_logp[b],
                    advantages=batch.advantages, roles=batch.roles, role_specs=self.specs,
                    teacher_logp=teacher_logp[b] if teacher_logp is not None else None,
                    clip_low=cfg.algo.clip_low, clip_high=cfg.algo.clip_high, dual_clip=cfg.algo.dual_clip,
                    normalizer=max(n_tokens, 1.0))
                loss.backward()
                loss_sum = loss_sum + loss.detach()
                _accumulate_stats(totals, counts, stats)
            loss_sum = _all_reduce(loss_sum.clone())
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.trainer.grad_clip)
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()
            finite = bool(torch.isfinite(loss_sum)) and bool(torch.isfinite(grad_norm))
            if finite:
                self.optimizer.step()
                self.bad_steps = 0
            else:
                skipped += 1
                self.bad_steps += 1
                self.logger.event(self.step, "nonfinite", f"skipped an update: loss {float(loss_sum)}, "
                                  f"grad norm {float(grad_norm)}", consecutive=self.bad_steps)
                if self.bad_steps >= cfg.trainer.max_bad_steps:
                    self.optimizer.zero_grad(set_to_none=True)
                    path = self.save()
                    raise TrainingError(f"{self.bad_steps} non-finite updates in a row at step {self.step}; "
                                        f"stopped (checkpoint {path}). Lower trainer.lr or check the data.")
            self.optimizer.zero_grad(set_to_none=True)
            totals["loss/total"] = totals.get("loss/total", 0.0) + (float(loss_sum) if finite else 0.0)
            counts["loss/total"] = counts.get("loss/total", 0.0) + 1
            totals["loss/grad_norm"] = totals.get("loss/grad_norm", 0.0) + (float(grad_norm) if finite else 0.0)
            counts["loss/grad_norm"] = counts.get("loss/grad_norm", 0.0) + 1
        out = {k: totals[k] / counts[k] for k in totals if counts.get(k)}
        out["loss/skipped_updates"] = float(skipped)
        return out

    # ------------------------------------------------------------------ validation and the loop
    def validate(self) -> Dict[str, float]:
        if not self.dev_questions:
            return {}
        qs = self.dev_questions[self.rank::self.world]
        ev = self.cfg.eval
        self.model.eval()
        with torch.no_grad():
            records = self._rollout(qs, step_seed=12345 + self.step, attempts=1, candidates=ev.answer_candidates,
                                    temperature=ev.temperature, top_p=ev.top_p)
        self.model.train()
        s = torch.tensor([sum(_team_em(r) for r in records), float(len(records)),
                          float(sum(r.search_actions for r in records)),
                          float(sum(1 for r in records if r.search_actions == 0))], dtype=torch.float64)
        s = _all_reduce(s.to(self.device)).cpu()
        n = max(float(s[1]), 1.0)
        return {"val/em": float(s[0]) / n, "val/search_per_workflow": float(s[2]) / n,
                "val/no_search_frac": float(s[3]) / n}

    def fit(self, steps: Optional[int] = None) -> Dict[str, float]:
        """Train until ``steps`` (default trainer.steps); checkpoints, validation, logs, plots."""
        cfg = self.cfg.trainer
        target = steps if steps is not None else cfg.steps
        last: Dict[str, float] = {}
        bar = None
        if self.progress:
            from tqdm import tqdm

            bar = tqdm(total=target, initial=self.step, desc=f"train {self.cfg.method}", unit="step",
                       dynamic_ncols=True)
        interrupted = False
        old_handler = None
        if self.rank == 0 and hasattr(signal, "SIGTERM"):
            old_handler = signal.getsignal(signal.SIGTERM)

        try:
            if self.step == 0 and cfg.val_every and self.dev_questions:
                v = self.validate()
                self.logger.log(0, v)
            while self.step < target:
                m = self.train_step()
                if cfg.val_every and (self.step % cfg.val_every == 0 or self.step == target):
                    m.update(self.validate())
                if self.step % cfg.log_every == 0 or self.step == target:
                    self.logger.log(self.step, m)
                last = m
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix({k.split("/")[-1]: f"{m[k]:.3g}" for k in
                                     ("rollout/em", "val/em", "rollout/search_per_workflow") if k in m})
                if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 and self.step < target:
                    self.save()
        except KeyboardInterrupt:
            interrupted = True
            self.logger.event(self.step, "interrupt", "Ctrl-C: writing a checkpoint")
        except _retriever_errors() as e:
            path = self.save()
            raise TrainingError(f"the retriever is unreachable ({e}); stopped at step {self.step}, "
                                f"checkpoint {path}. Restart the server and resume with --resume.") from None
        finally:
            if bar is not None:
                bar.close()
            if old_handler is not None:
                signal.signal(signal.SIGTERM, old_handler)
        self.save()
        if self.rank == 0:
            plot_training(self.run_dir)
        if interrupted:
            raise KeyboardInterrupt
        return last

    def export(self, out_dir) -> Path:
        """A Hugging Face model directory of the current weights (how Stage I becomes the teacher)."""
        return ckpt.export_hf(self.model, self.tokenizer, out_dir)

    def close(self) -> None:
        self.logger.close()


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines of steps after the checkpoint we resume from (they will be redone)."""
    if not path.is_file():
        return
    import json

    keep = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= step:
                keep.append(line)
        except (ValueError, TypeError):
            continue
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, path)


def _retriever_errors():
    try:
        from mopd.retriever import RetrieverUnavailable

        return (RetrieverUnavailable,)
    except ImportError:  # pragma: no cover
        return ()


def _team_em(record) -> float:
    from mopd.algo.rewards import candidate_scores, team_outcome

    return team_outcome(candidate_scores(record))


def _accumulate_stats(totals: Dict[str, float], counts: Dict[str, float], stats) -> None:
    """Token-weighted running sums of the loss's per-role stats (``loss/<role>_<stat>``) and of
    the same stats pooled over roles (``loss/<stat>``); one host transfer per micro-batch."""
    from mopd.kernels import stats_to_floats

    flat = stats_to_floats(stats, list(ROLES))
    for role in ROLES:
        n = flat.get(f"{role}/tokens", 0.0)
        if n <= 0:
            continue
        for key, v in flat.items():
            r, name = key.split("/", 1)
            if r != role or name == "tokens" or not math.isfinite(v):
                continue
            for k in (f"loss/{role}_{name}", f"loss/{name}"):
                totals[k] = totals.get(k, 0.0) + v * n
                counts[k] = counts.get(k, 0.0) + n
