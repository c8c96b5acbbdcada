"""`mopd train` and `mopd export`."""

from __future__ import annotations

from mopd.cli import add_overrides_argument


def register(sub) -> None:
    p = sub.add_parser(
        "train", help="train with a method preset (cmas_rl = Stage I, mopd = Stage II, ablations)",
        description="Run a training method. Presets: `mopd config list`. Works as one process (CPU or one "
                    "GPU) and under `torchrun --nproc_per_node N mopd train ...` (FSDP2; gloo on CPU, NCCL on "
                    "CUDA). Writes metrics.jsonl, events.jsonl, checkpoints/ and training.png under "
                    "trainer.out_dir. Options go before PRESET; everything after it is a config override.")
    p.add_argument("--file", dest="yaml_file", default=None, help="YAML config applied on top of the preset")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest complete checkpoint in trainer.out_dir (exactly: weights, "
                        "optimizer, scheduler, RNG, data position)")
    p.add_argument("--steps", type=int, default=None, help="stop after this many total steps (default trainer.steps)")
    p.add_argument("--export", default=None, metavar="DIR",
                   help="after training, also write a Hugging Face model here (e.g. the Stage-I teacher)")
    p.add_argument("preset", help="method preset (cmas_rl, mopd, outcome_searcher, base_teacher, "
                                  "no_searcher_supervision, prompted_critic)")
    add_overrides_argument(p)
    p.set_defaults(func=_train)

    e = sub.add_parser("export", help="write a Hugging Face model (safetensors + tokenizer) from a checkpoint",
                       description="Load a training checkpoint (a step_N directory, or a run directory for its "
                                   "latest checkpoint) into the run's base architecture and save it in Hugging "
                                   "Face format, loadable by transformers and vLLM (and as a teacher).")
    e.add_argument("checkpoint", help="checkpoint directory (RUN/checkpoints/step_N) or run directory")
    e.add_argument("--out", required=True, help="output model directory")
    e.add_argument("--base-model", default=None,
                   help="architecture/tokenizer source (default: the model.path recorded in the checkpoint)")
    e.set_defaults(func=_export)


def _train(args) -> int:
    import logging

    from mopd.cli import UserError
    from mopd.config import resolve
    from mopd.train.model import ModelLoadError
    from mopd.train.trainer import PolicyTrainer, TrainingError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = resolve(args.preset, args.overrides, args.yaml_file)
    try:
        trainer = PolicyTrainer(cfg, resume=args.resume)
        try:
            last = trainer.fit(args.steps)
            if args.export:
                trainer.export(args.export)
        finally:
            trainer.close()
    except (ModelLoadError, TrainingError) as e:
        raise UserError(str(e)) from None
    if trainer.rank == 0:
        shown = {k: round(v, 4) for k, v in last.items() if k in ("rollout/em", "val/em", "loss/total")}
        print(f"done: step {trainer.step}, {shown}; run directory {cfg.trainer.out_dir}")
    return 0


def _export(args) -> int:
    from mopd.train.checkpoint import export_checkpoint

    out = export_checkpoint(args.checkpoint, args.out, args.base_model)
    print(f"exported {out}")
    return 0
