"""`mopd world ...`: the built-in tiny search-QA world and its warm-started policy pi_0."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("world", help="the built-in tiny search-QA world: build it, warm-start pi_0, check a policy")
    wsub = p.add_subparsers(dest="world_command", metavar="ACTION")

    b = wsub.add_parser("build", help="generate the world (knowledge base, corpus, questions, splits) and its index",
                        description="Write a seeded tiny world: invented bands, companies, towns and rivers as "
                                    "one-sentence passages plus distractors, one-hop and two-hop questions "
                                    "(datasets tiny_1hop, tiny_2hop) split into train/dev/test with a manifest, "
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
    w.add_argument("--check", action="store_true", help="afterwards, measure format validity and EM on the test split")
    w.set_defaults(func=_pi0)

    c = wsub.add_parser("check", help="format validity and strict EM of a policy on a split, per workflow")
    c.add_argument("--model", required=True, help="model directory")
    c.add_argument("--world", required=True, help="world directory")
    c.add_argument("--split", default="test", choices=["train", "dev", "test"])
    c.add_argument("--workflow", nargs="+", default=["cmas", "hmas"], choices=["cmas", "hmas"])
    c.add_argument("--temperature", type=float, default=0.6)
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(func=_check)


def _world_dir(path: str):
    from pathlib import Path

    from mopd.cli import UserError
    from mopd.data.tinyworld import read_settings

    if read_settings(path) is None:
        raise UserError(f"{path} holds no finished tiny world; build one with `mopd world build --out {path}`")
    return Path(path)


def _build(args) -> int:
    from mopd.data.tinyworld import build_world, read_settings

    paths = build_world(args.out, seed=args.seed, index_kind=args.index, progress=True)
    info = read_settings(paths.root)
    q = info["questions"]
    print(f"world {paths.root}: {info['passages']} passages, questions train {q['train']} dev {q['dev']} "
          f"test {q['test']}, index {args.index}")
    return 0


def _pi0(args) -> int:
    from mopd.data.warmstart import build_pi0, read_pi0

    world = _world_dir(args.world)
    kwargs = {"seed": args.seed}
    if args.steps is not None:
        if args.steps < 1:
            from mopd.cli import UserError

            raise UserError("--steps must be >= 1")
        kwargs["steps"] = args.steps
    out = build_pi0(world, args.out, **kwargs)
    info = read_pi0(out)
    sec = info["seconds"]
    print(f"pi0 {out}: {info['parameters']} parameters, final loss {info['losses'][-1]:.3f}, "
          f"SFT {sec['sft']}s (total {sec['total']}s)")
    if args.check:
        _print_check(out, world, "test", ["cmas", "hmas"], 0.6, args.seed)
    return 0


def _check(args) -> int:
    from pathlib import Path

    from mopd.cli import UserError

    if not (Path(args.model) / "config.json").is_file():
        raise UserError(f"{args.model} is not a model directory (no config.json)")
    _print_check(args.model, _world_dir(args.world), args.split, args.workflow, args.temperature, args.seed)
    return 0


def _print_check(model, world, split, workflows, temperature, seed) -> None:
    from mopd.data.policy_check import check_policy

    result = check_policy(model, world, split=split, workflows=workflows, temperature=temperature, seed=seed)
    for wf, r in result.items():
        per = "  ".join(f"{k} {v:.3f}" for k, v in r["em_by_dataset"].items())
        print(f"{wf}: EM {r['em']:.3f} ({per})  answer valid {r['answer_valid']:.3f}  "
              f"invalid calls {r['invalid_calls']:.3f}  searches {r['searches']:.2f}")
    print(json.dumps(result))
