"""The tiny world: deterministic for a seed, answerable from its corpus, split without leaks."""

import json
import re

import pytest

from mopd.core.qa import load_flashrag
from mopd.recipes.tiny_world.world import (
    WorldSettings,
    build_world,
    held_out_questions,
    load_kb,
    load_question_meta,
    load_split,
    read_settings,
)
from mopd.recipes.tiny_world.world_kb import WorldSizes, generate_kb
from mopd.recipes.tiny_world.world_text import CHAIN_DATASETS, DATASETS, ONE_HOP, TWO_HOP

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # tiny models: one thread is fast and steady

SMALL = dict(bands=30, companies=8, towns=12, rivers=4, twins=4, distractors=40, test_per_dataset=6,
             dev_per_dataset=3, index_kind="bm25")


def corpus_of(paths):
    with paths.corpus.open(encoding="utf-8") as f:
        return {r["id"]: r["contents"] for r in map(json.loads, f)}


def words(text):
    return re.findall(r"\b\S+\b", text)


def test_same_seed_same_world_and_other_seed_other_world(tmp_path):
    a = build_world(tmp_path / "a", settings=WorldSettings(seed=3, **SMALL))
    b = build_world(tmp_path / "b", settings=WorldSettings(seed=3, **SMALL))
    c = build_world(tmp_path / "c", settings=WorldSettings(seed=4, **SMALL))
    for name in ("corpus", "kb", "train", "dev", "test"):
        assert getattr(a, name).read_bytes() == getattr(b, name).read_bytes(), name
    assert a.corpus.read_bytes() != c.corpus.read_bytes()
    assert a.train.read_bytes() != c.train.read_bytes()


def test_a_finished_world_is_reused_and_other_settings_rebuild_it(tmp_path):
    s = WorldSettings(seed=1, **SMALL)
    paths = build_world(tmp_path / "w", settings=s)
    stamp = (paths.root / "world.json").stat().st_mtime_ns
    assert build_world(tmp_path / "w", settings=s) == paths
    assert (paths.root / "world.json").stat().st_mtime_ns == stamp
    s2 = WorldSettings(seed=2, **SMALL)
    build_world(tmp_path / "w", settings=s2)
    assert read_settings(paths.root)["settings"]["seed"] == 2


def test_default_world_sizes_and_files(world):
    info = read_settings(world.root)
    assert info["passages"] == 400 + 40 + 60 + 20 + 280
    # 360 + 360 chain and 320 + 320 pair questions train, 20 and 60 of each of the four datasets
    assert info["questions"] == {"train": 1360, "dev": 80, "test": 240}
    assert info["questions_by_dataset"]["train"] == {ONE_HOP: 360, TWO_HOP: 360, "tiny_pair_towns": 320,
                                                     "tiny_pair_genres": 320}
    corpus = corpus_of(world)
    assert len(corpus) == info["passages"]
    for contents in corpus.values():
        title, _, text = contents.partition("\n")
        assert title and text and "\n" not in text
    for split in ("train", "dev", "test"):
        examples, report = load_flashrag(world.split(split))
        assert report.skipped == 0 and {e.dataset for e in examples} == set(DATASETS)
    manifest = json.loads(world.manifest.read_text())
    assert manifest["counts"]["test"] == {d: 60 for d in DATASETS}
    assert manifest["disjoint_hashes_checked"]


def test_every_answer_is_in_its_gold_passages(world):
    corpus = corpus_of(world)
    kb = load_kb(world)
    meta = load_question_meta(world)
    for split in ("train", "dev", "test"):
        for q in load_split(world, split):
            m = meta[q.question]
            gold = [corpus[g] for g in m["gold"]]
            if q.dataset not in CHAIN_DATASETS:  # pair questions: tests/recipes/tiny_world/test_pair_questions.py
                continue
            assert m["subject"] in q.question and m["subject"] in gold[0]
            assert m["town"] in words(gold[0])  # the subject's passage names its town
            if m["hops"] == 1:
                assert q.answers == [m["town"]] and kb.subject(m["subject"])["town"] == m["town"]
            else:
                # the town's passage and the river's passage both name the river, and the
                # river's passage names the town
                assert m["river"] in words(gold[1]) and m["river"] in words(gold[2]) and m["town"] in gold[2]
                assert q.answers[0] == m["river"] == kb.towns[m["town"]]["river"]
            assert all(a for a in q.answers)


