"""The built-in tiny search-QA world: a seeded knowledge base, its corpus, questions, splits and index.

``build_world(out_dir, seed)`` writes::

    DIR/kb.json                  the knowledge base (entities, relations)
    DIR/corpus.jsonl             passages, FlashRAG/Search-R1 rows {"id", "contents": "title\\ntext"}
    DIR/pools/{train,test}.jsonl question pools (FlashRAG rows, meta with subject, hops and gold ids)
    DIR/questions/{train,dev,test}.jsonl + manifest.json   the splits (mopd.data.splits)
    DIR/index/                   the retrieval index (MiniLM flat by default, or BM25)
    DIR/world.json               the settings and counts (written last: marks a finished world)

Datasets: the chain questions tiny_1hop and tiny_2hop, and the pair questions tiny_pair_towns and
tiny_pair_genres (two bands each; :mod:`mopd.recipes.tiny_world.world_text`). Test questions are new questions,
each about its own subject, whose sibling (the other hop about the same subject) stays in
training, as in the calibration prototype; a test pair question's bands are, as far as the bands
go, not the subjects of any other test question. A split by subject (test
subjects never named in training) was tried: the 0.5M-parameter pi_0, trained for minutes,
learns to write training answers from memory long before it learns to copy names from its
prompt, and scored 0.01-0.05 test EM, leaving RL nothing to reinforce. Every town and river is
the answer of some training question (towns are dealt evenly to subjects and the test and dev
samples are redrawn until they leave every name answered), so the model has written every name.

A second call with the same settings returns at once; other settings rebuild the directory.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from mopd.core.atomic import atomic_open, atomic_write_json
from mopd.core.qa import QAExample, load_flashrag, write_questions
from mopd.data.markers import read_marker
from mopd.data.splits import build_splits, write_splits
from mopd.recipes.tiny_world.world_kb import KnowledgeBase, WorldSizes, generate_kb
from mopd.recipes.tiny_world.world_text import CHAIN_DATASETS, DATASETS, PAIR_DATASETS, write_world_text
from mopd.core.key_values import parse_key_values
from mopd.retriever.builder import IndexSpec, build_index

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
    bands: int = 400
    """Bands (the main subjects). Test and dev questions each take a subject of their own, so the
    test split's size needs enough of them: 400 leave 640 training questions beside 2 x 100 test."""
    companies: int = 40
    towns: int = 60
    rivers: int = 20
    twins: int = 16
    distractors: int = 280
    pair_questions: int = 400
    """Questions of each pair type (towns, genres) in the pool; test and dev take theirs from them
    and the rest train: 400 leave 320 of each in training beside 720 chain questions. With 120 of
    each (200 here), pi_0 (1,200 SFT steps) wrote the pair answer right in 20-29% of the scripted
    team's H-MAS workflows on seed 0's dev split, with 320 in 46-51% (bench/RESULTS.md, "Pair
    questions with one-token answers"). A pool's pairs share no band while the bands last (a random
    matching, about 200 pairs), then reuse bands; the test and dev pairs are taken from bands of
    their own first (:func:`held_out_pairs`)."""
    test_per_dataset: int = 60
    """Test questions per dataset (one-hop, two-hop, pair towns, pair genres), each about its own subject
    where the bands allow. With the two chain datasets alone, 2 x 100 made the demo's 95% intervals
    about +-3.5-4 points of avg@4 (+-6 with 2 x 40); 4 x 60 keeps about as many questions (240) for
    five evaluations instead of four within the demo's 25 minutes."""
    dev_per_dataset: int = 20
    index_kind: str = "flat"
    encoder: str = "minilm"

    def __post_init__(self):
        if self.pair_questions < self.test_per_dataset + self.dev_per_dataset:
            raise ValueError(f"pair_questions={self.pair_questions} must hold test_per_dataset + dev_per_dataset "
                             f"({self.test_per_dataset + self.dev_per_dataset}) questions of each pair type")

    def sizes(self) -> WorldSizes:
        return WorldSizes(bands=self.bands, companies=self.companies, towns=self.towns, rivers=self.rivers,
                          twins=self.twins)


