"""`mopd score --records FILE`: strict and flexible EM of a records file."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("score", help="strict and flexible exact match of a workflow records file",
                       description="Score each workflow by its final Answerer output: strict EM uses the "
                                   "text of the last complete <answer> tag; flexible EM applies the paper's "
                                   "six extraction rules. Prints per-dataset and macro means.")
    p.add_argument("--records", required=True, nargs="+", metavar="FILE", help="records .jsonl file(s)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=_score)


def score_records(records) -> dict:
    """Per dataset and macro (datasets weighted equally): n, strict EM, flexible EM."""
    from collections import defaultdict

    from mopd.eval.scoring import exact_match, extract_answer, flexible_extract

    per = defaultdict(lambda: [0, 0.0, 0.0])
    for r in records:
        last = r.candidates[-1] if r.candidates else None
        row = per[r.dataset]
        row[0] += 1
        row[1] += exact_match(extract_answer(last), r.answers)
        row[2] += exact_match(flexible_extract(last), r.answers)
    out = {ds: {"n": n, "strict_em": s / n, "flexible_em": f / n} for ds, (n, s, f) in sorted(per.items())}
    if out:
        out["macro"] = {
            "n": sum(v["n"] for v in out.values()),
            "strict_em": sum(v["strict_em"] for v in out.values()) / len(out),
            "flexible_em": sum(v["flexible_em"] for v in out.values()) / len(out),
        }
    return out


def _score(args) -> int:
    import json

    from mopd.cli import UserError
    from mopd.rollout.records import read_records

    records = [r for f in args.records for r in read_records(f)]
    if not records:
        raise UserError(f"no records in {' '.join(args.records)}")
    table = score_records(records)
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    print(f"{'dataset':24s} {'n':>7s} {'strict EM':>10s} {'flex EM':>10s}")
    for ds, v in table.items():
        print(f"{ds:24s} {v['n']:7d} {100 * v['strict_em']:9.2f}% {100 * v['flexible_em']:9.2f}%")
    return 0