def test_no_distractor_contradicts_a_gold_fact(world):
    """Only a subject's own passage says where it was formed / is headquartered, and only a town's
    own passage or its river's passage puts it on a river."""
    kb = load_kb(world)
    for pid, contents in corpus_of(world).items():
        title, _, text = contents.partition("\n")
        for m in re.finditer(r"^(.+?) (?:is|are) an? \w+ (?:band|group).*?formed in (\w+)", text):
            assert kb.bands[m.group(1)]["town"] == m.group(2)
        for m in re.finditer(r"(\w+) is a (?:market )?town .*?river (\w+)", text):
            assert kb.towns[m.group(1)]["river"] == m.group(2)
        if not pid.startswith(("band", "company")):
            assert "formed in" not in text and "headquarter" not in text


def test_test_questions_are_new_and_their_siblings_are_in_training(world):
    meta = load_question_meta(world)
    train = {q.question for s in ("train", "dev") for q in load_split(world, s)}
    test = [q for q in load_split(world, "test") if q.dataset in CHAIN_DATASETS]
    subjects = [meta[q.question]["subject"] for q in test]
    assert len(set(subjects)) == len(test) == 120  # one test question per subject
    trained = {(meta[q]["subject"], meta[q]["hops"]) for q in train if "subjects" not in meta[q]}
    for q in test:
        m = meta[q.question]
        assert q.question not in train
        assert (m["subject"], 3 - m["hops"]) in trained and (m["subject"], m["hops"]) not in trained


def test_every_town_and_river_is_an_answer_in_training(world):
    kb = load_kb(world)
    answers = {a for q in load_split(world, "train") for a in q.answers}
    assert set(kb.towns) <= answers
    assert set(kb.rivers) <= answers


def test_held_out_questions_pick_one_hop_per_subject():
    from mopd.recipes.tiny_world.world_text import write_world_text

    kb = generate_kb(5, WorldSizes())
    qs = write_world_text(kb, 5, 10).questions
    held = held_out_questions(qs, 30, seed=5)
    assert sorted(q.meta["hops"] for q in held) == [1] * 30 + [2] * 30
    assert len({q.meta["subject"] for q in held}) == 60
    with pytest.raises(ValueError):
        held_out_questions(qs, 200, seed=5)


def test_confusable_names_exist():
    kb = generate_kb(0, WorldSizes())
    twins = [b for b in kb.bands if b + "s" in kb.bands]
    assert len(twins) >= 8
    shared_word = [b for b in kb.bands if sum(b.split()[0] == o.split()[0] for o in kb.bands) > 1]
    assert len(shared_word) > len(kb.bands) // 2


def test_bm25_finds_the_gold_passage_for_a_query_naming_the_entity(world, retriever):
    meta = load_question_meta(world)
    qs = load_split(world, "train")[:120]
    ms = [meta[q.question] for q in qs]
    results = retriever.search([m["subject"] for m in ms], 3)
    hits = sum(m["gold"][0] in [p.id for p in r] for m, r in zip(ms, results, strict=True))
    assert hits / len(ms) >= 0.95
    two = [m for m in ms if m["hops"] == 2]
    results = retriever.search([f"{m['town']} river" for m in two], 3)
    hits = sum(bool({m["gold"][1], m["gold"][2]} & {p.id for p in r}) for m, r in zip(two, results, strict=True))
    assert hits / len(two) >= 0.95
