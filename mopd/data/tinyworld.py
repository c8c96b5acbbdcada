"""The built-in tiny search-QA world: a seeded knowledge base, its corpus, questions, splits and index.

``build_world(out_dir, seed)`` writes::

    DIR/kb.json                  the knowledge base (entities, relations)
    DIR/corpus.jsonl             passages, FlashRAG/Search-R1 rows {"id", "contents": "title\\ntext"}
    DIR/pools/{train,test}.jsonl question pools (FlashRAG rows, meta with subject, hops and gold ids)
    DIR/questions/{train,dev,test}.jsonl + manifest.json   the splits (mopd.data.splits)
    DIR/index/                   the retrieval index (MiniLM flat by default, or BM25)
    DIR/world.json               the settings and counts (written last: marks a finished world)

Test questions are about bands and companies that no training question mentions, so test EM
measures searching and reading, not memory of training answers. Every town and river is still
the answer of some training question (towns are dealt evenly to subjects, the test sample keeps
at least two training subjects per town, and the dev sample is redrawn until it leaves every
name answered), so the model has written every answer name.

A second call with the same settings returns at once; other settings rebuild the directory.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional

from mopd.data.qa import QAExample, load_flashrag, write_questions
from mopd.data.splits import build_splits, write_splits
from mopd.data.world_kb import KnowledgeBase, WorldSizes, generate_kb
from mopd.data.world_text import ONE_HOP, TWO_HOP, write_world_text

WORLD_FORMAT = 1
WORLD_FILE = "world.json"


@dataclass(frozen=True)
class WorldPaths:
    root: Path
    corpus: Path
    kb: Path
    train: Path
    dev: Path
    test: Path
    manifest: Path
    index: Path

    @classmethod
    def of(cls, root) -> "WorldPaths":
        r = Path(root)
        q = r / "questions"
        return cls(root=r, corpus=r / "corpus.jsonl", kb=r / "kb.json", train=q / "train.jsonl", dev=q / "dev.jsonl",
                   test=q / "test.jsonl", manifest=q / "manifest.json", index=r / "index")

    def split(self, name: str) -> Path:
        return {"train": self.train, "dev": self.dev, "test": self.test}[name]


@dataclass(frozen=True)
class WorldSettings:
    seed: int = 0
    bands: int = 200
    companies: int = 40
    towns: int = 60
    rivers: int = 20
    twins: int = 16
    distractors: int = 280
    test_subjects: int = 40
    """Bands and companies held out for test (each gives a one-hop and a two-hop question)."""
    dev_per_dataset: int = 20
    index_kind: str = "flat"
    encoder: str = "minilm"

    def sizes(self) -> WorldSizes:
        return WorldSizes(bands=self.bands, companies=self.companies, towns=self.towns, rivers=self.rivers,
                          twins=self.twins)


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _write_jsonl(path: Path, rows) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def held_out_subjects(kb: KnowledgeBase, n: int, seed: int, keep_per_town: int = 2) -> List[str]:
    """``n`` bands/companies for test, drawn so that every town keeps ``keep_per_town`` training subjects."""
    rng = random.Random(f"split-{seed}")
    subjects = sorted(kb.bands) + sorted(kb.companies)
    rng.shuffle(subjects)
    left: Dict[str, int] = {}
    for s in subjects:
        left[kb.subject(s)["town"]] = left.get(kb.subject(s)["town"], 0) + 1
    out = []
    for s in subjects:
        if len(out) == n:
            break
        town = kb.subject(s)["town"]
        if left[town] > keep_per_town:
            left[town] -= 1
            out.append(s)
    if len(out) < n:
        raise ValueError(f"cannot hold out {n} subjects and keep {keep_per_town} per town; ask for fewer")
    return out


def _covering_splits(kb: KnowledgeBase, train_pool, test_pool, test_counts, dev_counts, seed: int, tries: int = 100):
    """Splits whose training questions have every town and river among their answers (so the
    model has written every answer name): the first split seed ``seed * 1000 + k`` that does."""
    names = set(kb.towns) | set(kb.rivers)
    for k in range(tries):
        split_seed = seed * 1000 + k
        splits = build_splits(train_pool, test_pool, test_counts=test_counts, dev_counts=dev_counts, seed=split_seed)
        if names <= {a for q in splits.train for a in q.answers}:
            return splits, split_seed
    raise ValueError(f"no dev sample in {tries} seeds leaves every town and river answered in training; "
                     "ask for a smaller dev set or fewer test subjects")


def read_settings(root) -> Optional[dict]:
    p = Path(root) / WORLD_FILE
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None


def build_world(out_dir, seed: int = 0, *, settings: Optional[WorldSettings] = None, index_kind: Optional[str] = None,
                encoder: Optional[str] = None, progress: bool = False) -> WorldPaths:
    """Write (or reuse) the tiny world in ``out_dir``; see the module docstring for the layout.

    ``settings`` overrides every size (its own seed wins over ``seed``); ``index_kind`` ("flat",
    "bm25", ...) and ``encoder`` ("minilm") choose the retrieval index."""
    s = settings or WorldSettings(seed=seed)
    if index_kind is not None or encoder is not None:
        s = WorldSettings(**{**asdict(s), **({"index_kind": index_kind} if index_kind else {}),
                             **({"encoder": encoder} if encoder else {})})
    paths = WorldPaths.of(out_dir)
    wanted = {"format": WORLD_FORMAT, **asdict(s)}
    done = read_settings(paths.root)
    if done is not None and done.get("settings") == wanted:
        return paths
    if paths.root.exists():
        for name in ("kb.json", "corpus.jsonl", WORLD_FILE):
            (paths.root / name).unlink(missing_ok=True)
        for name in ("pools", "questions", "index"):
            shutil.rmtree(paths.root / name, ignore_errors=True)
    paths.root.mkdir(parents=True, exist_ok=True)

    kb = generate_kb(s.seed, s.sizes())
    text = write_world_text(kb, s.seed, s.distractors)
    _write_json(paths.kb, kb.to_dict())
    _write_jsonl(paths.corpus, (p.to_corpus_row() for p in text.passages))

    test_subjects = set(held_out_subjects(kb, s.test_subjects, s.seed))
    pools = paths.root / "pools"
    train_pool = [q for q in text.questions if q.meta["subject"] not in test_subjects]
    test_pool = [q for q in text.questions if q.meta["subject"] in test_subjects]
    write_questions(pools / "train.jsonl", train_pool)
    write_questions(pools / "test.jsonl", test_pool)
    test_counts = {ONE_HOP: s.test_subjects, TWO_HOP: s.test_subjects}
    dev_counts = {ONE_HOP: s.dev_per_dataset, TWO_HOP: s.dev_per_dataset} if s.dev_per_dataset else None
    splits, split_seed = _covering_splits(kb, train_pool, test_pool, test_counts, dev_counts, s.seed)
    write_splits(splits, paths.manifest.parent, seed=split_seed,
                 inputs=[str(pools / "train.jsonl"), str(pools / "test.jsonl")],
                 test_counts=test_counts, dev_counts=dev_counts)

    from mopd.retriever import build_index

    build_index(paths.corpus, paths.index, encoder=s.encoder, index_kind=s.index_kind, progress=progress)
    kinds: Dict[str, int] = {}
    for p in text.passages:
        kinds[p.kind] = kinds.get(p.kind, 0) + 1
    _write_json(paths.root / WORLD_FILE, {
        "settings": wanted, "passages": len(text.passages), "passage_kinds": dict(sorted(kinds.items())),
        "questions": {"train": len(splits.train), "dev": len(splits.dev), "test": len(splits.test)},
        "test_subjects": sorted(test_subjects)})
    return paths


def load_kb(paths: WorldPaths) -> KnowledgeBase:
    return KnowledgeBase.from_dict(json.loads(paths.kb.read_text(encoding="utf-8")))


def load_split(paths: WorldPaths, name: str) -> List[QAExample]:
    """A split's questions (FlashRAG rows; the dataset name is each row's ``dataset``)."""
    examples, _ = load_flashrag(paths.split(name))
    return examples


def load_question_meta(paths: WorldPaths) -> Dict[str, dict]:
    """Question text -> meta (subject, kind, hops, town, river, gold passage ids), over both pools."""
    out: Dict[str, dict] = {}
    for name in ("train", "test"):
        with (paths.root / "pools" / f"{name}.jsonl").open(encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                out[row["question"]] = row["meta"]
    return out
