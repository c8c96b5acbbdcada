"""A small search-QA world for the core's tests that need a corpus, an index and question splits
(the real-model and vLLM tests): written here, so those tests stand without the tiny-world recipe.

Seeded facts about invented bands, towns and rivers; one passage per fact and a few distractors;
one- and two-hop questions (``Which river flows through the town where X was formed?``) split
into train, dev and test; a BM25 index (no encoder: seconds to build).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

TOWNS = ["Varnholt", "Quenby", "Orlisk", "Tamsford", "Hexley", "Brisca", "Durnmoor", "Pellow"]
RIVERS = ["Ouse", "Marr", "Calder", "Ystra", "Fenn", "Lorrow", "Astel", "Kenna"]
BANDS = ["The Glass Owls", "Copper Lanterns", "Velvet Static", "The Paper Tides", "Iron Meadow",
         "Saffron Echo", "The Hollow Kings", "Northern Vessel", "Blue Ember", "The Quiet Foxes",
         "Silver Harbour", "Tin Orchard"]


@dataclass(frozen=True)
class QAWorld:
    root: Path
    corpus: Path
    train: Path
    dev: Path
    test: Path
    index: Path


def build_qa_world(out_dir, seed: int = 0) -> QAWorld:
    """Write the world under ``out_dir`` (corpus.jsonl, questions/{train,dev,test}.jsonl in FlashRAG
    rows, index/ with BM25) and return its paths."""
    from mopd.retriever.builder import IndexSpec, build_index

    rng = random.Random(seed)
    root = Path(out_dir)
    (root / "questions").mkdir(parents=True, exist_ok=True)
    river_of = dict(zip(TOWNS, rng.sample(RIVERS, len(TOWNS))))
    town_of = {band: rng.choice(TOWNS) for band in BANDS}
    passages = [(t, f"{t} is a town on the river {r}.") for t, r in river_of.items()]
    passages += [(b, f"{b} is a band formed in {t} in {rng.randrange(1965, 2015)}.") for b, t in town_of.items()]
    passages += [(f"{t} market", f"{t} holds a market every spring by the old bridge.") for t in TOWNS]
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"{title}\n{text}"}) + "\n"
                              for i, (title, text) in enumerate(passages)), encoding="utf-8")
    questions = []
    for i, band in enumerate(BANDS):
        town = town_of[band]
        questions.append({"id": f"q{i}a", "question": f"Where was {band} formed?", "golden_answers": [town],
                          "dataset": "one_hop"})
        questions.append({"id": f"q{i}b", "question": f"Which river flows through the town where {band} was formed?",
                          "golden_answers": [river_of[town]], "dataset": "two_hop"})
    rng.shuffle(questions)
    splits = {"train": questions[:14], "dev": questions[14:18], "test": questions[18:]}
    for name, rows in splits.items():
        (root / "questions" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    build_index(corpus, root / "index", IndexSpec(index_kind="bm25"))
    q = root / "questions"
    return QAWorld(root=root, corpus=corpus, train=q / "train.jsonl", dev=q / "dev.jsonl", test=q / "test.jsonl",
                   index=root / "index")
