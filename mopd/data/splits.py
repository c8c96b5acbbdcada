"""Train/dev/test split builder (the paper's Appendix A).

Questions are normalised (Unicode NFKC, lowercase, punctuation removed, whitespace collapsed)
and hashed. The test set is a seeded sample with per-dataset counts from the test pool, after
removing test-pool entries whose normalised question occurs in the training pool; the dev set
is a seeded sample of the training pool, removed from training. No hash may be shared by two
splits (checked). A manifest records counts, seed, removed entries and the sha256 of every input
and output file.
"""

from __future__ import annotations

import hashlib
import os
import random
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from mopd.core.atomic import atomic_write_json
from mopd.core.qa import DataError, QAExample, write_questions

# The paper's main test set: 5,000 questions over seven datasets.
PAPER_TEST_COUNTS: Dict[str, int] = {
    "nq": 812, "triviaqa": 812, "popqa": 812,
    "hotpotqa": 813, "2wikimultihopqa": 813, "musique": 813, "bamboogle": 125,
}


def normalize_question(q: str) -> str:
    """NFKC, lowercase, drop punctuation (Unicode categories P*), collapse whitespace."""
    q = unicodedata.normalize("NFKC", q).lower()
    q = "".join(ch for ch in q if not unicodedata.category(ch).startswith("P"))
    return " ".join(q.split())


def question_hash(q: str) -> str:
    return hashlib.sha256(normalize_question(q).encode("utf-8")).hexdigest()[:16]


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class Splits:
    train: List[QAExample]
    dev: List[QAExample]
    test: List[QAExample]
    removed: Dict[str, List[dict]] = field(default_factory=dict)
    """Per dataset: test-pool entries dropped because their question occurs in training data."""
    duplicates_dropped: int = 0
    """Repeated questions inside a pool (the first occurrence is kept)."""


def _dedup(examples: Sequence[QAExample]) -> tuple:
    seen, out = set(), []
    for ex in examples:
        h = question_hash(ex.question)
        if h in seen:
            continue
        seen.add(h)
        out.append(ex)
    return out, len(examples) - len(out)


def _by_dataset(examples: Sequence[QAExample]) -> Dict[str, List[QAExample]]:
    groups: Dict[str, List[QAExample]] = defaultdict(list)
    for ex in examples:
        groups[ex.dataset].append(ex)
    return dict(sorted(groups.items()))


def _sample(groups: Dict[str, List[QAExample]], counts: Optional[Dict[str, int]], rng: random.Random,
            what: str) -> List[QAExample]:
    """Seeded per-dataset sample; counts None keeps everything (in a seeded order)."""
    out: List[QAExample] = []
    if counts is not None:
        missing = sorted(set(counts) - set(groups))
        if missing:
            raise DataError(f"{what}: no questions for dataset(s) {missing}; pools hold {sorted(groups)}")
    for name, exs in groups.items():
        if counts is not None and name not in counts:
            continue
        want = len(exs) if counts is None else counts[name]
        if want > len(exs):
            raise DataError(f"{what}: dataset {name!r} has {len(exs)} eligible questions, {want} requested")
        idx = sorted(rng.sample(range(len(exs)), want))
        out.extend(exs[i] for i in idx)
    return out


def build_splits(train_pool: Sequence[QAExample], test_pool: Sequence[QAExample], *,
                 test_counts: Optional[Dict[str, int]] = None, dev_counts: Optional[Dict[str, int]] = None,
                 seed: int = 20260728) -> Splits:
    """Sample dev from the training pool and test from the test pool, without shared questions."""
    rng = random.Random(seed)
    train, dup_train = _dedup(train_pool)
    test_candidates, dup_test = _dedup(test_pool)

    dev: List[QAExample] = []
    if dev_counts:
        dev = _sample(_by_dataset(train), dev_counts, rng, "dev split")
        dev_ids = {id(ex) for ex in dev}
        train = [ex for ex in train if id(ex) not in dev_ids]

    seen = {question_hash(ex.question) for ex in train} | {question_hash(ex.question) for ex in dev}
    removed: Dict[str, List[dict]] = defaultdict(list)
    eligible = []
    for ex in test_candidates:
        if question_hash(ex.question) in seen:
            removed[ex.dataset].append({"id": ex.id, "question": ex.question})
        else:
            eligible.append(ex)
    test = _sample(_by_dataset(eligible), test_counts, rng, "test split")
    splits = Splits(train, dev, test, dict(removed), dup_train + dup_test)
    check_disjoint(splits)
    return splits


def check_disjoint(splits: Splits) -> None:
    """Raise when a normalised question hash occurs in two of train, dev, test."""
    hashes = {name: {question_hash(ex.question) for ex in getattr(splits, name)}
              for name in ("train", "dev", "test")}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        shared = hashes[a] & hashes[b]
        if shared:
            raise DataError(f"splits {a} and {b} share {len(shared)} question hash(es), e.g. {sorted(shared)[:3]}")


def write_splits(splits: Splits, out_dir: str | os.PathLike, *, seed: int, inputs: Sequence[str],
                 test_counts: Optional[Dict[str, int]], dev_counts: Optional[Dict[str, int]],
                 skipped_rows: int = 0, extra: Optional[dict] = None) -> Path:
    """Write train/dev/test jsonl and manifest.json (with sha256 of every input and output);
    ``extra``: more manifest fields (the command that wrote it, where each split came from)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    outputs = {}
    for name in ("train", "dev", "test"):
        p = out / f"{name}.jsonl"
        write_questions(p, getattr(splits, name))
        outputs[name] = p
    manifest = {
        **(extra or {}),
        "seed": seed,
        "requested": {"test": test_counts, "dev": dev_counts},
        "counts": {name: _count_by_dataset(getattr(splits, name)) for name in ("train", "dev", "test")},
        "removed_test_overlap": {k: {"count": len(v), "entries": v} for k, v in sorted(splits.removed.items())},
        "duplicates_dropped": splits.duplicates_dropped,
        "malformed_rows_skipped": skipped_rows,
        "disjoint_hashes_checked": True,
        "normalisation": "NFKC, lowercase, punctuation removed, whitespace collapsed; sha256[:16]",
        "inputs": {str(p): sha256_file(p) for p in inputs},
        "outputs": {f"{k}.jsonl": sha256_file(v) for k, v in outputs.items()},
    }
    mp = out / "manifest.json"
    atomic_write_json(mp, manifest, ensure_ascii=False)
    return mp


def _count_by_dataset(examples: Sequence[QAExample]) -> Dict[str, int]:
    counts: Dict[str, int] = defaultdict(int)
    for ex in examples:
        counts[ex.dataset] += 1
    return dict(sorted(counts.items()))


def parse_counts(spec: Optional[str]) -> Optional[Dict[str, int]]:
    """``paper`` or ``nq=812,hotpotqa=813`` -> dict; None or ``all`` -> None (keep every question)."""
    if spec is None or spec == "all":
        return None
    if spec == "paper":
        return dict(PAPER_TEST_COUNTS)
    out = {}
    for part in spec.split(","):
        if "=" not in part:
            raise DataError(f"count {part!r} is not NAME=N (e.g. nq=812,hotpotqa=813, or 'paper')")
        name, n = part.split("=", 1)
        try:
            out[name.strip()] = int(n)
        except ValueError:
            raise DataError(f"count for {name!r} is not an integer: {n!r}") from None
        if out[name.strip()] < 0:
            raise DataError(f"count for {name!r} must be >= 0")
    return out
