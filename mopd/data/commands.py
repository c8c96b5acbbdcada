"""`mopd data ...` (QA splits), `mopd world ...` (the built-in tiny world and its pi_0) and
`mopd model init-tiny` (a random small Qwen3 model beside `mopd.data.tiny_model`)."""

from __future__ import annotations

import json

from mopd.core.workflows import workflow_names


def register(sub) -> None:
    p = sub.add_parser("data", help="QA datasets: build train/dev/test splits")
    dsub = p.add_subparsers(dest="data_command", metavar="ACTION")
    b = dsub.add_parser(
        "build-splits",
        help="seeded train/dev/test splits with overlap removal and a manifest (paper, Appendix A)",
        description="Sample a test set from the test pool (per-dataset counts), a dev set from the "
                    "training pool, drop test-pool questions whose normalised text occurs in training "
                    "data, check that no question hash is shared by two splits, and write "
                    "train/dev/test.jsonl plus manifest.json (counts, seed, removed entries, sha256 of "
                    "every input and output).")
    b.add_argument("--train", nargs="+", required=True, metavar="FILE",
                   help="training-pool files: FlashRAG .jsonl (id, question, golden_answers) or Search-R1 .parquet")
    b.add_argument("--test", nargs="+", required=True, metavar="FILE",
                   help="test-pool files (same formats); the dataset name comes from the row's 'dataset' or "
                        "'data_source' field, else the parent folder for FlashRAG's NAME/test.jsonl, else the file stem")
    b.add_argument("--test-counts", default="all",
                   help="questions per dataset in the test set: 'paper' (812 NQ/TriviaQA/PopQA, 813 HotpotQA/"
                        "2Wiki/MuSiQue, 125 Bamboogle), 'all', or NAME=N,NAME=N (default: all)")
    b.add_argument("--dev-counts", default=None,
                   help="questions per dataset moved from training to dev: NAME=N,... (default: no dev set)")
    b.add_argument("--seed", type=int, default=20260728, help="sampling seed (default: 20260728, the paper's)")
    b.add_argument("--skip-malformed", action="store_true",
                   help="skip malformed rows (counted in the manifest) instead of stopping at the first one")
    b.add_argument("--out", required=True, help="output directory")
    b.set_defaults(func=_build_splits)
    _register_prepare(dsub)
    _register_world(sub)
    _register_model(sub)


def _build_splits(args) -> int:
    from mopd.core.errors import UserError
    from mopd.core.qa import DataError, load_questions
    from mopd.data.splits import build_splits, parse_counts, write_splits

    try:
        train, test, skipped, aliases = [], [], 0, 0
        for files, pool in ((args.train, train), (args.test, test)):
            for f in files:
                exs, rep = load_questions(f, skip_malformed=args.skip_malformed)
                pool.extend(exs)
                skipped += rep.skipped
                aliases += rep.aliases_dropped
                if rep.skipped:
                    print(f"{f}: skipped {rep.skipped} malformed row(s), first: {rep.problems[0]}")
                if rep.aliases_dropped:
                    print(f"{f}: dropped {rep.aliases_dropped} gold answer(s) empty after answer normalisation, "
                          f"first: {rep.alias_notes[0]}")
        for files, pool, name in ((args.train, train, "training"), (args.test, test, "test")):
            if not pool:
                raise UserError(f"the {name} pool is empty: {' '.join(files)} hold(s) no questions")
        test_counts, dev_counts = parse_counts(args.test_counts), parse_counts(args.dev_counts)
        splits = build_splits(train, test, test_counts=test_counts, dev_counts=dev_counts, seed=args.seed)
        if not splits.train or not splits.test:
            empty = "train" if not splits.train else "test"
            raise UserError(f"the {empty} split would be empty (train {len(splits.train)}, dev {len(splits.dev)}, "
                            f"test {len(splits.test)}): lower --dev-counts / --test-counts or add questions; "
                            "nothing was written")
        manifest = write_splits(splits, args.out, seed=args.seed, inputs=list(args.train) + list(args.test),
                                test_counts=test_counts, dev_counts=dev_counts, skipped_rows=skipped,
                                extra={"command": "mopd data build-splits", "aliases_dropped": aliases})
    except DataError as e:
        raise UserError(str(e)) from None
    print(f"train {len(splits.train)}  dev {len(splits.dev)}  test {len(splits.test)}  "
          f"(duplicates dropped {splits.duplicates_dropped})")
    for name, rows in sorted(splits.removed.items()):
        print(f"removed from {name} test pool (question in training data): {len(rows)}")
    print(f"manifest: {manifest}")
    return 0


