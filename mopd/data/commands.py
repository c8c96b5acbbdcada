"""`mopd data ...`: QA datasets, their splits and the paper's data preparation."""

from __future__ import annotations




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
