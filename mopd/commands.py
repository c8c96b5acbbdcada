"""`mopd config ...` (presets and resolved configs) and `mopd demo` (the built-in end-to-end run)."""

from __future__ import annotations

from mopd.core.arguments import add_overrides_argument


def register(sub) -> None:
    _register_config(sub)
    _register_demo(sub)


def _register_config(sub) -> None:
    p = sub.add_parser("config", help="show presets and resolved run configurations")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    show = csub.add_parser("show", help="print the resolved config of a preset with overrides")
    show.add_argument("preset", nargs="?", default=None,
                      help="preset name (see `mopd config list`); omitted: the plain defaults")
    show.add_argument("--file", dest="yaml_file", default=None,
                      help="YAML config applied on top of the preset, before the overrides (put it before PRESET)")
    add_overrides_argument(show)
    show.set_defaults(func=_show)
    ls = csub.add_parser("list", help="list the named presets")
    ls.set_defaults(func=_list)


def _show(args) -> int:
    from mopd.config import describe, resolve, to_yaml

    cfg = resolve(args.preset, args.overrides, args.yaml_file)
    print(describe(cfg))
    print("---")
    print(to_yaml(cfg), end="")
    return 0


def _list(args) -> int:
    from mopd.config import PRESETS

    for name, fn in PRESETS.items():
        print(f"{name:26s} {(fn.__doc__ or '').strip()}")
    return 0


def _register_demo(sub) -> None:
    from mopd.demo import DemoSettings

    d = DemoSettings()
    p = sub.add_parser(
        "demo", help="the whole method end to end on the built-in tiny world (CPU, ~25 minutes)",
        description="Build a tiny search-QA world and its retrieval index, warm-start pi_0 by SFT, train "
                    "Stage I (C-MAS outcome RL), export it as the teacher, train two Stage II arms from pi_0 "
                    "side by side (MultiAgent-OPD, and the same run without Searcher supervision), evaluate "
                    "C-MAS base, C-MAS + RL, H-MAS base and both arms with the paper's protocol (4 attempts, "
                    "paired question bootstrap) and write a report with plots and the claims: OPD's own "
                    "contribution, MultiAgent-OPD against C-MAS + RL, and the trained-minus-base checks. "
                    "Finished stages are reused, so a second run (or a resumed one) is quick. It is the `demo` "
                    "pipeline (`mopd pipeline demo --dry-run` lists its stages).")
    p.add_argument("--out", default="runs/demo", help="run directory (default: runs/demo)")
    p.add_argument("--seed", type=int, default=0, help="seed of the world, pi_0 and training (default 0)")
    p.add_argument("--with-ablations", action="store_true",
                   help="also train the outcome-reward Searcher and base-teacher ablations (read at their last "
                        "step, as the paper's Table 3) and report search activity over training")
    p.add_argument("--stage1-steps", type=int, default=d.stage1_steps,
                   help=f"Stage I steps (default {d.stage1_steps})")
    p.add_argument("--stage2-steps", type=int, default=d.stage2_steps,
                   help=f"Stage II steps (default {d.stage2_steps})")
    p.add_argument("--pi0-steps", type=int, default=None, help="SFT steps of pi_0 (default: the recipe's)")
    p.add_argument("--test-questions", type=int, default=None,
                   help="evaluate on the first N test questions only (default: all)")
    p.add_argument("--attempts", type=int, default=4, help="workflows per test question (default 4)")
    p.add_argument("--draws", type=int, default=4000, help="bootstrap draws (default 4000)")
    p.add_argument("--bm25", action="store_true", help="retrieve with BM25 instead of MiniLM + flat FAISS")
    p.add_argument("--quick", action="store_true",
                   help="a shortened smoke run (few steps, few questions): checks the pipeline, not the method")
    p.add_argument("--seeds", type=int, nargs="+", default=None, metavar="N",
                   help="run the demo on each seed (OUT/seedN, finished stages reused; OUT defaults to "
                        "runs/demo_seeds) and write OUT/summary.md: per claim, on how many seeds it holds "
                        "and the pooled effect (bootstrap over seeds and questions); config overrides go "
                        "before it")
    p.add_argument("--world", nargs="+", default=[], metavar="KEY=VALUE",
                   help="world settings, e.g. test_per_dataset=100 bands=400 (see mopd.data.tinyworld.WorldSettings; "
                        "config overrides go before it)")
    p.add_argument("--pi0", nargs="+", default=[], metavar="KEY=VALUE",
                   help="warm-start settings, e.g. search_first=0.9 (see mopd.data.warmstart.WarmStartSettings; "
                        "config overrides go before it)")
    p.add_argument("--stage2-questions", type=int, default=None,
                   help="Stage II questions per step (default: the tiny_mopd preset's)")
    p.add_argument("--eval-split", default="test", choices=["test", "dev"],
                   help="evaluate on test (the final numbers) or dev (for every tuning choice; "
                        "written to report_dev/) (default test)")
    p.add_argument("--eval-workers", type=int, default=d.eval_workers,
                   help=f"processes for the final evaluations, pi_0's demonstrations and its check; the records are "
                        f"the same with 1 (default {d.eval_workers})")
    p.add_argument("--threads", type=int, default=d.threads,
                   help=f"torch threads of pi_0's SFT and Stage I, which run alone (default {d.threads}; "
                        "results depend on it in the last bits)")
    p.add_argument("--arm-workers", type=int, default=d.arm_workers,
                   help=f"Stage II arms trained at once, one thread each (default {d.arm_workers})")
    p.add_argument("--pi0-check-attempts", type=int, default=d.pi0_check_attempts,
                   help=f"workflows per dev question of the pi_0 check, 0 to skip it (default {d.pi0_check_attempts})")
    p.add_argument("--weak-pi0-em", type=float, default=d.weak_pi0_em,
                   help=f"flag pi_0 as weak below this dev EM (default {d.weak_pi0_em})")
    p.add_argument("overrides", nargs="*", help="config overrides for every training stage, e.g. trainer.lr=5e-4")
    p.set_defaults(func=_demo, pin_cpu=True)
    _register_demo_docs(sub)


