"""`mopd data ...`: QA dataset tools."""

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


def _build_splits(args) -> int:
    from mopd.cli import UserError
    from mopd.data.qa import DataError, load_questions
    from mopd.data.splits import build_splits, parse_counts, write_splits

    try:
        train, test, skipped = [], [], 0
        for files, pool in ((args.train, train), (args.test, test)):
            for f in files:
                exs, rep = load_questions(f, skip_malformed=args.skip_malformed)
                pool.extend(exs)
                skipped += rep.skipped
                if rep.skipped:
                    print(f"{f}: skipped {rep.skipped} malformed row(s), first: {rep.problems[0]}")
        test_counts, dev_counts = parse_counts(args.test_counts), parse_counts(args.dev_counts)
        splits = build_splits(train, test, test_counts=test_counts, dev_counts=dev_counts, seed=args.seed)
        manifest = write_splits(splits, args.out, seed=args.seed, inputs=list(args.train) + list(args.test),
                                test_counts=test_counts, dev_counts=dev_counts, skipped_rows=skipped)
    except DataError as e:
        raise UserError(str(e)) from None
    print(f"train {len(splits.train)}  dev {len(splits.dev)}  test {len(splits.test)}  "
          f"(duplicates dropped {splits.duplicates_dropped})")
    for name, rows in sorted(splits.removed.items()):
        print(f"removed from {name} test pool (question in training data): {len(rows)}")
    print(f"manifest: {manifest}")
    return 0
