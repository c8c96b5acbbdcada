"""`mopd train` and `mopd export`.

Handlers import what they run when they run (:mod:`mopd.cli` says why).
"""

from __future__ import annotations

from mopd.core.arguments import add_overrides_argument


def register(sub) -> None:
    p = sub.add_parser(
        "train", help="train with a method preset (cmas_rl = Stage I, mopd = Stage II, ablations)",
        description="Run a training method. Presets: `mopd config list`. Works as one process (CPU or one "
                    "GPU) and under `torchrun --nproc_per_node N mopd train ...` (FSDP2; gloo on CPU, NCCL on "
                    "CUDA). Writes metrics.jsonl, events.jsonl, checkpoints/ and training.png under "
                    "trainer.out_dir. Options go before PRESET; everything after it is a config override.")
    p.add_argument("--file", dest="yaml_file", default=None, help="YAML config applied on top of the preset")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in trainer.out_dir that verifies (exactly: "
                        "weights, optimizer, scheduler, RNG, data position); the method, model, teacher, data and "
                        "config must be the run's own (see --allow-changed)")
    p.add_argument("--resume-or-start", action="store_true",
                   help="as --resume when trainer.out_dir holds a run, else start a fresh one there (plain "
                        "--resume refuses a directory without a run: a mistyped path must not restart training)")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in a trainer.out_dir that holds a run, moving that run's files aside to "
                        "OUT_DIR.replaced-<time>/ (without it such a start is refused)")
    p.add_argument("--allow-changed", nargs="+", default=(), metavar="KEY",
                   help="with --resume: config keys (or sections, e.g. trainer) allowed to differ from the "
                        "run's recorded ones, e.g. trainer.steps; any other difference is refused")
    p.add_argument("--steps", type=int, default=None, help="stop after this many total steps (default trainer.steps)")
    p.add_argument("--export", default=None, metavar="DIR",
                   help="after training, also write a Hugging Face model here (e.g. the Stage-I teacher)")
    p.add_argument("--export-checkpoint", choices=["best", "last"], default="best",
                   help="what --export writes: the best-validation checkpoint (the paper's selection; the last "
                        "weights when no validation ran) or the last weights (default best, as `mopd export`). "
                        "DIR must be new, empty, or an earlier export of this run")
    p.add_argument("--export-adapter", action="store_true",
                   help="a LoRA run (model.lora.rank > 0): --export writes the adapter alone (PEFT's format, with "
                        "the fingerprint of its base: a Stage II over the same base takes it as teacher.path) "
                        "instead of the adapter merged into the base")
    p.add_argument("preset", help="method preset (cmas_rl, mopd, outcome_searcher, base_teacher, "
                                  "no_searcher_supervision, prompted_critic)")
    add_overrides_argument(p)
    p.set_defaults(func=_train)

    e = sub.add_parser("export", help="write a Hugging Face model (safetensors + tokenizer) from a checkpoint, or a "
                                      "LoRA run's adapter",
                       description="Load a training checkpoint (a step_N directory, or a run directory and "
                                   "--checkpoint latest|best|STEP) into the run's base architecture and save it "
                                   "in Hugging Face format, loadable by transformers and vLLM (and as a teacher). "
                                   "The checkpoint must verify against its manifest.")
    e.add_argument("checkpoint", help="checkpoint directory (RUN/checkpoints/step_N) or run directory")
    e.add_argument("--checkpoint", dest="which", default="best", metavar="WHICH",
                   help="for a run directory: best (the best-validation checkpoint, kept beside the last K: the "
                        "paper's model selection, and what `mopd train --export` writes; the latest when the run "
                        "never validated; default), latest (the newest checkpoint that verifies) or a step number")
    e.add_argument("--out", required=True,
                   help="output model directory: new, empty, or an earlier export of the same run (which it "
                        "replaces); anything else is refused, never deleted")
    e.add_argument("--base-model", default=None,
                   help="architecture/tokenizer source (default: the run's model.path in run.json, else the one "
                        "recorded in the checkpoint); a checkpoint that does not fit it is skipped or refused")
    e.add_argument("--adapter", action="store_true",
                   help="a LoRA run: write its adapter alone in PEFT's format (adapter_config.json, "
                        "adapter_model.safetensors) with mopd_base.json, the fingerprint of the base it needs; "
                        "without it the adapter is merged into the base (a plain model, no peft needed to load it)")
    e.add_argument("--trust-remote-code", action="store_true",
                   help="allow a base model whose config names Python code of its own (auto_map) and run that "
                        "code (as model.trust_remote_code=true); without it such a model is refused")
    e.add_argument("--repair", action="store_true",
                   help="only put back or remove what an interrupted export to --out left beside it (the earlier "
                        "export moved into a hidden .NAME.export-old-* folder, an unfinished .NAME.export-*), then "
                        "stop; every export does this first")
    e.set_defaults(func=_export)
    _register_plan(sub)


