"""`mopd data prepare`: the paper's train/dev/test splits from a folder of downloaded QA files.

Two layouts are read:

- FlashRAG's (``RUC-NLPIR/FlashRAG_datasets``): ``ROOT/<dataset>/<split>.jsonl`` with rows
  ``{"id", "question", "golden_answers"}``; the dataset is the folder's name. Some datasets have
  no test split (HotpotQA, 2WikiMultiHopQA, MuSiQue keep only train and dev).
- Search-R1's (``scripts/data_process/*.py``): ``ROOT/<split>.parquet`` or
  ``ROOT/<name>/<split>.parquet`` whose rows name their dataset in ``data_source``.

The paper's sets (the defaults): training from NQ and HotpotQA's train splits only; a dev set of
1,000 questions taken out of that training pool (500 from each: the paper gives the total, not
the split between the two); the test set with the paper's per-dataset counts and seed from each
dataset's test split, else its dev split (the manifest names which). Sampling, deduplication,
overlap removal, the disjointness check and the manifest's hashes are
:func:`mopd.data.splits.build_splits` and :func:`mopd.data.splits.write_splits`, as for
``mopd data build-splits``.
"""

from __future__ import annotations

import os
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from mopd.core.qa import DataError, QAExample, first_line, load_flashrag, load_searchr1_parquet
from mopd.data.splits import PAPER_TEST_COUNTS, Splits, build_splits, write_splits

PAPER_TRAIN_DATASETS: Tuple[str, ...] = ("nq", "hotpotqa")
PAPER_DEV_COUNTS: Dict[str, int] = {"nq": 500, "hotpotqa": 500}
PAPER_SEED = 20260728
SPLITS = ("train", "dev", "test")
FORMATS = ("flashrag", "searchr1")
COMMAND = "mopd data prepare"


@dataclass(frozen=True)
class SourceFile:
    """One file under ROOT: its split (from its name), format, and the datasets its rows hold."""

    path: Path
    split: str
    fmt: str
    datasets: Tuple[str, ...]


@dataclass
class Pick:
    """The rows of one dataset in one pool (train or test), and which split and file give them."""

    pool: str
    dataset: str
    split: str
    path: Path
    rows: int = 0


@dataclass
class PrepareSettings:
    train_datasets: Tuple[str, ...] = PAPER_TRAIN_DATASETS
    test_counts: Optional[Dict[str, int]] = field(default_factory=lambda: dict(PAPER_TEST_COUNTS))
    """Questions per test dataset; None: every question of the paper's seven test datasets."""
    dev_counts: Optional[Dict[str, int]] = field(default_factory=lambda: dict(PAPER_DEV_COUNTS))
    """Questions per dataset moved from training to dev; None: no dev set."""
    seed: int = PAPER_SEED
    fmt: str = "auto"
    skip_malformed: bool = False


@dataclass
class Prepared:
    picks: List[Pick]
    unused: List[SourceFile]
    splits: Splits
    malformed_skipped: int = 0
    aliases_dropped: int = 0
    notes: List[str] = field(default_factory=list)


def _parquet_datasets(path: Path) -> Tuple[str, ...]:
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(path).names
        if "data_source" not in names:
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            raise DataError(f"{path}: not a Search-R1 parquet file: no 'data_source' column (its columns: "
                            f"{shown or 'none'})")
        column = pq.read_table(path, columns=["data_source"]).column("data_source").to_pylist()
    except DataError:
        raise
    except Exception as e:  # pyarrow raises many types: not parquet, a damaged file, ...
        raise DataError(f"{path}: not a readable Search-R1 parquet file ({first_line(e)})") from None
    return tuple(sorted({str(d) for d in column if d}))


