"""`mopd pipeline PRESET [--file YAML] [--dry-run] [overrides...]`: the whole run in one command."""

from __future__ import annotations

import argparse

FLAGS = {"--dry-run": "dry_run", "--show": "show", "--list": "list"}
"""The command's switches, also accepted after PRESET (``mopd pipeline paper --dry-run``)."""


def register(sub) -> None:
    p = sub.add_parser(
        "pipeline", help="the whole run in one command: Stage I, its export, Stage II, its export, evaluation, report",
        description="Run every stage of a pipeline preset (`mopd pipeline --list`): Stage I, the teacher export, "
                    "the Stage II arms and their exports, the evaluation of every system and the report. A finished "
                    "stage is reused (its marker holds what it was built with), a killed one resumes: run the same "
                    "command again. `paper` is the paper's run on 8 GPUs (each stage its `mopd ...` command, "
                    "training under torchrun); recipes add theirs. "
                    "Options go before PRESET; everything after it is a pipeline override, e.g. "
                    "root=runs/mine model=/models/q stage1.steps=300 launcher.gpus=16 "
                    "'overrides=[trainer.lr=2e-6]'.")
    p.add_argument("--file", dest="yaml_file", default=None,
                   help="YAML file applied on top of the preset, before the overrides (the layout `--show` prints); "
                        "without PRESET, the whole pipeline")
    p.add_argument("--dry-run", action="store_true",
                   help="print each stage (done or to run), its command, its memory per GPU and the disk it needs; "
                        "load and run nothing")
    p.add_argument("--show", action="store_true", help="print the resolved pipeline as YAML and stop")
    p.add_argument("--list", action="store_true", help="list the pipeline presets and stop")
    p.add_argument("preset", nargs="?", default=None,
                   help="pipeline preset: paper, or one a recipe adds (`mopd pipeline --list`; omitted: the whole "
                        "pipeline comes from --file)")
    p.add_argument("overrides", nargs=argparse.REMAINDER,
                   help="pipeline overrides after the preset: stage1.steps=300 or --stage1.steps 300")
    p.set_defaults(func=_pipeline)


def _own_options(args) -> None:
    """Move --dry-run, --show, --list and --file FILE typed after PRESET from the overrides to ``args``
    (and an override taken for PRESET, when there is none, back to the overrides)."""
    rest, items, i = [], list(args.overrides or ()), 0
    if args.preset and ("=" in args.preset or args.preset.startswith("-")):   # no PRESET: an override came first
        items.insert(0, args.preset)
        args.preset = None
    while i < len(items):
        a = items[i]
        if a in FLAGS:
            setattr(args, FLAGS[a], True)
        elif a == "--file" and i + 1 < len(items):
            args.yaml_file, i = items[i + 1], i + 1
        elif a.startswith("--file="):
            args.yaml_file = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    args.overrides = rest


def _pipeline(args) -> int:
    from mopd.core.errors import UserError
    from mopd.pipeline.presets import PIPELINES, resolve_pipeline, show_pipeline

    _own_options(args)
    if args.list:
        for name, fn in PIPELINES.items():
            print(f"{name:12s} {' '.join((fn.__doc__ or '').split())}")
        return 0
    if not args.preset and not args.yaml_file:
        raise UserError(f"name a pipeline preset ({', '.join(PIPELINES)}: `mopd pipeline --list`) or a whole "
                        "pipeline with --file YAML (the layout `mopd pipeline PRESET --show` prints)")
    if args.show:
        print(show_pipeline(args.preset, args.overrides, args.yaml_file), end="")
        return 0
    cfg = resolve_pipeline(args.preset, args.overrides, args.yaml_file)
    from mopd.pipeline.run import describe

    if args.dry_run:
        print(describe(cfg))
        print("(dry run: nothing was loaded or run)")
        return 0
    import sys

    if cfg.launcher.kind == "inprocess" and "torch" not in sys.modules:
        # before torch loads: the pinned CPU variables that make in-process runs reproducible
        from mopd.core.reproducible import pin_cpu_environment

        pin_cpu_environment()
    from mopd.pipeline.run import run_pipeline

    try:
        report = run_pipeline(cfg)
    except Exception as e:
        trainer = sys.modules.get("mopd.train.trainer")   # loaded only where a stage trained in this process
        if trainer is not None and isinstance(e, trainer.TrainingError):
            raise UserError(str(e)) from None   # e.g. a stage's run directory already past its (changed) steps
        raise
    print(f"report: {report}")
    return 0