def _train(args) -> int:
    import logging
    import os
    import sys
    from pathlib import Path

    from mopd.config import resolve
    from mopd.core.errors import UserError
    from mopd.train.preflight import PreflightError, check_training_inputs
    from mopd.train.run_start import RunCommandError, check_run_outputs, lock_run, prepare_run, resume_or_refuse

    if args.allow_changed and not (args.resume or args.resume_or_start):
        raise UserError("--allow-changed only applies with --resume")
    if args.resume and args.resume_or_start:
        raise UserError("--resume and --resume-or-start: choose one")
    if args.steps is not None and args.steps < 0:
        raise UserError(f"--steps {args.steps}: give the step to stop after (0 or more), or leave it out for "
                        "trainer.steps")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = resolve(args.preset, args.overrides, args.yaml_file)
    from mopd.core.model_dir import trust_remote_code
    from mopd.train.run_dir import default_out_dir

    trust_remote_code(cfg.model.trust_remote_code)

    default_out_dir(cfg, args.preset)
    lock = None
    notes = []
    try:
        notes = check_training_inputs(cfg)
        if int(os.environ.get("RANK", "0")) == 0:
            for line in notes:                # said now; recorded in events.jsonl once the run starts
                print(f"mopd: {line}", file=sys.stderr, flush=True)
        check_run_outputs(cfg, args.export)
        start = None
        resume = args.resume or args.resume_or_start
        if int(os.environ.get("RANK", "0")) == 0:   # under torchrun, rank 0 owns the directory
            resume = resume_or_refuse(cfg, args.resume, args.resume_or_start)
            lock = lock_run(cfg.trainer.out_dir, "mopd train" + (" --resume" if resume else ""))
            start = prepare_run(cfg, resume, args.overwrite, args.allow_changed)
    except (PreflightError, RunCommandError) as e:
        raise UserError(str(e)) from None
    from mopd.train.checkpoint import CheckpointError
    from mopd.train.model import ModelLoadError
    from mopd.train.run_dir import discard_unstarted
    from mopd.train.trainer import PolicyTrainer, TrainingError

    try:
        try:
            # Every rank looks for a checkpoint when asked to (a collective): with --resume-or-start
            # in a new directory rank 0 has just started the run, and finds none, as the others do.
            trainer = PolicyTrainer(cfg, resume=args.resume or args.resume_or_start)
        except BaseException:
            if start is not None and not resume:   # nothing trained: the directory is free again
                discard_unstarted(Path(cfg.trainer.out_dir))
            raise
        for line in start.events if start is not None else ():
            trainer.logger.event(trainer.step, "run_dir", line)
        for line in notes if start is not None else ():   # e.g. dev questions that are training questions
            trainer.logger.event(trainer.step, "data", line)
        try:
            last = trainer.fit(args.steps)
            if args.export:
                trainer.export(args.export, which=args.export_checkpoint, adapter=args.export_adapter)
        except BaseException:
            trainer.close(failed=True)
            raise
        trainer.close()
    except (ModelLoadError, TrainingError, CheckpointError) as e:
        raise UserError(str(e)) from None
    except Exception as e:
        from mopd.core.peers import raise_if_peer_lost

        raise_if_peer_lost(e, intact_checkpoint(cfg.trainer.out_dir))
        raise
    finally:
        if lock is not None:
            lock.release()
    if trainer.rank == 0:
        shown = {k: round(v, 4) for k, v in last.items() if k in ("rollout/em", "val/em", "loss/total")}
        print(f"done: step {trainer.step}, {shown}; run directory {cfg.trainer.out_dir}")
    return 0