def discover(root: Path, fmt: str = "auto", exclude: Sequence[Path] = ()) -> List[SourceFile]:
    """The train/dev/test files under ``root`` (FlashRAG's ``<dataset>/<split>.jsonl``, Search-R1's
    ``[<name>/]<split>.parquet``), skipping those under ``exclude`` (the output directory)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root} is not a directory; pass the folder holding <dataset>/<split>.jsonl "
                        "(FlashRAG) or <split>.parquet files (Search-R1)")
    skip = [Path(os.path.abspath(e)) for e in exclude]

    def kept(p: Path) -> bool:
        a = Path(os.path.abspath(p))
        return not any(a == s or s in a.parents for s in skip)

    found: List[SourceFile] = []
    if fmt in ("auto", "flashrag"):
        for split in SPLITS:
            for p in sorted(root.glob(f"*/{split}.jsonl")):
                if kept(p):
                    found.append(SourceFile(p, split, "flashrag", (p.parent.name,)))
    if fmt in ("auto", "searchr1"):
        for split in SPLITS:
            for p in sorted([*root.glob(f"{split}.parquet"), *root.glob(f"*/{split}.parquet")]):
                if kept(p):
                    found.append(SourceFile(p, split, "searchr1", _parquet_datasets(p)))
    formats = sorted({s.fmt for s in found})
    if len(formats) > 1:
        raise DataError(f"{root} holds both FlashRAG .jsonl and Search-R1 .parquet files; pass --format "
                        "flashrag or --format searchr1")
    if not found:
        raise DataError(f"{root} holds no <dataset>/train|dev|test.jsonl (FlashRAG) and no "
                        "[<name>/]train|dev|test.parquet (Search-R1) files")
    return found


def _holders(sources: Sequence[SourceFile]) -> Dict[Tuple[str, str], List[SourceFile]]:
    out: Dict[Tuple[str, str], List[SourceFile]] = defaultdict(list)
    for s in sources:
        for d in s.datasets:
            out[(d, s.split)].append(s)
    return out


def plan(sources: Sequence[SourceFile], settings: PrepareSettings, root: Path) -> Tuple[List[Pick], List[SourceFile]]:
    """Which file gives each training dataset (its train split) and each test dataset (its test
    split, else its dev split); and the files nothing reads."""
    holders = _holders(sources)
    have = sorted({d for d, _ in holders})

    def one(dataset: str, split: str) -> SourceFile:
        files = holders[(dataset, split)]
        if len(files) > 1:
            raise DataError(f"{dataset} {split} is in {len(files)} files ({', '.join(str(f.path) for f in files)}); "
                            "point ROOT at a folder where each dataset's split is in one file")
        return files[0]

    picks: List[Pick] = []
    for d in settings.train_datasets:
        if not holders.get((d, "train")):
            raise DataError(f"no train split for training dataset {d!r} under {root} (datasets found: {have}); "
                            "download it or choose --train-datasets")
        picks.append(Pick("train", d, "train", one(d, "train").path))
    test_sets = list(settings.test_counts) if settings.test_counts is not None else list(PAPER_TEST_COUNTS)
    missing = [d for d in test_sets if not holders.get((d, "test")) and not holders.get((d, "dev"))]
    if missing:
        raise DataError(f"no test or dev split for test dataset(s) {missing} under {root} (datasets found: "
                        f"{have}); download them or choose --test-counts NAME=N,...")
    for d in test_sets:
        split = "test" if holders.get((d, "test")) else "dev"
        picks.append(Pick("test", d, split, one(d, split).path))
    used = {p.path for p in picks}
    return picks, [s for s in sources if s.path not in used]


def _load(picks: Sequence[Pick], sources: Sequence[SourceFile], skip_malformed: bool, progress: bool
          ) -> Tuple[List[QAExample], List[QAExample], Prepared]:
    fmt = {s.path: s.fmt for s in sources}
    cache: Dict[Path, List[QAExample]] = {}
    result = Prepared(picks=list(picks), unused=[], splits=Splits([], [], []))
    pools: Dict[str, List[QAExample]] = {"train": [], "test": []}
    for pick in picks:
        if pick.path not in cache:
            if progress:
                print(f"reading {pick.path} ...", file=sys.stderr, flush=True)
            if fmt[pick.path] == "flashrag":
                rows, rep = load_flashrag(pick.path, dataset=pick.dataset, skip_malformed=skip_malformed)
            else:
                rows, rep = load_searchr1_parquet(pick.path, skip_malformed=skip_malformed)
            cache[pick.path] = rows
            result.malformed_skipped += rep.skipped
            result.aliases_dropped += rep.aliases_dropped
            if rep.skipped:
                result.notes.append(f"{pick.path}: skipped {rep.skipped} malformed row(s), first: {rep.problems[0]}")
            if rep.aliases_dropped:
                result.notes.append(f"{pick.path}: dropped {rep.aliases_dropped} gold answer(s) empty after answer "
                                    f"normalisation, first: {rep.alias_notes[0]}")
        rows = cache[pick.path]
        if fmt[pick.path] == "flashrag":
            # A FlashRAG file is its folder's dataset, whatever a row's own 'dataset' field says.
            for ex in rows:
                ex.dataset = pick.dataset
        else:
            rows = [ex for ex in rows if ex.dataset == pick.dataset]
        pick.rows = len(rows)
        if not rows:
            raise DataError(f"{pick.path} holds no usable {pick.dataset} rows for the {pick.pool} pool")
        pools[pick.pool].extend(rows)
    return pools["train"], pools["test"], result


def prepare(root, settings: PrepareSettings = PrepareSettings(), exclude: Sequence[Path] = (),
            progress: bool = False) -> Prepared:
    """Discover, plan, load and split (nothing is written: see :func:`write_prepared`)."""
    root = Path(root)
    sources = discover(root, settings.fmt, exclude)
    picks, unused = plan(sources, settings, root)
    train_pool, test_pool, result = _load(picks, sources, settings.skip_malformed, progress)
    result.unused = unused
    result.splits = build_splits(train_pool, test_pool, test_counts=settings.test_counts,
                                 dev_counts=settings.dev_counts, seed=settings.seed)
    return result


def out_dir_refusal(out: Path) -> Optional[str]:
    """Why ``out`` may not be written, or None: it must not exist, be empty, or hold an earlier
    ``mopd data prepare`` output (its manifest says so); anything else is the user's."""
    import json

    from mopd.core.out_path import out_dir_problem

    problem = out_dir_problem(out)
    if problem:
        return f"--out {out} {problem}"
    if not out.is_dir() or not any(out.iterdir()):
        return None
    try:
        made_by = json.loads((out / "manifest.json").read_text(encoding="utf-8")).get("command")
    except (OSError, ValueError, AttributeError):
        made_by = None
    if made_by == COMMAND:
        return None
    return (f"--out {out} already holds files that `{COMMAND}` did not write (no manifest.json of it); "
            "choose a new or empty directory, nothing was written")