QUICK_WORLD = {"bands": 24, "companies": 8, "towns": 8, "rivers": 4, "twins": 2, "distractors": 20,
               "pair_questions": 12, "test_per_dataset": 4, "dev_per_dataset": 2}
"""The world of a quick (smoke) demo run."""


def parse_world_settings(items: Sequence[str] = (), *, seed: int = 0, index_kind: str = "flat",
                         quick: bool = False) -> WorldSettings:
    """The default world (or the quick one) with ``seed`` and ``index_kind``, then ``items``'
    KEY=VALUE entries (any field but seed, typed like its default)."""

    base: Dict[str, object] = dict(QUICK_WORLD) if quick else {}
    base["index_kind"] = index_kind
    base.update(parse_key_values(items, WorldSettings, what="world", exclude=("seed",)))
    return WorldSettings(seed=seed, **base)


def _write_json(path: Path, obj) -> None:
    atomic_write_json(path, obj, ensure_ascii=False)


def _write_jsonl(path: Path, rows) -> None:
    with atomic_open(path) as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def held_out_questions(questions: List[QAExample], n_per_dataset: int, seed: int) -> List[QAExample]:
    """The test pool: ``n_per_dataset`` one-hop and as many two-hop questions, about
    ``2 * n_per_dataset`` distinct subjects, so that each test question's sibling (the other hop
    about the same subject) stays in training; then ``n_per_dataset`` of each pair type present
    (:func:`held_out_pairs`)."""
    rng = random.Random(f"split-{seed}")
    chain = [q for q in questions if q.dataset in CHAIN_DATASETS]
    subjects = sorted({q.meta["subject"] for q in chain})
    if 2 * n_per_dataset > len(subjects):
        raise ValueError(f"cannot hold out {2 * n_per_dataset} subjects' questions from {len(subjects)} subjects")
    chosen = rng.sample(subjects, 2 * n_per_dataset)
    one_hop, two_hop = set(chosen[:n_per_dataset]), set(chosen[n_per_dataset:])
    held = [q for q in chain if (q.meta["hops"] == 1 and q.meta["subject"] in one_hop)
            or (q.meta["hops"] == 2 and q.meta["subject"] in two_hop)]
    return held + held_out_pairs(questions, n_per_dataset, set(chosen), random.Random(f"split-pairs-{seed}"))


def held_out_pairs(questions: List[QAExample], n_per_dataset: int, taken: set, rng: random.Random) -> List[QAExample]:
    """``n_per_dataset`` questions of each pair dataset present, each pair's bands the subjects of
    no other test question (``taken``: the chain test subjects) as far as the world's bands go:
    candidates in a seeded order are taken first when both bands are free, then when they are
    free of the other pair test questions, then at all (a band is in several test questions only
    when the world has too few bands for the test size)."""
    out: List[QAExample] = []
    taken, in_pairs = set(taken), set()
    for dataset in PAIR_DATASETS:
        pool = [q for q in questions if q.dataset == dataset]
        if not pool:
            continue
        if n_per_dataset > len(pool):
            raise ValueError(f"cannot hold out {n_per_dataset} {dataset} questions from {len(pool)}")
        order = rng.sample(pool, len(pool))
        chosen: List[QAExample] = []
        for free in (lambda s: not s & taken, lambda s: not s & in_pairs, lambda s: True):
            for q in order:
                s = set(q.meta["subjects"])
                if len(chosen) < n_per_dataset and q not in chosen and free(s):
                    chosen.append(q)
                    taken |= s
                    in_pairs |= s
        out += sorted(chosen, key=lambda q: q.id)
    return out