def _register_prepare(dsub) -> None:
    p = dsub.add_parser(
        "prepare", help="the paper's train/dev/test splits from a folder of FlashRAG or Search-R1 files",
        description="Read ROOT/<dataset>/<split>.jsonl (FlashRAG) or ROOT/[<name>/]<split>.parquet (Search-R1, "
                    "datasets from the rows' data_source) and write the paper's sets: training from NQ and "
                    "HotpotQA's train splits only, a 1,000-question dev set taken out of that pool (500 each), "
                    "and the 5,000-question test set (812 NQ/TriviaQA/PopQA, 813 HotpotQA/2Wiki/MuSiQue, 125 "
                    "Bamboogle, seed 20260728) from each dataset's test split, else its dev split (named in the "
                    "manifest). Deduplication, overlap removal and hashes as `mopd data build-splits`. Prints "
                    "which file gives what; --dry-run stops there.")
    p.add_argument("root", metavar="ROOT", help="folder of the downloaded datasets")
    p.add_argument("--out", default=None, help="output directory: new, empty, or an earlier `mopd data prepare` "
                                               "output (anything else is refused)")
    p.add_argument("--train-datasets", default="nq,hotpotqa",
                   help="datasets whose train split is the training pool (default: nq,hotpotqa, the paper's)")
    p.add_argument("--test-counts", default="paper",
                   help="questions per test dataset: 'paper' (default), 'all' (every question of the paper's "
                        "seven test datasets) or NAME=N,NAME=N")
    p.add_argument("--dev-counts", default="nq=500,hotpotqa=500",
                   help="questions per dataset moved from training to dev (default nq=500,hotpotqa=500: the "
                        "paper's 1,000; it does not say how they divide), or 'none'")
    p.add_argument("--seed", type=int, default=20260728, help="sampling seed (default: 20260728, the paper's)")
    p.add_argument("--format", default="auto", choices=["auto", "flashrag", "searchr1"],
                   help="which files to read when ROOT holds both kinds (default: the kind ROOT holds)")
    p.add_argument("--skip-malformed", action="store_true",
                   help="skip malformed rows (counted in the manifest) instead of stopping at the first one")
    p.add_argument("--dry-run", action="store_true", help="print which file gives what, and the split sizes; "
                                                          "write nothing")
    p.set_defaults(func=_prepare)


def _prepare(args) -> int:
    from pathlib import Path

    from mopd.core.errors import UserError
    from mopd.core.qa import DataError
    from mopd.data.prepare import PrepareSettings, out_dir_refusal, prepare, summary_lines, write_prepared
    from mopd.data.splits import parse_counts

    if args.out is None and not args.dry_run:
        raise UserError("--out DIR is required (or --dry-run to only print what would be written)")
    out = Path(args.out) if args.out else None
    if out is not None:
        refusal = out_dir_refusal(out)
        if refusal:
            raise UserError(refusal)
    try:
        train = tuple(d.strip() for d in args.train_datasets.split(",") if d.strip())
        if not train:
            raise UserError("--train-datasets names no dataset")
        test_counts = parse_counts(args.test_counts)       # 'all': None, every question
        dev_counts = None if args.dev_counts in ("none", "0", "") else parse_counts(args.dev_counts)
        settings = PrepareSettings(train_datasets=train, test_counts=test_counts, dev_counts=dev_counts,
                                   seed=args.seed, fmt=args.format, skip_malformed=args.skip_malformed)
        result = prepare(args.root, settings, exclude=[out] if out is not None else [], progress=True)
    except DataError as e:
        raise UserError(str(e)) from None
    for note in result.notes:
        print(note)
    for line in summary_lines(result, Path(args.root)):
        print(line)
    if not result.splits.train or not result.splits.test:
        raise UserError("the train or test split would be empty: lower --dev-counts / --test-counts; nothing was "
                        "written")
    if args.dry_run:
        print("dry run: nothing written")
        return 0
    manifest = write_prepared(result, out, args.root, settings)
    print(f"manifest: {manifest}")
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
                    help="warm-start settings, e.g. search_first=0.5 (see mopd.data.warmstart.WarmStartSettings)")
    pc.add_argument("--weak-pi0-em", type=float, default=0.15, help="weak below this dev EM (default 0.15, as the demo)")
    pc.add_argument("--bm25", action="store_true", help="BM25 index instead of MiniLM + flat FAISS")
    pc.set_defaults(func=_pi0_check)
    for action in (b, w, c, pc):
        action.set_defaults(pin_cpu=True)   # reproducible CPU environment (mopd.core.reproducible)


def _world_dir(path: str):
    from pathlib import Path

    from mopd.core.errors import UserError
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
    from mopd.data.policy_check import check_policy

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
    from mopd.data.policy_check import WeakPi0, check_seeds

    if args.attempts < 1:
        raise UserError("--attempts must be >= 1")

    def log(msg):
        print(f"[pi0-check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        items = list(args.world) + (["index_kind=bm25"] if args.bm25 else [])
        rows = check_seeds(args.out, args.seeds, world_items=items, pi0_steps=args.pi0_steps, pi0_items=args.pi0,
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
    from mopd.data.tiny_model import init_tiny_model

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
