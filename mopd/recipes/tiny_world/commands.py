"""The tiny world's commands: `mopd demo` (the method end to end on it), `mopd demo-docs` (its
published runs and the docs' tables), `mopd world ...` (build the world, warm-start pi_0, check a
policy) and `mopd model init-tiny` (a random small Qwen3 model for tests and smoke runs).

Handlers import what they run, so `mopd --help` stays fast.
"""

from __future__ import annotations

import json

from mopd.core.workflows import workflow_names
from mopd.recipes.tiny_world.pipeline import DemoSettings


def register(sub) -> None:
    _register_demo(sub)
    _register_world(sub)
    _register_model(sub)


def _register_demo(sub) -> None:
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
    p.add_argument("--out", default=None,
                   help="run directory (default: runs/demo; each mode its own: runs/demo_quick with --quick, "
                        "runs/demo_seeds with --seeds, runs/demo_lora... with --lora; a directory that another "
                        "mode built is refused, never rebuilt)")
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
    p.add_argument("--lora", action="store_true",
                   help="train Stage I and every Stage II arm as LoRA adapters over pi_0's frozen weights (rank 16, "
                        "alpha 32, lr 5e-3; Stage I's adapter is the arms' teacher); OUT defaults to runs/demo_lora "
                        "(runs/demo_lora_quick with --quick, runs/demo_lora_seeds with --seeds). It is the "
                        "`demo_lora` pipeline")
    p.add_argument("--seeds", type=int, nargs="+", default=None, metavar="N",
                   help="run the demo on each seed (OUT/seedN, finished stages reused; OUT defaults to "
                        "runs/demo_seeds) and write OUT/summary.md: per claim, on how many seeds it holds "
                        "and the pooled effect (bootstrap over seeds and questions); config overrides go "
                        "before it")
    p.add_argument("--world", nargs="+", default=[], metavar="KEY=VALUE",
                   help="world settings, e.g. test_per_dataset=100 bands=400 (see mopd.recipes.tiny_world.world.WorldSettings; "
                        "config overrides go before it)")
    p.add_argument("--pi0", nargs="+", default=[], metavar="KEY=VALUE",
                   help="warm-start settings, e.g. search_first=0.9 (see mopd.recipes.tiny_world.warmstart.WarmStartSettings; "
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
    from mopd.recipes.tiny_world.demo import run_demo, run_seeds
    from mopd.recipes.tiny_world.pipeline import quick_settings

    out = args.out or default_demo_dir(quick=args.quick, lora=args.lora, seeds=args.seeds is not None)
    try:
        s = DemoSettings(out=out, seed=args.seed, pi0_steps=args.pi0_steps, stage1_steps=args.stage1_steps,
                         stage2_steps=args.stage2_steps, test_questions=args.test_questions, attempts=args.attempts,
                         bootstrap_draws=args.draws, with_ablations=args.with_ablations,
                         index_kind="bm25" if args.bm25 else "flat", overrides=list(args.overrides),
                         quick=args.quick, world=list(args.world), pi0=list(args.pi0), stage2_questions_per_step=args.stage2_questions,
                         eval_split=args.eval_split, pi0_check_attempts=args.pi0_check_attempts,
                         weak_pi0_em=args.weak_pi0_em, eval_workers=args.eval_workers,
                         threads=args.threads, arm_workers=args.arm_workers, lora=args.lora)
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


def default_demo_dir(quick: bool, lora: bool, seeds: bool) -> str:
    """Each mode of `mopd demo` in its own directory, so that none rebuilds what another built:
    runs/demo, then _lora, _quick, _seeds as they apply (runs/demo_quick, runs/demo_lora_quick_seeds)."""
    return "runs/demo" + "_lora" * lora + "_quick" * quick + "_seeds" * seeds


def _register_demo_docs(sub) -> None:
    p = sub.add_parser("demo-docs", help="publish demo runs into docs/ and render docs/demo.md's tables from them",
                       description="`publish` copies a finished demo run (or a --seeds run) into a docs folder; "
                                   "`readme` rewrites the demo page's tables (docs/demo.md, between <!-- demo-tables:NAME --> "
                                   "markers) from the committed reports, so no number is typed by hand.")
    dsub = p.add_subparsers(dest="docs_command", metavar="ACTION")
    pub = dsub.add_parser("publish", help="copy a demo run's reports into a docs folder")
    pub.add_argument("run", help="run directory of `mopd demo` (or of `mopd demo --seeds`)")
    pub.add_argument("dest", help="docs folder, e.g. docs/demo or docs/demo_seeds (replaced)")
    pub.set_defaults(func=_docs_publish)
    rd = dsub.add_parser("readme", help="render docs/demo.md's tables from the reports under docs/")
    rd.add_argument("--page", "--readme", dest="readme", metavar="PAGE", default="docs/demo.md", help="the page with the markers")
    rd.add_argument("--docs", default="docs")
    rd.add_argument("--check", action="store_true", help="only compare: exit 1 when the page is out of date")
    rd.set_defaults(func=_docs_readme)


def _docs_publish(args) -> int:
    from mopd.recipes.tiny_world.tables import publish

    print(f"published {publish(args.run, args.dest)}")
    return 0


def _docs_readme(args) -> int:
    from mopd.recipes.tiny_world.tables import update_readme

    changed = update_readme(args.readme, args.docs, check=args.check)
    if args.check:
        print(f"{args.readme} demo tables are " + ("OUT OF DATE: " + ", ".join(changed) if changed else "up to date"))
        return 1 if changed else 0
    print("updated: " + (", ".join(changed) if changed else "nothing (already up to date)"))
    return 0


# --------------------------------------------------------------------------------------------
# `mopd world ...`: the built-in tiny search-QA world and its warm-started policy pi_0.
# --------------------------------------------------------------------------------------------


def _register_world(sub) -> None:
    p = sub.add_parser("world", help="the built-in tiny search-QA world: build it, warm-start pi_0, check a policy")
    wsub = p.add_subparsers(dest="world_command", metavar="ACTION")

    b = wsub.add_parser("build", help="generate the world (knowledge base, corpus, questions, splits) and its index",
                        description="Write a seeded tiny world: invented bands, companies, towns and rivers as "
                                    "one-sentence passages plus distractors, one-hop and two-hop chain questions "
                                    "and two-band pair questions asking both bands' towns or genres (datasets tiny_1hop, "
                                    "tiny_2hop, tiny_pair_towns, tiny_pair_genres) split into train/dev/test with a manifest, "
                                    "and the retrieval index. A directory holding the same world is reused.")
    b.add_argument("--out", required=True, help="output directory")
    b.add_argument("--seed", type=int, default=0, help="world seed (default 0)")
    b.add_argument("--index", default="flat", choices=["flat", "bm25"],
                   help="retrieval index: flat (bundled MiniLM encoder, exact inner product) or bm25 (default flat)")
    b.set_defaults(func=_build)

    w = wsub.add_parser("pi0", help="warm-start pi_0: a tiny Qwen3 model fine-tuned on scripted demonstrations",
                        description="Train a byte-level BPE tokenizer and a small Qwen3 model, then fine-tune it on "
                                    "scripted, deliberately imperfect demonstrations of the Leader, Searcher and "
                                    "Answerer in both workflows. A directory holding the same pi_0 is reused.")
    w.add_argument("--world", required=True, help="world directory (from `mopd world build`)")
    w.add_argument("--out", required=True, help="output model directory")
    w.add_argument("--steps", type=int, default=None, help="optimiser steps (default: the recipe's)")
    w.add_argument("--seed", type=int, default=0, help="seed of the model, the demonstrations and the training")
    w.add_argument("--check", action="store_true", help="afterwards, measure format validity and EM on the dev split")
    w.set_defaults(func=_pi0)

    c = wsub.add_parser("check", help="format validity and strict EM of a policy on a split, per workflow")
    c.add_argument("--model", required=True, help="model directory")
    c.add_argument("--world", required=True, help="world directory")
    c.add_argument("--split", default="dev", choices=["train", "dev", "test"],
                   help="default dev: choices are made on dev, the test split is looked at once")
    c.add_argument("--workflow", nargs="+", default=list(workflow_names()), choices=list(workflow_names()))
    c.add_argument("--temperature", type=float, default=0.6)
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(func=_check)

    pc = wsub.add_parser("pi0-check", help="pi_0's format validity and dev EM on several seeds (is the warm start "
                                           "reliable?)",
                         description="For each seed: build (or reuse) the world and pi_0 exactly as `mopd demo` does, "
                                     "in OUT/seedN/world and OUT/seedN/pi0 (so `mopd demo --seeds ... --out OUT` "
                                     "reuses them), check pi_0 on the dev split in both workflows and flag it weak "
                                     "below the thresholds; writes OUT/pi0_check.json and prints a table.")
    pc.add_argument("--seeds", type=int, nargs="+", required=True, metavar="N")
    pc.add_argument("--out", default="runs/demo_seeds", help="root of the seed directories (default runs/demo_seeds)")
    pc.add_argument("--attempts", type=int, default=4, help="workflows per dev question (default 4, as the demo)")
    pc.add_argument("--world-setting", dest="world", nargs="+", default=[], metavar="KEY=VALUE",
                    help="world settings, as `mopd demo --world`")
    pc.add_argument("--pi0-steps", type=int, default=None, help="SFT steps of pi_0 (default: the recipe's)")
    pc.add_argument("--pi0", nargs="+", default=[], metavar="KEY=VALUE",
                    help="warm-start settings, e.g. search_first=0.5 (see mopd.recipes.tiny_world.warmstart.WarmStartSettings)")
    pc.add_argument("--weak-pi0-em", type=float, default=0.15, help="weak below this dev EM (default 0.15, as the demo)")
    pc.add_argument("--bm25", action="store_true", help="BM25 index instead of MiniLM + flat FAISS")
    pc.set_defaults(func=_pi0_check)
    for action in (b, w, c, pc):
        action.set_defaults(pin_cpu=True)   # reproducible CPU environment (mopd.core.reproducible)


def _world_dir(path: str):
    from pathlib import Path

    from mopd.core.errors import UserError
    from mopd.recipes.tiny_world.world import read_settings

    if read_settings(path) is None:
        raise UserError(f"{path} holds no finished tiny world; build one with `mopd world build --out {path}`")
    return Path(path)


def _build(args) -> int:
    from mopd.recipes.tiny_world.world import build_world, read_settings

    paths = build_world(args.out, seed=args.seed, index_kind=args.index, progress=True)
    info = read_settings(paths.root)
    q = info["questions"]
    print(f"world {paths.root}: {info['passages']} passages, questions train {q['train']} dev {q['dev']} "
          f"test {q['test']}, index {args.index}")
    return 0


def _pi0(args) -> int:
    from mopd.recipes.tiny_world.warmstart import build_pi0, read_pi0

    world = _world_dir(args.world)
    kwargs = {"seed": args.seed}
    if args.steps is not None:
        if args.steps < 1:
            from mopd.core.errors import UserError

            raise UserError("--steps must be >= 1")
        kwargs["steps"] = args.steps
    out = build_pi0(world, args.out, **kwargs)
    info = read_pi0(out)
    sec = info["seconds"]
    print(f"pi0 {out}: {info['parameters']} parameters, final loss {info['losses'][-1]:.3f}, "
          f"SFT {sec['sft']}s (total {sec['total']}s)")
    if args.check:
        _print_check(out, world, "dev", list(workflow_names()), 0.6, args.seed)
    return 0


def _check(args) -> int:
    from pathlib import Path

    from mopd.core.errors import UserError

    if not (Path(args.model) / "config.json").is_file():
        raise UserError(f"{args.model} is not a model directory (no config.json)")
    _print_check(args.model, _world_dir(args.world), args.split, args.workflow, args.temperature, args.seed)
    return 0


def _print_check(model, world, split, workflows, temperature, seed) -> None:
    from mopd.recipes.tiny_world.policy_check import check_policy

    result = check_policy(model, world, split=split, workflows=workflows, temperature=temperature, seed=seed)
    for wf, r in result.items():
        per = "  ".join(f"{k} {v:.3f}" for k, v in r["em_by_dataset"].items())
        print(f"{wf}: EM {r['em']:.3f} ({per})  answer valid {r['answer_valid']:.3f}  "
              f"invalid calls {r['invalid_calls']:.3f}  searches {r['searches']:.2f}")
    print(json.dumps(result))


def _pi0_check(args) -> int:
    import sys
    import time

    from mopd.core.errors import UserError
    from mopd.recipes.tiny_world.policy_check import WeakPi0, check_seeds

    if args.attempts < 1:
        raise UserError("--attempts must be >= 1")

    def log(msg):
        print(f"[pi0-check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        items = list(args.world) + (["index_kind=bm25"] if args.bm25 else [])
        steps = [f"steps={args.pi0_steps}"] if args.pi0_steps is not None else []
        rows = check_seeds(args.out, args.seeds, world_items=items, pi0_items=[*args.pi0, *steps],
                           attempts=args.attempts, weak=WeakPi0(em=args.weak_pi0_em), log=log)
    except ValueError as e:
        raise UserError(str(e)) from None
    print("| seed | C-MAS EM | H-MAS EM | Answerer valid | weak |")
    print("|---|---|---|---|---|")
    for n, r in rows.items():
        wf = r["workflows"]
        print(f"| {n} | {wf['cmas']['em']:.3f} | {wf['hmas']['em']:.3f} | {r['valid']:.3f} | "
              f"{'WEAK' if r['weak'] else 'no'} |")
    weak = sum(r["weak"] for r in rows.values())
    print(f"{weak} of {len(rows)} seeds weak (dev EM < {args.weak_pi0_em}); table in {args.out}/pi0_check.json")
    return 0


# --------------------------------------------------------------------------------------------
# `mopd model init-tiny`: a random small Qwen3 model for tests and smoke runs.
# --------------------------------------------------------------------------------------------


def _register_model(sub) -> None:
    m = sub.add_parser("model", help="models for tests and smoke runs")
    msub = m.add_subparsers(dest="model_command", metavar="ACTION")
    t = msub.add_parser("init-tiny", help="write a random small Qwen3 model with its own byte-level BPE "
                                          "tokenizer and a Qwen-style chat template (offline, seconds)")
    t.add_argument("--out", required=True, help="output directory (Hugging Face format)")
    t.add_argument("--corpus", nargs="*", default=[], metavar="FILE",
                   help="text or jsonl files whose lines also train the tokenizer (default: prompts only)")
    t.add_argument("--vocab-size", type=int, default=1024)
    t.add_argument("--hidden", type=int, default=128)
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--ffn", type=int, default=384)
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=_init_tiny)


def _init_tiny(args) -> int:
    from pathlib import Path

    from mopd.core.errors import UserError
    from mopd.recipes.tiny_world.tiny_model import init_tiny_model

    texts = []
    for f in args.corpus:
        p = Path(f)
        if not p.is_file():
            raise UserError(f"corpus file {f} does not exist")
        texts.extend(line for line in p.read_text(encoding="utf-8").splitlines() if line.strip())
    try:
        out = init_tiny_model(args.out, corpus_texts=texts, vocab_size=args.vocab_size, hidden=args.hidden,
                              layers=args.layers, heads=args.heads, ffn=args.ffn, seed=args.seed)
    except ValueError as e:
        raise UserError(str(e)) from None
    print(f"tiny model written to {out}")
    return 0