def _covering_splits(kb: KnowledgeBase, questions: List[QAExample], test_per_dataset: int, dev_per_dataset: int,
                     seed: int, tries: int = 100):
    """(train pool, test pool, splits, split seed) whose training questions have every town and
    river among their answers (so the model has written every answer name): the first split seed
    ``seed * 1000 + k`` whose held-out test questions and dev sample leave that so."""
    names = set(kb.towns) | set(kb.rivers)
    test_counts, dev_counts = dataset_counts(questions, test_per_dataset, dev_per_dataset)
    for k in range(tries):
        split_seed = seed * 1000 + k
        test_pool = held_out_questions(questions, test_per_dataset, split_seed)
        held = {q.id for q in test_pool}
        train_pool = [q for q in questions if q.id not in held]
        splits = build_splits(train_pool, test_pool, test_counts=test_counts, dev_counts=dev_counts, seed=split_seed)
        if names <= {a for q in splits.train for a in q.answers}:
            return train_pool, test_pool, splits, split_seed
    raise ValueError(f"no split in {tries} seeds leaves every town and river answered in training; "
                     "ask for a smaller dev or test set")


def dataset_counts(questions: List[QAExample], test_per_dataset: int, dev_per_dataset: int):
    """(test counts, dev counts or None) per dataset of ``questions`` (every dataset alike)."""
    present = [d for d in DATASETS if any(q.dataset == d for q in questions)]
    test_counts = {d: test_per_dataset for d in present}
    return test_counts, ({d: dev_per_dataset for d in present} if dev_per_dataset else None)


def read_settings(root) -> Optional[dict]:
    """The build marker of ``root`` (None: nothing finished there)."""
    return read_marker(Path(root) / WORLD_FILE)


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
    text = write_world_text(kb, s.seed, s.distractors, s.pair_questions)
    _write_json(paths.kb, kb.to_dict())
    _write_jsonl(paths.corpus, (p.to_corpus_row() for p in text.passages))

    train_pool, test_pool, splits, split_seed = _covering_splits(kb, text.questions, s.test_per_dataset,
                                                                 s.dev_per_dataset, s.seed)
    held = {q.id for q in test_pool}
    pools = paths.root / "pools"
    write_questions(pools / "train.jsonl", train_pool)
    write_questions(pools / "test.jsonl", test_pool)
    test_counts, dev_counts = dataset_counts(text.questions, s.test_per_dataset, s.dev_per_dataset)
    write_splits(splits, paths.manifest.parent, seed=split_seed,
                 inputs=[str(pools / "train.jsonl"), str(pools / "test.jsonl")],
                 test_counts=test_counts, dev_counts=dev_counts)


    build_index(paths.corpus, paths.index, IndexSpec(encoder=s.encoder, index_kind=s.index_kind), progress=progress)
    kinds: Dict[str, int] = {}
    for p in text.passages:
        kinds[p.kind] = kinds.get(p.kind, 0) + 1
    _write_json(paths.root / WORLD_FILE, {
        "settings": wanted, "passages": len(text.passages), "passage_kinds": dict(sorted(kinds.items())),
        "questions": {"train": len(splits.train), "dev": len(splits.dev), "test": len(splits.test)},
        "questions_by_dataset": {name: {d: sum(q.dataset == d for q in getattr(splits, name)) for d in DATASETS}
                                 for name in ("train", "dev", "test")},
        "test_questions": sorted(held)})
    return paths


def load_kb(paths: WorldPaths) -> KnowledgeBase:
    return KnowledgeBase.from_dict(json.loads(paths.kb.read_text(encoding="utf-8")))


def load_split(paths: WorldPaths, name: str) -> List[QAExample]:
    """A split's questions (FlashRAG rows; the dataset name is each row's ``dataset``)."""
    examples, _ = load_flashrag(paths.split(name))
    return examples


def load_question_meta(paths: WorldPaths) -> Dict[str, dict]:
    """Question text -> meta (subject, kind, hops, town, river, gold passage ids; pair questions:
    subjects, relation, towns, years), over both pools."""
    out: Dict[str, dict] = {}
    for name in ("train", "test"):
        with (paths.root / "pools" / f"{name}.jsonl").open(encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                out[row["question"]] = row["meta"]
    return out