def intact_checkpoint(run_dir) -> str:
    """Where a run stopped by a dead rank resumes from: its newest complete checkpoint (the
    manifest is written last), found without a collective."""
    from mopd.train.checkpoint import list_checkpoints
    from mopd.train.manifest import MANIFEST

    done = [p for p in list_checkpoints(run_dir) if (p / MANIFEST).is_file()]
    if not done:
        return f"no checkpoint of {run_dir} was written yet: start it again"
    return f"the newest intact checkpoint is {done[-1]}: continue with `mopd train --resume ...`"


def _export(args) -> int:
    from mopd.core.errors import UserError
    from mopd.core.model_dir import trust_remote_code
    from mopd.train.checkpoint import CheckpointError
    from mopd.train.export import export_checkpoint
    from mopd.train.export_target import run_of
    from mopd.core.run_lock import RunLock, RunLocked

    trust_remote_code(args.trust_remote_code)
    run = run_of(args.checkpoint)
    lock = None
    if (run / "checkpoints").is_dir():   # retention of a training run must not delete what is being read
        try:
            lock = RunLock(run, "mopd export")
        except RunLocked as e:
            raise UserError(str(e)) from None
        except OSError:                  # a read-only run (a published one): nothing writes it either
            lock = None
    try:
        if args.repair:
            return _repair_export(args.out)
        out = export_checkpoint(args.checkpoint, args.out, args.base_model, which=args.which, log=print,
                                adapter=args.adapter)
    except CheckpointError as e:
        raise UserError(str(e)) from None
    finally:
        if lock is not None:
            lock.release()
    print(f"exported {out}")
    return 0


def _repair_export(out: str) -> int:
    """`mopd export RUN --out DIR --repair`: what an interrupted export to DIR left, put back or removed."""
    from mopd.core.errors import UserError
    from mopd.train.export_target import repair_export

    try:
        lines = repair_export(out)
    except OSError as e:
        raise UserError(f"--out {out}: what an interrupted export left cannot be repaired: {e}") from None
    for line in lines or [f"nothing to repair: no interrupted export beside {out}"]:
        print(line)
    return 0


def _register_plan(sub) -> None:
    p = sub.add_parser(
        "plan", help="per-GPU memory of a training config (rollout and training phases); refuses what cannot fit",
        description="Estimate, before any model loads, what each GPU holds in a colocated step: the fp32 master "
                    "and AdamW shards, gradients, the teacher, vLLM's weights and KV cache, activations and the "
                    "loss head. The model's config.json is read offline (a local directory, a bundled config, or "
                    "the Hugging Face cache). Exits 2 with the reason when the config cannot fit.")
    p.add_argument("--file", dest="yaml_file", default=None, help="YAML config applied on top of the preset")
    p.add_argument("--gpus", type=int, default=None, help="GPUs (FSDP world size; default $WORLD_SIZE, else 8)")
    p.add_argument("--gpu-gib", type=float, default=None,
                   help="memory of one GPU in GiB (default: this machine's GPU, else an H200's 139)")
    p.add_argument("--retriever-gib", type=float, default=0.0,
                   help="GiB that a retriever served on the same GPUs holds on each for the whole run "
                        "(`mopd retriever serve --faiss-gpu`: index shard + faiss scratch; default 0)")
    p.add_argument("preset", help="method preset, as for `mopd train`")
    add_overrides_argument(p)
    p.set_defaults(func=_plan)


def _plan(args) -> int:
    import os

    from mopd.config import resolve
    from mopd.core.errors import UserError
    from mopd.train.memory_plan import H200_GIB, PlanError, plan_memory

    cfg = resolve(args.preset, args.overrides, args.yaml_file)
    if not cfg.model.path:
        raise UserError("model.path is empty: set model.path=DIR or a bundled name such as Qwen/Qwen3-4B-Instruct-2507")
    gpu_gib = args.gpu_gib
    if gpu_gib is None:
        import torch

        gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2 ** 30 if torch.cuda.is_available() else H200_GIB
    try:
        plan = plan_memory(cfg, gpu_gib=gpu_gib, world=args.gpus or int(os.environ.get("WORLD_SIZE", "8")),
                           retriever_gib=args.retriever_gib)
    except PlanError as e:
        raise UserError(str(e)) from None
    print(plan.render())
    if not plan.fits:
        raise UserError("the config does not fit: " + "; ".join(plan.problems))
    return 0