def _demo(args) -> int:
    from mopd.core.errors import UserError
    from mopd.demo import DemoSettings, quick_settings, run_demo, run_seeds

    out = args.out
    if args.seeds is not None and out == "runs/demo":
        out = "runs/demo_seeds"
    try:
        s = DemoSettings(out=out, seed=args.seed, pi0_steps=args.pi0_steps, stage1_steps=args.stage1_steps,
                         stage2_steps=args.stage2_steps, test_questions=args.test_questions, attempts=args.attempts,
                         bootstrap_draws=args.draws, with_ablations=args.with_ablations,
                         index_kind="bm25" if args.bm25 else "flat", overrides=list(args.overrides),
                         quick=args.quick, world=list(args.world), pi0=list(args.pi0), stage2_questions_per_step=args.stage2_questions,
                         eval_split=args.eval_split, pi0_check_attempts=args.pi0_check_attempts,
                         weak_pi0_em=args.weak_pi0_em, eval_workers=args.eval_workers,
                         threads=args.threads, arm_workers=args.arm_workers)
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.quick:
        quick_settings(s)
    from mopd.train.trainer import TrainingError

    try:
        if args.seeds is not None:
            print(f"summary: {run_seeds(s, list(args.seeds))}")
            return 0
        report = run_demo(s)
    except TrainingError as e:   # e.g. a stage's run directory already past its (changed) steps
        raise UserError(str(e)) from None
    print(f"report: {report}")
    return 0


def _register_demo_docs(sub) -> None:
    p = sub.add_parser("demo-docs", help="publish demo runs into docs/ and render README.md's demo tables from them",
                       description="`publish` copies a finished demo run (or a --seeds run) into a docs folder; "
                                   "`readme` rewrites the README's demo tables (between <!-- demo-tables:NAME --> "
                                   "markers) from the committed reports, so no number is typed by hand.")
    dsub = p.add_subparsers(dest="docs_command", metavar="ACTION")
    pub = dsub.add_parser("publish", help="copy a demo run's reports into a docs folder")
    pub.add_argument("run", help="run directory of `mopd demo` (or of `mopd demo --seeds`)")
    pub.add_argument("dest", help="docs folder, e.g. docs/demo or docs/demo_seeds (replaced)")
    pub.set_defaults(func=_docs_publish)
    rd = dsub.add_parser("readme", help="render README.md's demo tables from docs/")
    rd.add_argument("--readme", default="README.md")
    rd.add_argument("--docs", default="docs")
    rd.add_argument("--check", action="store_true", help="only compare: exit 1 when README.md is out of date")
    rd.set_defaults(func=_docs_readme)


def _docs_publish(args) -> int:
    from mopd.demo_tables import publish

    print(f"published {publish(args.run, args.dest)}")
    return 0


def _docs_readme(args) -> int:
    from mopd.demo_tables import update_readme

    changed = update_readme(args.readme, args.docs, check=args.check)
    if args.check:
        print("README.md demo tables are " + ("OUT OF DATE: " + ", ".join(changed) if changed else "up to date"))
        return 1 if changed else 0
    print("updated: " + (", ".join(changed) if changed else "nothing (already up to date)"))
    return 0