def write_prepared(result: Prepared, out, root, settings: PrepareSettings) -> Path:
    out = Path(out)
    splits = result.splits
    test_split = {p.dataset: {"split": p.split, "file": str(p.path)} for p in result.picks if p.pool == "test"}
    extra = {
        "command": COMMAND,
        "root": str(Path(root).resolve()),
        "format": sorted({"jsonl" if p.path.suffix == ".jsonl" else "parquet" for p in result.picks}),
        "train_datasets": list(settings.train_datasets),
        "sources": [{"pool": p.pool, "dataset": p.dataset, "split": p.split, "file": str(p.path), "rows": p.rows}
                    for p in result.picks],
        "test_split_used": test_split,
        "dev_from_training_pool": "dev questions are sampled per dataset from the training pool and removed from it",
        "aliases_dropped": result.aliases_dropped,
    }
    inputs = sorted({str(p.path) for p in result.picks})
    return write_splits(splits, out, seed=settings.seed, inputs=inputs, test_counts=settings.test_counts,
                        dev_counts=settings.dev_counts, skipped_rows=result.malformed_skipped, extra=extra)


def summary_lines(result: Prepared, root: Path) -> List[str]:
    """The table of which file gives what, per dataset: rows read, then questions per split."""
    s = result.splits
    counts = {name: Counter(ex.dataset for ex in getattr(s, name)) for name in SPLITS}

    def rel(p: Path) -> str:
        try:
            return str(p.relative_to(root))
        except ValueError:
            return str(p)

    width = max(len(rel(p.path)) for p in result.picks)
    lines = [f"{'pool':<6}{'dataset':<17}{'split':<6}{'file':<{width + 2}}{'rows':>9}{'train':>9}{'dev':>7}{'test':>7}"]
    for p in result.picks:
        if p.pool == "train":
            tail = f"{counts['train'][p.dataset]:>9,}{counts['dev'][p.dataset]:>7,}{'':>7}"
        else:
            tail = f"{'':>9}{'':>7}{counts['test'][p.dataset]:>7,}"
            removed = len(s.removed.get(p.dataset, []))
            if removed:
                tail += f"  ({removed} removed: question in training data)"
            if p.split == "dev":
                tail += "  (dev split: no test split)"
        lines.append(f"{p.pool:<6}{p.dataset:<17}{p.split:<6}{rel(p.path):<{width + 2}}{p.rows:>9,}{tail}")
    if result.unused:
        lines.append("not used: " + ", ".join(rel(u.path) for u in result.unused))
    lines.append(f"splits: train {len(s.train):,}  dev {len(s.dev):,}  test {len(s.test):,}  (duplicate questions dropped "
                 f"{s.duplicates_dropped}, malformed rows skipped {result.malformed_skipped}, empty gold answers "
                 f"dropped {result.aliases_dropped})")
    return lines
